"""The camera FiLM cache (issue 15): each block's (1 + scale, shift) computed once per model and camera, read later.

Every check is against the same model without a cache, bit for bit (torch.equal), on tiny float32 configs on the
CPU: single forwards, sequential / batched / layered CFG, token chunks, the device store and the host store (whose
copies are synchronous on a CPU), the expert switch, a new camera tensor, and whole sampling runs. The CUDA test
(tests/test_speed_cuda.py) repeats it with the host store's side-stream copies on an NF4 expert.
"""
import pytest
import torch

from lingbot_world.memory.film_stream import HostFilmStore
from lingbot_world.wan.dit import blocks as blocks_mod
from lingbot_world.wan.dit.blocks import WanBlock
from lingbot_world.wan.dit.film_cache import FilmCache
from lingbot_world.wan.dit.model import DiTConfig, WanDiT, pad_context
from lingbot_world.wan.sampling.sampler import ResidentExperts, SamplingSettings, make_noise, sample

F, H, W = 2, 4, 6
LAYERS = 3


@pytest.fixture(scope="module")
def setup():
    cfg = DiTConfig.tiny(num_layers=LAYERS)
    torch.manual_seed(3)
    model = WanDiT(cfg).eval()
    torch.manual_seed(4)
    other = WanDiT(cfg).eval()  # the second expert
    g = torch.Generator().manual_seed(5)
    pos = pad_context([torch.randn(5, cfg.text_dim, generator=g)], cfg.text_len)
    neg = pad_context([torch.randn(9, cfg.text_dim, generator=g)], cfg.text_len)
    x = torch.randn(1, 16, F, H, W, generator=g)
    y = torch.randn(1, 20, F, H, W, generator=g)
    cam = torch.randn(1, 384, F, H, W, generator=g)
    return cfg, model, other, pos, neg, x, y, cam


def _caches():
    return {
        "device": lambda: FilmCache.on_device(LAYERS),
        "host": lambda: FilmCache(host_blocks=range(LAYERS), host_store=HostFilmStore("cpu")),
        "mixed": lambda: FilmCache(device_blocks=[0], host_blocks=[2], host_store=HostFilmStore("cpu")),
    }


@pytest.mark.parametrize("kind", ["device", "host", "mixed"])
@pytest.mark.parametrize("chunk", [None, 5])  # 5 < 12 tokens: three chunks, the last one short
def test_cached_forwards_equal_uncached_bit_for_bit(setup, kind, chunk):
    cfg, model, _, pos, neg, x, y, cam = setup
    model.set_token_chunk(chunk)
    cache = _caches()[kind]()
    try:
        with torch.no_grad():
            refs = [model(x, torch.tensor([t]), c, y, camera=cam) for t, c in ((900, pos), (900, neg), (500, pos))]
            gots = [model(x, torch.tensor([t]), c, y, camera=cam, film=cache)
                    for t, c in ((900, pos), (900, neg), (500, pos))]
    finally:
        model.set_token_chunk(blocks_mod.DEFAULT_TOKEN_CHUNK)
        cache.close()
    for ref, got in zip(refs, gots):
        assert torch.equal(got, ref)
    n = len(cache.blocks)
    assert cache.stats["filled"] == n and cache.stats["read"] == 2 * n and cache.stats["restarts"] == 0


def test_values_are_computed_once_and_camera_tokens_skipped_once_complete(setup, monkeypatch):
    cfg, model, _, pos, neg, x, y, cam = setup
    film_calls, token_calls = [], []
    film, tokens = WanBlock.camera_film, WanDiT.camera_tokens
    monkeypatch.setattr(WanBlock, "camera_film", lambda self, *a: film_calls.append(1) or film(self, *a))
    monkeypatch.setattr(WanDiT, "camera_tokens", lambda self, *a: token_calls.append(1) or tokens(self, *a))
    cache = FilmCache.on_device(LAYERS)
    with torch.no_grad():
        for _ in range(4):
            model(x, torch.tensor([700]), pos, y, camera=cam, film=cache)
    assert len(film_calls) == LAYERS and len(token_calls) == 1
    # a partial cache: the uncached block computes its FiLM every time, from camera tokens made every time
    film_calls.clear(), token_calls.clear()
    partial = FilmCache(device_blocks=[0, 2])
    with torch.no_grad():
        for _ in range(3):
            model(x, torch.tensor([700]), pos, y, camera=cam, film=partial)
    assert len(film_calls) == 2 + 3 and len(token_calls) == 3


