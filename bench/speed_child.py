"""bench_speed's children: one case in a process of its own: a forward case (the expert loaded, its speed plan
applied, timed forwards, the profile, the 4-step error run, outputs saved), the attention kernels, and every path's
error on the tiny config."""
from __future__ import annotations

import os
import time
from pathlib import Path

import torch

from ..wan.dit.model import DiTConfig
from .pipeline_setup import apply_cap, make_inputs, schedule, sync
from .speed_cases import CASES, FORWARD, TINY_SMALL_VIDEO, TINY_VIDEO
from .speed_profile import profile_split


def _plan_for(spec: dict, device: torch.device):
    from ..speed.options import SpeedOptions, SpeedOptionError, SpeedPlan, resolve_speed

    opts = SpeedOptions(compile=spec.get("compile", "off"), compute=spec.get("compute", "bf16"),
                        attention=spec.get("attention", "sdpa"))
    try:
        return resolve_speed(opts, device)
    except SpeedOptionError:
        if not spec["tiny"]:
            raise
        # CPU smoke run: exercise the low-precision paths through their CPU emulation anyway.
        return SpeedPlan(compile=opts.compile, compute=opts.compute, attention="sdpa", device=str(device),
                         strict_compile=True)


def _forward_setup(spec: dict):
    """Model (speed plan applied), inputs and the forward closure for a forward case."""
    from ..loaders.expert_loader import load_expert
    from ..speed import compile as compile_mod
    from ..speed.options import apply_speed
    from ..wan.dit import attention as attn
    from ..wan.sampling.sampler import make_noise

    device = torch.device(spec["device"])
    cfg = DiTConfig.from_json(spec["config"])
    info: dict = {}
    from ..speed.options import GELU_EPILOGUE_ENV

    if spec.get("gelu_epilogue") is not None:  # compiled phases: the FFN's GELU in the GEMM epilogue or its own
        os.environ[GELU_EPILOGUE_ENV] = "1" if spec["gelu_epilogue"] else "0"
    info["ffn_gelu_epilogue"] = os.environ.get(GELU_EPILOGUE_ENV, "1") != "0"
    if spec.get("compile") == "blocks":
        info["inductor_cache"] = str(compile_mod.configure_cache(Path(spec["workdir"]) / "inductor"))
        if spec.get("inductor_options") is not None:
            compile_mod.INDUCTOR_OPTIONS = spec["inductor_options"]
        if device.type == "cpu":
            compile_mod.BACKEND = "aot_eager"  # the smoke run checks the plumbing, not the C++ build
        info["inductor_options"] = compile_mod.inductor_options(compile_mod.BACKEND)
    dtype = torch.bfloat16 if spec["tiny"] else None  # the CPU smoke run computes in bf16 like a GPU
    model = load_expert(spec["expert"], device=device, compute_dtype=dtype)
    model.set_token_chunk(spec["chunk"])
    if spec.get("legacy"):
        attn.set_backend("sdpa", device, sdpa_order=())  # torch's own kernel order, as before issue 15
        info["plan"] = "legacy block, bitsandbytes forward, torch's default SDPA"
    else:
        plan = _plan_for(spec, device)
        plan.strict_compile = False  # a phase that fails to compile runs eagerly and is listed in compile_stats
        apply_speed(model, plan)
        info["plan"] = plan.to_json()
        if spec["tiny"]:
            for m in model.modules():
                if hasattr(m, "lowp_min_rows"):
                    m.lowp_min_rows = 1
    inputs = make_inputs(tuple(spec["video"]), cfg, device)
    noise = make_noise(inputs["shape"], 1, source="cuda" if device.type == "cuda" else "cpu").to(device)
    t = torch.tensor([900], device=device)
    film = {"film": make_film_cache(spec, cfg, device)} if spec.get("film") else {}

    def forward(ctx):
        with torch.inference_mode():
            return model(noise, t, ctx, inputs["y"], camera=inputs["camera"], **film)

    def layered_step():
        """A whole CFG step as the sampler's layered mode calls it: [cond, uncond] from one model call."""
        with torch.inference_mode():
            both = torch.cat([inputs["ctx"], inputs["neg"]])
            return model(noise.expand(2, *noise.shape[1:]), t.expand(2), both, inputs["y"], camera=inputs["camera"],
                         layered=True, shared_input=True, **film)

    info["cfg_mode"] = spec.get("cfg", "sequential")
    if film:
        info["film_cache"] = film["film"]
    return model, inputs, (layered_step if spec.get("cfg") == "layered" else forward), info


def make_film_cache(spec: dict, cfg: DiTConfig, device: torch.device):
    """Every block's camera FiLM in pinned host memory ("host") or on the device ("device")."""
    from ..memory.film_stream import HostFilmStore
    from ..wan.dit.film_cache import FilmCache

    if spec["film"] == "device":
        return FilmCache.on_device(cfg.num_layers)
    return FilmCache(host_blocks=range(cfg.num_layers), host_store=HostFilmStore(device))


