"""The machine a world runs on, as the doors report it and plan around it: the host RAM new allocations can take,
this process's peak, the RAM a door keeps free beside what it copies, freed heap pages given back to the OS, and a
size in words. memory/ measures; the doors see it here.
"""
from ..memory.fast_planner import RAM_MARGIN
from ..memory.memstats import peak_rss_bytes
from ..memory.host_buffer import return_freed_host_memory
from ..memory.estimates import available_ram_bytes

__all__ = ["RAM_MARGIN", "available_ram_bytes", "gb", "peak_rss_bytes", "return_freed_host_memory"]


def gb(n: float) -> str:
    """A size for a message: decimal gigabytes, one decimal."""
    return f"{n / 1e9:.1f} GB"
