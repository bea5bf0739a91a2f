"""The node graph end to end on the tiny demo checkpoint, with small stand-ins for ComfyUI's modules.

The stand-ins reproduce only the calls the pack makes (load_models_gpu / current_loaded_models /
LoadedModel.model_unload / ModelPatcher's load-detach protocol, ProgressBar, the previewer, the interrupt
flag), so the ExpertPatcher, the provider, the text-encoder child, the camera, I2V, sampler and decode
nodes all run for real. The same classes against ComfyUI's own model management are tested in
test_comfyui_server.py (needs COMFYUI_PATH).
"""
from __future__ import annotations

import contextlib
import sys
import types
import uuid

import pytest
import torch

from lingbot_world.loaders.demo_checkpoint import build_demo_checkpoint
from lingbot_world.loaders.expert_loader import load_expert
from lingbot_world.wan.dit.model import pad_context
from lingbot_world.wan.sampling.sampler import ResidentExperts, SamplingSettings, make_noise, sample

from tests.conftest import load_sibling

H, W, FRAMES, STEPS = 32, 48, 9, 3


# ---- stand-ins for ComfyUI ------------------------------------------------------------------------------------
class Interrupted(Exception):
    pass


def make_comfy(base) -> dict[str, types.ModuleType]:
    mm = types.ModuleType("comfy.model_management")
    mm.current_loaded_models = []
    mm.calls = []
    mm.interrupt_after = None  # number of processing_interrupted() calls answered False before True
    mm.InterruptProcessingException = Interrupted
    cpu = torch.device("cpu")
    for name in ("get_torch_device", "intermediate_device", "vae_device", "vae_offload_device", "unet_offload_device"):
        setattr(mm, name, lambda: cpu)
    mm.cpu_mode = lambda: True
    mm.is_device_cpu = lambda d: torch.device(d).type == "cpu"
    mm.get_free_memory = lambda dev=None: 1 << 40
    mm.minimum_inference_memory = lambda: 0
    mm.soft_empty_cache = lambda force=False: None

    def processing_interrupted():
        if mm.interrupt_after is None:
            return False
        mm.interrupt_after -= 1
        return mm.interrupt_after < 0

    def throw_exception_if_processing_interrupted():
        if mm.interrupt_after is not None and mm.interrupt_after < 0:
            mm.interrupt_after = None
            raise Interrupted()

    class LoadedModel:
        def __init__(self, model):
            self.model = model
            self.device = model.load_device

        def model_loaded_memory(self):
            return self.model.model.model_loaded_weight_memory

        def model_unload(self, memory_to_free=None, unpatch_weights=True):
            self.model.detach(unpatch_weights)
            return True

    def load_models_gpu(models, memory_required=0, force_patch_weights=False, minimum_memory_required=None,
                        force_full_load=False):
        mm.calls.append(("load_models_gpu", [type(m.model).__name__ for m in models], memory_required, force_full_load))
        for m in models:
            if any(lm.model is m for lm in mm.current_loaded_models):
                continue
            m.partially_load(m.load_device, 1e32)
            mm.current_loaded_models.insert(0, LoadedModel(m))

    def unload_all_models():
        while mm.current_loaded_models:
            mm.current_loaded_models.pop().model_unload()

    mm.processing_interrupted = processing_interrupted
    mm.throw_exception_if_processing_interrupted = throw_exception_if_processing_interrupted
    mm.load_models_gpu = load_models_gpu
    mm.unload_all_models = unload_all_models

    mp = types.ModuleType("comfy.model_patcher")

    class ModelPatcher:
        def __init__(self, model, load_device, offload_device, size=0, weight_inplace_update=False):
            self.model, self.load_device, self.offload_device, self.size = model, load_device, offload_device, size
            self.patches_uuid = uuid.uuid4()
            self.patches, self.object_patches = {}, {}
            self.backup, self.object_patches_backup = {}, {}
            if not hasattr(model, "device"):
                model.device = offload_device
            model.model_loaded_weight_memory = 0
            model.model_lowvram = False
            model.lowvram_patch_counter = 0
            model.current_weight_patches_uuid = None

        def model_size(self):
            if self.size <= 0:
                self.size = sum(t.numel() * t.element_size() for t in self.model.state_dict().values())
            return self.size

        def use_ejected(self, skip_and_inject_on_exit_only=False):
            return contextlib.nullcontext()

        def eject_model(self):
            pass

        def get_all_callbacks(self, kind):
            return []

        def load(self, device_to=None, lowvram_model_memory=0, force_patch_weights=False, full_load=False):
            self.model.to(device_to)
            self.model.model_loaded_weight_memory = self.model_size()

        def patch_model(self, device_to=None, lowvram_model_memory=0, load_weights=True, force_patch_weights=False):
            for k, v in self.object_patches.items():
                self.object_patches_backup.setdefault(k, getattr(self.model, k))
                setattr(self.model, k, v)
            if load_weights:
                self.load(device_to, lowvram_model_memory, force_patch_weights, full_load=lowvram_model_memory == 0)
            return self.model

        def partially_load(self, device_to, extra_memory=0, force_patch_weights=False):
            if self.model.model_loaded_weight_memory > 0 and not self.model.model_lowvram:
                return 0
            self.load(device_to, lowvram_model_memory=extra_memory, full_load=True)
            return self.model.model_loaded_weight_memory

        def unpatch_model(self, device_to=None, unpatch_weights=True):
            if unpatch_weights:
                self.model.to(device_to)
                self.model.model_loaded_weight_memory = 0

        def detach(self, unpatch_all=True):
            if unpatch_all:
                self.unpatch_model(self.offload_device, unpatch_weights=True)
            return self.model

    mp.ModelPatcher = ModelPatcher

    utils = types.ModuleType("comfy.utils")
    utils.progress = []

    class ProgressBar:
        def __init__(self, total, node_id=None):
            self.total = total

        def update_absolute(self, value, total=None, preview=None):
            utils.progress.append((value, total or self.total, preview))  # the preview tuple, or None
            throw_exception_if_processing_interrupted()  # as ComfyUI's hook does

    utils.ProgressBar = ProgressBar
    utils.set_attr = lambda obj, attr, value: setattr(obj, attr, value)

    ext = types.ModuleType("comfy.patcher_extension")
    ext.CallbacksMP = types.SimpleNamespace(ON_LOAD="on_load_after")
    lf = types.ModuleType("comfy.latent_formats")
    lf.Wan21 = type("Wan21", (), {"latent_channels": 16})
    preview = types.ModuleType("latent_preview")
    preview.MAX_PREVIEW_RESOLUTION = 512

    class Previewer:  # ComfyUI's LatentPreviewer API: one latent image [1, C, h, w] -> a PIL image
        def decode_latent_to_preview(self, x0):
            from PIL import Image

            assert x0.dim() == 4 and x0.shape[:2] == (1, 16)
            rgb = ((x0[0, :3].clamp(-1, 1) + 1) * 127.5).to(torch.uint8).permute(1, 2, 0)
            return Image.fromarray(rgb.numpy())

    preview.get_previewer = lambda device, fmt: Previewer()
    comfy = types.ModuleType("comfy")
    comfy.model_management, comfy.model_patcher, comfy.utils, comfy.latent_formats = mm, mp, utils, lf
    comfy.patcher_extension = ext

    return {"comfy": comfy, "comfy.model_management": mm, "comfy.model_patcher": mp, "comfy.utils": utils,
            "comfy.patcher_extension": ext, "comfy.latent_formats": lf, "latent_preview": preview,
            "folder_paths": load_sibling("test_nodes").make_folder_paths(base)}  # test_nodes.py's stand-in


