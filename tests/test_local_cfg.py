"""CFG over two devices of one process (parallel/local_cfg.py, ComfyUI's cfg_parallel): tested with two CPU
"devices" (separate expert copies, the unconditional pass in the worker thread) against one device's sequential
CFG, plus failures on the second device and the cleanup."""
from __future__ import annotations

import copy
import threading

import pytest
import torch

from lingbot_world.parallel.local_cfg import TwoDeviceCFG
from lingbot_world.wan.dit.model import DiTConfig, WanDiT, pad_context
from lingbot_world.wan.sampling.sampler import ResidentExperts, SamplingSettings, sample

CFG = DiTConfig.tiny(num_layers=2, text_dim=16, text_len=8)


@pytest.fixture(scope="module")
def experts():
    def make(seed):
        torch.manual_seed(seed)
        return WanDiT(CFG).eval().requires_grad_(False)

    return make(1), make(2)


def _inputs():
    g = torch.Generator().manual_seed(0)
    return dict(noise=torch.randn(1, 16, 3, 4, 6, generator=g), y=torch.randn(1, 20, 3, 4, 6, generator=g),
                camera=torch.randn(1, 384, 3, 4, 6, generator=g),
                context=pad_context([torch.randn(5, 16, generator=g)], 8),
                negative_context=pad_context([torch.randn(7, 16, generator=g)], 8))


class Copies(ResidentExperts):
    """The second device's provider: its own copies of the experts; records where the calls ran."""

    def __init__(self, high, low):
        super().__init__(copy.deepcopy(high), copy.deepcopy(low))
        self.threads: set[str] = set()
        self.closed = False
        for m in self.models.values():
            m.register_forward_pre_hook(lambda *_: self.threads.add(threading.current_thread().name))

    def close(self):
        self.closed = True
        self.models.clear()


def _settings(**kw):
    return SamplingSettings(**{**dict(steps=4, boundary=0.9, guide_high=5.0, guide_low=3.0, cfg_mode="sequential"),
                               **kw})


def test_two_devices_give_the_one_device_result_bit_for_bit(experts):
    ref = sample(ResidentExperts(*experts), settings=_settings(), **_inputs())
    second = Copies(*experts)
    pair = TwoDeviceCFG(ResidentExperts(*experts), second, "cpu")
    try:
        with torch.inference_mode():  # ComfyUI runs nodes in inference mode; the worker follows the caller's mode
            got = sample(pair, settings=_settings(), velocity=pair.velocity, **_inputs())
    finally:
        pair.close()
    torch.testing.assert_close(got, ref, rtol=0, atol=0)
    assert second.threads and all(t.startswith("lingbot-cfg-device") for t in second.threads)
    assert second.events == [("acquire", "high"), ("release", "high"), ("acquire", "low"), ("release", "low")]
    assert second.closed and pair.pool._shutdown
    pair.close()  # idempotent


def test_guide_one_never_uses_the_second_device(experts):
    second = Copies(*experts)
    pair = TwoDeviceCFG(ResidentExperts(*experts), second, "cpu")
    try:
        sample(pair, settings=_settings(guide_high=1.0, guide_low=1.0), velocity=pair.velocity, **_inputs())
    finally:
        pair.close()
    assert not second.threads


def test_a_failure_on_the_second_device_is_one_clear_error_and_nothing_keeps_running(experts):
    second = Copies(*experts)

    def broken(*a, **k):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 9.00 GiB")

    for m in second.models.values():
        m.forward = broken
    pair = TwoDeviceCFG(ResidentExperts(*experts), second, "cpu")
    with pytest.raises(RuntimeError, match="the unconditional pass on cpu failed: CUDA out of memory"):
        sample(pair, settings=_settings(), velocity=pair.velocity, **_inputs())
    pair.close()
    assert second.closed and pair.pool._shutdown

    class NoRoom(Copies):
        def acquire(self, name):
            raise torch.cuda.OutOfMemoryError("CUDA out of memory")

    pair = TwoDeviceCFG(ResidentExperts(*experts), NoRoom(*experts), "cpu")
    with pytest.raises(RuntimeError, match="second device cpu could not place the high-noise expert"):
        sample(pair, settings=_settings(), velocity=pair.velocity, **_inputs())
    pair.close()


def test_second_device_choices(monkeypatch):
    from lingbot_world.nodes.adapters.cfg_parallel import second_device

    assert second_device("off", "cpu") is None
    with pytest.raises(ValueError, match="needs two CUDA GPUs visible to ComfyUI"):
        second_device("auto", "cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda i: ({1: 5, 2: 9}[i], 10))
    assert second_device("auto", "cuda:0") == torch.device("cuda", 2)  # the other GPU with the most free memory
    assert second_device("cuda:1", "cuda:0") == torch.device("cuda", 1)
    with pytest.raises(ValueError, match="is ComfyUI's own device"):
        second_device("cuda:0", "cuda:0")
    with pytest.raises(ValueError, match="sees 3 GPUs"):
        second_device("cuda:5", "cuda:0")
    with pytest.raises(ValueError, match="must be one of"):
        second_device("cuda:9", "cuda:0")
