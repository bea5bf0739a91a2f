"""Benchmarks: run as `python -m lingbot_world.bench.<name>`; each writes JSON (see BENCHMARKS.md)."""