@pytest.fixture(scope="module")
def demo_base(tmp_path_factory):
    base = tmp_path_factory.mktemp("comfy")
    for d in ("models/diffusion_models", "models/text_encoders", "models/vae", "input", "output", "user"):
        (base / d).mkdir(parents=True, exist_ok=True)
    build_demo_checkpoint(base / "models" / "lingbot_world" / "lingbot-demo")
    return base


@pytest.fixture
def comfy(demo_base, monkeypatch):
    mods = make_comfy(demo_base)
    for name, mod in mods.items():
        monkeypatch.setitem(sys.modules, name, mod)
    for name in ("lingbot_world.nodes.adapters.patchers",):  # subclasses the stand-in ModelPatcher: import fresh
        monkeypatch.delitem(sys.modules, name, raising=False)
    from lingbot_world.nodes.adapters import comfy_paths

    comfy_paths.register_model_folders()
    return mods["comfy.model_management"]


def load_experts(mode: str = "swap", blocks_on_gpu: int = 1):
    from lingbot_world.nodes import NODE_CLASS_MAPPINGS

    return NODE_CLASS_MAPPINGS["LingBotExpertLoader"]().load(
        "lingbot-demo/high_noise_model_bnb_nf4", "lingbot-demo/low_noise_model_bnb_nf4", "nf4", mode, blocks_on_gpu)[0]


