"""Speed options of a run: compile, compute (GEMM precision) and attention kernel, checked before anything
loads and applied to each expert when it is placed on the device.

    options = SpeedOptions(compile="auto", compute="fp8", attention="auto")
    plan = resolve_speed(options, device)      # SpeedOptionError (one line) if an explicit choice cannot run
    for line in plan.notes: log.info(line)     # what `auto` picked and why
    apply_speed(model, plan)                   # after every load of an expert (cheap: flags and shared code)

`auto` picks per GPU and says why: compile when Triton is there; the attention kernel that is fastest and exact
for the GPU (cuDNN FP8 attention instead when compute is FP8 too: the user chose approximate maths); compute FP8
on cards with FP8 tensor cores (sm89+), INT8 on Ampere (sm80-86), bf16 otherwise. An
explicit choice the machine cannot run is refused; `auto` instead falls back to the exact path.
"""
from __future__ import annotations

import dataclasses
import logging
import os
from dataclasses import dataclass, field
from typing import Optional

import torch

from ..quant import compute as qcompute
from ..quant import fp8, int8, nf4_rows, rowwise_triton
from ..quant.lowp_kinds import LOWP_WEIGHTS
from ..wan.dit import attention as attn
from . import compile as compile_mod
from .block_graphs import BlockGraphs
from .levers import ChunkLevers

log = logging.getLogger(__name__)

COMPILE_CHOICES = ("auto", "off", "blocks", "graphs")
COMPUTE_CHOICES = ("auto", "bf16", "fp8", "int8", "fp16acc")
ATTENTION_CHOICES = attn.CHOICES  # auto, sdpa, sage, flash, fp8, cudnn
DEFAULTS = {"compile": "auto", "compute": "bf16", "attention": "auto"}


class SpeedOptionError(ValueError):
    """An explicitly chosen speed option cannot run on this machine (the message is one line)."""


@dataclass(frozen=True)
class SpeedOptions:
    compile: str = DEFAULTS["compile"]
    compute: str = DEFAULTS["compute"]
    attention: str = DEFAULTS["attention"]

    def validate(self) -> None:
        for name, value, allowed in (("compile", self.compile, COMPILE_CHOICES),
                                     ("compute", self.compute, COMPUTE_CHOICES),
                                     ("attention", self.attention, ATTENTION_CHOICES)):
            if value not in allowed:
                raise SpeedOptionError(f"{name}={value!r} is not an option; choose one of {', '.join(allowed)}")


@dataclass
class SpeedPlan:
    """What runs: compile "off"/"blocks"/"graphs" (compiled only inside CUDA graphs: fit_to_model), compute "bf16"/
    "fp8"/"int8"/"fp16acc" (the DiT then computes in fp16: activation_dtype), attention "sdpa"/"sage"/"flash"/"fp8"/
    "cudnn"."""

    compile: str
    compute: str
    attention: str
    device: str
    sdpa_order: Optional[tuple] = None
    notes: list[str] = field(default_factory=list)
    # False: a compiler error mid-run logs one line and that phase runs eagerly (the same maths); the preflight
    # has already refused machines that cannot compile at all. True (tests, debugging): the error is raised.
    strict_compile: bool = False
    # The speed preset that made the plan (speed/presets.py; None: the flags alone) and its Fast chunk-loop levers.
    preset: Optional[str] = None
    levers: ChunkLevers = field(default_factory=ChunkLevers)
    compile_requested: str = ""  # what was asked for ("auto" lets fit_to_model decide per model)

    def fast_run_options(self, recipe) -> dict:
        """FastRun keyword options of the plan's chunk levers on a model of `recipe` (a ChunkRecipe; empty for the
        release's schedule)."""
        return self.levers.fast_run_options(recipe)

    def fast_window(self, window_frames: Optional[int], latent_frames: Optional[int] = None) -> Optional[int]:
        """The K/V window (latent frames) a Fast run uses under this plan: the run's, capped by the levers."""
        return self.levers.window(window_frames, latent_frames)

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d["sdpa_order"] = list(self.sdpa_order) if self.sdpa_order else None
        return d

    def summary(self) -> str:
        order = f" ({'>'.join(self.sdpa_order)})" if self.attention == "sdpa" and self.sdpa_order else ""
        head = f"preset={self.preset}, " if self.preset else ""
        return f"{head}compile={self.compile}, compute={self.compute}, attention={self.attention}{order}"


