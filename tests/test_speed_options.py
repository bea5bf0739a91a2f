"""Speed options (issue 15): what `auto` picks and says, one clear line for an explicit choice the machine cannot
run (before anything loads), applying a plan to a model, the CLI flags, the node, and the attention backend
choice (kernel order per GPU, the first-call check of sage/flash)."""
from __future__ import annotations

import pytest
import torch

from lingbot_world.quant.nf4 import NF4Linear
from lingbot_world.speed import compile as compile_mod
from lingbot_world.speed import options
from lingbot_world.speed.options import SpeedOptionError, SpeedOptions, apply_speed, resolve_speed
from lingbot_world.wan.dit import attention as attn
from lingbot_world.wan.dit import token_ops
from lingbot_world.wan.dit.model import DiTConfig, WanDiT

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def _restore_attention():
    yield
    attn.set_backend("sdpa", CPU)


def test_defaults_on_the_cpu_are_the_exact_path():
    plan = resolve_speed(SpeedOptions(), CPU)
    assert (plan.compile, plan.compute, plan.attention) == ("off", "bf16", "sdpa")
    assert any("compile auto: off" in n for n in plan.notes)
    assert plan.summary() == "compile=off, compute=bf16, attention=sdpa"
    auto = resolve_speed(SpeedOptions(compile="auto", compute="auto", attention="auto"), CPU)
    assert auto.compute == "bf16" and any("compute auto: bf16" in n for n in auto.notes)


@pytest.mark.parametrize("opts,match", [
    (SpeedOptions(compute="fp8"), r"--compute fp8: .*CUDA GPU.*use --compute bf16"),
    (SpeedOptions(compute="int8"), r"--compute int8: .*CUDA GPU"),
    (SpeedOptions(attention="flash"), r"--attention flash: flash-attn.* not installed|needs a CUDA GPU"),
    (SpeedOptions(compile="everything"), r"compile='everything' is not an option"),
])
def test_explicit_choices_that_cannot_run_are_refused_in_one_line(opts, match):
    with pytest.raises(SpeedOptionError, match=match) as e:
        resolve_speed(opts, CPU)
    assert "\n" not in str(e.value)


def test_sage_not_installed_is_refused(monkeypatch):
    monkeypatch.setattr(attn, "available_backends", lambda: ["sdpa"])
    with pytest.raises(SpeedOptionError, match="sageattention is not installed"):
        resolve_speed(SpeedOptions(attention="sage"), CPU)


def test_fp8_needs_nf4_weights():
    with pytest.raises(SpeedOptionError, match="--compute fp8 works with NF4 weights"):
        resolve_speed(SpeedOptions(compute="fp8"), CPU, weights="bf16")
    assert resolve_speed(SpeedOptions(compute="auto"), CPU, weights="bf16").compute == "bf16"


def test_compile_without_a_compiler(monkeypatch):
    monkeypatch.setattr(compile_mod, "unavailable_reason", lambda device: "torch.compile needs Triton (test)")
    with pytest.raises(SpeedOptionError, match="--compile blocks: torch.compile needs Triton"):
        resolve_speed(SpeedOptions(compile="blocks"), CPU)
    # auto on a GPU without Triton: eager, and the log says why
    monkeypatch.setattr(options.attn, "sdpa_kernel_order", lambda device=None: None)
    notes: list = []
    assert options._resolve_compile("auto", torch.device("cuda"), notes) == "off"
    assert "needs Triton" in notes[0]


def test_compile_blocks_is_allowed_on_a_cpu_with_a_compiler(monkeypatch):
    monkeypatch.setattr(compile_mod, "unavailable_reason", lambda device: None)
    plan = resolve_speed(SpeedOptions(compile="blocks"), CPU)
    assert plan.compile == "blocks" and not plan.strict_compile  # a mid-run compiler error falls back to eager


def test_inductor_cache_is_persistent_and_configurable(tmp_path, monkeypatch):
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv(compile_mod.CACHE_ENV, raising=False)
    assert compile_mod.configure_cache() == tmp_path / "xdg" / "lingbot-world" / "inductor"
    monkeypatch.setenv(compile_mod.CACHE_ENV, str(tmp_path / "mine"))
    assert compile_mod.configure_cache() == tmp_path / "mine"
    import os

    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "mine") and (tmp_path / "mine").is_dir()


def test_apply_speed_sets_every_layer(monkeypatch):
    from lingbot_world.quant.nf4 import replace_linears_with_nf4

    cfg = DiTConfig.tiny()
    model = WanDiT(cfg, device="meta")
    replace_linears_with_nf4(model, cfg.num_layers, torch.bfloat16)
    plan = options.SpeedPlan(compile="off", compute="int8", attention="sdpa", device="cpu")
    apply_speed(model, plan)
    linears = [m for m in model.modules() if isinstance(m, NF4Linear)]
    assert len(linears) == 9 + 14 * cfg.num_layers and all(m.compute_mode == "int8" for m in linears)
    assert all(b.ops is token_ops.EAGER for b in model.blocks) and model.token_ops is token_ops.EAGER
    monkeypatch.setattr(compile_mod, "BACKEND", "aot_eager")
    apply_speed(model, options.SpeedPlan(compile="blocks", compute="bf16", attention="sdpa", device="cpu"))
    assert all(isinstance(b.ops.gelu_tanh, compile_mod.CompiledFn) for b in model.blocks)
    assert all(isinstance(b.ops.modulate, compile_mod.CompiledFn) for b in model.blocks)
    assert model.blocks[0].ops.modulate is model.blocks[1].ops.modulate  # one compiled function for all
    assert all(m.compute_mode == "bf16" and m._lowp_ops is not None for m in linears)


