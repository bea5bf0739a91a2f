"""The Fast chunk loop under the speed presets on a CUDA GPU (issue 26): the `auto` preset (compiled per-token
work) within 1e-3 of eager per forward and over whole chunks, `fast` (FP8) bounded, the draft levers running.
Skipped without a GPU."""
from __future__ import annotations

import pytest
import torch
from lingbot_world.world.models import V1_FAST

V1_RUN = {"schedule": V1_FAST.recipe.schedule(), "chunk_frames": V1_FAST.recipe.chunk_frames}

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

CUDA = torch.device("cuda")
LAT_H, LAT_W = 8, 12  # 4 x 6 = 24 tokens per latent frame, 72 per chunk


@pytest.fixture(autouse=True)
def _restore_attention():
    yield
    from lingbot_world.wan.dit import attention as attn

    attn.set_backend("sdpa", CUDA)


def rel_err(a, b) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def _causal_nf4_model(seed=0):
    from lingbot_world.quant.nf4 import NF4Linear, replace_linears_with_nf4
    from lingbot_world.wan.dit.model import DiTConfig, WanDiT

    cfg = DiTConfig.tiny(dim=256, ffn_dim=512, num_heads=2, text_dim=64, text_len=16, num_layers=3, causal=True)
    torch.manual_seed(seed)
    ref = WanDiT(cfg)
    model = WanDiT(cfg, device="meta")
    replace_linears_with_nf4(model, cfg.num_layers, torch.bfloat16)
    plain = {}
    for key, value in ref.state_dict().items():
        mod = model.get_submodule(key.rpartition(".")[0])
        if isinstance(mod, NF4Linear) and key.endswith(".weight"):
            mod.load_float_weight(value.to(CUDA))
        else:
            plain[key] = value.to(CUDA, torch.bfloat16)
    model.load_state_dict(plain, strict=False, assign=True)
    model.compute_dtype = torch.bfloat16
    return cfg, model.eval().requires_grad_(False)