def _resolve_compile(choice: str, device: torch.device, notes: list) -> str:
    if choice == "off":
        return "off"
    if choice == "auto" and device.type != "cuda":  # decided without asking the compiler (importing it takes seconds)
        notes.append("compile auto: off on the CPU (building the kernels takes longer than they save here)")
        return "off"
    reason = compile_mod.unavailable_reason(device)
    if choice in ("blocks", "graphs"):  # graphs: compiled only where CUDA graphs replay the blocks (fit_to_model)
        if reason:
            raise SpeedOptionError(f"--compile {choice}: {reason}; use --compile off (or auto)")
        return choice
    if reason:
        notes.append(f"compile auto: off, {reason}; running eagerly (same results)")
        return "off"
    notes.append("compile auto: blocks (the DiT's per-token phases through torch.compile; the first steps "
                 "include compiling, later runs load the kernels from the cache)")
    return "blocks"


def _resolve_compute(choice: str, device: torch.device, weights: str, notes: list) -> str:
    if choice == "bf16":
        return "bf16"
    if weights != "nf4":
        if choice == "auto":
            notes.append(f"compute auto: the {weights.upper()} weights' GEMMs run in {weights.upper()} as stored "
                         "(--compute picks the GEMMs of NF4 weights)" if weights in LOWP_WEIGHTS else
                         f"compute auto: bf16 (low-precision compute applies to NF4 weights, not {weights})")
            return "bf16"
        raise SpeedOptionError(f"--compute {choice} works with NF4 weights; with --weights {weights} use "
                               "--compute bf16")
    if choice in ("fp8", "int8", "fp16acc"):
        reason = qcompute.unavailable_reason(choice, device)
        if reason:
            raise SpeedOptionError(f"--compute {choice}: {reason}; use --compute bf16 (or auto)")
        return choice
    mode, why = qcompute.auto_mode(device)
    notes.append(f"compute auto: {mode} ({why})")
    return mode


def _resolve_attention(choice: str, device: torch.device, notes: list, compute: str = "bf16") -> str:
    from ..wan.dit import attention_fp8

    if choice == "fp8":
        problem = attention_fp8.unavailable_reason(device) or attention_fp8.probe(device)
        if problem:
            raise SpeedOptionError(f"--attention fp8: {problem}; use --attention auto")
        return "fp8"
    if choice == "cudnn":
        from ..wan.dit import attention_cudnn

        problem = attention_cudnn.unavailable_reason(device) or attention_cudnn.probe(device, attn.cudnn_kernel)
        if problem:
            raise SpeedOptionError(f"--attention cudnn: {problem}; use --attention auto")
        return "cudnn"
    if choice == "auto" and compute == "fp8":
        problem = attention_fp8.unavailable_reason(device) or attention_fp8.probe(device)
        if not problem:
            notes.append("attention auto: fp8 (cuDNN FP8 attention for the video self-attention, since compute is "
                         "FP8; --attention sdpa keeps attention exact)")
            return "fp8"
        notes.append(f"attention auto: not FP8 ({problem})")
    if choice in ("sage", "flash"):
        if choice not in attn.available_backends():
            pkg = "sageattention" if choice == "sage" else "flash-attn (or FlashAttention-3)"
            raise SpeedOptionError(f"--attention {choice}: {pkg} is not installed; install it or use "
                                   "--attention auto")
        if device.type != "cuda":
            raise SpeedOptionError(f"--attention {choice} needs a CUDA GPU; use --attention auto on the CPU")
        if choice == "sage":
            problem = attn.probe_sage(device)
            if problem:
                raise SpeedOptionError(f"--attention sage: {problem}; use --attention auto")
        return choice
    order = attn.sdpa_kernel_order(device)
    if choice == "auto" and order:
        notes.append(f"attention auto: torch SDPA, kernels tried in the order {' > '.join(order)} "
                     f"(the fastest exact one on sm{''.join(map(str, torch.cuda.get_device_capability(device)))})")
    return "sdpa"


