"""`lingbot-world compare` (issue 48): the quality metrics against formulas written here independently, the preset
specs, and the command on the v1 Fast demo and the v2 1.3B demo (CPU): the table, the JSON, the picture, and bad
input refused in one line before any work."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from PIL import Image

from lingbot_world.cli import main
from lingbot_world.cli.compare import parse_preset, parse_presets
from lingbot_world.cli.errors import UsageError
from lingbot_world.world import quality as q
from lingbot_world.world.compare import Comparison
from lingbot_world.world.compare_plot import BACKGROUND, colour, panel_boxes, plot_comparison
from lingbot_world.world.compare_store import FOLDER_PREFIX
from lingbot_world.world.models import V1_FAST, model

SIZE = "32*48"  # 16x48 from the demo image: a chunk in a fraction of a second on the CPU
C1, C2 = (0.01 * 255) ** 2, (0.03 * 255) ** 2


# ---- PSNR -----------------------------------------------------------------------------------------------------
def _frames(seed: int, n=2, h=20, w=24, lo=0, hi=256) -> np.ndarray:
    return np.random.default_rng(seed).integers(lo, hi, size=(n, h, w, 3), dtype=np.uint8)


def test_psnr_of_known_noise():
    a = _frames(0, lo=20, hi=236)
    signs = np.where(np.random.default_rng(1).random(a.shape) < 0.5, -10, 10)
    b = (a.astype(np.int16) + signs).astype(np.uint8)  # every value off by exactly 10: MSE 100
    assert q.psnr(b, a) == pytest.approx(10 * math.log10(255 ** 2 / 100), abs=1e-9)  # 28.1308 dB
    c = a.copy()
    c[0, :5] = 255 - c[0, :5]  # an arbitrary change: the MSE computed here
    mse = np.mean((c.astype(np.float64) - a) ** 2)
    assert q.psnr(c, a) == pytest.approx(10 * math.log10(255 ** 2 / mse), abs=1e-9)
    per = q.psnr_per_frame(c, a)
    assert math.isinf(per[1]) and per[0] == pytest.approx(10 * math.log10(255 ** 2 / (mse * 2)), abs=1e-9)
    assert math.isinf(q.psnr(a, a.copy()))


# ---- SSIM -----------------------------------------------------------------------------------------------------
def _ssim_by_loops(x: np.ndarray, y: np.ndarray, size=11, sigma=1.5) -> float:
    """Wang et al.'s SSIM of two grey images, window by window (valid positions), written out in numpy."""
    r = np.arange(size) - (size - 1) / 2
    g = np.exp(-(r[:, None] ** 2 + r[None, :] ** 2) / (2 * sigma ** 2))
    g /= g.sum()
    vals = []
    for i in range(x.shape[0] - size + 1):
        for j in range(x.shape[1] - size + 1):
            a, b = x[i:i + size, j:j + size], y[i:i + size, j:j + size]
            ma, mb = (g * a).sum(), (g * b).sum()
            va, vb = (g * (a - ma) ** 2).sum(), (g * (b - mb) ** 2).sum()
            cov = (g * (a - ma) * (b - mb)).sum()
            vals.append((2 * ma * mb + C1) * (2 * cov + C2) / ((ma ** 2 + mb ** 2 + C1) * (va + vb + C2)))
    return float(np.mean(vals))


def _grey(values: np.ndarray) -> np.ndarray:
    return np.repeat(values[..., None], 3, axis=-1).astype(np.uint8)  # R = G = B: the luma is the value


def test_ssim_of_identical_frames_is_one():
    a = _frames(2, n=3)
    assert q.ssim(a, a.copy()) == 1.0
    assert q.ssim_per_frame(a, a.copy()) == [1.0, 1.0, 1.0]


def test_ssim_of_two_flat_frames_is_the_luminance_term():
    a, b = _grey(np.full((1, 16, 16), 100)), _grey(np.full((1, 16, 16), 150))
    want = (2 * 100 * 150 + C1) / (100 ** 2 + 150 ** 2 + C1)  # no variance: the structure term is C2 / C2
    assert q.ssim(a, b) == pytest.approx(want, abs=1e-12)


