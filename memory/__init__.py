"""Where weights and caches live: the memory planner, providers, block swap, pinned host copies, readings."""