def _small_run(model, spec: dict, device: torch.device) -> tuple[torch.Tensor, float]:
    """4 sampling steps (2 + 2, the same expert for both phases) at a small size: the whole-run error check."""
    from ..wan.sampling.sampler import ResidentExperts, make_noise, sample

    cfg = DiTConfig.from_json(spec["config"])
    inputs = make_inputs(tuple(spec["small_video"]), cfg, device, seed=3)
    settings = schedule(2, 2)
    settings.cfg_mode = spec.get("cfg", "sequential")
    noise = make_noise(inputs["shape"], 7, source="cuda" if device.type == "cuda" else "cpu")
    cache = make_film_cache(spec, cfg, device) if spec.get("film") else None
    sync(device)
    t0 = time.perf_counter()
    try:
        with torch.inference_mode():
            latent = sample(ResidentExperts(model, model), noise, inputs["ctx"], inputs["neg"], inputs["y"],
                            inputs["camera"], settings, device=device, camera_cache=cache)
        sync(device)
    finally:
        if cache is not None:
            cache.close()
    return latent, time.perf_counter() - t0


def _save(path: Path, tensor: torch.Tensor) -> None:
    from safetensors.torch import save_file

    tmp = path.with_suffix(".tmp")
    save_file({"t": tensor.detach().float().cpu().contiguous()}, str(tmp))
    os.replace(tmp, path)


def child_forward(spec: dict) -> dict:
    from contextlib import nullcontext

    from ..speed import compile as compile_mod
    from .legacy_block import legacy_forward

    device = torch.device(spec["device"])
    out: dict = {"cap_bytes": apply_cap(device, spec.get("cap_gib"), spec["context_gib"])}
    if device.type == "cuda":
        torch.empty(1, device=device)
    workdir = Path(spec["workdir"])
    with legacy_forward() if spec.get("legacy") else nullcontext():
        t_load = time.perf_counter()
        model, inputs, forward, info = _forward_setup(spec)
        film = info.pop("film_cache", None)
        sync(device)
        out.update(info, load_seconds=round(time.perf_counter() - t_load, 2))
        if device.type == "cuda":
            out["weights_allocated"] = torch.cuda.memory_allocated(device)
            torch.cuda.reset_peak_memory_stats(device)
        # Layered: one call is a whole step (cond and uncond); sequential: a step is two forwards.
        layered = spec.get("cfg") == "layered"
        step = (lambda: forward()) if layered else (lambda: (forward(inputs["ctx"]), forward(inputs["neg"])))
        # First forward: includes compiling (compile cases) and one-time kernel selection.
        t0 = time.perf_counter()
        first = forward() if layered else forward(inputs["ctx"])
        sync(device)
        out["first_forward_seconds"] = round(time.perf_counter() - t0, 3)
        out["finite"] = bool(torch.isfinite(first).all())
        _save(workdir / f"out_{spec['case']}.safetensors", first[0])  # the cond output (a layered call's first half)
        del first
        t0 = time.perf_counter()
        if layered:
            forward()
        else:
            forward(inputs["neg"])
        sync(device)
        out["second_forward_seconds"] = round(time.perf_counter() - t0, 3)
        steps = []
        for _ in range(spec["timed"]):
            t0 = time.perf_counter()
            step()
            sync(device)
            steps.append(time.perf_counter() - t0)
        if film is not None:
            # a forward that reads every block's values: the output compared bit for bit with the twin's first one
            last = forward() if layered else forward(inputs["ctx"])
            _save(workdir / f"out_{spec['case']}.safetensors", last[0])
            del last
            out["film_cache"] = {**film.to_json(), **film.stores["host"].stats()} if "host" in film.stores \
                else film.to_json()
        out["step_seconds"] = [round(s, 3) for s in steps]
        out["s_per_step"] = round(sum(steps) / len(steps), 3)
        out["s_per_forward"] = round(out["s_per_step"] / 2, 3)  # layered: half a step, per pass
        if device.type == "cuda":
            out["peak_allocated"] = torch.cuda.max_memory_allocated(device)
            out["peak_reserved"] = torch.cuda.max_memory_reserved(device)
            out["activation_peak"] = out["peak_allocated"] - out["weights_allocated"]
        out["compile_stats"] = compile_mod.STATS.to_json()
        from ..wan.dit import attention as attn

        out["attention"] = {"backend_in_use": attn.get_backend(), "sdpa_order": attn.get_sdpa_order(),
                            "first_call_checks": dict(attn.CHECKS)}
        if spec.get("profile") and layered:  # one layered call is both passes: the split per pass, like the others
            prof = profile_split(forward, device)
            prof["seconds"] = {k: round(v / 2, 4) for k, v in prof["seconds"].items()}
            prof["kernel_seconds"] = round(prof["kernel_seconds"] / 2, 4)
            prof["per"] = "pass (half of one layered call)"
            out["profile"] = prof
        elif spec.get("profile"):
            out["profile"] = profile_split(lambda: forward(inputs["ctx"]), device)
        if spec.get("small_run"):
            latent, seconds = _small_run(model, spec, device)
            out["small_run_seconds"] = round(seconds, 2)
            out["small_run_finite"] = bool(torch.isfinite(latent).all())
            _save(workdir / f"small_{spec['case']}.safetensors", latent)
    return out