def test_ssim_equals_the_window_by_window_formula():
    rng = np.random.default_rng(3)
    x = rng.integers(0, 256, size=(15, 17)).astype(np.float64)
    y = np.clip(x + rng.normal(0, 25, size=x.shape), 0, 255).round()
    got = q.ssim(_grey(x[None]), _grey(y[None]))
    assert got == pytest.approx(_ssim_by_loops(x, y), abs=1e-10)
    assert 0.5 < got < 0.99  # noisy, not identical
    # colour frames: the luma (BT.601) is what is compared
    rgb_x, rgb_y = _frames(4, n=1, h=15, w=17), _frames(5, n=1, h=15, w=17)
    luma = lambda f: f[0].astype(np.float64) @ np.array([0.299, 0.587, 0.114])  # noqa: E731
    assert q.ssim(rgb_x, rgb_y) == pytest.approx(_ssim_by_loops(luma(rgb_x), luma(rgb_y)), abs=1e-10)


def test_frames_of_other_shapes_are_refused():
    with pytest.raises(ValueError, match="different shapes"):
        q.psnr(_frames(0, h=8), _frames(0, h=9))
    with pytest.raises(ValueError, match="uint8"):
        q.ssim(np.zeros((1, 8, 8, 3), np.float32), np.zeros((1, 8, 8, 3), np.float32))


# ---- K/V drift ------------------------------------------------------------------------------------------------
def test_drift_of_identical_and_of_known_tensors():
    b = torch.randn(1, 50, 2, 8)
    assert q.drift(b.clone(), b) == q.Drift(1.0, 0.0)
    d = q.drift(b * 1.1, b, block=7)  # blocks of 7 tokens: the sums add up over them
    assert d.cosine == pytest.approx(1.0, abs=1e-6) and d.rel_l2 == pytest.approx(0.1, abs=1e-6)
    a = torch.randn(1, 50, 2, 8)
    a64, b64 = a.double().flatten(), b.double().flatten()
    d = q.drift(a, b, block=9)
    assert d.cosine == pytest.approx(float(a64 @ b64 / (a64.norm() * b64.norm())), abs=1e-9)
    assert d.rel_l2 == pytest.approx(float((a64 - b64).norm() / b64.norm()), abs=1e-9)
    assert q.drift(a.to(torch.bfloat16), a.to(torch.bfloat16)) == q.Drift(1.0, 0.0)


def test_the_cache_drift_compares_the_tokens_both_caches_hold():
    """A cache of 100 tokens without eviction against a 60-token window with a 10-token sink: tokens 0-9 and
    50-99 are in both. Each token's K/V is its own value, so aligned slots are identical: drift 0."""
    full, windowed = q.CacheSpan(100, 100, 10), q.CacheSpan(100, 60, 10)
    ia, ib = q.common_slots(windowed, full)
    assert ia.tolist() == list(range(60)) and ib.tolist() == list(range(10)) + list(range(50, 100))

    def layer(span, scale=1.0):
        tokens = torch.from_numpy(span.held()).float()
        k = (tokens[None, :, None, None] + torch.arange(4.0)) * scale
        return k, -k

    ref = [layer(full), layer(full)]
    drift = q.cache_drift(iter([layer(windowed), layer(windowed)]), windowed, iter(ref), full)
    assert drift.tokens == 60 and (drift.cosine, drift.rel_l2) == (1.0, 0.0)
    drift = q.cache_drift(iter([layer(windowed, 1.5), layer(windowed)]), windowed, iter(ref), full)
    assert drift.layers[0].k.rel_l2 == pytest.approx(0.5) and drift.layers[1].rel_l2 == 0.0
    assert drift.rel_l2 == pytest.approx(0.25)  # the mean over layers of the mean of K and V
    with pytest.raises(ValueError, match="numbers of layers"):
        q.cache_drift(iter([layer(full)]), full, iter(ref), full)


