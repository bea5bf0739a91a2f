"""What a world raises at a door: a request it cannot carry out as given, and a run stopped on request."""
from ..wan.sampling.sampler import Cancelled  # a run's cancel check said stop (between two model calls)

__all__ = ["Cancelled", "WorldError"]


class WorldError(ValueError):
    """A request the session cannot carry out as given; the message says what to do."""
