"""Host RAM goes back to the OS when the pack's weights are dropped (nodes/adapters/host_memory.py), measured as RSS.

glibc keeps freed 1-16 MB chunks (weights) in its heap once its dynamic mmap threshold has grown; the pack trims
the heap after an expert unload and after ComfyUI's full collection that follows "Free model and node cache".
Each case runs in a fresh interpreter so the heap layout is the same every time.
"""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from lingbot_world.memory.host_buffer import _malloc_trim

pytestmark = pytest.mark.skipif(_malloc_trim() is None, reason="needs glibc's malloc_trim (Linux)")

SCRIPT = textwrap.dedent("""
    import gc, json, torch
    from lingbot_world.nodes.adapters import host_memory

    def rss_mb():
        for line in open("/proc/self/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024

    class Weights:  # stands in for an expert / VAE held by ComfyUI's node cache
        pass

    big = torch.ones(16 << 20, dtype=torch.uint8)
    del big  # glibc raises its mmap threshold to 16 MB: smaller weights now come from the heap
    host_memory.install()
    before = rss_mb()
    w, survivors = Weights(), []
    w.tensors = []
    for _ in range(100):  # 300 MB of 3 MB weights, with small live allocations between them
        w.tensors.append(torch.ones(3 << 20, dtype=torch.uint8))
        survivors.append(torch.ones(64 << 10, dtype=torch.uint8))
    host_memory.track(w)
    loaded = rss_mb()
    {release}
    print("RESULT" + json.dumps({{"before": before, "loaded": loaded, "dropped": dropped, "after": after}}))
""")

NODE_CACHE_FREED = """
    del w  # ComfyUI's e.reset(): the node output goes away ...
    dropped = rss_mb()
    gc.collect()  # ... and ComfyUI's prompt worker collects right after
    after = rss_mb()
"""

UNLOADED = """
    w.tensors.clear()  # an expert unload drops its weights ...
    dropped = rss_mb()
    host_memory.trim_now()  # ... and trims at once
    after = rss_mb()
"""


def _run(release: str) -> dict:
    code = SCRIPT.format(release=textwrap.dedent(release).strip())
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT")), None)
    assert line is not None, proc.stdout[-2000:] + proc.stderr[-3000:]
    return json.loads(line[len("RESULT"):])


@pytest.mark.parametrize("release", [NODE_CACHE_FREED, UNLOADED], ids=["node_cache_freed", "expert_unloaded"])
def test_freed_weights_leave_the_process(release):
    r = _run(release)
    assert r["loaded"] - r["before"] > 250, r  # the weights were resident
    assert r["dropped"] - r["before"] > 250, r  # freeing alone keeps them (glibc): the problem being fixed
    assert r["after"] - r["before"] < 40, r  # the trim returned them


def test_a_trim_waits_for_a_released_object_and_runs_once(monkeypatch):
    import gc

    from lingbot_world.nodes.adapters import host_memory

    calls = []
    monkeypatch.setattr(host_memory, "return_freed_host_memory", lambda: calls.append(1))
    monkeypatch.setattr(host_memory, "_pending", False)  # earlier tests in this process may have released weights
    host_memory.install()
    host_memory.install()  # idempotent
    try:
        assert gc.callbacks.count(host_memory._after_collection) == 1
        gc.collect()
        assert calls == []  # nothing of ours was freed: no trim
        holder = type("Holder", (), {})()
        host_memory.track(holder)
        del holder
        gc.collect()
        gc.collect()
        assert calls == [1]
    finally:
        gc.callbacks.remove(host_memory._after_collection)