# ---- --preset specs -------------------------------------------------------------------------------------------
def test_preset_specs():
    p = parse_preset("draft:steps=2,tiny-vae")
    assert (p.label, p.preset, p.steps, p.flags, p.tiny_vae) == ("draft:steps=2,tiny-vae", "draft", 2, (), True)
    p = parse_preset(" Auto:compile=off , compute=bf16")
    assert (p.label, p.preset, dict(p.flags)) == ("auto:compile=off,compute=bf16", "auto", {"compile": "off",
                                                                                           "compute": "bf16"})
    assert [s.label for s in parse_presets(())] == ["exact", "draft", "draft:steps=2"]
    for bad, why in (("slow", "no preset 'slow'"), ("draft:steps=5", "steps=5"), ("exact:", "nothing after"),
                     ("draft:steps=2,steps=3", "steps given twice"), ("fast:compute=fp9", "compute=fp9"),
                     ("exact:window=3", "unknown option 'window=3'")):
        with pytest.raises(UsageError, match=why):
            parse_preset(bad)
    with pytest.raises(UsageError, match="two presets or more"):
        parse_presets(["exact"])
    with pytest.raises(UsageError, match="given twice"):
        parse_presets(["exact", "draft", "exact"])


# ---- the command ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def demos(demo_ckpt, tmp_path_factory):
    """{model: demo folder}: the v1 Fast demo (conftest's) and the v2 1.3B demo beside it, borrowing its umT5 and
    VAE as a real 1.3B borrows another download's; and one prompt cache for the module."""
    root = tmp_path_factory.mktemp("compare_demos")
    (root / V1_FAST.demo.folder).symlink_to(demo_ckpt, target_is_directory=True)
    return {"fast": demo_ckpt, "v2-1.3b": root / model("v2-1.3b").demo.folder, "text": root / "text"}


def _compare(demos, model_name, out, *extra):
    return main(["compare", "--demo", "--model", model_name, "--demo-dir", str(demos[model_name]), "--size", SIZE,
                 "--cache-dir", str(demos["text"]), "--out-dir", str(out), "--quiet", *extra])


