"""Where the camera FiLM cache lives (memory/camera_cache.py): decisions from made-up memory numbers."""
import pytest

from lingbot_world.memory.camera_cache import (CameraCacheError, film_block_bytes, plan_camera_cache,
                                                plan_host_bytes)
from lingbot_world.memory.film_stream import HostFilmStore
from lingbot_world.memory.estimates import RAM_RESERVE
from lingbot_world.memory.expert_plan import plan_memory
from lingbot_world.wan.dit.model import DiTConfig

GB = 10**9
CFG = DiTConfig()  # full size: 40 blocks of width 5120
V480 = (81, 464, 832)  # 31,668 tokens
PER = 2 * 31668 * 5120 * 2  # one block's (1 + scale, shift) in bf16


def plan(choice="auto", ram=128 * GB, vram=None, memory_plan=None, forwards=140, camera=True, **kw):
    return plan_camera_cache(choice, V480, CFG, camera=camera, forwards=forwards, ram_free=ram,
                             memory_plan=memory_plan, vram_free=vram, **kw)


def swap_plan(ram=128 * GB, vram=24 * GB, mode="swap", **kw):
    return plan_memory(V480, CFG, vram, ram, mode=mode, cfg_mode="sequential", **kw)


def test_block_bytes_at_480p_and_with_a_sequence_split():
    assert film_block_bytes(V480, CFG) == PER  # 0.65 GB: 26 GB for 40 blocks
    assert film_block_bytes(V480, CFG, seq_parallel=2) == PER // 2
    assert film_block_bytes(V480, CFG, compute_bytes=4) == 2 * PER


def test_auto_takes_host_ram_for_every_block_when_it_is_there_and_never_vram():
    p = plan(vram=80 * GB, memory_plan=swap_plan(vram=80 * GB))
    assert (p.place, p.blocks, p.nbytes) == ("host", 40, 40 * PER)
    assert "40 blocks' values in pinned host RAM (25.9 GB)" in p.reason and "instead of 140 times" in p.reason


def test_auto_fits_as_many_blocks_as_the_ram_left_holds():
    mp = swap_plan(ram=40 * GB, keep_in_ram=True)  # the released expert stays in pinned RAM
    assert plan_host_bytes(mp) == mp.estimates["expert_bytes"] > 9 * GB
    left = 40 * GB - RAM_RESERVE - plan_host_bytes(mp)
    p = plan(ram=40 * GB, vram=24 * GB, memory_plan=mp)
    assert p.place == "host" and p.blocks == left // PER and 0 < p.blocks < 40
    assert f"(of 40: the RAM left" in p.reason
    assert plan(ram=RAM_RESERVE + PER // 2, vram=24 * GB).place == "off"


def test_block_swap_streamed_blocks_count_as_host_ram():
    mp = swap_plan(vram=12 * GB, mode="auto", keep_in_ram=False)
    assert mp.mode == "block_swap" and mp.blocks_on_gpu < 40
    assert plan_host_bytes(mp) == (40 - mp.blocks_on_gpu) * mp.estimates["block_bytes"]


@pytest.mark.parametrize("kw, why", [
    (dict(camera=False), "no camera"), (dict(choice="off"), "off as requested"), (dict(forwards=2), "nothing to reuse")])
def test_off(kw, why):
    p = plan(**kw)
    assert p.place == "off" and p.blocks == 0 and why in p.reason and p.make("cpu") is None


def test_explicit_requests_that_do_not_fit_are_refused_with_the_numbers():
    with pytest.raises(CameraCacheError, match=r"--camera-cache host needs 25.9 GB of RAM .* auto"):
        plan("host", ram=20 * GB, vram=24 * GB)
    with pytest.raises(CameraCacheError, match=r"--camera-cache device needs 25.9 GB of VRAM .* host or auto"):
        plan("device", vram=24 * GB, memory_plan=swap_plan())
    with pytest.raises(CameraCacheError, match="choose one of auto, off, host, device"):
        plan("gpu")
    assert plan("device", vram=80 * GB, memory_plan=swap_plan(vram=80 * GB)).place == "device"


def test_a_cpu_run_keeps_the_values_in_place():
    p = plan(vram=None)
    assert p.place == "device" and "host RAM (CPU run)" in p.reason


def test_make_builds_the_stores():
    host = plan(vram=24 * GB).make("cpu")
    assert host.host_blocks == tuple(range(40)) and isinstance(host.stores["host"], HostFilmStore)
    dev = plan(vram=None).make("cpu")
    assert dev.device_blocks == tuple(range(40)) and "host" not in dev.stores
