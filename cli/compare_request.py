"""`lingbot-world compare`'s flags as a typed request, and its `--preset` specs.

A spec is a speed preset's name, optionally followed by a colon and comma-separated options that change it:

    exact                       draft:steps=2               draft:steps=2,tiny-vae
    auto:compile=off            fast:compute=bf16           exact:tiny-vae

- steps=2|3|4: denoising calls per chunk over the preset's (`--chunk-steps`);
- tiny-vae: decode with the tiny decoder given by `--tiny-vae PATH` (`--tiny-vae` on `play` / `generate`);
- compile=, compute=, attention=: the speed flag of that name over the preset's (`--compile` ...).

The label of a preset in the table, the JSON and the plot is its spec as written (options in the order given).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ..speed.options import ATTENTION_CHOICES, COMPILE_CHOICES, COMPUTE_CHOICES
from ..speed.presets import CHUNK_STEP_CHOICES, PRESET_NAMES
from .errors import UsageError
from .request_base import FlagRequest

DEFAULT_PRESETS = ("exact", "draft", "draft:steps=2")
DEFAULT_CHUNKS = 10
FLAG_CHOICES = {"compile": COMPILE_CHOICES, "compute": COMPUTE_CHOICES, "attention": ATTENTION_CHOICES}
SPEC_HELP = ("NAME[:OPTION,...]: a speed preset (exact, auto, fast, draft) and what changes in it: steps=2|3|4, "
             "tiny-vae (decode with --tiny-vae PATH), compile=, compute=, attention= (the speed flags)")


@dataclass(frozen=True)
class PresetSpec:
    """One `--preset`: the preset, its steps per chunk (None: the preset's), the speed flags put over it, whether
    it decodes with the tiny decoder, and its label (the spec as given)."""

    label: str
    preset: str
    steps: Optional[int] = None
    flags: tuple = ()  # ((name, value), ...) over the preset's options
    tiny_vae: bool = False


def parse_preset(spec: str) -> PresetSpec:
    """A `--preset` value -> PresetSpec; UsageError (one line) for anything else."""
    text = spec.strip()
    name, _, rest = text.partition(":")
    name = name.strip().lower()
    if name not in PRESET_NAMES:
        raise UsageError(f"--preset {spec!r}: no preset {name!r}; use one of {', '.join(PRESET_NAMES)}, optionally "
                         "with options, e.g. draft:steps=2,tiny-vae")
    steps, flags, tiny, options = None, {}, False, []
    if ":" in text and not rest.strip():
        raise UsageError(f"--preset {spec!r}: nothing after the colon; give options (steps=2, tiny-vae, ...) or "
                         f"drop it")
    for raw in rest.split(",") if rest.strip() else ():
        option = raw.strip().lower()
        key, eq, value = (part.strip() for part in option.partition("="))
        if key == "tiny-vae" and not eq:
            tiny = _once(spec, key, tiny, True)
        elif key == "steps" and eq:
            if value not in {str(s) for s in CHUNK_STEP_CHOICES}:
                raise UsageError(f"--preset {spec!r}: steps={value}; a chunk takes "
                                 f"{', '.join(map(str, CHUNK_STEP_CHOICES))} steps")
            steps = _once(spec, key, steps, int(value))
        elif key in FLAG_CHOICES and eq:
            if value not in FLAG_CHOICES[key]:
                raise UsageError(f"--preset {spec!r}: {key}={value}; use one of {', '.join(FLAG_CHOICES[key])}")
            flags[key] = _once(spec, key, flags.get(key), value)
        else:
            raise UsageError(f"--preset {spec!r}: unknown option {raw.strip()!r}; use steps=2|3|4, tiny-vae, "
                             "compile=, compute= or attention=")
        options.append(f"{key}={value}" if eq else key)
    label = name + (":" + ",".join(options) if options else "")
    return PresetSpec(label, name, steps, tuple(flags.items()), tiny)


def _once(spec: str, key: str, old, new):
    if old not in (None, False):
        raise UsageError(f"--preset {spec!r}: {key} given twice")
    return new


def parse_presets(specs) -> list[PresetSpec]:
    """Every `--preset` (the defaults without one); two or more, each label once."""
    parsed = [parse_preset(s) for s in (specs or DEFAULT_PRESETS)]
    if len(parsed) < 2:
        raise UsageError(f"--preset {parsed[0].label}: give two presets or more (the first is the reference the "
                         "others are compared with), e.g. --preset exact --preset draft:steps=2")
    seen = set()
    for p in parsed:
        if p.label in seen:
            raise UsageError(f"--preset {p.label} given twice; each preset once")
        seen.add(p.label)
    return parsed


@dataclass(frozen=True)
class CompareRequest(FlagRequest):
    """Every `compare` flag under its argparse dest name (FlagRequest.from_args reads them)."""

    # inputs
    model: str = "fast"
    ckpt_dir: Optional[Path] = None
    assets_dir: Optional[Path] = None
    demo: bool = False
    demo_dir: Optional[Path] = None
    image: Optional[Path] = None
    prompt: Optional[str] = None
    actions: Optional[str] = None
    # the comparison
    preset: tuple = ()  # the --preset specs, in order (empty: DEFAULT_PRESETS)
    chunks: int = DEFAULT_CHUNKS
    kv_drift: str = "on"
    tiny_vae: Optional[Path] = None
    # generation
    seed: int = 42
    size: Optional[str] = None
    weights: str = "nf4"
    kv_cache: str = "auto"
    device: str = "auto"
    noise: str = "auto"
    t5_device: str = "auto"
    cache_dir: Optional[Path] = None
    # outputs
    out_dir: Path = Path("lingbot_compare")
    quiet: bool = False
