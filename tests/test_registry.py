"""A model is one registry entry (world/models.py). A fake causal model (new constants: chunks of 2 latent frames,
its own step indices and shift, the v2 camera form, a release window of 8 with a sink of 2; the same maths) added
here runs through the CLI, a played session and the ComfyUI Fast nodes with no door changed, and a played video
equals its batch run bit for bit. The real entries are told from their files (never a folder name)."""
from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from lingbot_world.cli import main
from lingbot_world.loaders.expert_format import ExpertFormat
from lingbot_world.loaders.expert_loader import load_expert
from lingbot_world.wan.control.camera import camera_condition
from lingbot_world.wan.dit.model import DiTConfig, pad_context
from lingbot_world.wan.sampling.fast_sampler import FastRun, draw, make_generator
from lingbot_world.wan.sampling.recipe import ChunkRecipe
from lingbot_world.world import TextSettings, WorldFiles, WorldSettings, models, open_session
from lingbot_world.world.detect import identify
from lingbot_world.world.models import (CAUSAL, CC_BY_NC_SA, V1_FAST, V2_14B, V2_1_3B, Demo, ModelEntry,
                                        ModelFiles)

from tests.conftest import load_sibling

IMAGE = "assets/examples/00/image.jpg"
PROMPT = "a lake with a lone tree"
SIZE = "64*112"
FAKE = ModelEntry(
    "fake-causal", "A fake causal model", CAUSAL, "camera", V1_FAST.dit, ModelFiles("example/fake", ("fake_dit",)),
    CC_BY_NC_SA, Demo("demo-fake", 25, "lingbot_demo_fake.mp4"),
    recipe=ChunkRecipe(2, (0, 300, 600, 900), 7.0, ((3, (0, 600, 900)), (2, (0, 900))), "v2", window=8, sink=2),
    play_window=8, play_sink=2)
KEYS = ["w-4", "a-8", None, "jw-8", "d-8"]  # five chunks of 2 latent frames: 10 > 8, the window evicts


@pytest.fixture
def fake(monkeypatch):
    monkeypatch.setitem(models.MODELS, FAKE.name, FAKE)
    return FAKE


def _png_frames(folder: Path) -> np.ndarray:
    return np.stack([np.asarray(Image.open(f)) for f in sorted(folder.glob("frame_*.png"))])


def test_a_fake_model_plays_as_its_batch_run_through_the_cli(fake, tmp_path):
    demo = tmp_path / "demo-fake"
    text = TextSettings(device="cpu", cache_dir=tmp_path / "text")
    files = WorldFiles.demo(demo, model=fake.name)
    assert files.dit == demo / "fake_dit"
    with open_session(files, WorldSettings(size=SIZE, text=text, play=True), device="cpu") as s:
        s.start(IMAGE, PROMPT)
        assert s.settings.recipe == fake.recipe and (s.settings.window, s.settings.sink) == (8, 2)
        assert s.keys_for_next_chunk() == 4  # one latent frame fewer than a chunk: the first frame is the image
        played = np.concatenate([b.frames for k in KEYS for b in s.step(k)])
        assert s.keys_for_next_chunk() == 8 and s.chunks == 5 and played.shape[0] == 4 * 9 + 1
        assert s.cache.global_end > s.cache.local_end  # the release's window of 8 evicted
        actions = s.action_string()
    out = tmp_path / "batch"
    assert main(["generate", "--demo", "--model", fake.name, "--demo-dir", str(demo), "--rule", "continuable",
                 "--actions", actions, "--image", IMAGE, "--prompt", PROMPT, "--size", SIZE, "--quiet",
                 "--cache-dir", str(tmp_path / "text"), "--out", str(out), "--save-state",
                 str(tmp_path / "fake.state")]) == 0
    assert np.array_equal(_png_frames(out), played)
    from lingbot_world.world.assembly import open_state

    saved = open_state(tmp_path / "fake.state").state.settings
    assert saved.model_name == fake.name and saved.recipe == fake.recipe


P = load_sibling("test_nodes_pipeline")
demo_base = P.demo_base
comfy = P.comfy


