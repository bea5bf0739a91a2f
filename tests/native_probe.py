"""Runs INSIDE a ComfyUI interpreter (tests/test_native_comfy.py starts it with COMFYUI_PYTHON, cwd = ComfyUI):
the native door on the tiny demo checkpoint against ComfyUI's own sampling, LoRA, EasyCache and TorchCompile code.

Usage: python native_probe.py PACK_DIR BASE_DIR (BASE_DIR holds models/lingbot_world/lingbot-demo and
models/loras/*). Prints one line `PROBE{json}` with measurements; the test asserts on them.
"""
from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
import traceback


def _err(fn):
    try:
        fn()
    except Exception as e:  # the message is what the test checks
        return f"{type(e).__name__}: {e}"
    return None


def main(pack_dir: str, base_dir: str) -> dict:
    import logging

    import comfy.options

    logging.basicConfig(level=logging.INFO)  # EasyCache and the pack report at INFO
    comfy.options.enable_args_parsing()
    sys.argv = [sys.argv[0], "--cpu", "--base-directory", base_dir]
    import torch

    import comfy.model_management as mm
    import comfy.sample
    import comfy.sd
    import comfy.utils
    import node_helpers
    import nodes as comfy_nodes

    spec = importlib.util.spec_from_file_location("lingbot_native_probe", pack_dir + "/__init__.py",
                                                  submodule_search_locations=[pack_dir])
    pack = importlib.util.module_from_spec(spec)
    sys.modules["lingbot_native_probe"] = pack
    spec.loader.exec_module(pack)
    N = pack.NODE_CLASS_MAPPINGS
    from lingbot_native_probe.loaders.expert_loader import load_expert
    from lingbot_native_probe.loaders.lora_files import dit_weight_shapes, lora_hooks, parse_lora
    from lingbot_native_probe.quant.lora import apply_lora
    from lingbot_native_probe.quant.nf4 import nf4_linear_names
    from lingbot_native_probe.wan.i2v import first_frame_mask
    from lingbot_native_probe.wan.sampling.sampler import _model_velocity
    from lingbot_native_probe.wan.vae.model import VAEConfig

    out: dict = {}
    demo = "lingbot-demo/"
    loader = N["LingBotModelLoader"]()
    high = loader.load(demo + "high_noise_model_bnb_nf4")[0]
    low = loader.load(demo + "low_noise_model_bnb_nf4")[0]
    cfg = high.weights.fmt.config
    out["model_class"] = type(high.model).__name__
    out["shift"] = float(high.get_model_object("model_sampling").shift)
    out["keys_unloaded"] = len(high.model.state_dict())

    g = torch.Generator().manual_seed(0)
    f, h, w = 3, 4, 6
    x = torch.randn(1, 16, f, h, w, generator=g)
    raw = torch.randn(1, 16, f, h, w, generator=g)  # a raw VAE latent of the first frame + grey frames
    ctx = torch.randn(1, cfg.text_len, cfg.text_dim, generator=g)
    ctx_neg = torch.randn(1, cfg.text_len, cfg.text_dim, generator=g)
    ctx[:, 7:] = 0  # like ComfyUI's umT5: padded rows are zero
    ctx_neg[:, 5:] = 0
    cam = N["LingBotCameraPreset"]().make("dolly_in", "pan_right", 1.0, (f - 1) * 4 + 1)[0]
    cam_short = N["LingBotCameraPreset"]().make("pan_left", "none", 1.0, 5)[0]
    latent = {"samples": torch.zeros(1, 16, f, h, w)}
    mask = torch.ones(1, 1, f, h, w)
    mask[:, :, 0] = 0
    pos = [[ctx, {}]]
    neg = [[ctx_neg, {}]]
    pos, neg = N["LingBotCameraConditioning"]().apply(pos, neg, cam, latent)
    plucker = pos[0][1]["camera_conditions"]
    pos = node_helpers.conditioning_set_values(pos, {"concat_latent_image": raw, "concat_mask": mask})
    neg = node_helpers.conditioning_set_values(neg, {"concat_latent_image": raw, "concat_mask": mask})

    # ---- the conditions reach the DiT as LingBot's y and camera ----------------------------------------------
    conds = high.model.extra_conds(concat_latent_image=raw, concat_mask=mask, noise=x, device=torch.device("cpu"),
                                   cross_attn=ctx, camera_conditions=plucker)
    import comfy.latent_formats

    stats = VAEConfig()
    mean = torch.tensor(stats.latent_mean).view(1, 16, 1, 1, 1)
    std = torch.tensor(stats.latent_std).view(1, 16, 1, 1, 1)
    y = torch.cat([first_frame_mask(f, h, w)[None], (raw - mean) / std], dim=1)
    out["concat_err"] = (conds["c_concat"].cond - y).abs().max().item()
    out["wan21_stats_equal"] = bool(torch.allclose(comfy.latent_formats.Wan21().latents_mean, mean) and
                                    torch.allclose(comfy.latent_formats.Wan21().latents_std, std))
    out["camera_cond"] = list(conds["camera_conditions"].cond.shape)

    # ---- one call: apply_model == our DiT's velocity (flow: denoised = x - sigma * v) ------------------------
    mm.load_models_gpu([high])
    dit = high.dit
    out["loaded_class"] = type(dit).__name__
    sigma = torch.tensor([0.873])
    with torch.no_grad():
        den = high.model.apply_model(x, sigma, c_concat=y, c_crossattn=ctx, camera_conditions=plucker)
        v = dit(x, sigma * 1000, ctx, y, camera=plucker)
        den_nocam = high.model.apply_model(x, sigma, c_concat=y, c_crossattn=ctx)
        v_nocam = dit(x, sigma * 1000, ctx, y, camera=None)
    out["apply_model_err"] = (den - (x - sigma.view(-1, 1, 1, 1, 1) * v)).abs().max().item()
    out["no_camera_err"] = (den_nocam - (x - 0.873 * v_nocam)).abs().max().item()
    out["camera_effect"] = (den - den_nocam).abs().max().item()
    other_cam = N["LingBotCameraPreset"]().make("orbit_left", "none", 1.0, (f - 1) * 4 + 1)[0]
    other = N["LingBotCameraConditioning"]().apply([[ctx, {}]], [[ctx, {}]], other_cam, latent)[0][0][1]["camera_conditions"]
    with torch.no_grad():
        den_other = high.model.apply_model(x, sigma, c_concat=y, c_crossattn=ctx, camera_conditions=other)
    out["other_camera_effect"] = (den - den_other).abs().max().item()

    # ---- through comfy.sample with CFG: every call's guided velocity == our sampler's ---------------------------
    calls = []

    def record(args):
        calls.append((args["input"].clone(), args["sigma"].clone(), args["denoised"].clone()))
        return args["denoised"]

    rec = high.clone()
    rec.set_model_sampler_post_cfg_function(record)
    noise = torch.randn(1, 16, f, h, w, generator=g)
    samples = comfy.sample.sample(rec, noise, 4, 5.0, "euler", "simple", pos, neg, latent["samples"], seed=1,
                                  disable_pbar=True)
    errs = []
    with torch.no_grad():
        for xin, sig, guided in calls:
            s = sig.view(-1, 1, 1, 1, 1)
            v_native = (xin - guided) / s
            v_ours = _model_velocity(dit, xin, sig * 1000, ctx, ctx_neg, y, plucker, 5.0, False, lambda: None)
            errs.append(((v_native - v_ours).abs().max() / v_ours.abs().max()).item())
    out["sample_calls"] = len(calls)
    out["sample_velocity_rel_err"] = max(errs) if errs else None
    out["sample_finite"] = bool(samples.isfinite().all())
    sig_default = [c[1].item() for c in calls]
    from comfy_extras.nodes_model_advanced import ModelSamplingSD3

    shifted = ModelSamplingSD3().patch(rec, 3.0)[0]
    calls.clear()
    comfy.sample.sample(shifted, noise, 4, 5.0, "euler", "simple", pos, neg, latent["samples"], seed=1,
                        disable_pbar=True)
    out["sigmas_shift10"] = sig_default
    out["sigmas_shift3"] = [c[1].item() for c in calls]

    # ---- LoRA: native LoraLoaderModelOnly (ComfyUI format) and ours (diffusers format) -------------------------
    loads_before = high.weights.loads_from_disk
    lora_sd = comfy.utils.load_torch_file(base_dir + "/models/loras/lingbot_tiny_comfy.safetensors", safe_load=True)
    native = comfy_nodes.NODE_CLASS_MAPPINGS["LoraLoaderModelOnly"]().load_lora_model_only(
        high, "lingbot_tiny_comfy.safetensors", 0.8)[0]
    ours = N["LingBotLoraLoader"]().load(high, "lingbot_tiny_diffusers.safetensors", 0.8)[0]
    out["native_lora_patches"] = len(native.patches)
    out["ours_lora_patches"] = len(ours.patches)
    outs = {}
    for name, m in (("native", native), ("ours", ours), ("base", high)):
        mm.load_models_gpu([m])
        with torch.no_grad():
            outs[name] = m.model.apply_model(x, sigma, c_concat=y, c_crossattn=ctx, camera_conditions=plucker)
    out["lora_native_vs_ours"] = (outs["native"] - outs["ours"]).abs().max().item()
    out["lora_effect"] = (outs["native"] - outs["base"]).abs().max().item()
    out["lora_removed_err"] = (outs["base"] - den).abs().max().item()
    out["lora_reloads"] = high.weights.loads_from_disk - loads_before  # swapping patches must not reload
    # independent reference: a fresh copy of the expert with our hooks from the same file
    ref_model = load_expert(high.weights.fmt, "cpu")
    lora = parse_lora(lora_sd, dit_weight_shapes(cfg), "tiny")
    apply_lora(ref_model, *lora_hooks([(lora, 0.8)], nf4_linear_names(cfg.num_layers)))
    with torch.no_grad():
        v_ref = ref_model(x, sigma * 1000, ctx, y, camera=plucker)
    out["lora_vs_reference"] = (outs["native"] - (x - 0.873 * v_ref)).abs().max().item()
    out["lora_strength0_same_object"] = N["LingBotLoraLoader"]().load(high, "lingbot_tiny_diffusers.safetensors", 0.0)[0] is high
    out["lora_on_low_only"] = len(low.patches) == 0 and len(high.patches) == 0
    out["lora_other_model"] = _err(lambda: N["LingBotLoraLoader"]().load(high, "wan_1_3b_style.safetensors", 1.0))

    # ---- native two-pass KSamplerAdvanced (high then low) ------------------------------------------------------
    ksa = comfy_nodes.NODE_CLASS_MAPPINGS["KSamplerAdvanced"]()
    t0 = time.time()
    mid = ksa.sample(native, "enable", 3, 6, 5.0, "euler", "simple", pos, neg, latent, 0, 2, "enable")[0]
    fin = ksa.sample(low, "disable", 0, 6, 5.0, "euler", "simple", pos, neg, mid, 2, 10000, "disable")[0]
    out["two_pass_seconds"] = round(time.time() - t0, 2)
    out["two_pass_finite"] = bool(fin["samples"].isfinite().all()) and fin["samples"].shape == x.shape
    out["two_pass_low_loaded"] = low.is_loaded()

    # ---- EasyCache and TorchCompileModel -----------------------------------------------------------------------
    from comfy_extras.nodes_easycache import EasyCacheNode

    cached = EasyCacheNode.execute(high, 0.2, 0.0, 1.0, False).result[0]
    calls.clear()
    res = comfy.sample.sample(cached, noise, 8, 5.0, "euler", "simple", pos, neg, latent["samples"], seed=1,
                              disable_pbar=True)
    out["easycache_finite"] = bool(res.isfinite().all())

    # TorchCompileModel's own wrapper; the inductor backend compiles for minutes on a CPU, so by default the
    # "eager" backend runs the same dynamo capture of the slot (LINGBOT_TEST_INDUCTOR=1: the node with inductor).
    from comfy_api.torch_helpers import set_torch_compile_wrapper
    from comfy_extras.nodes_torch_compile import TorchCompileModel

    inductor = os.environ.get("LINGBOT_TEST_INDUCTOR") == "1"
    try:
        t0 = time.time()
        if inductor:
            compiled = TorchCompileModel.execute(high, "inductor").result[0]
        else:
            compiled = high.clone()
            set_torch_compile_wrapper(compiled, backend="eager")
        res = comfy.sample.sample(compiled, noise, 2, 5.0, "euler", "simple", pos, neg, latent["samples"], seed=1,
                                  disable_pbar=True)
        seconds = round(time.time() - t0, 1)
        base = comfy.sample.sample(high, noise, 2, 5.0, "euler", "simple", pos, neg, latent["samples"], seed=1,
                                   disable_pbar=True)
        out["compile"] = {"ok": True, "backend": "inductor" if inductor else "eager", "seconds": seconds,
                          "err": (res - base).abs().max().item()}
    except Exception as e:
        out["compile"] = {"ok": False, "reason": f"{type(e).__name__}: {str(e)[:300]}"}

    # ---- the first frame through ComfyUI's Wan 2.1 VAE == through ours (same weights, float32) ------------------
    from lingbot_native_probe.loaders.vae_files import load_vae
    from lingbot_native_probe.nodes.image import native_vae_condition
    from lingbot_native_probe.wan.i2v import build_i2v_condition, image_to_model_range

    vae_file = base_dir + "/models/vae/wan_2.1_vae.safetensors"
    native_vae = comfy.sd.VAE(sd=comfy.utils.load_torch_file(vae_file))
    ours_vae = load_vae(vae_file, "cpu")
    image = torch.rand(40, 56, 3, generator=g)
    with torch.no_grad():
        y_native = native_vae_condition(native_vae, image, 32, 48, 5)
        y_ours = build_i2v_condition(ours_vae, image_to_model_range(image), 32, 48, 5)
    out["native_vae_y_err"] = (y_native - y_ours).abs().max().item()
    out["native_vae_y_scale"] = y_ours.abs().max().item()
    img_node = N["LingBotImageToVideoNative"]()
    p2, n2, lat2 = img_node.encode([[ctx, {}]], [[ctx_neg, {}]], native_vae, image[None], "custom", 48, 32, 5, cam_short)
    conds = high.model.extra_conds(noise=lat2["samples"], device=torch.device("cpu"), cross_attn=ctx, **p2[0][1])
    out["native_i2v_node_y_err"] = (conds["c_concat"].cond - y_ours).abs().max().item()
    out["native_i2v_node_camera"] = list(conds["camera_conditions"].cond.shape)
    out["wan22_vae_refused"] = _err(lambda: img_node.encode([[ctx, {}]], [[ctx, {}]], "not a vae", image[None],
                                                            "custom", 48, 32, 5))

    # ---- bad input: one clear line before anything runs --------------------------------------------------------
    wide = [[torch.zeros(1, 77, 768), {}]]
    out["wrong_width"] = _err(lambda: comfy.sample.sample(high, noise, 1, 1.0, "euler", "simple", wide, wide,
                                                          latent["samples"], disable_pbar=True))
    funcam = node_helpers.conditioning_set_values(pos, {"camera_conditions": torch.zeros(1, 24, f, h * 8, w * 8)})
    out["wan_fun_camera"] = _err(lambda: comfy.sample.sample(high, noise, 1, 1.0, "euler", "simple", funcam, funcam,
                                                             latent["samples"], disable_pbar=True))
    out["bridge_refuses_other_model"] = _err(lambda: N["LingBotExpertsFromModels"]().build(high, "not a model"))
    experts = N["LingBotExpertsFromModels"]().build(native, low, "resident", -1)[0]
    out["bridge"] = [experts.high is native, experts.low is low, experts.weights]
    mm.unload_all_models()
    out["unloaded"] = [high.is_loaded(), low.is_loaded(), len(mm.current_loaded_models)]
    return out


if __name__ == "__main__":
    try:
        result = main(sys.argv[1], sys.argv[2])
    except Exception:
        traceback.print_exc()
        raise
    print("PROBE" + json.dumps(result))