@pytest.mark.parametrize("mode", ["sequential", "batch", "layered"])
@pytest.mark.parametrize("kind", ["device", "host"])
def test_sampling_with_the_cache_equals_without(setup, mode, kind):
    """A run over both experts: each expert fills the cache at its first call (a restart at the switch)."""
    cfg, model, other, pos, neg, x, y, cam = setup
    settings = SamplingSettings(steps=4, boundary=0.9, cfg_mode=mode)
    noise = make_noise((1, 16, F, H, W), 11)
    with torch.no_grad():
        ref = sample(ResidentExperts(model, other), noise, pos, neg, y, cam, settings)
        cache = _caches()[kind]()
        try:
            got = sample(ResidentExperts(model, other), noise, pos, neg, y, cam, settings, camera_cache=cache)
        finally:
            cache.close()
    assert torch.equal(got, ref)
    assert cache.stats["restarts"] == 1  # high expert, then the low one
    assert cache.stats["filled"] == 2 * LAYERS


def test_a_new_camera_or_model_starts_over(setup):
    cfg, model, other, pos, neg, x, y, cam = setup
    cache = FilmCache.on_device(LAYERS)
    cam2 = cam.clone().mul_(1.5)
    with torch.no_grad():
        model(x, torch.tensor([900]), pos, y, camera=cam, film=cache)
        got = model(x, torch.tensor([900]), pos, y, camera=cam2, film=cache)
        assert torch.equal(got, model(x, torch.tensor([900]), pos, y, camera=cam2))
        got = other(x, torch.tensor([900]), pos, y, camera=cam2, film=cache)
        assert torch.equal(got, other(x, torch.tensor([900]), pos, y, camera=cam2))
    assert cache.stats["restarts"] == 2


def test_an_interrupted_fill_keeps_only_whole_blocks(setup, monkeypatch):
    """A forward stopped inside block 1 (cancel, error): block 0 is stored, block 1 computes again next time."""
    cfg, model, _, pos, neg, x, y, cam = setup
    cache = FilmCache.on_device(LAYERS)

    def stop(i):
        if i == 1:
            raise KeyboardInterrupt

    model.after_block = stop
    try:
        with torch.no_grad(), pytest.raises(KeyboardInterrupt):
            model(x, torch.tensor([900]), pos, y, camera=cam, film=cache)
    finally:
        model.after_block = None
    assert cache.valid == {0, 1}  # block 1 finished its FiLM before the stop after it
    with torch.no_grad():
        assert torch.equal(model(x, torch.tensor([900]), pos, y, camera=cam, film=cache),
                           model(x, torch.tensor([900]), pos, y, camera=cam))
    assert cache.valid == set(range(LAYERS))