@pytest.mark.parametrize("model_name", ["fast", "v2-1.3b"])
def test_exact_against_draft_in_two_steps_on_the_demo(demos, model_name, tmp_path, capsys):
    out = tmp_path / "out"
    assert _compare(demos, model_name, out, "--preset", "exact", "--preset", "draft:steps=2", "--chunks", "3") == 0
    printed = capsys.readouterr().out.splitlines()
    rows = [line.split() for line in printed if line[:5].strip().isdigit()]
    assert [(r[0], r[1]) for r in rows] == [(str(c), p) for c in range(3) for p in ("exact", "draft:steps=2")]
    for c in range(3):
        ref, draft = rows[2 * c], rows[2 * c + 1]
        assert ref[2:7] == ["(ref)", "inf", "1.0000", "1.000000", "0.00000"]  # the reference against itself
        assert math.isfinite(float(draft[2])) and float(draft[3]) < 1 and float(draft[5]) > 0

    report = json.loads((out / "compare.json").read_text())
    entry = model(model_name)
    assert report["model"] == entry.name and report["reference"] == "exact" and len(report["chunk_keys"]) == 3
    assert report["chunk_keys"][0] == f"w-{4 * (entry.recipe.chunk_frames - 1)}"  # the default cycle: w, wj, w
    assert report["chunk_keys"][1].startswith("wj-")
    exact, draft = report["presets"]
    assert (exact["label"], draft["label"], exact["steps_per_chunk"], draft["steps_per_chunk"]) == (
        "exact", "draft:steps=2", 4, 2)
    assert draft["window"] == 15 and draft["levers"]["kv_fp8"] and draft["levers"]["fold_context"]
    frames = [4 * (entry.recipe.chunk_frames - 1) + 1] + [4 * entry.recipe.chunk_frames] * 2
    for c, (e, d) in enumerate(zip(exact["chunks"], draft["chunks"])):
        assert e["frames"] == d["frames"] == frames[c] == len(d["psnr_per_frame"]) == len(d["ssim_per_frame"])
        assert (e["psnr"], e["ssim"], e["kv_cosine"], e["kv_rel_l2"]) == (None, 1.0, 1.0, 0.0)
        assert set(e["psnr_per_frame"]) == {None} and len(e["kv_layers"]) == len(d["kv_layers"]) > 0
        assert 0 < d["psnr"] < 100 and -1 <= d["ssim"] < 1 and d["kv_cosine"] < 1 and d["kv_rel_l2"] > 0
        assert d["psnr"] == pytest.approx(10 * math.log10(frames[c] / sum(10 ** (-p / 10) for p in
                                                                         d["psnr_per_frame"])), abs=1e-6)
        assert d["kv_rel_l2"] == pytest.approx(np.mean([(x["k_rel_l2"] + x["v_rel_l2"]) / 2
                                                        for x in d["kv_layers"]]), abs=1e-12)
        assert d["kv_tokens"] == e["kv_tokens"] > 0  # 3 chunks: within the 15-frame window of draft

    picture = Image.open(out / "compare.png").convert("RGB")
    pixels = np.asarray(picture)
    for x0, y0, x1, y1 in panel_boxes(picture.size, 2):  # both panels draw the compared preset's lines
        inside = pixels[y0 + 1:y1, x0 + 1:x1].reshape(-1, 3)
        assert (inside == colour(1)).all(1).sum() > 50
        assert (inside == BACKGROUND).all(1).mean() > 0.5
    assert not list(out.glob(f"{FOLDER_PREFIX}*"))  # the reference's frames and cache are gone

    # compare.json reads back (Comparison.from_json) with every number, the means from the per-layer values to the
    # last bits, and draws the same picture from the file alone
    back = Comparison.from_json(report).to_json()
    assert [p["levers"] for p in back["presets"]] == [p["levers"] for p in report["presets"]]
    for a, b in zip(report["presets"], back["presets"]):
        for ca, cb in zip(a["chunks"], b["chunks"]):
            assert ca.keys() == cb.keys()
            for key, value in ca.items():
                if isinstance(value, float):
                    assert cb[key] == pytest.approx(value, rel=1e-12, abs=1e-15)
                elif key != "kv_layers":
                    assert cb[key] == value
    assert np.array_equal(np.asarray(plot_comparison(Comparison.from_json(report))), pixels)
    with pytest.raises(ValueError, match="not a lingbot-world compare file"):
        Comparison.from_json({"format": "other"})


def test_a_failed_run_keeps_the_old_outputs_and_leaves_no_reference_behind(demos, tmp_path, monkeypatch, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "compare.json").write_text("old")
    stale = out / f"{FOLDER_PREFIX}999999999"  # left by a run that was killed
    stale.mkdir()
    calls = []

    def failing(*a):
        calls.append(a)
        raise RuntimeError("the metrics failed")

    monkeypatch.setattr("lingbot_world.world.compare.frame_quality", failing)  # after the reference's first chunk
    assert _compare(demos, "v2-1.3b", out, "--chunks", "1", "--preset", "exact", "--preset", "draft") == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert calls and err[-1] == "lingbot-world compare: the metrics failed"
    assert (out / "compare.json").read_text() == "old" and not (out / "compare.png").exists()
    assert sorted(p.name for p in out.iterdir()) == ["compare.json"]  # the stale folder and this run's are gone


