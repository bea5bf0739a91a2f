"""Errors as ComfyUI shows them: in the words of the nodes, under a plain type name.

The layers below speak to the CLI ("run it with --model fast", "--camera-cache host"); inside ComfyUI the same fact
is a node or a widget. And ComfyUI names an error by its class's module, which for a custom node is the pack's file
path ("/home/me/ComfyUI/custom_nodes/ComfyUI-LingBot-World.loaders.expert_config.ExpertLoadError"). `node_door` wraps
each node's function once, at registration, so every node's error reaches the UI with the message in node words and
a type name without a path ("ValueError", "LingBot-World.ExpertLoadError"); it stays an instance of its class. ComfyUI's interrupt and
anything that is not an `Exception` pass through untouched.
"""
from __future__ import annotations

import functools
import re

# (pattern, replacement), applied in order; the specific phrases first, then any leftover --flag as its widget name
_CLI_PHRASES = (
    (r"run it with --model fast \(LingBot Fast Sampler in ComfyUI\)", "load it with LingBot Fast Model Loader"),
    (r"run it with --model fast", "load it with LingBot Fast Model Loader"),
    (r"[Uu]se --model base for the two experts", "Pick the two experts in LingBot Expert Loader"),
    (r"--model fast", "LingBot Fast Model Loader"),
    (r"--model base", "LingBot Expert Loader"),
    (r"; use target_size\(\) to pick one", "; choose size 480p or 720p, or a width and height that are multiples of 16"),
    (r"--save-state", "LingBot Fast Continue's state output"),
    (r"--continue-from", "LingBot Fast Continue"),
    (r"--ckpt-dir", "the model folder"),
)
_FLAG = re.compile(r"(?<![\w-])--([a-z][a-z0-9]*(?:-[a-z0-9]+)*)")


def in_node_words(text: str) -> str:
    """A message from the layers below, with the CLI's flags and function names said as ComfyUI widgets / nodes."""
    for pattern, replacement in _CLI_PHRASES:
        text = re.sub(pattern, replacement, text)
    return _FLAG.sub(lambda m: m.group(1).replace("-", "_"), text)


def _is_interrupt(error: BaseException) -> bool:
    try:
        import comfy.model_management as mm
    except ImportError:  # outside ComfyUI
        return False
    return isinstance(error, mm.InterruptProcessingException)


SHOWN_MODULE = "LingBot-World"  # what ComfyUI prints before the class name of the pack's errors
_shown: dict[type, type] = {}


def _shown_class(kind: type) -> type:
    """A subclass of `kind` that ComfyUI names "LingBot-World.<Name>": still caught by `except kind` (and by
    ComfyUI's own isinstance checks: out of memory, interrupt), only its module differs."""
    if kind not in _shown:
        _shown[kind] = type(kind.__name__, (kind,), {"__module__": SHOWN_MODULE, "__qualname__": kind.__qualname__})
    return _shown[kind]


def plain_error(error: Exception) -> Exception:
    """The same failure with its message in node words and a type name without a file path: builtin and torch
    errors keep their type (the message is rewritten in place), the pack's get `_shown_class`. `error` itself when
    nothing changes."""
    message = in_node_words(str(error))
    kind = type(error)
    module = kind.__module__ or ""
    if module in ("builtins", SHOWN_MODULE) or module.split(".")[0] == "torch":
        if message != str(error):
            error.args = (message,)
        return error
    shown = _shown_class(kind)
    plain = shown.__new__(shown)
    plain.__dict__.update(error.__dict__)
    plain.args = (message,)
    return plain


def node_door(function):
    """Wrap a node's FUNCTION: errors reach ComfyUI as `plain_error`s, the original chained as their cause."""
    @functools.wraps(function)
    def run(*args, **kwargs):
        try:
            return function(*args, **kwargs)
        except Exception as e:
            if _is_interrupt(e):
                raise
            plain = plain_error(e)
            if plain is e:
                raise
            raise plain.with_traceback(e.__traceback__) from e

    run.lingbot_door = True
    return run


def install(node_classes) -> None:
    """Wrap the FUNCTION of each node class once (idempotent)."""
    for cls in node_classes:
        name = getattr(cls, "FUNCTION", None)
        function = cls.__dict__.get(name) if name else None
        if function is None or getattr(function, "lingbot_door", False) or isinstance(function, (classmethod,
                                                                                                staticmethod)):
            continue
        setattr(cls, name, node_door(function))
