"""Downloads from a model's hub repository through huggingface_hub, against a local fake hub (tests/fake_hub.py),
and the stored copy made once on the first load (world/stored_copy.py)."""
from __future__ import annotations

from pathlib import Path

import pytest

from lingbot_world.world import hub, stored_copy

from tests.conftest import load_sibling


fake_hub = load_sibling("fake_hub")


@pytest.fixture(scope="module")
def repos(tmp_path_factory):
    return fake_hub.build_tiny_repos(tmp_path_factory.mktemp("repos"))


@pytest.fixture
def served(repos, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))  # no token, no cache of the user's
    with fake_hub.FakeHub(repos) as h:
        yield h


def test_a_loader_choice_names_the_part_of_its_repository():
    cases = {
        "lingbot-world-base-cam/high_noise_model": ("v1-base-cam", "high", ("high_noise_model/",)),
        "lingbot-world-base-cam/low_noise_model_bnb_nf4": ("v1-base-cam", "low", ("low_noise_model/",)),
        "lingbot-world-base-cam/lingbot_world_fast_bnb_nf4": ("v1-fast", "dit", hub.ROOT_DIT),
        "lingbot-world-v2-14b-causal-fast/transformers_fp8": ("v2-14b", "dit", ("transformers/",)),
        "lingbot-world-v2-1.3b-causal-fast": ("v2-1.3b", "dit", hub.ROOT_DIT + ("transformers/",)),
        "lingbot-world-base-cam/models_t5_umt5-xxl-enc-bf16.pth": ("v1-base-cam", "text_encoder",
                                                                   (hub.T5_FILE, "google/umt5-xxl/")),
        "lingbot-world-base-act/Wan2.1_VAE.pth": ("v1-base-act", "vae", ("Wan2.1_VAE.pth",)),
    }
    for name, (model, part, patterns) in cases.items():
        got = hub.part_for(name)
        assert (got.entry.name, got.part, got.patterns) == (model, part, patterns), name
    for name in ("lingbot-demo/high_noise_model_bnb_nf4", "my_experts/high", "umt5_xxl_fp16.safetensors",
                 "lingbot-world-v2-1.3b-causal-fast/Wan2.1_VAE.pth"):  # the 1.3B's download has the DiT only
        assert hub.part_for(name) is None, name
    assert hub.part_for("lingbot-world-base-cam/lingbot_world_fast").folder == "lingbot-world-base-cam/lingbot_world_fast"


def _tree(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*")
            if p.is_file() and ".cache" not in p.parts}


def test_only_the_parts_files_come_with_progress_and_the_licence_first(served, repos, tmp_path):
    models = tmp_path / "models"
    said, seen = [], []
    part = hub.part_for("lingbot-world-base-cam/models_t5_umt5-xxl-enc-bf16.pth")
    p = hub.fetch(part, models, progress=lambda d, t: seen.append((d, t)), say=said.append, endpoint=served.url)
    got = _tree(models / "lingbot-world-base-cam")
    cam = repos["robbyant/lingbot-world-base-cam"]
    want = {k: v for k, v in _tree(cam).items() if k == hub.T5_FILE or k.startswith("google/umt5-xxl/")}
    assert got == want and "README.md" not in got and not any(k.startswith("examples") for k in got)
    assert p.target == models / "lingbot-world-base-cam"
    assert said[0].startswith("downloading the LingBot-World Base (Cam)'s umT5 text encoder") and "Apache-2.0" in said[0]
    total = sum(len(v) for v in want.values())
    assert seen[-1] == (total, total) and all(b >= a for (a, _), (b, _) in zip(seen, seen[1:]))
    heads = [path for m, path, _ in served.requests if m == "HEAD"]
    assert any(path.endswith(f"/resolve/{fake_hub.SHA}/{hub.T5_FILE}") for path in heads), served.requests
    # a second call finds everything there and asks for no file
    before = len(served.gets(""))
    assert not hub.fetch(part, models, endpoint=served.url).missing and len(served.gets("")) == before


def test_a_dropped_download_resumes_with_a_ranged_get(served, repos, tmp_path, monkeypatch):
    from huggingface_hub import constants

    # huggingface_hub writes what it received in chunks of 10 MB; the tiny shards are smaller than one, so chunks of
    # 64 KB here, as a real shard of gigabytes has many chunks on disk when its connection drops
    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", 64 * 1024)
    models = tmp_path / "models"
    part = hub.part_for("lingbot-world-base-cam/lingbot_world_fast")
    shard = next(p for p in sorted(repos["robbyant/lingbot-world-fast"].glob("*.safetensors")))
    served.cut_once[f"robbyant/lingbot-world-fast/{shard.name}"] = shard.stat().st_size // 3
    try:
        hub.fetch(part, models, endpoint=served.url)
    except Exception:  # the client gave up on the dropped connection: the next fetch resumes the partial file
        hub.fetch(part, models, endpoint=served.url)
    ranges = served.gets(shard.name)
    assert len(ranges) >= 2 and ranges[-1] and int(ranges[-1][6:].split("-")[0]) > 0, ranges
    fast = models / "lingbot-world-base-cam" / "lingbot_world_fast"
    assert _tree(fast) == {k: v for k, v in _tree(repos["robbyant/lingbot-world-fast"]).items() if k != "README.md"}