def _chunks(model, cfg, plan, latent_frames=6, film=None):
    """Every chunk's x0 and the first call's output of a FastRun under `plan` (same seed and inputs each time)."""
    from lingbot_world.speed.options import apply_speed
    from lingbot_world.wan.dit.kv_cache import cache_layout
    from lingbot_world.wan.sampling.fast_sampler import FastRun, draw, make_generator

    apply_speed(model, plan)
    g = torch.Generator(device=CUDA).manual_seed(3)
    y = torch.randn(1, 20, latent_frames, LAT_H, LAT_W, generator=g, device=CUDA)
    cam = torch.randn(1, 384, latent_frames, LAT_H, LAT_W, generator=g, device=CUDA).bfloat16()
    ctx = torch.randn(1, cfg.text_len, cfg.text_dim, generator=g, device=CUDA).bfloat16()
    window = plan.fast_window(None, latent_frames)
    layout = cache_layout(latent_frames, (LAT_H // 2) * (LAT_W // 2), window_frames=window,
                          sink_frames=1 if window else 0)
    cache = layout.make(cfg.num_layers, cfg.num_heads, cfg.head_dim, dtype=torch.bfloat16, device=CUDA)
    gen = make_generator(11, "cuda")
    noise = draw(gen, (1, 16, latent_frames, LAT_H, LAT_W), CUDA)
    first = []
    hook = model.register_forward_hook(lambda m, a, out: first.append(out.float()) if not first else None)
    try:
        with torch.inference_mode():
            options = {**V1_RUN, **plan.fast_run_options(V1_FAST.recipe)}  # a preset's levers over the schedule
            latent = FastRun(model, noise, ctx, y, cam, cache, gen, film=film, **options).run()
    finally:
        hook.remove()
    return first[0], latent


def _rolling_window_run(model, cfg, seed: int, **run_options):
    """The latents of an 18-frame FastRun (6 chunks) over a 6-frame window with a 1-frame sink, so the window rolls
    from chunk 2 on; inputs from `seed`, noise from seed 11."""
    from lingbot_world.wan.dit.kv_cache import cache_layout
    from lingbot_world.wan.sampling.fast_sampler import FastRun, draw, make_generator

    frames = 18
    g = torch.Generator(device=CUDA).manual_seed(seed)
    y = torch.randn(1, 20, frames, LAT_H, LAT_W, generator=g, device=CUDA)
    cam = torch.randn(1, 384, frames, LAT_H, LAT_W, generator=g, device=CUDA).bfloat16()
    ctx = torch.randn(1, cfg.text_len, cfg.text_dim, generator=g, device=CUDA).bfloat16()
    layout = cache_layout(frames, (LAT_H // 2) * (LAT_W // 2), window_frames=6, sink_frames=1)
    cache = layout.make(cfg.num_layers, cfg.num_heads, cfg.head_dim, dtype=torch.bfloat16, device=CUDA)
    gen = make_generator(11, "cuda")
    noise = draw(gen, (1, 16, frames, LAT_H, LAT_W), CUDA)
    with torch.inference_mode():
        return FastRun(model, noise, ctx, y, cam, cache, gen, **{**V1_RUN, **run_options}).run()


def test_auto_preset_compiled_chunks_match_eager():
    from lingbot_world.speed import compile as compile_mod
    from lingbot_world.speed.presets import resolve_preset

    if compile_mod.unavailable_reason(CUDA):
        pytest.skip(compile_mod.unavailable_reason(CUDA))
    cfg, model = _causal_nf4_model()
    exact = resolve_preset("exact", CUDA)
    first_eager, eager = _chunks(model, cfg, exact)
    auto = resolve_preset("auto", CUDA, explicit={"compile": "blocks"})
    assert auto.compile == "blocks" and auto.compute == "bf16"
    first_compiled, compiled = _chunks(model, cfg, auto)
    assert rel_err(first_compiled, first_eager) < 1e-3  # per forward
    for c in range(0, eager.shape[2], 3):  # per chunk, through the cache
        assert rel_err(compiled[:, :, c:c + 3], eager[:, :, c:c + 3]) < 1e-3
    again = _chunks(model, cfg, exact)[1]
    assert torch.equal(again, eager)  # eager is deterministic: the differences above are compile's rounding
    assert not compile_mod.STATS.fallbacks


def test_fast_and_draft_presets_run_and_stay_bounded():
    from lingbot_world.speed.presets import resolve_preset

    cfg, model = _causal_nf4_model(1)
    _, exact = _chunks(model, cfg, resolve_preset("exact", CUDA))
    fast = resolve_preset("fast", CUDA, explicit={"compile": "off"})
    for m in model.modules():
        if hasattr(m, "lowp_min_rows"):
            m.lowp_min_rows = 64  # the tiny chunk's 72 tokens take the low-precision path
    _, lowp = _chunks(model, cfg, fast)
    assert torch.isfinite(lowp).all()
    if fast.compute != "bf16":
        assert 1e-4 < rel_err(lowp, exact) < 0.3
    draft = resolve_preset("draft", CUDA, explicit={"compile": "off"})
    _, drafted = _chunks(model, cfg, draft, latent_frames=9)
    assert torch.isfinite(drafted).all() and drafted.shape[2] == 9


def test_side_stream_decode_gives_the_same_frames_beside_other_work():
    from lingbot_world.speed.decode import ChunkDecoder
    from lingbot_world.wan.vae.model import VAEConfig, WanVAE
    from lingbot_world.wan.vae.streaming import StreamingDecoder

    torch.manual_seed(0)
    with torch.device(CUDA):
        vae = WanVAE(VAEConfig.tiny()).eval().requires_grad_(False)
    z = torch.randn(1, 16, 9, 16, 24, device=CUDA)
    ref = StreamingDecoder(vae)
    want = [ref.decode(z[:, :, c:c + 3]) for c in (0, 3, 6)]
    dec = ChunkDecoder(StreamingDecoder(vae).decode, CUDA, overlap=True)
    assert dec.overlapped
    a = torch.randn(4096, 4096, device=CUDA)
    pending = []
    for c in (0, 3, 6):
        x0 = z[:, :, c:c + 3] * 1.0  # written by the main stream just before the submit
        pending.append(dec.submit(x0))
        for _ in range(20):  # the "next chunk's DiT" on the main stream meanwhile
            a = torch.tanh(a @ a * 1e-3)
    for p, w in zip(pending, want):
        assert torch.equal(p.result(), w)


@pytest.mark.parametrize("preset", ["auto", "fast"])
def test_cuda_graphs_replay_a_rolling_window_bit_for_bit(preset, monkeypatch):
    """Once the window rolls, every block replays a captured CUDA graph (speed/block_graphs.py): the latents equal
    the same run's with every kernel launched eagerly, bit for bit (NF4 dequantization, compiled per-token work,
    the GPU's SDPA kernel and, for `fast`, the FP8 quantizers and GEMMs inside the graphs)."""
    from lingbot_world.speed import compile as compile_mod
    from lingbot_world.speed.options import GRAPHS_ENV, apply_speed
    from lingbot_world.speed.presets import resolve_preset

    if compile_mod.unavailable_reason(CUDA):
        pytest.skip(compile_mod.unavailable_reason(CUDA))
    cfg, model = _causal_nf4_model(2)
    for m in model.modules():
        if hasattr(m, "lowp_min_rows"):
            m.lowp_min_rows = 64  # the tiny chunk's 72 tokens take the low-precision path under `fast`
    plan = resolve_preset(preset, CUDA, explicit={"compile": "blocks"})

    def run():
        apply_speed(model, plan)
        return _rolling_window_run(model, cfg, 5, **plan.fast_run_options(V1_FAST.recipe)), model.block_runner

    monkeypatch.setenv(GRAPHS_ENV, "0")  # unset, a model this narrow would replay graphs by default
    eager, none = run()
    assert none is None
    monkeypatch.setenv(GRAPHS_ENV, "1")
    graphed, runner = run()
    assert runner is not None and runner.disabled is None, runner and runner.disabled
    # 6 chunks of 5 calls; chunks 2..5 roll the window: one warm-up call, one capture, 18 replayed forwards
    assert runner.captures == cfg.num_layers and runner.graphed_forwards == 19
    assert torch.equal(graphed, eager), f"max |diff| {(graphed - eager).abs().max().item():.3g}"


@pytest.mark.parametrize("preset", ["exact", "fast"])
def test_kept_gemm_weights_give_the_same_bits_eagerly_and_in_graphs(preset, monkeypatch):
    """The memory plan's resident GEMM weights (memory/resident_weights.py: bf16, or FP8 rows from the NF4 row
    kernel under `fast`): a rolled-window run with them equals the run that prepares them per call, eagerly and
    replaying CUDA graphs; kept again at other addresses mid-video, the graphs re-capture and still match."""
    from types import SimpleNamespace

    from lingbot_world.memory.resident_weights import apply_resident_weights, kept_bytes
    from lingbot_world.speed.options import GRAPHS_ENV, apply_speed
    from lingbot_world.speed.presets import resolve_preset

    cfg, model = _causal_nf4_model(7)
    for m in model.modules():
        if hasattr(m, "lowp_min_rows"):
            m.lowp_min_rows = 64  # the tiny chunk's 72 tokens take the low-precision path under `fast`
    plan = resolve_preset(preset, CUDA, explicit={"compile": "off"})
    keep, drop = SimpleNamespace(resident_weights=True), SimpleNamespace(resident_weights=False)

    def run(graphs: bool, plan_kept):
        monkeypatch.setenv(GRAPHS_ENV, "1" if graphs else "0")
        apply_speed(model, plan)  # drops kept weights (set_compute): the plan's decision makes them again
        apply_resident_weights(model, plan_kept)
        return _rolling_window_run(model, cfg, 8, **plan.fast_run_options(V1_FAST.recipe))

    want = run(False, drop)
    assert torch.equal(run(False, keep), want) and kept_bytes(model) > 0
    assert torch.equal(run(True, keep), want)
    runner = model.block_runner
    assert runner.disabled is None and runner.captures == cfg.num_layers
    held = kept_bytes(model)
    lin = model.blocks[1].ffn[0]
    old = lin.kept_tensors()  # still allocated: the weight made again lands elsewhere
    lin.drop_kept_weight()
    apply_resident_weights(model, keep)
    assert kept_bytes(model) == held and lin.kept_tensors()[0].data_ptr() != old[0].data_ptr()
    again = _rolling_window_run(model, cfg, 8, **plan.fast_run_options(V1_FAST.recipe))
    del old
    assert torch.equal(again, want) and runner.captures > cfg.num_layers  # block 1 captured again


def test_compile_graphs_builds_at_load_and_compiles_only_the_rolled_forwards(monkeypatch):
    """compile="graphs" (a narrow model's `auto`): the compiled phases are built when the plan is applied (no
    compile later, at the first rolled chunk); the chunks before the window rolls are the eager run's bit for bit,
    the rolled ones replay graphs of the compiled phases, within 1e-3 of eager."""
    from lingbot_world.speed import compile as compile_mod
    from lingbot_world.speed.options import GRAPHS_ENV, SpeedPlan, apply_speed

    if compile_mod.unavailable_reason(CUDA):
        pytest.skip(compile_mod.unavailable_reason(CUDA))
    cfg, model = _causal_nf4_model(3)
    monkeypatch.setenv(GRAPHS_ENV, "1")

    def run(compile_choice):
        apply_speed(model, SpeedPlan(compile_choice, "bf16", "sdpa", "cuda", strict_compile=True))
        compiled_before = compile_mod.STATS.compiling_calls
        latent = _rolling_window_run(model, cfg, 6)
        return latent, model.block_runner, compile_mod.STATS.compiling_calls - compiled_before

    eager, _, _ = run("off")
    graphed, runner, compiled_while_sampling = run("graphs")
    assert runner.ops is not None and runner.disabled is None and runner.captures == cfg.num_layers
    assert compiled_while_sampling == 0  # every phase was built by BlockGraphs.build at load
    rolled_from = 6  # latent frames: chunks 0 and 1 fill the 6-frame window, chunk 2 rolls it
    assert torch.equal(graphed[:, :, :rolled_from], eager[:, :, :rolled_from])
    assert rel_err(graphed, eager) < 1e-3


@pytest.mark.parametrize("compile_choice", ["off", "graphs"])
def test_cuda_graphs_keep_the_camera_film_per_chunk(compile_choice, monkeypatch):
    """Graphs over a camera FiLM kept on the device: each block has a graph that computes and keeps its FiLM (a
    chunk's first call) and one that reads it (the later calls); the latents equal the graphed run that computes
    the FiLM at every call, bit for bit, eager or with the compiled phases in the graphs."""
    from lingbot_world.speed import compile as compile_mod
    from lingbot_world.speed.options import GRAPHS_ENV, SpeedPlan, apply_speed
    from lingbot_world.wan.dit.film_cache import DeviceFilmStore, FilmCache

    if compile_choice == "graphs" and compile_mod.unavailable_reason(CUDA):
        pytest.skip(compile_mod.unavailable_reason(CUDA))
    cfg, model = _causal_nf4_model(3)
    monkeypatch.setenv(GRAPHS_ENV, "1")

    def run(film):
        apply_speed(model, SpeedPlan(compile_choice, "bf16", "sdpa", "cuda", strict_compile=True))
        return _rolling_window_run(model, cfg, 6, **({} if film is None else {"film": film})), model.block_runner

    computed, plain = run(None)
    film = FilmCache(device_blocks=range(cfg.num_layers - 1), device_store=DeviceFilmStore())
    kept, runner = run(film)
    assert plain.disabled is None and runner.disabled is None, (plain.disabled, runner.disabled)
    variants = [len(runner.graphs[i]) for i in range(cfg.num_layers)]
    # the kept blocks: a graph that keeps the FiLM and one that reads it; the last block computes its own (one graph
    # per residual address its input has: block 0's two graphs may leave the residual at two addresses)
    assert plain.captures == cfg.num_layers and variants[:-1] == [2] * (cfg.num_layers - 1), (variants, runner.stats())
    assert variants[-1] in (1, 2) and runner.captures == sum(variants), (variants, runner.stats())
    assert film.stats["read"] > 0 and runner.replays > 0
    assert torch.equal(kept, computed), f"max |diff| {(kept - computed).abs().max().item():.3g}"
    film.close()


@pytest.mark.parametrize("where", ["device", "host"])
@pytest.mark.parametrize("preset", ["exact", "auto", "fast", "draft"])
def test_camera_film_kept_per_chunk_gives_the_same_bits_on_the_gpu(preset, where):
    """The camera FiLM a chunk's first call keeps for its other calls (the memory plan's film_blocks, and with
    "host" its film_host_blocks: written to pinned RAM on a side stream, streamed back ahead of the blocks): the
    latents equal the run that computes it at every call, bit for bit, under every preset (eager, compiled
    per-token work, FP8 GEMMs, the draft levers)."""
    from lingbot_world.memory.film_stream import HostFilmStore
    from lingbot_world.speed import compile as compile_mod
    from lingbot_world.speed.presets import resolve_preset
    from lingbot_world.wan.dit.film_cache import FilmCache

    explicit = {} if preset == "exact" else {"compile": "off" if compile_mod.unavailable_reason(CUDA) else "blocks"}
    cfg, model = _causal_nf4_model(3)
    for m in model.modules():
        if hasattr(m, "lowp_min_rows"):
            m.lowp_min_rows = 64  # the tiny chunk's 72 tokens take the low-precision path under fast / draft
    plan = resolve_preset(preset, CUDA, explicit=explicit)
    _, computed = _chunks(model, cfg, plan, latent_frames=9)
    if where == "device":
        film = FilmCache(device_blocks=range(cfg.num_layers - 1))  # one block computes its own, as on a full card
    else:  # every block's from pinned RAM, through the Fast plan's two device buffers in turn
        store = HostFilmStore(CUDA, slots=2)
        film = FilmCache(host_blocks=range(cfg.num_layers), host_store=store, own_host_store=False)
    _, kept = _chunks(model, cfg, plan, latent_frames=9, film=film)
    calls = 3 if preset == "draft" else 5
    assert film.stats["read"] == len(film.blocks) * 3 * (calls - 1)
    assert torch.equal(kept, computed), f"max |diff| {(kept - computed).abs().max().item():.3g}"
    if where == "host":
        assert store.written_bytes == 3 * store.host_bytes and all(b.pinned for b in store.host.values())
        film.close()
        store.close()


@pytest.mark.parametrize("preset", ["exact", "draft"])
def test_a_chunk_queues_its_work_without_a_host_sync(preset):
    """Inside a chunk the host never waits for the GPU (torch's sync debug mode raises on a synchronizing call):
    the timesteps are filled on the device, the host noise, control and RoPE columns go through pinned memory.
    Every sync drained the GPU's queue and left it idle while the host prepared the next kernels."""
    from lingbot_world.speed.options import apply_speed
    from lingbot_world.speed.presets import resolve_preset
    from lingbot_world.wan.dit.film_cache import FilmCache
    from lingbot_world.wan.dit.kv_cache import cache_layout
    from lingbot_world.wan.sampling.fast_sampler import FastRun, make_generator

    cfg, model = _causal_nf4_model(4)
    plan = resolve_preset(preset, CUDA, explicit={"compile": "off"})
    apply_speed(model, plan)
    frames = 12
    g = torch.Generator().manual_seed(5)
    y = torch.randn(1, 20, frames, LAT_H, LAT_W, generator=g)  # host tensors, as a session's condition track
    cam = torch.randn(1, 384, frames, LAT_H, LAT_W, generator=g).bfloat16()
    ctx = torch.randn(1, cfg.text_len, cfg.text_dim, generator=g).bfloat16().to(CUDA)
    window = plan.fast_window(None, frames)
    layout = cache_layout(frames, (LAT_H // 2) * (LAT_W // 2), window_frames=window, sink_frames=1 if window else 0)
    cache = layout.make(cfg.num_layers, cfg.num_heads, cfg.head_dim, dtype=torch.bfloat16, device=CUDA)
    run = FastRun(model, None, ctx, y, cam, cache, make_generator(11, "cpu"), device=CUDA,
                  film=FilmCache(device_blocks=range(cfg.num_layers)),
                  **{**V1_RUN, **plan.fast_run_options(V1_FAST.recipe)})
    with torch.inference_mode():
        run.next_chunk()  # first use: cuDNN plans, pinned buffers, the text K/V
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            for _ in range(run.chunks - 1):
                run.next_chunk()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    assert run.done and torch.isfinite(run.latent()).all()