@pytest.mark.parametrize("flags, message", [
    (["--preset", "exact"], "give two presets or more"),
    (["--preset", "exact", "--preset", "turbo"], "no preset 'turbo'"),
    (["--preset", "exact", "--preset", "draft:steps=5"], "steps=5"),
    (["--chunks", "0"], "--chunks 0"),
    (["--preset", "exact", "--preset", "draft:tiny-vae"], "give its file with --tiny-vae"),
    (["--tiny-vae", "taew2_1.safetensors"], "no --preset uses it"),
    (["--preset", "exact", "--preset", "fast:attention=flash"], "--preset fast:attention=flash: "),
    (["--actions", "q-3"], "--actions"),
    (["--size", "huge"], "--size"),
    (["--ckpt-dir", "/nowhere"], "either --demo or --ckpt-dir"),
    (["--image", "/nowhere/image.png"], "/nowhere/image.png"),
])
def test_bad_input_is_refused_in_one_line_before_any_work(tmp_path, capsys, flags, message):
    demo_dir = tmp_path / "demo"
    size = [] if "--size" in flags else ["--size", SIZE]
    code = main(["compare", "--demo", "--demo-dir", str(demo_dir), "--out-dir", str(tmp_path / "out"), "--quiet",
                 *size, *flags])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("lingbot-world compare: error: "), err
    assert message in err[0]
    assert not demo_dir.exists()  # nothing was built or loaded