def test_too_little_disk_is_refused_before_any_file(served, tmp_path, monkeypatch):
    import shutil
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(10**9, 10**9 - 4096, 4096))
    part = hub.part_for("lingbot-world-v2-1.3b-causal-fast")
    with pytest.raises(OSError, match=r"not enough disk space for the LingBot-World v2 1.3B .*'s DiT: it needs"):
        hub.fetch(part, tmp_path / "models", endpoint=served.url)
    assert served.gets(".safetensors") == []


def test_a_v2_download_says_its_licence_before_the_files(served, tmp_path):
    said = []
    hub.fetch(hub.part_for("lingbot-world-v2-1.3b-causal-fast"), tmp_path / "models", say=said.append,
              endpoint=served.url)
    assert "CC BY-NC-SA 4.0" in said[0] and "non-commercial" in said[0]
    folder = tmp_path / "models" / "lingbot-world-v2-1.3b-causal-fast"
    assert sorted(p.name for p in folder.glob("model*")) == sorted(
        p.name for p in served.repos["robbyant/lingbot-world-v2-1.3b-causal-fast"].glob("model*"))


def test_the_first_load_makes_the_nf4_copy_and_later_loads_read_it(served, tmp_path):
    from lingbot_world.loaders.expert_format import detect_format

    models = tmp_path / "models"
    hub.fetch(hub.part_for("lingbot-world-v2-1.3b-causal-fast"), models, endpoint=served.url)
    source = models / "lingbot-world-v2-1.3b-causal-fast"
    said, steps = [], []
    first = stored_copy.ensure(source, "nf4", device="cpu", say=said.append, progress=lambda d, t: steps.append(d))
    assert first.how == "made" and first.path == models / "lingbot-world-v2-1.3b-causal-fast_bnb_nf4"
    assert said and "making the NF4 copy" in said[0] and steps
    fmt = detect_format(first.path)
    assert fmt.weights == "nf4"
    from lingbot_world.world.detect import recorded_model

    assert recorded_model(fmt) == "v2-1.3b"  # told from the release's layout (config-less model-* shards)
    again = stored_copy.ensure(source, "nf4", device="cpu")
    assert again.how == "copy" and again.path == first.path
    assert "read the NF4 copy" in again.line(source, "nf4")
    assert stored_copy.ensure(source, "bf16").how == "as chosen"  # bf16 reads the release's files
    assert not list(models.glob(".*tmp*"))  # no half copy left behind


def test_a_tiny_decoder_is_one_file_with_its_licence_first_and_not_fetched_twice(tmp_path, monkeypatch):
    from lingbot_world.loaders.demo_checkpoint import write_random_tiny_vae

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    repo = tmp_path / "autoencoders"
    repo.mkdir()
    write_random_tiny_vae(repo / "taew2_1.safetensors")
    (repo / "Wan2.1_VAE.pth").write_bytes(b"x" * 1000)  # the repository's other files stay there
    f = hub.TINY_DECODERS["taew2_1.safetensors"]
    said, seen = [], []
    with fake_hub.FakeHub({f.repo: repo}) as h:
        got = hub.fetch_file(f, tmp_path / "vae_approx", progress=lambda d, t: seen.append((d, t)), say=said.append,
                             endpoint=h.url)
        assert got == tmp_path / "vae_approx" / "taew2_1.safetensors"
        assert got.read_bytes() == (repo / "taew2_1.safetensors").read_bytes()
        size = got.stat().st_size
        assert said[0].startswith(f"downloading the {f.what}") and f.licence in said[0] and len(said) == 2
        assert seen[-1] == (size, size) and all(d <= t == size for d, t in seen)
        gets = [p for m, p, _ in h.requests if m == "GET" and "/resolve/" in p]
        assert gets == [f"/{f.repo}/resolve/{fake_hub.SHA}/taew2_1.safetensors"]
        said.clear()
        assert hub.fetch_file(f, tmp_path / "vae_approx", say=said.append, endpoint=h.url) == got
        assert not said and len([p for m, p, _ in h.requests if m == "GET" and "/resolve/" in p]) == 1
        with pytest.raises(FileNotFoundError, match="holds no lighttaew2_1.safetensors"):
            hub.fetch_file(hub.TINY_DECODERS["lighttaew2_1.safetensors"], tmp_path / "vae_approx", endpoint=h.url)