# ---- attention -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("cap,order", [((9, 0), ("cudnn", "flash", "efficient", "math")),
                                       ((8, 6), ("flash", "cudnn", "efficient", "math")),
                                       ((8, 9), ("flash", "cudnn", "efficient", "math")),
                                       ((7, 5), ("efficient", "math"))])
def test_sdpa_kernel_order_per_gpu(monkeypatch, cap, order):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: cap)
    assert attn.sdpa_kernel_order(torch.device("cuda")) == order
    assert attn.sdpa_kernel_order(CPU) is None


def test_set_backend():
    assert attn.set_backend("auto", CPU) == "sdpa" and attn.get_sdpa_order() is None
    attn.set_backend("sdpa", CPU, sdpa_order=("math",))
    assert attn.get_sdpa_order() == ("math",)
    with pytest.raises(ValueError, match="unknown SDPA kernel"):
        attn.set_backend("sdpa", CPU, sdpa_order=("fastest",))
    with pytest.raises(ValueError, match="unknown attention backend"):
        attn.set_backend("xformers")


def test_a_kernel_that_disagrees_with_sdpa_is_caught(monkeypatch):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 64, 2, 32, generator=g) for _ in range(3))
    monkeypatch.setattr(attn, "_kernel", lambda name, q, k, v: attn.sdpa(q, k, v))
    assert attn.check_against_sdpa("sage", q, k, v) < 1e-2
    monkeypatch.setattr(attn, "_kernel", lambda name, q, k, v: torch.zeros_like(q))  # "black video"
    assert attn.check_against_sdpa("sage", q, k, v) > attn.SAGE_MAX_REL_ERROR
    monkeypatch.setattr(attn, "_kernel", lambda name, q, k, v: torch.full_like(q, float("nan")))
    assert attn.check_against_sdpa("sage", q, k, v) == float("inf")


# ---- CLI and node ------------------------------------------------------------------------------------------------
def test_cli_refuses_before_loading(monkeypatch, tmp_path, capsys):
    from lingbot_world.cli import main

    touched = []
    import lingbot_world.world.base as base

    monkeypatch.setattr(base, "base_files", lambda source: touched.append("files"))
    assert main(["generate", "--demo", "--compute", "fp8", "--out", str(tmp_path / "x.mp4")]) == 2
    err = capsys.readouterr().err.strip()
    assert "--compute fp8" in err and "\n" not in err
    assert touched == []  # stopped before finding, loading or encoding anything


def test_cli_has_the_speed_flags():
    import argparse

    from lingbot_world.cli.generate import add_parser

    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    args = parser.parse_args(["generate", "--compile", "blocks", "--compute", "int8", "--attention", "sage"])
    assert (args.compile, args.compute, args.attention) == ("blocks", "int8", "sage")
    args = parser.parse_args(["generate"])
    assert (args.compile, args.compute, args.attention) == ("auto", "bf16", "auto")


def test_speed_node_declares_the_choices():
    from lingbot_world.nodes.speed import LingBotSpeedOptions

    req = LingBotSpeedOptions.INPUT_TYPES()["required"]
    assert req["compile"][0] == ["from preset", *options.COMPILE_CHOICES]
    assert req["compute"][0] == ["from preset", *options.COMPUTE_CHOICES]
    assert req["attention"][0] == ["from preset", *options.ATTENTION_CHOICES]
    assert all(req[name][1]["default"] == "from preset" for name in ("compile", "compute", "attention"))


def test_compile_graphs_hands_the_compiled_phases_to_the_graphs_only(monkeypatch, tmp_path):
    """compile="graphs" (a narrow model's `auto`): the blocks keep their eager phases for the forwards launched
    from Python; the CUDA graphs' runner gets the compiled ones to capture."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(options, "graphs_enabled", lambda device, cfg=None: True)
    built = []
    monkeypatch.setattr(options.BlockGraphs, "build", lambda runner, m: built.append(m))
    model = WanDiT(DiTConfig.tiny(), device="meta")
    apply_speed(model, options.SpeedPlan(compile="graphs", compute="bf16", attention="sdpa", device="cpu"))
    assert all(b.ops is token_ops.EAGER for b in model.blocks) and model.token_ops is token_ops.EAGER
    assert model.block_runner is not None and model.block_runner.ops.name.startswith("compiled")
    assert built == [model]  # compiled at load (BlockGraphs.build), not at the first rolled chunk
    apply_speed(model, options.SpeedPlan(compile="off", compute="bf16", attention="sdpa", device="cpu"))
    assert model.block_runner.ops is None and built == [model]
