"""Convert once, from the graph (issue 49): a release's float DiT folder picked in a loader is read through its NF4 /
FP8 / INT8 copy, made beside it on the first load (with ComfyUI's progress bar and the node saying so) and read by
every later load; a copy's own name whose release folder is installed is made from it. Tiny random weights in the
releases' layouts, with test_nodes_pipeline.py's stand-ins for ComfyUI's modules."""
from __future__ import annotations

from dataclasses import replace

import pytest

from tests.conftest import load_sibling


P = load_sibling("test_nodes_pipeline")
demo_base = P.demo_base
comfy = P.comfy


@pytest.fixture(scope="module")
def release(demo_base):
    """lingbot-world-base-cam/ with the float experts and the Fast model's folder, as a download lays them out."""
    from lingbot_world.loaders.demo_checkpoint import demo_configs
    from lingbot_world.loaders.nf4_writer import random_expert_state, write_official_expert

    cam = demo_base / "models" / "lingbot_world" / "lingbot-world-base-cam"
    cfg = demo_configs()[0]
    for i, name in enumerate(("high_noise_model", "low_noise_model")):
        state = list(random_expert_state(cfg, seed=60 + i))
        write_official_expert(iter(state), cfg, cam / name, max_shard_bytes=sum(t.numel() * 4 for _, t in state) // 2)
    fast = replace(cfg, causal=True)
    state = list(random_expert_state(fast, seed=70))
    write_official_expert(iter(state), fast, cam / "lingbot_world_fast",
                          max_shard_bytes=sum(t.numel() * 4 for _, t in state) // 2)
    return cam


@pytest.fixture
def shown(monkeypatch):
    import lingbot_world.nodes.adapters.progress as progress
    import lingbot_world.nodes.expert as expert
    import lingbot_world.nodes.fast as fast

    lines = []
    for module in (progress, expert, fast):
        if hasattr(module, "show_on_node"):
            monkeypatch.setattr(module, "show_on_node", lines.append)
    return lines


def _fast(name: str, weights: str):
    from lingbot_world.nodes import NODE_CLASS_MAPPINGS as N

    return N["LingBotFastLoader"]().load(name, weights, "auto")[0]


@pytest.mark.parametrize("weights", ["nf4", "fp8", "int8"])
def test_the_fast_loader_makes_the_copy_on_the_first_load_and_reads_it_after(comfy, release, shown, weights):
    from lingbot_world.loaders.expert_format import detect_format

    suffix = {"nf4": "_bnb_nf4", "fp8": "_fp8", "int8": "_int8"}[weights]
    copy = release / f"lingbot_world_fast{suffix}"
    assert not copy.exists()
    import comfy.utils as cu  # the stand-in's bar: what ComfyUI's ProgressBar was given

    bar_before = len(cu.progress)
    first = _fast("lingbot-world-base-cam/lingbot_world_fast", weights)
    assert first.format.path.parent == copy and detect_format(copy).weights == weights
    assert any(f"making the {weights.upper()} copy" in line for line in shown), shown
    assert shown[-1].startswith(f"LingBot-World Fast: made the {weights.upper()} copy lingbot_world_fast{suffix} "
                                "of lingbot_world_fast (first load); later loads read it; weights licensed Apache-2.0")
    assert len(cu.progress) > bar_before and cu.progress[-1][0] == cu.progress[-1][1]  # the bar ran to its end
    made = copy.stat().st_mtime_ns
    shown.clear()
    again = _fast("lingbot-world-base-cam/lingbot_world_fast", weights)
    assert again.format.path.parent == copy and copy.stat().st_mtime_ns == made  # read, not made again
    assert shown == [f"LingBot-World Fast: read the {weights.upper()} copy lingbot_world_fast{suffix} beside "
                     "lingbot_world_fast; weights licensed Apache-2.0: https://www.apache.org/licenses/LICENSE-2.0"]
    assert not list(release.glob(".lingbot_world_fast*.tmp*"))  # no half copy left behind
    shown.clear()
    by_name = _fast(f"lingbot-world-base-cam/lingbot_world_fast{suffix}", weights)  # the copy picked by its name
    assert by_name.format.path.parent == copy and shown[-1].startswith("LingBot-World Fast: read ")


def test_the_expert_loader_makes_both_nf4_copies_once(comfy, release, shown):
    from lingbot_world.nodes import NODE_CLASS_MAPPINGS as N

    loader = N["LingBotExpertLoader"]()
    # a copy's name whose release folder is installed: it is made from the release (and the check lets it pass)
    names = ("lingbot-world-base-cam/high_noise_model", "lingbot-world-base-cam/low_noise_model_bnb_nf4")
    assert loader.VALIDATE_INPUTS(*names) is True
    pair = loader.load(*names, "nf4", "swap", -1)[0]
    assert {k: f.path.parent.name for k, f in pair.formats.items()} == {"high": "high_noise_model_bnb_nf4",
                                                                  "low": "low_noise_model_bnb_nf4"}
    assert shown[-1] == ("high-noise: made the NF4 copy high_noise_model_bnb_nf4 of high_noise_model (first load); "
                         "later loads read it; low-noise: made the NF4 copy low_noise_model_bnb_nf4 of "
                         "low_noise_model (first load); later loads read it")
    shown.clear()
    loader.load(*names, "nf4", "swap", -1)
    assert shown[-1] == ("high-noise: read the NF4 copy high_noise_model_bnb_nf4 beside high_noise_model; low-noise: "
                         "read low_noise_model_bnb_nf4 as it is")
    shown.clear()
    loader.load("lingbot-world-base-cam/high_noise_model", "lingbot-world-base-cam/low_noise_model", "bf16", "swap",
                -1)
    assert shown == []  # bf16 reads the release's own files: no copy, nothing to say
