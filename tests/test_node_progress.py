"""What running nodes show (nodes/adapters/progress.py, nodes/text.py's encode_summary), against stand-ins for ComfyUI's
ProgressBar, PromptServer and execution context. The real server test checks the same on ComfyUI itself."""
from __future__ import annotations

import sys
import types

import pytest

from lingbot_world.nodes.adapters import progress as prog
from lingbot_world.nodes.text import encode_summary
from lingbot_world.world.models import V1_FAST


@pytest.fixture
def comfy_stubs(monkeypatch):
    """comfy.utils.ProgressBar, server.PromptServer.instance and comfy_execution.utils, recording what is sent."""
    sent = {"bar": [], "text": []}

    class ProgressBar:
        def __init__(self, total):
            self.total = total

        def update_absolute(self, value, total=None, preview=None):
            sent["bar"].append((value, total or self.total, preview))

    class Server:
        client_id = "client-1"
        last_node_id = None

        def send_progress_text(self, text, node_id, sid=None):
            sent["text"].append((node_id, text, sid))

    comfy = types.ModuleType("comfy")
    comfy.utils = types.ModuleType("comfy.utils")
    comfy.utils.ProgressBar = ProgressBar
    server = types.ModuleType("server")
    server.PromptServer = types.SimpleNamespace(instance=Server())
    execution = types.ModuleType("comfy_execution")
    execution.utils = types.ModuleType("comfy_execution.utils")
    context = types.SimpleNamespace(node_id="7")
    execution.utils.get_executing_context = lambda: context
    for name, mod in (("comfy", comfy), ("comfy.utils", comfy.utils), ("server", server),
                      ("comfy_execution", execution), ("comfy_execution.utils", execution.utils)):
        monkeypatch.setitem(sys.modules, name, mod)
    sent["context"] = context
    return sent


def test_show_on_node_targets_the_running_node_and_the_prompt_client(comfy_stubs):
    prog.show_on_node("hello")
    assert comfy_stubs["text"] == [("7", "hello", "client-1")]


def test_show_on_node_never_raises(monkeypatch):
    monkeypatch.setitem(sys.modules, "server", None)  # no ComfyUI server: import fails
    prog.show_on_node("nobody listens")


def test_text_encode_stages_drive_the_bar_and_the_node_text(comfy_stubs):
    p = prog.TextEncodeProgress(2)
    p("start", 0, 1)
    p("load", 0, 1)  # the child announces the load before it knows the size
    for done in range(0, 11_400_000_001, 570_000_000):
        p("load", done, 11_400_000_000)
    p("encode", 0, 2)
    p("encode", 1, 2)
    p("encode", 2, 2)
    p.finish("umT5 on cuda: 2 prompts encoded in 30.0 s (loading 28.0 s)")
    bar = [v for v, total, _ in comfy_stubs["bar"]]
    assert all(total == 100 for _, total, _ in comfy_stubs["bar"])
    assert bar == sorted(bar) and bar[0] == 0 and bar[-1] == 100 and len(bar) == len(set(bar))  # no repeats
    assert 5 in bar and 90 in bar and 95 in bar
    assert [t for _, t, _ in comfy_stubs["text"]] == [
        "umT5: starting the encoder process...",
        "umT5: loading the encoder weights...",
        "umT5: loading the encoder weights (11.4 GB)...",
        "umT5: encoding 2 prompts...",
        "umT5 on cuda: 2 prompts encoded in 30.0 s (loading 28.0 s)",
    ]


def test_encode_summary():
    worker = {"device": "cpu", "total_s": 12.34, "load_s": 10.0}
    assert encode_summary({"cache_hits": 2, "encoded": 0, "worker": None}) == \
        "umT5: both prompts from the cache (no encoder run)"
    assert encode_summary({"cache_hits": 1, "encoded": 1, "worker": worker}) == \
        "umT5 on cpu: 1 prompt encoded in 12.3 s (loading 10.0 s); 1 from the cache"
    assert encode_summary({"cache_hits": 0, "encoded": 2, "worker": worker}) == \
        "umT5 on cpu: 2 prompts encoded in 12.3 s (loading 10.0 s)"


def test_sampler_node_text_says_what_auto_picked():
    from lingbot_world.memory.expert_plan import MemoryPlan
    from lingbot_world.nodes.sampler import plan_summary
    from lingbot_world.wan.sampling.sampler import SamplingSettings

    settings = SamplingSettings(steps=70, cfg_mode="sequential")
    assert plan_summary(MemoryPlan("resident", False, None, False, "..."), settings, None) == \
        "70 steps, unipc, sequential CFG; memory: resident"
    swap = MemoryPlan("swap", True, None, False, "...")
    assert plan_summary(swap, settings, "zoom ignored") == \
        "70 steps, unipc, sequential CFG; memory: swap, released expert kept in RAM\nzoom ignored"
    blocks = MemoryPlan("block_swap", False, 12, True, "...")
    assert plan_summary(blocks, SamplingSettings(steps=8, cfg_mode="batch"), None) == \
        "8 steps, unipc, batch CFG; memory: block_swap 12 blocks on the GPU"


def test_fast_sampler_node_text_says_what_it_generates_and_where_the_cache_lives():
    from lingbot_world.memory.fast_planner import plan_fast_memory
    from lingbot_world.nodes.adapters.fast_host import fast_summary
    from lingbot_world.wan.dit.kv_cache import cache_layout
    from lingbot_world.wan.dit.model import DiTConfig
    from lingbot_world.wan.sampling.fast_sampler import fast_frames

    GiB = 1024**3
    cfg, layout = DiTConfig(causal=True), cache_layout(21, 30 * 52)
    frames = fast_frames(85, chunk=V1_FAST.recipe.chunk_frames)
    host = plan_fast_memory(480, 832, cfg, layout, int(23.5 * GiB), 64 * GiB)
    assert host.film_blocks and host.film_host_blocks  # 64 GiB of RAM: the FiLM the card has no room for is there
    assert fast_summary(frames, 832, 480, host, [frames.note, None]).split("\n") == [
        "832x480, 81 frames (5.1 s at 16 fps): 7 chunks x 4 steps",
        f"memory: K/V cache (26.8 GB) in pinned RAM, {host.cache_layers_on_gpu}/40 layers on the GPU"
        + f", camera FiLM kept per chunk for {host.film_blocks}/40 blocks on the GPU and {host.film_host_blocks} in "
        "pinned RAM",
        "The Fast model works in chunks of 3 latent frames (12 video frames), so it generates 81 frames instead of "
        "the requested 85."]
    gpu = plan_fast_memory(480, 832, cfg, layout, 80 * GiB, 64 * GiB)
    assert fast_summary(fast_frames(81, chunk=V1_FAST.recipe.chunk_frames), 832, 480, gpu, []).endswith(
        "memory: K/V cache (26.8 GB) on the GPU, camera FiLM kept per chunk for 40/40 blocks on the GPU")
    cpu = plan_fast_memory(480, 832, cfg, layout, None, 36 * GiB)
    assert fast_summary(fast_frames(81, chunk=V1_FAST.recipe.chunk_frames), 832, 480, cpu, []).endswith(
        "memory: model and K/V cache (26.8 GB) in RAM (CPU run)")
    small = plan_fast_memory(480, 832, cfg, layout, int(11.5 * GiB), 64 * GiB)
    assert "blocks on the GPU)" in fast_summary(fast_frames(81, chunk=V1_FAST.recipe.chunk_frames), 832, 480, small, [])
