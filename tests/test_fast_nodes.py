"""LingBot Fast Model Loader + LingBot Fast Sampler on the tiny demo, with the stand-ins for ComfyUI's modules of
test_nodes_pipeline.py (model management, progress bar, previewer, interrupt flag): the graph equals the library
run, previews every chunk, loads through model management, frees the cache on cancel, refuses wrong models."""
from __future__ import annotations

import sys

import pytest
import torch

from lingbot_world.loaders.expert_loader import load_expert
from lingbot_world.wan.control.camera import camera_condition
from lingbot_world.wan.dit.kv_cache import cache_layout
from lingbot_world.wan.dit.model import pad_context
from lingbot_world.wan.sampling.fast_sampler import FastRun, draw, make_generator
from lingbot_world.world.models import V1_FAST

from tests.conftest import load_sibling

H, W, FRAMES = 32, 48, 33  # 9 latent frames: 3 chunks


P = load_sibling("test_nodes_pipeline")
demo_base = P.demo_base
comfy = P.comfy
Interrupted = P.Interrupted


@pytest.fixture
def graph(comfy):
    from lingbot_world.nodes import NODE_CLASS_MAPPINGS as N

    text = N["LingBotTextEncode"]().encode("lingbot-demo/models_t5_umt5-xxl-enc-bf16.pth", "auto",
                                           "a lake with a lone tree", "", "auto", True)[0]
    cam = N["LingBotCameraPreset"]().make("dolly_in", "pan_right", 1.0, FRAMES)[0]
    vae = N["LingBotVAELoader"]().load("lingbot-demo/Wan2.1_VAE.pth")[0]
    image = torch.rand(1, 72, 128, 3, generator=torch.Generator().manual_seed(3))
    i2v = N["LingBotImageToVideo"]().encode(vae, image, "custom", W, H, FRAMES, False, cam)[0]
    return text, cam, vae, i2v


def fast_loader(kv_cache="auto", name="lingbot-demo/lingbot_world_fast_bnb_nf4", weights="nf4"):
    from lingbot_world.nodes import NODE_CLASS_MAPPINGS as N

    return N["LingBotFastLoader"]().load(name, weights, kv_cache)[0]


def run_fast(model, g, **kw):
    from lingbot_world.nodes import NODE_CLASS_MAPPINGS as N

    text, cam, vae, i2v = g
    args = dict(seed=5, noise_source="cpu", max_attention=0, window=0, sink=0, camera=cam)
    args.update(kw)
    return N["LingBotFastSampler"]().sample(model, text, i2v, **args)[0]["samples"]