@pytest.fixture
def graph(comfy):
    """Text, camera, VAE and I2V outputs of the demo graph (the expensive, mode-independent part)."""
    from lingbot_world.nodes import NODE_CLASS_MAPPINGS as N

    text = N["LingBotTextEncode"]().encode("lingbot-demo/models_t5_umt5-xxl-enc-bf16.pth", "auto",
                                           "a castle in a jungle", "", "auto", True)[0]
    cam = N["LingBotCameraPreset"]().make("dolly_in", "pan_right", 1.0, 17)[0]
    vae = N["LingBotVAELoader"]().load("lingbot-demo/Wan2.1_VAE.pth")[0]
    image = torch.rand(1, 72, 128, 3, generator=torch.Generator().manual_seed(3))
    i2v, w, h, frames = N["LingBotImageToVideo"]().encode(vae, image, "custom", W, H, FRAMES, False, cam)
    return types.SimpleNamespace(text=text, cam=cam, vae=vae, i2v=i2v, size=(w, h, frames))


def run_sampler(experts, g, **kw):
    from lingbot_world.nodes import NODE_CLASS_MAPPINGS as N

    args = dict(steps=STEPS, shift=10.0, boundary=0.947, guide_high=5.0, guide_low=4.0, seed=5, noise_source="cpu",
                solver="unipc", cfg_mode="sequential", camera=g.cam)
    args.update(kw)
    return N["LingBotSampler"]().sample(experts, g.text, g.i2v, **args)[0]


