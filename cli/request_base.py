"""What the typed requests of `generate` and `play` share: reading the parsed namespace once, and the speed flags."""
from __future__ import annotations

import argparse
from dataclasses import fields

from .speed_flags import EXPLICIT, SpeedFlags

GIVEN = "given_flags"  # the namespace attribute naming the flags (dest names) given on the command line


class Given(argparse.Action):
    """Stores the value and records that the flag was given, even when it equals the default (a continuation refuses
    a flag it takes from its state whatever its value)."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        setattr(namespace, GIVEN, set(getattr(namespace, GIVEN, None) or ()) | {self.dest})


class FlagRequest:
    """Base of a frozen dataclass holding every flag of one command under its argparse dest name. Subclasses have
    the fields speed, compile, compute, attention, chunk_steps, speed_explicit and weights."""

    @classmethod
    def from_args(cls, args):
        """The one place the command's namespace is read (a flag the parser lacks keeps its default)."""
        source = {"speed_explicit": EXPLICIT}
        return cls(**{f.name: _frozen(getattr(args, source.get(f.name, f.name), f.default)) for f in fields(cls)})

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
