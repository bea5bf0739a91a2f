"""The DiT's configuration: `DiTConfig` (the released config.json's fields, checked), the control widths the
released models take, and how a config.json says the model is the causal (Fast) one (spec §2.1, fast-act §2)."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Mapping

CAMERA_CHANNELS = 384  # 6 Plücker channels x 8 x 8 pixels of one VAE cell (spec §3)
PIXELS_PER_CELL = 64  # the control tensors fold the 8 x 8 pixels of a VAE cell into channels
# Per-pixel control channels the released models take: Base (Cam) and Fast 6 (Plücker origin + direction),
# Base (Act) 7 (ray direction + WASD), i.e. patch_embedding_wancamctrl input widths 1536 and 1792.
CONTROL_KINDS = {6: "camera", 7: "act"}
# The Fast release's class: the same weights (names and shapes) as a base expert, run causally with a K/V cache.
# Only its config.json tells them apart (diffusers writes the class name and the causal-only init arguments).
CAUSAL_CLASS = "WanModelFast"
CAUSAL_KEYS = ("local_attn_size", "sink_size")
_INT_FIELDS = ("dim", "ffn_dim", "freq_dim", "in_dim", "out_dim", "num_heads", "num_layers", "text_len", "text_dim",
               "control_in")
_FIXED_OPTIONS = {"qk_norm": True, "cross_attn_norm": True, "window_size": (-1, -1)}


def _as_tuple(value):
    return tuple(value) if isinstance(value, (list, tuple)) else value


@dataclass(frozen=True)
class DiTConfig:
    dim: int = 5120
    ffn_dim: int = 13824
    freq_dim: int = 256
    in_dim: int = 36
    out_dim: int = 16
    num_heads: int = 40
    num_layers: int = 40
    text_len: int = 512
    text_dim: int = 4096
    patch_size: tuple = (1, 2, 2)
    eps: float = 1e-6
    # Input width of patch_embedding_wancamctrl: 1536 (6-channel Plücker camera) or 1792 (Act: 7 channels).
    # The release's config.json does not carry it; loaders/expert_config.py reads it from the weights.
    control_in: int = 6 * PIXELS_PER_CELL * 4
    # Fast (causal) model: run chunk by chunk with a K/V cache. local_attn_size / sink_size are the release
    # config's values (latent frames; -1 = no window), kept for round trips; the released pipeline never evicts.
    causal: bool = False
    local_attn_size: int = -1
    sink_size: int = 0

    @property
    def head_dim(self) -> int:
        return self.dim // self.num_heads

    @property
    def camera_in(self) -> int:
        return self.control_in

    @property
    def control_channels(self) -> int:
        """Control channels per pixel: 6 (Plücker camera: Cam, Fast) or 7 (ray directions + WASD: Act)."""
        return self.control_in // (PIXELS_PER_CELL * math.prod(self.patch_size))

    @property
    def control_kind(self) -> str:
        """'camera' (Base Cam, Fast) or 'act' (Base Act), from the control width."""
        return CONTROL_KINDS[self.control_channels]

    @property
    def control_tensor_channels(self) -> int:
        """Channels of the packed control tensor the forward takes: 384 (camera) or 448 (act)."""
        return self.control_channels * PIXELS_PER_CELL

    @classmethod
    def from_json(cls, cfg: Mapping) -> "DiTConfig":
        """From an expert's `config.json` (unknown keys such as `_class_name` are ignored)."""
        if not isinstance(cfg, Mapping):
            raise ValueError(f"DiT config.json must hold a JSON object, got {type(cfg).__name__}")
        if cfg.get("model_type", "i2v") != "i2v":
            raise ValueError(f"config.json has model_type={cfg.get('model_type')!r}; LingBot-World experts are 'i2v'")
        # Options the reference keeps out of config.json; if a file carries them they must be the built-in ones.
        for key, supported in _FIXED_OPTIONS.items():
            if key in cfg and _as_tuple(cfg[key]) != supported:
                raise ValueError(f"config.json has {key}={cfg[key]!r}; this DiT only supports {supported!r}")
        known = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in cfg.items() if k in known}
        kwargs["causal"] = is_causal_config(cfg)
        if "patch_size" in kwargs:
            kwargs["patch_size"] = _as_tuple(kwargs["patch_size"])
        out = cls(**kwargs)
        out.validate()
        return out

    def to_json(self) -> dict:
        d = asdict(self)
        d["patch_size"] = list(self.patch_size)
        if not d.pop("causal"):
            del d["local_attn_size"], d["sink_size"]
            return {"_class_name": "WanModel", "model_type": "i2v", **d}
        return {"_class_name": CAUSAL_CLASS, "model_type": "i2v", **d}

    def validate(self) -> None:
        for name in _INT_FIELDS:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"DiT config {name}={value!r} must be a positive integer")
        if isinstance(self.eps, bool) or not isinstance(self.eps, (int, float)) or not 0 < self.eps < 1:
            raise ValueError(f"DiT config eps={self.eps!r} must be a small positive number (1e-6 in the release)")
        if _as_tuple(self.patch_size) != (1, 2, 2):
            # The camera packing (spec §3) and the Conv3d layout assume exactly this patch.
            raise ValueError(f"DiT config patch_size={self.patch_size!r}; LingBot-World uses (1, 2, 2)")
        if self.freq_dim % 2:
            raise ValueError(f"freq_dim {self.freq_dim} must be even (half cos, half sin)")
        if self.dim % self.num_heads:
            raise ValueError(f"dim {self.dim} is not divisible by num_heads {self.num_heads}")
        if self.head_dim % 2 or self.head_dim < 6:
            raise ValueError(f"head_dim {self.head_dim} must be even and >= 6 for the 3D RoPE split")
        if self.in_dim != self.out_dim + 20:
            raise ValueError(f"in_dim {self.in_dim} must be out_dim + 20 (noise | mask 4 | image latent 16)")
        per_channel = PIXELS_PER_CELL * math.prod(self.patch_size)
        if self.control_in % per_channel or self.control_in // per_channel not in CONTROL_KINDS:
            widths = " or ".join(f"{c * per_channel} ({k}, {c} channels)" for c, k in CONTROL_KINDS.items())
            raise ValueError(f"control_in {self.control_in} (patch_embedding_wancamctrl input width) must be {widths}")
        for name, low in (("local_attn_size", -1), ("sink_size", 0)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < low or (name == "local_attn_size" and value == 0):
                raise ValueError(f"DiT config {name}={value!r} must be an integer >= {low} (and not 0 for a window)")

    @classmethod
    def tiny(cls, **over) -> "DiTConfig":
        """A small config with the same structure, for tests and the demo."""
        base = dict(dim=64, ffn_dim=128, freq_dim=32, num_heads=4, num_layers=2, text_dim=32)
        base.update(over)
        return cls(**base)


def is_causal_config(cfg: Mapping) -> bool:
    """Does a config.json describe the Fast (causal) model? Its class name, or the init arguments only the causal
    class has (diffusers writes every init argument into config.json)."""
    name = str(cfg.get("_class_name", ""))
    return name == CAUSAL_CLASS or bool(cfg.get("causal", False)) or any(k in cfg for k in CAUSAL_KEYS)