def test_host_store_moves_one_block_at_a_time_and_frees_everything(setup):
    cfg, model, _, pos, neg, x, y, cam = setup
    store = HostFilmStore("cpu")
    cache = FilmCache(host_blocks=range(LAYERS), host_store=store)
    with torch.no_grad():
        for _ in range(3):
            model(x, torch.tensor([900]), pos, y, camera=cam, film=cache)
    per_block = 2 * HostFilmStore.block_bytes((1, F * H * W // 4, cfg.dim), torch.float32)
    assert store.host_bytes == LAYERS * per_block
    assert store.uploads == 2 * LAYERS and store.uploaded_bytes == 2 * LAYERS * per_block
    assert store.written_bytes == LAYERS * per_block
    assert store.staging is not None and store.staging.numel() == per_block  # one block on the device
    cache.close()
    assert store.host_bytes == 0 and store.staging is None


def test_cache_without_camera_is_ignored_and_bad_places_refused(setup):
    cfg, model, _, pos, neg, x, y, cam = setup
    cache = FilmCache.on_device(LAYERS)
    with torch.no_grad():
        assert torch.equal(model(x, torch.tensor([900]), pos, y, film=cache), model(x, torch.tensor([900]), pos, y))
    assert cache.stats["forwards"] == 0
    with pytest.raises(ValueError, match="both a device and a host"):
        FilmCache(device_blocks=[0, 1], host_blocks=[1], host_store=HostFilmStore("cpu"))
    with pytest.raises(ValueError, match="host_store"):
        FilmCache(host_blocks=[1])
    with pytest.raises(ValueError, match="custom velocity"):
        sample(ResidentExperts(model, model), make_noise((1, 16, F, H, W), 1), pos, neg, y, cam,
               SamplingSettings(steps=1), velocity=lambda *a: a[1], camera_cache=cache)


# ---- an NF4 expert in bf16 (the real formats): CPU here, CUDA (side-stream copies, pinned memory) on a GPU ----------
@pytest.mark.parametrize("device", [
    "cpu", pytest.param("cuda", marks=[pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(),
                                                                             reason="needs a CUDA GPU")])])
@pytest.mark.parametrize("mode", ["sequential", "layered"])
def test_nf4_bf16_sampling_with_host_cache_equals_without(tmp_path, device, mode):
    from lingbot_world.loaders.expert_loader import load_expert
    from lingbot_world.loaders.nf4_writer import random_expert_state, write_official_expert

    cfg = DiTConfig.tiny(dim=128, ffn_dim=256, num_heads=2, num_layers=3)
    experts = []
    for seed in (4, 5):
        path = tmp_path / str(seed)
        write_official_expert(random_expert_state(cfg, "cpu", seed=seed, dtype=torch.bfloat16), cfg, path,
                              dtype=torch.bfloat16)
        experts.append(load_expert(path, device=device, mode="nf4", compute_dtype=torch.bfloat16))
    for m in experts:
        m.set_token_chunk(5)
    g = torch.Generator().manual_seed(2)
    pos, neg = (pad_context([torch.randn(n, cfg.text_dim, generator=g)], cfg.text_len).to(device) for n in (4, 8))
    y = torch.randn(1, 20, F, H, W, generator=g).to(device)
    cam = torch.randn(1, 384, F, H, W, generator=g).to(device)
    noise = make_noise((1, 16, F, H, W), 9)
    settings = SamplingSettings(steps=5, boundary=0.9, cfg_mode=mode)
    store = HostFilmStore(device)
    cache = FilmCache(host_blocks=range(3), host_store=store)
    with torch.inference_mode():
        ref = sample(ResidentExperts(*experts), noise, pos, neg, y, cam, settings, device=device)
        try:
            got = sample(ResidentExperts(*experts), noise, pos, neg, y, cam, settings, device=device,
                         camera_cache=cache)
        finally:
            uploads = store.uploads
            cache.close()
    assert torch.isfinite(got).all() and torch.equal(got, ref)
    forwards = 5 * (1 if mode == "layered" else 2)
    assert uploads == 3 * (forwards - 2)  # every block of every forward but each expert's first
    assert store.host_bytes == 0


def test_the_staging_buffer_is_dropped_when_the_cache_starts_over(setup):
    """The expert switch: the next expert's filling forward holds the camera tokens, not also a block's values."""
    cfg, model, other, pos, neg, x, y, cam = setup
    store = HostFilmStore("cpu")
    cache = FilmCache(host_blocks=range(LAYERS), host_store=store)
    with torch.no_grad():
        model(x, torch.tensor([900]), pos, y, camera=cam, film=cache)
        model(x, torch.tensor([900]), neg, y, camera=cam, film=cache)
        assert store.staging is not None
        buffers = dict(store.host)
        cache.begin(other, cam, (1, F * H * W // 4, cfg.dim), torch.float32, torch.device("cpu"))
        assert store.staging is None and store.host == buffers  # host buffers kept for the same sizes
    cache.close()


def test_the_writes_in_flight_are_bounded_by_waiting_for_the_oldest():
    """A host far ahead of the GPU waits for the oldest FiLM write before queueing one more than the limit, so the
    memory the allocator holds back for the copies stays at `limit` blocks' values."""
    from lingbot_world.memory.film_stream import WRITES_IN_FLIGHT, InFlight

    waited = []

    class Copy:  # a recorded event: synchronize() is the host waiting for its copy
        def __init__(self, n):
            self.n = n

        def synchronize(self):
            waited.append(self.n)

    writes = InFlight(WRITES_IN_FLIGHT)
    for n in range(WRITES_IN_FLIGHT):
        writes.make_room()
        writes.add(Copy(n))
    assert waited == []  # room for `limit` copies without waiting
    for n in range(WRITES_IN_FLIGHT, WRITES_IN_FLIGHT + 2):
        writes.make_room()
        writes.add(Copy(n))
    assert waited == [0, 1] and len(writes.events) == WRITES_IN_FLIGHT  # the oldest, in order
    writes.clear()  # after a whole-store sync every copy is done
    writes.make_room()
    assert waited == [0, 1] and not writes.events