def assert_equals_direct_run(latent, fm, graph, weights="nf4"):
    """The sampler node's latent equals FastRun on the same model file, noise, text, I2V and camera, bit for bit."""
    text, cam, vae, i2v = graph
    model = load_expert(fm.format.path, "cpu", weights)
    plucker = camera_condition(cam.poses, cam.intrinsics, H, W, FRAMES, latent_frames=9).plucker
    g = make_generator(5, "cpu")
    noise = draw(g, (1, 16, 9, H // 8, W // 8))
    cache = cache_layout(9, (H // 16) * (W // 16)).make(2, model.cfg.num_heads, model.cfg.head_dim, dtype=torch.float32)
    z = FastRun(model, noise, pad_context([text.positive], 512), i2v.y, plucker, cache, g,
                schedule=V1_FAST.recipe.schedule(), chunk_frames=V1_FAST.recipe.chunk_frames).run()
    torch.testing.assert_close(latent, i2v.to_raw_latent(z), rtol=0, atol=0)


def test_fast_graph_equals_the_library_run(comfy, graph):
    text, cam, vae, i2v = graph
    fm = fast_loader()
    latent = run_fast(fm, graph)
    assert latent.shape == (1, 16, 9, H // 8, W // 8)

    assert_equals_direct_run(latent, fm, graph)

    # the cache streamed from host memory (kv_cache "host"; a CPU "device" here) gives the same latent
    torch.testing.assert_close(run_fast(fast_loader("host"), graph), latent, rtol=0, atol=0)


def test_progress_per_chunk_and_step_with_chunk_previews(comfy, graph):
    utils = sys.modules["comfy.utils"]
    text, cam, vae, i2v = graph
    utils.progress.clear()
    comfy.calls.clear()
    fm = fast_loader()
    run_fast(fm, graph, preview_vae=vae)
    steps = [(v, t, p) for v, t, p in utils.progress if t == 12]
    values = [v for v, _, _ in steps]
    assert values[:4] == [1, 2, 3, 4] and values[-1] == 12
    assert sum(1 for _, _, p in steps if p) == 3  # one decoded preview per finished chunk
    loads = [c for c in comfy.calls if "ExpertContainer" in c[1]]
    assert loads and loads[-1][1] == ["ExpertContainer", "VAEContainer"] and loads[-1][3] is True
    assert fm.patcher.is_loaded()  # stays under model management, like a resident expert

    utils.progress.clear()
    run_fast(fm, graph)  # without a VAE: the latent previewer on every step, showing every latent frame so far
    from lingbot_world.nodes.adapters.previews import GAP, grid_layout

    previews = [(v, p) for v, t, p in utils.progress if t == 12 and p]
    assert len(previews) == 12
    for value, (_, image, _) in previews:
        frames = 3 * ((value - 1) // 4 + 1)  # the finished chunks and the current one
        cols, rows = grid_layout(frames, W // 8, H // 8)
        assert image.size == (cols * (W // 8) + (cols - 1) * GAP, rows * (H // 8) + (rows - 1) * GAP), (value, frames)
    assert fm.patcher.weights.loads_from_disk == 1  # reused
    comfy.unload_all_models()
    assert not fm.patcher.is_loaded()


def test_frame_rounding_and_cache_options(comfy, graph):
    from lingbot_world.nodes import NODE_CLASS_MAPPINGS as N

    text, cam, vae, i2v = graph
    fm = fast_loader()
    i2v25 = N["LingBotImageToVideo"]().encode(vae, torch.rand(1, 72, 128, 3), "custom", W, H, 25, False, cam)[0]
    out = N["LingBotFastSampler"]().sample(fm, text, i2v25, 1, "cpu", 0, 0, 0, cam)[0]["samples"]
    assert out.shape[2] == 6  # 25 frames -> 7 latent frames -> 6: 21 frames
    base = run_fast(fm, graph)
    windowed = run_fast(fm, graph, window=3, sink=0)  # only the current chunk: differs after the first chunk
    torch.testing.assert_close(windowed[:, :, :3], base[:, :, :3], rtol=0, atol=0)
    assert not torch.equal(windowed, base)
    with pytest.raises(ValueError, match="cannot hold the 3-frame sink"):
        run_fast(fm, graph, window=4, sink=3)


def test_interrupt_frees_the_cache_and_leaves_the_model_usable(comfy, graph):
    fm = fast_loader("host")
    comfy.interrupt_after = 6  # chunk 1, mid-chunk
    with pytest.raises(Interrupted):
        run_fast(fm, graph)
    model = fm.patcher.model.diffusion_model
    assert model.before_block is None and model.after_block is None  # the streamer is gone
    assert run_fast(fm, graph).isfinite().all()


def test_loaders_refuse_the_wrong_model(comfy, demo_base):
    from lingbot_world.loaders.expert_format import ExpertLoadError
    from lingbot_world.nodes import NODE_CLASS_MAPPINGS as N

    with pytest.raises(ExpertLoadError, match="is a base .* not the Fast model"):
        fast_loader(name="lingbot-demo/high_noise_model_bnb_nf4")
    with pytest.raises(ExpertLoadError, match="is the Fast \\(causal\\) model"):
        N["LingBotExpertLoader"]().load("lingbot-demo/lingbot_world_fast_bnb_nf4", "lingbot-demo/low_noise_model_bnb_nf4")


def _stored_weights_graph_equals_the_library_run(kind, comfy, graph, demo_base, monkeypatch):
    """weights `kind` on the demo's own stored copy (convert-fp8 / convert-int8): the graph's latent equals FastRun
    on load_expert(..., kind); a card that cannot run the kind is refused in one line at the loader."""
    from lingbot_world.quant import compute
    from lingbot_world.world.demos import add_stored_copy
    from lingbot_world.world.models import V1_FAST

    root = demo_base / "models" / "lingbot_world" / "lingbot-demo"
    name = f"lingbot-demo/{add_stored_copy(V1_FAST, root, kind).name}"
    text, cam, vae, i2v = graph
    fm = fast_loader(name=name, weights=kind)
    latent = run_fast(fm, graph)
    assert_equals_direct_run(latent, fm, graph, kind)

    monkeypatch.setattr(compute, "stored_weights_unavailable", lambda k, device: "this card is sm75")
    with pytest.raises(ValueError, match="sm75"):
        fast_loader(name=name, weights=kind)
    with pytest.raises(ValueError, match="weights must be one of"):
        fast_loader(weights="int4")
    return fm


def test_fp8_weights_in_the_graph_equal_the_library_run(comfy, graph, demo_base, monkeypatch):
    """FP8 GEMMs emulated on the CPU."""
    _stored_weights_graph_equals_the_library_run("fp8", comfy, graph, demo_base, monkeypatch)


def test_int8_weights_in_the_graph_equal_the_library_run(comfy, graph, demo_base, monkeypatch):
    """INT8 GEMMs through torch's CPU int8 matmul; an FP8 folder is not taken as INT8."""
    from lingbot_world.loaders.expert_format import ExpertLoadError

    fm = _stored_weights_graph_equals_the_library_run("int8", comfy, graph, demo_base, monkeypatch)
    assert fm.format.kind == "int8" and fm.weights == "int8"
    with pytest.raises(ExpertLoadError, match="holds NF4 weights; weights int8 reads an INT8 folder"):
        fast_loader(weights="int8")  # the NF4 demo model