def resolve_speed(options: SpeedOptions, device, weights: str = "nf4") -> SpeedPlan:
    """Decide what runs on `device`, before any weights load. Raises SpeedOptionError for explicit choices the
    machine cannot run; `auto` choices fall back to the exact path and say so in `plan.notes`."""
    options.validate()
    device = torch.device(device)
    if device.type == "cuda" and device.index is None and torch.cuda.is_available():
        device = torch.device("cuda", torch.cuda.current_device())
    notes: list[str] = []
    compiled = _resolve_compile(options.compile, device, notes)
    compute = _resolve_compute(options.compute, device, weights, notes)
    plan = SpeedPlan(
        compile=compiled,
        compute=compute,
        attention=_resolve_attention(options.attention, device, notes, compute),
        device=str(device),
        notes=notes,
        compile_requested=options.compile,
    )
    plan.sdpa_order = attn.sdpa_kernel_order(device) if plan.attention == "sdpa" else None
    if compute == "fp16acc":
        notes.append("fp16acc: the DiT's GEMMs, attention and K/V cache run in fp16 (largest value 65504); its "
                     "residual stream, time modulation and head stay float32")
    if compute in ("fp8", "int8"):
        why_not = rowwise_triton.unavailable_reason(device)
        notes.append(f"{compute} activations and weights quantized by " + (
            "the one-pass Triton row kernel" if why_not is None else f"torch's quantizers ({why_not})"))
        why_not = nf4_rows.unavailable_reason(device)
        notes.append(f"NF4 weights to {compute} rows " + (
            "in one Triton kernel" if why_not is None else f"in two passes, bnb's dequantize + the quantizer ({why_not})"))
    return plan


GELU_EPILOGUE_ENV = "LINGBOT_GELU_EPILOGUE"  # "0": compiled phases keep the FFN's GELU out of its GEMM
GRAPHS_ENV = "LINGBOT_CUDA_GRAPHS"  # "1" / "0": replay the causal model's blocks from CUDA graphs, or never
GRAPHS_ON = ("1", "true", "yes", "on")
GRAPHS_OFF = ("0", "false", "no", "off")
# Models narrower than this replay their blocks from CUDA graphs by default: their kernels are small, so a chunk
# waits on the host's launches (v2 1.3B on an H200: a rolled 2-step draft chunk 0.24 s with graphs against 0.41 s).
GRAPHS_BELOW_DIM = 5120


def fit_to_model(plan: Optional[SpeedPlan], cfg) -> Optional[SpeedPlan]:
    """The plan for a model of `cfg`: `--compile auto` on a model narrower than the 14B compiles its per-token work
    only where CUDA graphs replay it ("graphs"), and runs it eagerly before the window rolls and without graphs
    ("off"). Its kernels are small: launched from Python, compiled phases cost the host more than they save the GPU
    (v2 1.3B on an H200: 0.905 s of DiT per chunk compiled against 0.657 s eager), while replayed from graphs
    they cost no launches and save it 14 % of a rolled `auto` chunk (0.572 against 0.665 s; BENCHMARKS)."""
    if plan is None or plan.compile != "blocks" or plan.compile_requested != "auto" or cfg.dim >= GRAPHS_BELOW_DIM:
        return plan
    graphs = graphs_enabled(plan.device, cfg)
    note = (f"compile auto: a model {cfg.dim} wide launches small kernels, so its per-token work is compiled only "
            "into the CUDA graphs that replay its blocks once the window rolls (eager before)" if graphs else
            f"compile auto: off for a model {cfg.dim} wide without CUDA graphs (its small kernels wait on the host: "
            "compiling its per-token work makes a chunk slower)")
    notes = [n for n in plan.notes if not n.startswith("compile auto:")]
    return dataclasses.replace(plan, compile="graphs" if graphs else "off", notes=[note] + notes)


def graphs_enabled(device, cfg=None) -> bool:
    """Whether the causal model's blocks replay CUDA graphs once its K/V window rolls (speed/block_graphs.py), on a
    CUDA GPU: LINGBOT_CUDA_GRAPHS=1 / 0 decides; unset, on for a model narrower than the 14B (`cfg`: its DiTConfig;
    the same bits, about 0.6 GB of VRAM). The 14B models keep them off: on an H100 they gave 2-3 % of a played
    `draft` chunk for 0.9 GB more VRAM (BENCHMARKS, "CUDA graphs")."""
    if torch.device(device).type != "cuda":
        return False
    choice = os.environ.get(GRAPHS_ENV, "").strip().lower()
    if choice in GRAPHS_ON or choice in GRAPHS_OFF:
        return choice in GRAPHS_ON
    return cfg is not None and cfg.dim < GRAPHS_BELOW_DIM


def activation_dtype(compute: str) -> Optional[torch.dtype]:
    """The dtype the DiT computes in under `compute`: float16 for fp16acc (its GEMMs take and give fp16, so the
    activations, attention and K/V cache stay fp16 and no cast surrounds a GEMM), None (the load's) otherwise."""
    return torch.float16 if compute == "fp16acc" else None