# ---- tests ---------------------------------------------------------------------------------------------------
def test_graph_matches_the_library_pipeline(comfy, graph):
    from lingbot_world.nodes import NODE_CLASS_MAPPINGS as N
    from lingbot_world.nodes.sampler import plucker_for
    from lingbot_world.wan.text.prompts import DEFAULT_NEGATIVE_PROMPT

    assert graph.size == (W, H, FRAMES)
    assert graph.text.negative_prompt == DEFAULT_NEGATIVE_PROMPT  # empty negative -> the model's own
    assert graph.text.positive.shape[1] == 32 and graph.i2v.y.shape == (1, 20, 3, H // 8, W // 8)
    experts = load_experts("swap")
    latent = run_sampler(experts, graph)
    assert latent["samples"].shape == (1, 16, 3, H // 8, W // 8)

    # The same run through the library directly, with the experts loaded by load_expert.
    demo = experts.formats
    high, low = (load_expert(demo[n].path, "cpu") for n in ("high", "low"))
    settings = SamplingSettings(steps=STEPS, guide_high=5.0, guide_low=4.0, cfg_mode="sequential")
    noise = make_noise((1, 16, 3, H // 8, W // 8), 5, "cpu")
    ctx, neg = pad_context([graph.text.positive], 512), pad_context([graph.text.negative], 512)
    z = sample(ResidentExperts(high, low), noise, ctx, neg, graph.i2v.y, plucker_for(graph.cam, graph.i2v), settings)
    torch.testing.assert_close(latent["samples"], graph.i2v.to_raw_latent(z), rtol=0, atol=0)

    frames = N["LingBotVAEDecode"]().decode(graph.vae, latent, False, 32)[0]
    assert frames.shape == (FRAMES, H, W, 3) and frames.dtype == torch.float32
    assert 0 <= frames.min() <= frames.max() <= 1
    tiled = N["LingBotVAEDecode"]().decode(graph.vae, latent, True, 8)[0]
    assert tiled.shape == frames.shape
    # the sampler's LATENT names its speed plan's decode precision (on this CPU the release's float32), and the
    # decode follows it: a LATENT saying fp16 (a GPU's auto / fast / draft) decodes under fp16 autocast
    from lingbot_world.nodes.adapters.payloads import DECODE_KEY

    assert latent[DECODE_KEY] == "float32"
    half = N["LingBotVAEDecode"]().decode(graph.vae, {**latent, DECODE_KEY: "fp16"}, False, 32)[0]
    err = ((half - frames).norm() / frames.norm()).item()
    assert half.dtype == torch.float32 and 0 < err < 1e-2, err
    with pytest.raises(ValueError, match="decode dtype 'fp8'"):
        N["LingBotVAEDecode"]().decode(graph.vae, {**latent, DECODE_KEY: "fp8"}, False, 32)
    with pytest.raises(ValueError, match="Wan video latent"):
        N["LingBotVAEDecode"]().decode(graph.vae, {"samples": torch.zeros(1, 4, 8, 8)}, False, 32)


def test_native_conditioning_into_lingbot_sampler_is_the_same_video(comfy, graph):
    """LingBot Text Encode's CONDITIONING outputs (what CLIPTextEncode gives) drive LingBot Sampler exactly like
    its LINGBOT_TEXT output: [1, 512, width] zero-padded rows are LingBot's own zero padding."""
    from lingbot_world.nodes import NODE_CLASS_MAPPINGS as N

    _, pos, neg = N["LingBotTextEncode"]().encode("lingbot-demo/models_t5_umt5-xxl-enc-bf16.pth", "auto",
                                                  "a castle in a jungle", "", "auto", True)
    assert pos[0][0].shape == (1, 512, 32) and pos[0][0][0, graph.text.positive.shape[0]:].abs().sum() == 0
    experts = load_experts("resident")
    reference = run_sampler(experts, graph, steps=2)["samples"]
    native = N["LingBotSampler"]().sample(experts, None, graph.i2v, steps=2, guide_low=4.0, seed=5,
                                          cfg_mode="sequential", camera=graph.cam, positive=pos, negative=neg)[0]
    torch.testing.assert_close(native["samples"], reference, rtol=0, atol=0)
    with pytest.raises(ValueError, match="either 'text'"):
        N["LingBotSampler"]().sample(experts, graph.text, graph.i2v, steps=1, positive=pos, negative=neg)
    with pytest.raises(ValueError, match="needs the prompt"):
        N["LingBotSampler"]().sample(experts, None, graph.i2v, steps=1, positive=pos)
    with pytest.raises(ValueError, match="768 wide.*umT5-XXL"):
        N["LingBotSampler"]().sample(experts, None, graph.i2v, steps=1, positive=[[torch.zeros(1, 77, 768), {}]],
                                     negative=neg)


def test_progress_previews_and_loads_through_model_management(comfy, graph):
    from lingbot_world.nodes.adapters import patchers

    utils = sys.modules["comfy.utils"]
    utils.progress.clear()
    comfy.calls.clear()
    experts = load_experts("swap")
    run_sampler(experts, graph)
    steps = [(v, t, p) for v, t, p in utils.progress if t == STEPS]
    assert [v for v, _, _ in steps] == list(range(1, STEPS + 1)) + [STEPS] and all(p for _, _, p in steps[:-1])
    loads = [c for c in comfy.calls if c[1] == ["ExpertContainer"]]
    assert len(loads) == 2 and all(c[3] is True and c[2] > 0 for c in loads)  # force_full_load + activations
    assert not experts.high.is_loaded() and not experts.low.is_loaded()  # swap: released after each phase
    assert not any(isinstance(lm.model, patchers.ExpertPatcher) for lm in comfy.current_loaded_models)
    assert experts.high.weights.loads_from_disk == experts.low.weights.loads_from_disk == 1


def test_memory_modes_give_identical_videos(comfy, graph):
    swap = load_experts("swap")
    reference = run_sampler(swap, graph)["samples"]

    resident = load_experts("resident")
    torch.testing.assert_close(run_sampler(resident, graph)["samples"], reference, rtol=0, atol=0)
    assert resident.high.is_loaded() and resident.low.is_loaded()
    run_sampler(resident, graph, seed=6)  # reused, not streamed again
    assert resident.high.weights.loads_from_disk == 1
    comfy.unload_all_models()  # "free memory"
    assert not resident.high.is_loaded() and resident.high.model.diffusion_model is None

    pinned = load_experts("swap_pinned")
    torch.testing.assert_close(run_sampler(pinned, graph)["samples"], reference, rtol=0, atol=0)
    assert pinned.high.weights.parked is not None and pinned.low.weights.parked is not None
    torch.testing.assert_close(run_sampler(pinned, graph)["samples"], reference, rtol=0, atol=0)
    assert (pinned.high.weights.loads_from_disk, pinned.high.weights.loads_from_ram) == (1, 1)

    blocks = load_experts("block_swap", blocks_on_gpu=1)  # 1 of the demo's 2 blocks resident, 1 streamed
    torch.testing.assert_close(run_sampler(blocks, graph)["samples"], reference, rtol=0, atol=0)
    assert not blocks.high.is_loaded() and not blocks.low.is_loaded()
    assert blocks.high.weights.swapper is None and blocks.high.weights.loads_from_disk == 1
    with pytest.raises(ValueError, match="blocks_on_gpu=20 but these experts have 2 blocks"):
        load_experts("block_swap", 20)


def test_auto_mode_follows_the_memory_plan(comfy, graph):
    from lingbot_world.nodes.adapters.memory import plan_for

    comfy.unload_all_models()
    auto = load_experts("auto")
    video = (FRAMES, H, W)
    est = plan_for(auto, video, "sequential", True, vram_free=1 << 60, ram_free=1 << 30).estimates
    one = est["expert_bytes"] + est["activation_bytes_sequential"] + est["headroom"]
    assert plan_for(auto, video, "sequential", True, vram_free=one + 1, ram_free=1 << 30).mode == "swap"
    assert plan_for(auto, video, "auto", True, vram_free=1 << 60, ram_free=1 << 30).mode == "resident"
    assert plan_for(auto, video, "sequential", True, vram_free=one // 2, ram_free=1 << 30).mode == "block_swap"

    comfy.is_device_cpu = lambda d: False  # pretend the device is a GPU with this much free memory
    comfy.get_free_memory = lambda dev=None: one + 1
    run_sampler(auto, graph)
    assert not auto.high.is_loaded() and not auto.low.is_loaded()  # planned swap: each released after its phase
    comfy.get_free_memory = lambda dev=None: 1 << 50
    run_sampler(auto, graph)
    assert auto.high.is_loaded() and auto.low.is_loaded()  # room for both: planned resident


def test_interrupt_stops_within_a_step_and_leaves_nothing_loaded(comfy, graph):
    experts = load_experts("swap")
    comfy.interrupt_after = 5  # a few model calls in, i.e. mid-sampling
    with pytest.raises(Interrupted):
        run_sampler(experts, graph, steps=20)
    assert not experts.high.is_loaded() and not experts.low.is_loaded()
    assert comfy.interrupt_after is None  # the flag was consumed, as ComfyUI's throw_exception... does
    assert run_sampler(experts, graph, steps=2)["samples"].isfinite().all()  # usable again


def test_expert_oom_is_a_clear_cuda_oom(comfy, graph, monkeypatch):
    from lingbot_world.nodes.adapters import patchers

    experts = load_experts("swap")

    def oom(device):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB")

    monkeypatch.setattr(experts.high.weights, "materialize", oom)
    with pytest.raises(torch.cuda.OutOfMemoryError, match="Not enough GPU memory to load the high-noise expert.*swap"):
        run_sampler(experts, graph)
    assert issubclass(patchers.ExpertOutOfMemory, torch.cuda.OutOfMemoryError)
    assert not experts.high.is_loaded() and not comfy.current_loaded_models or all(
        not isinstance(lm.model, patchers.ExpertPatcher) for lm in comfy.current_loaded_models)


def test_loader_refuses_bad_pairs(comfy, demo_base):
    from lingbot_world.loaders.expert_format import ExpertLoadError
    from lingbot_world.nodes import NODE_CLASS_MAPPINGS as N

    loader = N["LingBotExpertLoader"]()
    with pytest.raises(ValueError, match="same"):
        loader.load("lingbot-demo/high_noise_model_bnb_nf4", "lingbot-demo/high_noise_model_bnb_nf4")
    with pytest.raises(ValueError, match="memory_mode"):
        loader.load("lingbot-demo/high_noise_model_bnb_nf4", "lingbot-demo/low_noise_model_bnb_nf4", "nf4", "fast")
    bad = demo_base / "models" / "diffusion_models" / "vae_as_expert.safetensors"
    from safetensors.torch import save_file

    save_file({"decoder.middle.0.residual.0.gamma": torch.zeros(2), "encoder.conv1.weight": torch.zeros(2)}, str(bad))
    with pytest.raises(ExpertLoadError, match="VAE"):
        loader.load(bad.name, "lingbot-demo/low_noise_model_bnb_nf4")


def test_text_encode_uses_the_cache_and_never_starts_a_slot_on_cpu(comfy, graph, monkeypatch):
    from lingbot_world.text_encoder import encode as text_encoding
    from lingbot_world.nodes import NODE_CLASS_MAPPINGS as N
    from lingbot_world.nodes import text as text_node

    started = []
    monkeypatch.setattr(text_encoding, "run_text_encoder", lambda *a, **k: started.append(1) or (_ for _ in ()).throw(
        AssertionError("the child must not start for cached prompts")))
    again = N["LingBotTextEncode"]().encode("lingbot-demo/models_t5_umt5-xxl-enc-bf16.pth", "auto",
                                            "a castle in a jungle", "", "auto", True)[0]
    torch.testing.assert_close(again.positive, graph.text.positive, rtol=0, atol=0)
    assert not started and not comfy.calls or all(c[1] != ["_EmptyContainer"] for c in comfy.calls)
    from lingbot_world.nodes.adapters import comfy_paths

    enc = comfy_paths.resolve_text_encoder("lingbot-demo/models_t5_umt5-xxl-enc-bf16.pth")
    assert text_node.all_cached(enc, None, ["a castle in a jungle"], comfy_paths.text_cache_dir())
    assert not text_node.all_cached(enc, None, ["never encoded"], comfy_paths.text_cache_dir())


def test_text_encoder_child_stops_on_interrupt_and_on_free_memory(comfy, monkeypatch):
    from lingbot_world.text_encoder.child_process import live_text_encoder_pids
    from lingbot_world.nodes import NODE_CLASS_MAPPINGS as N
    from lingbot_world.nodes.text import FreeMemoryRequested

    node = N["LingBotTextEncode"]()
    args = ("lingbot-demo/models_t5_umt5-xxl-enc-bf16.pth", "auto", "never cached", "", "cpu", False)
    comfy.interrupt_after = 2  # the cancel check is polled while the child runs
    with pytest.raises(Interrupted):
        node.encode(*args)
    assert live_text_encoder_pids() == []

    flags, reads = {}, []

    def get_flags(reset=True):  # the /free arrives once the encode has started (its first read saw none)
        reads.append(1)
        return dict(flags) if len(reads) == 1 else {**flags, "free_memory": True}

    queue = types.SimpleNamespace(get_flags=get_flags)
    server = types.ModuleType("server")
    server.PromptServer = types.SimpleNamespace(instance=types.SimpleNamespace(prompt_queue=queue))
    monkeypatch.setitem(sys.modules, "server", server)
    with pytest.raises(FreeMemoryRequested, match="free memory"):
        node.encode(*args)
    assert live_text_encoder_pids() == []
    queue.get_flags = lambda reset=True: dict(flags)
    assert node.encode(*args)[0].positive.shape[1] == 32  # and it works again
    # a /free posted while ComfyUI was idle waits for the prompt to end: it does not stop this prompt's encode
    flags["free_memory"] = True
    assert node.encode(*args)[0].positive.shape[1] == 32
    assert live_text_encoder_pids() == []


def test_cfg_parallel_on_a_second_device_gives_the_same_latent(comfy, graph, monkeypatch):
    """cfg_parallel: the unconditional pass on a second device with its own expert copies (two CPU "devices" here:
    the choice is forced to the CPU), freed when the run ends; the latent equals the one-device run's."""
    from lingbot_world.nodes.adapters import cfg_parallel
    from lingbot_world.parallel import local_cfg

    experts = load_experts("swap")
    reference = run_sampler(experts, graph)["samples"]
    pairs = []
    real = local_cfg.TwoDeviceCFG
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cfg_parallel, "second_device", lambda choice, main: torch.device("cpu"))
        mp.setattr(cfg_parallel, "TwoDeviceCFG", lambda *a, **k: pairs.append(real(*a, **k)) or pairs[-1])
        got = run_sampler(experts, graph, cfg_parallel="auto")["samples"]
    torch.testing.assert_close(got, reference, rtol=0, atol=0)
    (pair,) = pairs
    assert pair.closed and pair.second.events[-1]["op"] == "release"  # the second copies are gone
    assert not experts.high.is_loaded() and not experts.low.is_loaded()
    with pytest.raises(ValueError, match="needs two CUDA GPUs"):
        run_sampler(experts, graph, cfg_parallel="cuda:1")



def test_cfg_parallel_puts_the_experts_loras_on_the_second_copy(comfy, graph, monkeypatch):
    """An expert with a LoRA (ComfyUI patches, as LoraLoaderModelOnly leaves them): the second device's copy gets
    the same LoRA, so cfg_parallel's latent equals the one-device run's with that LoRA (and differs without it)."""
    from lingbot_world.nodes.adapters import cfg_parallel

    class LoRAAdapter:  # the one field of comfy.weight_adapter.LoRAAdapter the pack reads
        def __init__(self, keys, weights):
            self.weights = weights

    wa = types.ModuleType("comfy.weight_adapter")
    wa.LoRAAdapter = LoRAAdapter
    lora = types.ModuleType("comfy.lora")
    lora.calculate_weight = None  # only plain LoRAs here: ComfyUI's generic path is not taken
    monkeypatch.setitem(sys.modules, "comfy.weight_adapter", wa)
    monkeypatch.setitem(sys.modules, "comfy.lora", lora)
    monkeypatch.delitem(sys.modules, "lingbot_world.nodes.adapters.lora_patches", raising=False)

    experts = load_experts("swap")
    plain = run_sampler(experts, graph)["samples"]
    dim = experts.formats["high"].config.dim
    g = torch.Generator().manual_seed(3)
    for name in ("high", "low"):
        up, down = torch.randn(dim, 4, generator=g) * 0.5, torch.randn(4, dim, generator=g) * 0.5
        patcher = experts.patcher(name)
        patcher.patches = {f"diffusion_model.blocks.{i}.self_attn.q.weight":
                           [(1.0, LoRAAdapter(set(), (up, down, 4.0, None, None, None)), 1.0, None, None)]
                           for i in range(2)}
        patcher.patches_uuid = uuid.uuid4()
    reference = run_sampler(experts, graph)["samples"]
    assert (reference - plain).abs().max() > 1e-3  # the LoRA changes the video
    monkeypatch.setattr(cfg_parallel, "second_device", lambda choice, main: torch.device("cpu"))
    got = run_sampler(experts, graph, cfg_parallel="auto")["samples"]
    torch.testing.assert_close(got, reference, rtol=0, atol=0)


def test_comfyui_memory_budget_becomes_block_swap(comfy):
    """ComfyUI's lowvram budget for a model that does not fit: the expert loads whole when the budget holds it,
    else with as many blocks on the GPU as fit beside the base weights and the two streaming buffers."""
    from lingbot_world.memory.estimates import expert_sizes
    from lingbot_world.nodes.adapters.expert_weights import compute_bytes_for

    import dataclasses

    from lingbot_world.wan.dit.model import DiTConfig

    experts = load_experts("auto")
    patcher, w = experts.high, experts.high.weights
    w.fmt = dataclasses.replace(w.fmt, config=DiTConfig())  # sized like the real 40-block expert (no file read)
    cuda = torch.device("cuda")
    sizes = expert_sizes(w.fmt.config, "nf4", compute_bytes_for(cuda, "nf4"))
    patcher._place_for_budget(cuda, sizes.total)
    assert w.blocks_on_gpu is None and not w.block_swapping()
    patcher._place_for_budget(cuda, int(sizes.base + 17.5 * sizes.block))  # 15 blocks + 2 ring buffers
    assert w.blocks_on_gpu == 15 and w.block_swapping()
    patcher._place_for_budget(cuda, 1)
    assert w.blocks_on_gpu == 0
    patcher._place_for_budget(cuda, sizes.total + 1)
    assert w.blocks_on_gpu is None
    patcher._place_for_budget(torch.device("cpu"), 1)  # host RAM: ComfyUI does not budget it
    assert w.blocks_on_gpu is None


def test_camera_cache_choices_give_the_same_latent_and_free_their_memory(comfy, graph, monkeypatch, caplog):
    """The sampler node's camera_cache: off, host (a CPU run's "pinned" store), device and auto give the same latent
    bit for bit; the cache is closed when the run ends, and when it is cancelled."""
    import comfy.model_management as mm

    from lingbot_world.wan.dit import film_cache

    experts = load_experts("swap")
    made = []
    real_init = film_cache.FilmCache.__init__

    def spy(self, *a, **k):
        real_init(self, *a, **k)
        made.append(self)

    monkeypatch.setattr(film_cache.FilmCache, "__init__", spy)
    with caplog.at_level("INFO"):
        ref = run_sampler(experts, graph, camera_cache="off")["samples"]
    assert not made and "camera cache: off as requested" in caplog.text
    for choice in ("host", "device", "auto"):
        got = run_sampler(experts, graph, camera_cache=choice)["samples"]
        assert torch.equal(got, ref), choice
        cache = made[-1]
        assert cache.stats["filled"] > 0 and cache.stats["read"] > 0 and not cache.valid  # used, then closed
    assert len(made) == 3 and made[0].host_blocks and made[1].device_blocks
    calls = []
    monkeypatch.setattr(mm, "processing_interrupted", lambda: len(calls) > 3 or calls.append(1))
    with pytest.raises(mm.InterruptProcessingException):
        run_sampler(experts, graph, camera_cache="host")
    assert not made[-1].valid and not made[-1].stores["host"].host
    with pytest.raises(ValueError, match="camera_cache must be one of"):
        run_sampler(experts, graph, camera_cache="gpu")