def test_outputs_are_checked_before_any_work(tmp_path, capsys):
    blocked = tmp_path / "file"
    blocked.write_text("x")
    base = ["compare", "--demo", "--demo-dir", str(tmp_path / "demo"), "--quiet", "--size", SIZE]
    assert main(base + ["--out-dir", str(blocked)]) == 2
    assert "--out-dir" in capsys.readouterr().err
    out = tmp_path / "out"
    (out / "compare.png").mkdir(parents=True)
    assert main(base + ["--out-dir", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "compare.png is a folder" in err[0]
    assert main(["compare", "--ckpt-dir", str(tmp_path), "--out-dir", str(out), "--quiet"]) == 2
    assert "--image and --prompt are required" in capsys.readouterr().err
    assert not (tmp_path / "demo").exists()


def test_the_picture_of_presets_identical_to_the_reference():
    """A preset that makes the reference's frames bit for bit (PSNR inf) is a triangle on the top edge of the frames
    panel; its drift of 0 lies on the K/V panel's bottom edge."""
    from lingbot_world.world.compare import ChunkResult, Comparison, Variant, VariantResult
    from lingbot_world.world.compare_plot import plot_comparison

    same = q.FrameQuality(math.inf, 1.0, (math.inf,), (1.0,))
    none = q.CacheDrift((q.LayerDrift(q.Drift(1.0, 0.0), q.Drift(1.0, 0.0)),), 10)
    result = Comparison("v2-1.3b", "a model", 16, 48, 42, "p", ["w-12", "w-16"])
    for label in ("exact", "auto"):
        v = VariantResult(Variant(label, None), 18, 6, 4, "eager")
        v.chunks = [ChunkResult(c, 1, same, none, 0.1) for c in range(2)]
        result.variants.append(v)
    picture = plot_comparison(result)
    pixels = np.asarray(picture)
    (x0, y0, x1, y1), (kx0, ky0, kx1, ky1) = panel_boxes(picture.size, 2)
    top_band = pixels[y0 + 1:y0 + 10, x0 + 1:x1].reshape(-1, 3)
    assert (top_band == colour(1)).all(1).sum() > 20  # the triangles (and SSIM 1 on its axis' top)
    bottom_band = pixels[ky1 - 4:ky1, kx0 + 1:kx1].reshape(-1, 3)
    assert (bottom_band == colour(1)).all(1).sum() > 20


def test_a_long_preset_summary_is_cut_to_the_pictures_width():
    """The legend's rows end with an ellipsis inside the picture instead of running off its right edge (a full-size
    run's summaries are longer than 960 pixels)."""
    from PIL import Image, ImageDraw

    from lingbot_world.world.compare import ChunkResult, Comparison, Variant, VariantResult
    from lingbot_world.world.compare_plot import LEFT, _font, fit_text, plot_comparison

    quality = q.FrameQuality(30.0, 0.9, (30.0,), (0.9,))
    drift = q.CacheDrift((q.LayerDrift(q.Drift(0.9, 0.2), q.Drift(0.9, 0.2)),), 10)
    long_summary = ", ".join(["preset=draft, compile=blocks, compute=fp8, attention=sdpa (cudnn>flash>efficient>math)"]
                             * 3)
    result = Comparison("v2-1.3b", "a model", 16, 48, 42, "p", ["w-12", "w-16"])
    for label in ("exact", "draft:steps=2,tiny-vae"):
        v = VariantResult(Variant(label, None), 18, 6, 4, long_summary)
        v.chunks = [ChunkResult(c, 1, quality, drift, 0.1) for c in range(2)]
        result.variants.append(v)
    picture = plot_comparison(result)
    pixels = np.asarray(picture)
    legend = pixels[-60:, :]  # the legend's rows under the K/V panel
    ink = np.nonzero((legend != 255).any(-1))[1]
    assert ink.min() >= LEFT - 1 and ink.max() < picture.size[0] - 8
    draw = ImageDraw.Draw(Image.new("RGB", (10, 10)))
    cut = fit_text(draw, "draft (" + long_summary + ")", _font(12), 400)
    assert cut.endswith("…") and draw.textlength(cut, font=_font(12)) <= 400 and cut.startswith("draft (preset=")
    assert fit_text(draw, "short", _font(12), 400) == "short"


def test_the_reference_store_is_checked_against_the_free_space(demos, tmp_path, monkeypatch, capsys):
    """Too little room for the reference's caches: one line before the model loads, naming the way out; with
    --kv-drift off only the frames are kept and compared."""
    import lingbot_world.world.compare as world_compare

    real = world_compare.reference_bytes
    monkeypatch.setattr(world_compare, "reference_bytes",
                        lambda s, layers, *a: 10 ** 15 if layers else real(s, layers, *a))
    loads = []
    monkeypatch.setattr(world_compare.ReferenceStore, "__init__", lambda *a: loads.append(a) or None)
    out = tmp_path / "out"
    assert _compare(demos, "v2-1.3b", out, "--chunks", "1") == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("lingbot-world")]
    assert len(err) == 1 and err[0].startswith("lingbot-world compare: error: --out-dir "), err
    assert "free" in err[0] and "--kv-drift off" in err[0]
    assert not loads and not (out / "compare.json").exists()

    monkeypatch.undo()
    assert _compare(demos, "v2-1.3b", out, "--chunks", "1", "--kv-drift", "off", "--preset", "exact",
                    "--preset", "draft") == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line[:5].strip().isdigit()]
    assert [r[:2] + r[-3:-1] for r in rows] == [["0", "exact", "-", "-"], ["0", "draft", "-", "-"]]
    report = json.loads((out / "compare.json").read_text())
    draft = report["presets"][1]["chunks"][0]
    assert draft["kv_cosine"] is draft["kv_rel_l2"] is draft["kv_tokens"] is None and draft["kv_layers"] == []
    assert 0 < draft["psnr"] < 100



def test_a_preset_is_recorded_as_it_ran_on_the_model(demos, tmp_path, monkeypatch):
    """`auto` compiles where the compiler runs, but a model narrower than the 14B runs it eagerly
    (speed.options.fit_to_model): the table, JSON and picture say what ran (here, as a GPU would resolve `auto`
    before that fit, on the narrow demo model), not the preset's request."""
    import dataclasses

    import lingbot_world.world.speed as world_speed

    real = world_speed.played_speed_plan

    def as_on_a_gpu(given, device):
        plan = real(given, device)
        return dataclasses.replace(plan, compile="blocks", compile_requested="auto") if given.speed == "auto" else plan

    monkeypatch.setattr(world_speed, "played_speed_plan", as_on_a_gpu)
    out = tmp_path / "out"
    assert _compare(demos, "v2-1.3b", out, "--preset", "exact", "--preset", "auto", "--chunks", "1") == 0
    auto = json.loads((out / "compare.json").read_text())["presets"][1]
    assert auto["levers"]["compile"] == "off" and "compile=off" in auto["speed"]
    assert auto["chunks"][0]["psnr"] is None  # eager auto makes exact's frames