def apply_speed(model: torch.nn.Module, plan: SpeedPlan) -> torch.nn.Module:
    """Set the plan on a loaded DiT: attention kernel (process-wide), compute dtype (activation_dtype; another plan
    restores the load's) and compute mode of every NF4 linear, compiled or eager per-token phases on every block and
    the head, CUDA graphs for a rolling K/V window's blocks where opted in. Cheap; call it after each load and before
    the K/V cache and camera FiLM cache are made (they take the model's compute dtype; a new plan drops the graphs
    of the old one)."""
    attn.set_backend(plan.attention, torch.device(plan.device), plan.sdpa_order)
    if hasattr(model, "set_compute_dtype"):
        model.set_compute_dtype(activation_dtype(plan.compute))
    # before the graphs' build below: its forward compiles the phases for the dtype and GEMMs the run uses
    lowp_ops = compiled_quantizers(plan.strict_compile) if plan.compile == "blocks" else eager_quantizers()
    for module in model.modules():
        if hasattr(module, "set_compute"):
            module.set_compute(plan.compute, ops=lowp_ops)
    if plan.compile in ("blocks", "graphs"):
        compile_mod.configure_cache()
    if plan.attention == "fp8":
        from ..wan.dit import attention_fp8

        kernel = attn.fp8_kernel()
        compiled = plan.compile == "blocks"
        kernel.cast = compile_mod.compiled(attention_fp8.cast, plan.strict_compile) if compiled \
            else attention_fp8.cast
        kernel.dequantizer = compile_mod.compiled(attention_fp8.dequantize, plan.strict_compile) if compiled \
            else attention_fp8.dequantize
    from ..wan.dit.token_ops import EAGER

    ops = compiled_token_ops(plan.strict_compile) if plan.compile == "blocks" else EAGER
    if hasattr(model, "set_token_ops"):
        model.set_token_ops(ops)
    if hasattr(model, "block_runner"):
        on = graphs_enabled(plan.device, getattr(model, "cfg", None))
        graph_ops = compiled_token_ops(plan.strict_compile) if plan.compile == "graphs" else None
        model.block_runner = BlockGraphs(torch.device(plan.device), ops=graph_ops) if on else None
        if graph_ops is not None and model.block_runner is not None:
            model.block_runner.build(model)  # compiled at load, not at the first rolled chunk of a played video
        if model.block_runner is not None:
            log.info("speed: CUDA graphs on (%s): once a K/V window rolls, the blocks replay captured graphs",
                     GRAPHS_ENV)
    return model


def compiled_token_ops(strict: bool = False):
    """The DiT's per-token phases through torch.compile, shared by every model in the process. They put the FFN's
    GELU into its GEMM's epilogue where the GEMM is bf16 (TokenOps.gelu_in_gemm; GELU_EPILOGUE_ENV=0 keeps it a
    phase of its own): compiled phases already round in another order than eager ones."""
    from ..wan.dit.token_ops import TokenOps

    gelu_in_gemm = os.environ.get(GELU_EPILOGUE_ENV, "1").strip() != "0"
    return TokenOps(lambda fn: compile_mod.compiled(fn, strict), name="compiled" + ("-strict" if strict else ""),
                    gelu_in_gemm=gelu_in_gemm)


def compiled_quantizers(strict: bool = False) -> dict:
    """The FP8/INT8 activation and weight quantizers and the INT8 rescale: the one-pass Triton row kernel where it
    runs (quant/rowwise_triton.py), else torch.compile's fused kernel."""
    return _quantizers(lambda fn: compile_mod.compiled(fn, strict))


def eager_quantizers() -> dict:
    """The same without compile: the Triton row kernel where it runs, else the torch ops."""
    return _quantizers(lambda fn: fn)


def _quantizers(wrap) -> dict:
    return {
        "fp8": rowwise_triton.preferring_kernel("fp8", wrap(fp8.quantize_rows)),
        "fp8_weight": rowwise_triton.preferring_kernel_weight("fp8", wrap(fp8.quantize_weight)),
        "int8": rowwise_triton.preferring_kernel("int8", wrap(int8.quantize_rows)),
        "int8_weight": rowwise_triton.preferring_kernel_weight("int8", wrap(int8.quantize_weight)),
        "int8_rescale": wrap(int8.rescale),
        "nf4_fp8": nf4_rows.preferring_kernel("fp8"),  # NF4 weight -> FP8 rows in one kernel (quant/nf4_rows.py)
        "nf4_int8": nf4_rows.preferring_kernel("int8"),
    }
