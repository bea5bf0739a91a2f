"""The one place a causal world is put together, for every door and every causal model of the registry.

    files    = WorldFiles.find(source, weights)          # world/files.py: the model's DiT, umT5, tokenizer, VAE
    checked  = check(files, settings, device)            # headers read, model told from its weights, every tensor,
                                                         # the LoRA files and the tiny decoder checked
    video    = video_settings(checked, settings, ...)    # the video's fixed settings: the model's recipe, its window
                                                         # and sink defaults, the speed preset's window cap
    plan     = plan_memory(checked, video, ...)          # where the model, its K/V cache and the decoder go
    load     = model_loader(checked, settings, device)   # load (NF4 / FP8 / INT8 / bf16), then the LoRAs
    session  = open_session(...)                         # a WorldSession on them (world/session.py)

The CLI runs these steps with its start-up overlap (world/first_part.py; a continuation: world/continuation.py),
ComfyUI with its own placement (the model through its model management) and the VRAM it can free, the player
through `open_session`. The base models' two experts have their own assembly (world/base.py). None of them builds a
FastSettings, caps a window or calls the memory planner itself.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Optional, Union

import torch

from ..loaders.expert_format import ExpertFormat
from ..loaders.fast_state_file import model_fingerprint, model_label
from ..quant.lowp_kinds import LOWP_WEIGHTS
from ..speed.levers import plan_levers
from ..wan.sampling.fast_state import FastSettings
from ..wan.sizes import height_width, max_area_for, target_size
from .errors import WorldError
from .files import WorldFiles
from .models import ModelEntry
from .plan import cache_dtype, compute_dtype, play_layout, plan_world_memory, session_layout
from .settings import MODEL_DEFAULT, WorldSettings

log = logging.getLogger(__name__)


@dataclass
class Checked:
    """A causal model's files after the checks: its format (config, headers), registry entry, the LoRAs read and
    matched against it, the tiny decoder (on the device, or None) and notes for the log."""

    files: WorldFiles
    fmt: ExpertFormat
    entry: ModelEntry
    loras: list = field(default_factory=list)
    tiny: object = None
    notes: list = field(default_factory=list)

    @property
    def config(self):
        return self.fmt.config


def compute_device(device=None) -> torch.device:
    """The device a world computes on: the one given, else CUDA when available, else the CPU."""
    if device is not None:
        return torch.device(device)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def check_weights_mode(weights: str, device: torch.device) -> None:
    """FP8 / INT8 weights refused in one line where the device cannot run them, before a file is read."""
    if weights in LOWP_WEIGHTS:
        from ..quant.compute import check_lowp_weights

        check_lowp_weights(weights, device)


def check(files: WorldFiles, settings: WorldSettings, device: torch.device, *, tiny=True) -> Checked:
    """Read and check everything that can be refused before any work: the DiT's headers (every tensor, and which
    registry model it is), the LoRA files against it, the tiny decoder's file (loaded: it is a few MB). Notes (a
    model told from its layout only, another kind of model) are logged."""
    fmt, entry, notes = files.check(settings.weights)
    loras = read_loras(settings.loras, fmt.config)
    decoder = load_tiny(settings.tiny_vae, device) if tiny else None
    for note in notes:
        log.warning("%s", note)
    return Checked(files, fmt, entry, loras, decoder, notes)


def check_dit(path, settings: WorldSettings, device: torch.device, wanted: Optional[str] = None) -> Checked:
    """`check` for a door that names the DiT alone (ComfyUI: the umT5 encoder and the VAE come from nodes of their
    own): its headers, which registry model it is, every tensor; the LoRAs of the settings."""
    files = WorldFiles(Path(path).parent, Path(path), None, None, None, wanted)
    return check(files, settings, device, tiny=False)


def check_tiny_vae(path, label: str = "the tiny decoder") -> None:
    """A tiny decoder's file read and checked (a few MB) without building the decoder: one line beginning with
    `label` (the flag or input that named it) when it cannot be used."""
    from ..loaders.tiny_vae_files import TinyVAEFileError, check_tiny_decoder_file

    try:
        check_tiny_decoder_file(path)
    except (TinyVAEFileError, FileNotFoundError) as e:
        raise WorldError(f"{label}: {e}") from None


def read_loras(loras, cfg) -> list:
    """(path, strength[, label]) items read and matched against the model; a bad file is a LoraFileError naming it
    (after its label: the flag or input it came from)."""
    if not loras:
        return []
    from ..loaders.lora_files import LoraFileError, dit_weight_shapes, load_lora

    shapes = dit_weight_shapes(cfg)
    out, cache = [], {}
    for path, strength, *label in loras:
        path = Path(path)
        if path not in cache:
            try:
                cache[path] = load_lora(path, shapes)
            except LoraFileError as e:
                raise LoraFileError(f"{label[0]}: {e}" if label else str(e)) from None
            log.info("LoRA %s", cache[path].report())
        out.append((cache[path], float(strength)))
    return out


def load_tiny(path, device: torch.device):
    """The tiny decoder of `path` (None: none asked for): bf16 on a GPU, float32 on the CPU."""
    if path is None:
        return None
    from ..loaders.tiny_vae_files import load_tiny_decoder

    return load_tiny_decoder(path, device, torch.bfloat16 if device.type == "cuda" else torch.float32)


def tiny_bytes(tiny, height: int, width: int, beside_vae=False):
    """What the memory plan counts for the tiny decoder (None: the VAE decodes). beside_vae: the VAE stays on the
    device too (the player encodes new start images with it): its weights are counted as well (a VAEConfig, or
    None for the Wan2.1 VAE's; False: the VAE leaves the device, as in the CLI)."""
    if tiny is None:
        return None
    from ..wan.vae.tiny import tiny_decode_bytes

    total = tiny_decode_bytes(tiny.cfg, height, width, tiny.dtype.itemsize)
    if beside_vae is not False:
        from ..wan.vae.footprint import vae_weight_bytes
        from ..wan.vae.model import VAEConfig

        total += vae_weight_bytes(beside_vae or VAEConfig())
    return total


def window_and_sink(entry: ModelEntry, settings: WorldSettings) -> tuple[Optional[int], int]:
    """The K/V window and sink a video of `entry` keeps: the settings', or the model's defaults for MODEL_DEFAULT
    (its release's for a batch video, its play window for a played one)."""
    default_window, default_sink = ((entry.play_window, entry.play_sink) if settings.play
                                    else (entry.window, entry.sink))
    window = default_window if settings.window == MODEL_DEFAULT else settings.window
    sink = default_sink if settings.sink == MODEL_DEFAULT else settings.sink
    return window, (0 if window is None else sink)  # a sink only exists in a window


def video_settings(checked: Checked, settings: WorldSettings, device: torch.device, height: int, width: int, *,
                   keep: bool = True, latent_frames: Optional[int] = None, mode: Optional[str] = None,
                   seed: Optional[int] = None, window: Union[int, None] = MODEL_DEFAULT,
                   sink: int = MODEL_DEFAULT) -> FastSettings:
    """The fixed settings of a video of this size: the one place they are made.

    The model's recipe (chunk, steps, shift, camera form) and window / sink defaults, the speed preset's window cap
    (draft), the K/V cache's dtype. keep: the video may be continued, so the model's files are fingerprinted (a
    state checks them). window / sink: given over the settings' (a continuation keeps its state's)."""
    dtype = cache_dtype(settings.weights, device, settings.speed)
    w, s = window_and_sink(checked.entry, settings)
    if window != MODEL_DEFAULT:
        w = window
    if sink != MODEL_DEFAULT:
        s = sink
    if settings.speed is not None:  # a preset's window cap (draft: 15 latent frames)
        w = settings.speed.fast_window(w, latent_frames)
    fmt = checked.fmt
    return FastSettings(height, width, int(settings.seed if seed is None else seed), settings.noise,
                        mode or settings.rule, window=w, sink=s if w is not None else 0,
                        max_attention=settings.max_attention, precision=settings.precision,
                        weights=settings.weights, cache_dtype=str(dtype).replace("torch.", ""),
                        model=model_fingerprint(fmt) if keep else "", model_label=model_label(fmt),
                        vae_tiled=settings.vae_tiled, model_name=checked.entry.name, recipe=checked.entry.recipe)


def plan_memory(checked: Checked, video: FastSettings, device: torch.device, settings: WorldSettings, *,
                latent_frames: int = 0, play: bool = False, with_camera: bool = True, seq_parallel: int = 1,
                vram: Optional[int] = -1, stream_decode: Optional[str] = None, beside_vae=False,
                decode_bytes: Optional[int] = None):
    """(the memory plan of a video of `latent_frames` so far plus the next part, whether the decoder streams beside
    the model). play: a played video's layout (room for 81 frames at once without a window). vram: what the door
    can give (ComfyUI: what its model management can free; -1: the device's free memory). The decoder counted is
    the tiny decoder's when there is one (beside_vae: the VAE stays on the device too), else the VAE's streaming
    decode; decode_bytes: another decoder's. Raises memory.fast_plan.FastMemoryError when nothing fits."""
    layout = play_layout(video, latent_frames) if play else session_layout(video, latent_frames)
    if layout.note:
        log.warning("K/V cache: %s", layout.note)
    tiny = checked.tiny
    if decode_bytes is None and tiny is not None:
        decode_bytes = tiny_bytes(tiny, video.height, video.width, beside_vae=beside_vae)
    if stream_decode is None:
        stream_decode = "on" if decode_bytes is not None else settings.stream_decode
    plan, stream = plan_world_memory(checked.config, layout, device, video.height, video.width,
                                     weights=settings.weights, kv_cache=settings.kv_cache,
                                     kv_layers_on_gpu=settings.kv_layers_on_gpu, with_camera=with_camera,
                                     stream_decode=stream_decode, vae_cfg=checked.files.vae_config(),
                                     seq_parallel=seq_parallel, vram=vram, decode_bytes=decode_bytes,
                                     compute=gemm_compute(settings.speed), **plan_levers(settings.speed))
    log.info("memory plan: %s", plan.reason)
    return plan, stream


def gemm_compute(speed) -> str:
    """The NF4 GEMMs' mode a speed plan sets on the model (apply_speed; none: the linears' bf16)."""
    return getattr(speed, "compute", None) or "bf16"


def model_loader(checked: Checked, settings: WorldSettings, device: torch.device) -> Callable:
    """load(placement, progress=None) -> the model: loaded as the placement's plan says (NF4 / FP8 / INT8 / bf16,
    resident or block by block), then the LoRAs put on it. The one way every door loads a causal model."""
    dtype = compute_dtype(settings.weights, device)
    path, weights, loras = checked.files.dit, settings.weights, checked.loras

    def load(placement, progress=None):
        model = placement.load_model(path, weights, progress=progress, compute_dtype=dtype)
        if loras:
            from ..loaders.lora_apply import put_loras

            put_loras(model, loras, dtype=dtype, device=device, name=path.name)
        return model

    return load


def fit_speed(checked: Checked, speed):
    """The speed plan for this model (speed.options.fit_to_model: a narrow model runs `--compile auto` eagerly)."""
    from ..speed.options import fit_to_model

    return fit_to_model(speed, checked.config)


def speed_preparer(speed):
    """prepare_model for a session: the speed plan's compile / GEMM / attention choices put on the loaded model."""
    if speed is None:
        return None
    from ..speed.options import apply_speed

    return lambda model: apply_speed(model, speed)


def planning_size(size: str) -> tuple[int, int]:
    """The (height, width) the memory is planned for: an "H*W" size as given, a named one as 16:9 landscape."""
    hw = height_width(size)
    return target_size(*(hw or (9, 16)), max_area_for(size))


def open_session(files: WorldFiles, settings: Optional[WorldSettings] = None, *, device=None, play: bool = True):
    """A WorldSession of `files` ready to start videos from an image and a prompt (the player's way): the files
    checked from their headers, the memory planned for `settings.size` (a played video's layout), the VAE on the
    device; the model loads with the first chunk (or `session.load()`)."""
    from ..loaders.vae_files import load_vae
    from ..memory.kv_placement import FastPlacement
    from .session import WorldSession

    settings = settings or WorldSettings()
    device = compute_device(device)
    check_weights_mode(settings.weights, device)
    checked = check(files, settings, device)
    settings = replace(settings, speed=fit_speed(checked, settings.speed))
    height, width = planning_size(settings.size)
    probe = video_settings(checked, settings, device, height, width)
    plan, _ = plan_memory(checked, probe, device, settings, play=play, stream_decode="on",
                          beside_vae=files.vae_config())
    placement = FastPlacement(plan, device, log.info)
    load = model_loader(checked, settings, device)
    vae = load_vae(files.vae, device, config=files.vae_config())
    session = WorldSession(placement, probe, device=device, load_model=lambda progress=None: load(placement, progress),
                           vae=vae,
                           prepare_model=speed_preparer(settings.speed), speed=settings.speed,
                           tiny_decoder=checked.tiny)
    session.opened = Opened(checked, settings, plan.reason)
    log.info("model: %s", checked.entry.describe())
    return session


@dataclass
class Opened:
    """What `start()` needs to make a new video in a session opened from files."""

    checked: Checked
    settings: WorldSettings
    plan_reason: str

    def new_video(self, vae, image, prompt: str, device):
        """(height, width, conditioning track, prompt embedding, the video's settings) of a new video from an image
        (a path or [3, H, W] in [-1, 1]) and a prompt."""
        h, w, condition, context = start_inputs(self.checked.files, self.settings, vae, load_start_image(image),
                                                prompt, device)
        return h, w, condition, context, video_settings(self.checked, self.settings, device, h, w)


def check_start_image(path) -> Path:
    """A start image's file read now (unreadable or not a picture: one line), before anything loads; its absolute
    path."""
    from ..loaders.image_files import load_image

    path = Path(path).expanduser().resolve()
    load_image(path)
    return path


def load_start_image(image: Union[str, Path, torch.Tensor]) -> torch.Tensor:
    """A path (PNG/JPEG) or a [3, H, W] tensor in [-1, 1] -> the tensor."""
    if isinstance(image, torch.Tensor):
        if image.dim() != 3 or image.shape[0] != 3:
            raise ValueError(f"the start image must be [3, H, W] in [-1, 1], got {tuple(image.shape)}")
        return image.float()
    from ..loaders.image_files import load_image

    decoded = load_image(image)
    for n in decoded.notes:
        log.info("image %s: %s", image, n)
    return decoded.pixels


def start_inputs(files: WorldFiles, settings: WorldSettings, vae, image: torch.Tensor, prompt: str,
                 device: torch.device):
    """(height, width, conditioning track, prompt embedding [L, dim]) of a new video."""
    from ..text_encoder.encode import encode_prompts
    from ..wan.i2v import ConditionTrack

    height, width = target_size(image.shape[1], image.shape[2], max_area_for(settings.size))
    t = settings.text
    context = encode_prompts(files.t5, files.tokenizer, [prompt], device=t.device, cache_dir=t.cache_dir,
                             use_cache=t.use_cache, timeout=t.timeout)[0]
    with torch.inference_mode():
        condition = ConditionTrack.build(vae, image, height, width, tiled=settings.vae_tiled)
    return height, width, condition, context


def open_state(path):
    """A saved Fast state (loaders/fast_state_file.StateFile), its recipe recorded or, for a file written before
    that, v1 Fast's (the only model that wrote them)."""
    from ..loaders.fast_state_file import StateFile
    from .models import legacy_recipe

    return StateFile(path, legacy_recipe())
