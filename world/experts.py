"""`lingbot-world generate --lora FILE[:STRENGTH]` (both experts), `--lora-high` / `--lora-low` (one expert).

The files are read and matched against the experts' config before anything expensive runs (a LoRA for another
model, or a pickle, stops here with one line). The LoRAs are put on each expert right after it loads
(`quant.lora.apply_lora`: low-rank terms next to the NF4 linears), whatever the memory mode.
"""
from __future__ import annotations

import argparse
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

from .errors import UsageError

if TYPE_CHECKING:
    from ..loaders.lora_files import LoraSet

# The LoRA modules are imported when a LoRA is given: they import bitsandbytes (seconds), which the Fast path
# imports on a background thread (cli/heavy_imports.py) and the parser must not import first.

log = logging.getLogger(__name__)


def add_lora_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("LoRA (Wan 2.1/2.2 14B LoRAs, .safetensors)")
    g.add_argument("--lora", action="append", default=[], metavar="FILE[:STRENGTH]",
                   help="a LoRA on both experts (repeat to stack; strength default 1)")
    g.add_argument("--lora-high", action="append", default=[], metavar="FILE[:STRENGTH]",
                   help="a LoRA on the high-noise expert only")
    g.add_argument("--lora-low", action="append", default=[], metavar="FILE[:STRENGTH]",
                   help="a LoRA on the low-noise expert only")


@dataclass(frozen=True)
class LoraFlags:
    """The FILE[:STRENGTH] specs of --lora (both experts), --lora-high and --lora-low, as given."""

    lora: tuple = ()
    lora_high: tuple = ()
    lora_low: tuple = ()


STRENGTH_MAX = 100.0  # |strength| beyond this swamps the weights (and overflows bf16 towards inf)


def parse_spec(spec: str, flag: str = "--lora") -> tuple[Path, float]:
    """FILE or FILE:STRENGTH -> (path, strength). An existing file whose name holds ':' is taken whole; a strength
    that is not a finite number in -100..100 is a UsageError naming the flag (nan would make every frame black)."""
    path, sep, strength = spec.rpartition(":")
    if not sep or not path or strength.startswith(("/", "\\")) or Path(spec).expanduser().is_file():
        return Path(spec), 1.0
    try:
        value = float(strength)
    except ValueError:
        raise UsageError(f"{flag} {spec}: strength {strength!r} is not a number; write FILE:STRENGTH, e.g. "
                         f"{path}:0.8") from None
    if not math.isfinite(value) or abs(value) > STRENGTH_MAX:
        raise UsageError(f"{flag} {spec}: strength {strength} must be a finite number from -{STRENGTH_MAX:g} to "
                         f"{STRENGTH_MAX:g} (1 = the LoRA as trained)")
    return Path(path), value


def read_cli_loras(loras: LoraFlags, config) -> dict[str, list[tuple["LoraSet", float]]]:
    """{"high": [(lora, strength), ...], "low": [...]} from the flags; a UsageError (exit code 2) with one line on
    bad input."""
    out: dict[str, list] = {"high": [], "low": []}
    if not (loras.lora or loras.lora_high or loras.lora_low):
        return out
    from ..loaders.lora_files import LoraFileError, dit_weight_shapes, load_lora

    shapes = dit_weight_shapes(config)
    cache: dict[Path, "LoraSet"] = {}
    for flag, experts in (("lora", ("high", "low")), ("lora_high", ("high",)), ("lora_low", ("low",))):
        for spec in getattr(loras, flag):
            path, strength = parse_spec(spec, f"--{flag.replace('_', '-')}")
            if path not in cache:
                try:
                    cache[path] = load_lora(path, shapes)
                except LoraFileError as e:
                    raise UsageError(f"--{flag.replace('_', '-')} {spec}: {e}") from None
                log.info("LoRA %s", cache[path].report())
            for name in experts:
                out[name].append((cache[path], strength))
    return out


def lora_loader(loras: dict[str, list], paths: dict[str, Path], base: Optional[Callable] = None) -> Optional[Callable]:
    """A `make_provider(loader=...)` that loads an expert, then puts its LoRAs on it; None without LoRAs."""
    if not any(loras.values()):
        return None
    from ..loaders.lora_files import lora_hooks
    from ..memory.placement import _default_loader
    from ..quant.lora import apply_lora
    from ..quant.nf4_format import nf4_linear_names

    base = base or _default_loader
    by_path = {str(Path(p)): name for name, p in paths.items()}

    def load(path, device, mode, compute_dtype, host=None):
        model = base(path, device=device, mode=mode, compute_dtype=compute_dtype, host=host)
        chosen = loras.get(by_path.get(str(Path(path)), ""), [])
        if chosen:
            hooks, plain = lora_hooks(chosen, nf4_linear_names(model.cfg.num_layers))
            applied = apply_lora(model, hooks, plain, dtype=compute_dtype, device=device)
            log.info("%d LoRA(s) on %s: %d linears, %d other tensors", len(chosen), path, len(applied.hooked),
                     len(plain))
        return model

    return load