def child_attention(spec: dict) -> dict:
    """SDPA kernels (and installed packages) on the full-size self-attention: ms, TFLOP/s, error vs float32."""
    from ..wan.dit import attention as attn

    device = torch.device(spec["device"])
    b, seq, heads, hd = spec["attn_shape"]
    g = torch.Generator(device=device).manual_seed(0)
    dtype = torch.bfloat16
    q, k, v = (torch.randn(b, seq, heads, hd, device=device, generator=g, dtype=dtype) for _ in range(3))
    flops = 4 * b * heads * seq * seq * hd
    nq = min(seq, 1024)
    ref = attn.sdpa(q[:, :nq].float(), k.float(), v.float())  # float32 reference for the first queries
    out: dict = {"shape": [b, seq, heads, hd], "flops": flops, "order_auto": attn.sdpa_kernel_order(device)}
    runs = {f"sdpa_{kname}": (lambda kname=kname: attn.sdpa(q, k, v, (kname,))) for kname in
            (("cudnn", "flash", "efficient") if device.type == "cuda" else ("math",))}
    runs["sdpa_auto"] = lambda: attn.sdpa(q, k, v, attn.sdpa_kernel_order(device))
    for name in ("sage", "flash", "fp8", "cudnn"):
        if name in attn.available_backends() and device.type == "cuda":
            runs[name] = lambda name=name: attn._kernel(name, q, k, v)
    for name, fn in runs.items():
        try:
            fn()
            sync(device)
            n = spec["attn_iters"]
            t0 = time.perf_counter()
            for _ in range(n):
                o = fn()
            sync(device)
            sec = (time.perf_counter() - t0) / n
            out[name] = {"ms": round(sec * 1e3, 2), "tflops": round(flops / sec / 1e12, 1),
                         "rel_error_vs_fp32": attn.relative_error(o[:, :nq], ref)}
        except Exception as e:  # noqa: BLE001 - a kernel this GPU or build lacks
            out[name] = {"error": type(e).__name__ + ": " + str(e).partition("\n")[0][:200]}
    if "sage" in attn.available_backends() and device.type == "cuda":
        out["sage_probe"] = attn.probe_sage(device) or "ok"
    return out


def child_tiny(spec: dict) -> dict:
    """Every compute/compile path on the tiny config, against the bf16 NF4 path (and NF4 against its float
    weights, for scale): per forward and over a 4-step run."""
    import tempfile

    from ..loaders.expert_loader import load_expert
    from ..loaders.nf4_writer import random_expert_state, write_official_expert
    from ..speed import compile as compile_mod
    from ..speed.options import apply_speed
    from ..wan.sampling.sampler import make_noise

    device = torch.device(spec["device"])
    cfg = DiTConfig.tiny()
    if device.type == "cpu":
        compile_mod.BACKEND = "aot_eager"
    compile_mod.configure_cache(Path(spec["workdir"]) / "inductor")
    spec = {**spec, "config": cfg.to_json(), "tiny": True}
    out: dict = {"config": cfg.to_json()}
    with tempfile.TemporaryDirectory(dir=spec["workdir"]) as tmp:
        write_official_expert(random_expert_state(cfg, "cpu", seed=5, dtype=torch.bfloat16), cfg, tmp,
                              dtype=torch.bfloat16)
        nf4 = load_expert(tmp, device=device, mode="nf4", compute_dtype=torch.bfloat16)
        plain = load_expert(tmp, device=device, mode="bf16")
    inputs = make_inputs(TINY_VIDEO, cfg, device)
    noise = make_noise(inputs["shape"], 1, source="cpu").to(device)
    t = torch.tensor([900], device=device)

    def forward(model):
        with torch.inference_mode():
            return model(noise, t, inputs["ctx"], inputs["y"], camera=inputs["camera"]).float()

    small = {"config": cfg.to_json(), "small_video": list(TINY_SMALL_VIDEO)}

    def run4(model):
        return _small_run(model, small, device)[0].float()

    def rel(a, b):
        return ((a - b).norm() / b.norm()).item()

    ref_f, ref_r = forward(nf4), run4(nf4)
    out["nf4_vs_float_weights"] = {"forward": rel(ref_f, forward(plain)), "run4": rel(ref_r, run4(plain))}
    del plain
    for name in ("compile", "fp8", "fp8_compile", "int8", "int8_compile", "fp16acc"):
        case = CASES[name]
        try:
            plan = _plan_for({**spec, **case}, device)
            apply_speed(nf4, plan)
            for m in nf4.modules():
                if hasattr(m, "lowp_min_rows"):
                    m.lowp_min_rows = 1
            out[name] = {"forward": rel(forward(nf4), ref_f), "run4": rel(run4(nf4), ref_r)}
        except Exception as e:  # noqa: BLE001
            out[name] = {"error": type(e).__name__ + ": " + str(e).partition("\n")[0][:300]}
    return out


CHILDREN = {FORWARD: child_forward, "attention": child_attention, "tiny": child_tiny}