def test_a_fake_model_runs_through_the_fast_nodes(fake, comfy, demo_base, tmp_path):
    """LingBot Fast Model Loader tells the fake model from its files (its window); LingBot Fast Sampler runs its
    recipe: the latent equals FastRun with the fake's schedule, chunk and release window, bit for bit."""
    from lingbot_world.nodes import NODE_CLASS_MAPPINGS as N
    from lingbot_world.wan.dit.kv_cache import cache_layout

    built = WorldFiles.demo(tmp_path / "demo-fake", model=fake.name)
    folder = demo_base / "models" / "lingbot_world" / "lingbot-fake"
    shutil.copytree(built.dit, folder / "fake_dit", dirs_exist_ok=True)
    h, w, frames = 32, 48, 21  # 6 latent frames: 3 chunks of 2
    fm = N["LingBotFastLoader"]().load("lingbot-fake/fake_dit", "nf4", "auto")[0]
    assert fm.entry is fake
    text = N["LingBotTextEncode"]().encode("lingbot-demo/models_t5_umt5-xxl-enc-bf16.pth", "auto", PROMPT, "",
                                           "auto", True)[0]
    cam = N["LingBotCameraPreset"]().make("dolly_in", "pan_right", 1.0, frames)[0]
    vae = N["LingBotVAELoader"]().load("lingbot-demo/Wan2.1_VAE.pth")[0]
    image = torch.rand(1, 72, 128, 3, generator=torch.Generator().manual_seed(3))
    i2v = N["LingBotImageToVideo"]().encode(vae, image, "custom", w, h, frames, False, cam)[0]
    latent = N["LingBotFastSampler"]().sample(fm, text, i2v, seed=5, noise_source="cpu", max_attention=0, window=0,
                                              sink=0, camera=cam)[0]["samples"]
    model = load_expert(fm.format.path, "cpu", "nf4")
    plucker = camera_condition(cam.poses, cam.intrinsics, h, w, frames, latent_frames=6, form="v2").plucker
    g = make_generator(5, "cpu")
    noise = draw(g, (1, 16, 6, h // 8, w // 8))
    cache = cache_layout(6, (h // 16) * (w // 16), 2, window_frames=8, sink_frames=2).make(
        2, model.cfg.num_heads, model.cfg.head_dim, dtype=torch.float32)
    z = FastRun(model, noise, pad_context([text.positive], 512), i2v.y, plucker, cache, g,
                schedule=fake.recipe.schedule(), chunk_frames=2).run()
    torch.testing.assert_close(latent, i2v.to_raw_latent(z), rtol=0, atol=0)


# ---- the real entries, told from their files -----------------------------------------------------------------
def _format(tmp_path: Path, cfg: DiTConfig, names: list[str], source: str, config_json: dict = None) -> ExpertFormat:
    """An ExpertFormat of files with these names (headers are not read by the identification)."""
    folder = tmp_path / "dit"
    folder.mkdir()
    for n in names:
        (folder / n).write_bytes(b"")
    if config_json is not None:
        (folder / "config.json").write_text(json.dumps(config_json))
    return ExpertFormat("official_sharded", folder, tuple(folder / n for n in names if n.endswith(".safetensors")),
                        cfg, source)


@pytest.mark.parametrize("names,want", [
    (["diffusion_pytorch_model-00001-of-00002.safetensors", "diffusion_pytorch_model-00002-of-00002.safetensors",
      "diffusion_pytorch_model.safetensors.index.json"], "v1-fast"),
    (["model-00001-of-00008.safetensors", "model.safetensors.index.json"], "v2-14b"),
])
def test_v1_fast_and_the_v2_14b_are_told_apart_by_their_release_layout(tmp_path, names, want):
    fast = DiTConfig(causal=True)
    entry, note = identify(_format(tmp_path, fast, names, "config.json"))
    assert entry.name == want and note is None


def test_the_same_tensors_in_one_file_need_the_users_word(tmp_path):
    fmt = _format(tmp_path, DiTConfig(causal=True), ["model.safetensors"], "config.json")
    entry, note = identify(fmt)
    assert entry is V1_FAST and "--model v2-14b" in note
    assert identify(fmt, "v2-14b") == (V2_14B, None)
    with pytest.raises(ValueError, match="holds LingBot-World v2 14B"):
        identify(replace(fmt, headers={fmt.path: _Header({"lingbot_model": "v2-14b"})}), "fast")


class _Header:
    def __init__(self, metadata):
        self.metadata = metadata


def test_the_1_3b_is_told_from_its_shapes_without_a_config(tmp_path):
    cfg = DiTConfig(dim=1536, ffn_dim=8960, num_heads=12, num_layers=30)  # inferred: not marked causal
    entry, note = identify(_format(tmp_path, cfg, ["model-00001-of-00006.safetensors"], "inferred from shapes"))
    assert entry is V2_1_3B and note is None
    assert entry.licence is CC_BY_NC_SA and not entry.licence.commercial


def test_every_entry_is_consistent():
    for e in models.entries():
        assert models.model(e.name) is e and all(models.model(a) is e for a in e.aliases)
        if e.causal:
            assert e.recipe.steps == 4 and set(e.recipe.step_choices) == {4, 3, 2}
            assert e.files.dit_dirs[0].endswith("_bnb_nf4") and e.play_window >= e.play_sink + e.recipe.chunk_frames
        else:
            assert e.schedule is not None and e.files.experts
    with pytest.raises(KeyError, match="no model called 'v9'"):
        models.model("v9")


@pytest.mark.parametrize("name", ["v2-1.3b", "v2-14b"])
def test_the_v2_demos_play_as_their_batch_run(name, tmp_path):
    """Each v2 demo in its release's layout (the 1.3B's DiT alone, its umT5 / VAE borrowed from the v1 demo beside
    it; the 14B's float shards quantized while loading): a played video equals the batch run of its keys."""
    entry = models.model(name)
    demo = tmp_path / entry.demo.folder
    text = TextSettings(device="cpu", cache_dir=tmp_path / "text")
    with open_session(WorldFiles.demo(demo, model=name), WorldSettings(size=SIZE, text=text), device="cpu") as s:
        s.start(IMAGE, PROMPT)
        assert s.settings.recipe == entry.recipe and s.keys_for_next_chunk() == 12
        played = np.concatenate([b.frames for k in ("w-12", "jw-16") for b in s.step(k)])
        actions = s.action_string()
    out = tmp_path / "batch"
    assert main(["generate", "--demo", "--model", name, "--demo-dir", str(demo), "--rule", "continuable",
                 "--actions", actions, "--image", IMAGE, "--prompt", PROMPT, "--size", SIZE, "--quiet",
                 "--cache-dir", str(tmp_path / "text"), "--out", str(out)]) == 0
    assert np.array_equal(_png_frames(out), played) and played.shape[0] == 29
