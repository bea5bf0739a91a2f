"""The CLI (generate, play, continue, ...) runs torch's CUDA allocator with expandable segments, as the benchmarks
measure it, unless the user configured the allocator; not on Windows, where torch does not support them."""
from __future__ import annotations

import os
import sys

from lingbot_world.cli import ALLOC_CONF, cuda_allocator_defaults, main


def test_the_cli_turns_expandable_segments_on_before_anything_runs(monkeypatch, capsys):
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.delenv(ALLOC_CONF, raising=False)
    assert main(["--help"]) == 0
    assert os.environ[ALLOC_CONF] == "expandable_segments:True"


def test_a_users_allocator_setting_wins_and_windows_is_left_alone(monkeypatch):
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setenv(ALLOC_CONF, "backend:cudaMallocAsync")
    cuda_allocator_defaults()
    assert os.environ[ALLOC_CONF] == "backend:cudaMallocAsync"
    monkeypatch.setattr(sys, "platform", "win32")
    monkeypatch.delenv(ALLOC_CONF)
    cuda_allocator_defaults()
    assert ALLOC_CONF not in os.environ
