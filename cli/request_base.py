"""What the typed requests of `generate` and `play` share: reading the parsed namespace once, and the speed flags."""
from __future__ import annotations

from dataclasses import fields

from .speed_flags import EXPLICIT, SpeedFlags


class FlagRequest:
    """Base of a frozen dataclass holding every flag of one command under its argparse dest name. Subclasses have
    the fields speed, compile, compute, attention, chunk_steps, speed_explicit and weights."""

    @classmethod
    def from_args(cls, args):
        """The one place the command's namespace is read (a flag the parser lacks keeps its default)."""
        return cls(**{f.name: _frozen(getattr(args, EXPLICIT if f.name == "speed_explicit" else f.name, f.default))
                      for f in fields(cls)})

    @property
    def speed_flags(self) -> SpeedFlags:
        """The effective speed flags: the --speed preset with the explicit flags over it, for these weights."""
        return SpeedFlags.given(self.speed, {"compile": self.compile, "compute": self.compute,
                                             "attention": self.attention}, self.speed_explicit, self.weights,
                                self.chunk_steps)


def _frozen(value):
    """Lists (nargs, append) as tuples, sets (the explicit speed flags) as frozensets."""
    if isinstance(value, list):
        return tuple(value)
    if isinstance(value, set):
        return frozenset(value)
    return value
