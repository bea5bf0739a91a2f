"""The LingBot-World DiT: Wan2.2 I2V-A14B transformer plus LingBot's camera layers (spec §2-3); its config is in
config.py (re-exported here, where the rest of the pack imports it from).

`WanDiT(cfg).state_dict()` has exactly the released expert's keys and shapes (1,421 at full size). The model
can be built on the `meta` device and filled tensor by tensor by a loader; nothing here allocates full-size
float weights on the host unless asked to.
"""
from __future__ import annotations

import math
from typing import Callable, Mapping, Optional, Sequence, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
from einops import rearrange

from .blocks import Head, WanBlock, as_compute, linear_fp32
from .config import CAMERA_CHANNELS, DiTConfig, is_causal_config  # noqa: F401 (the pack imports them from here)
from .film_cache import FilmCache
from .kv_cache import KVCache
from .rope import RopeCache
from .token_ops import EAGER, TokenOps

def sinusoidal_embedding(dim: int, t: torch.Tensor) -> torch.Tensor:
    """[cos(t*w), sin(t*w)] with w_k = 10000^(-k/half), computed in float64 (spec §2.4 step 3)."""
    half = dim // 2
    freqs = torch.pow(10000.0, -torch.arange(half, dtype=torch.float64, device=t.device) / half)
    ang = torch.outer(t.to(torch.float64), freqs)
    return torch.cat([torch.cos(ang), torch.sin(ang)], dim=1).float()


def pad_context(context: Union[torch.Tensor, Sequence[torch.Tensor]], text_len: int) -> torch.Tensor:
    """Zero-pad text embeddings to `text_len` rows (the reference pads, never masks; spec §5.7)."""
    if isinstance(context, torch.Tensor) and context.dim() == 3:
        rows = list(context)
    elif isinstance(context, torch.Tensor):
        rows = [context]
    else:
        rows = list(context)
    out = []
    for c in rows:
        if c.shape[0] > text_len:
            raise ValueError(f"text embedding has {c.shape[0]} rows; the model takes at most {text_len}")
        out.append(F.pad(c, (0, 0, 0, text_len - c.shape[0])))
    return torch.stack(out)


class WanDiT(nn.Module):
    def __init__(self, cfg: DiTConfig, device=None, dtype=None):
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        fk = {"device": device, "dtype": dtype}
        d = cfg.dim
        self.patch_embedding = nn.Conv3d(cfg.in_dim, d, kernel_size=cfg.patch_size, stride=cfg.patch_size, **fk)
        self.patch_embedding_wancamctrl = nn.Linear(cfg.camera_in, d, **fk)
        self.c2ws_hidden_states_layer1 = nn.Linear(d, d, **fk)
        self.c2ws_hidden_states_layer2 = nn.Linear(d, d, **fk)
        self.text_embedding = nn.Sequential(
            nn.Linear(cfg.text_dim, d, **fk), nn.GELU(approximate="tanh"), nn.Linear(d, d, **fk)
        )
        self.time_embedding = nn.Sequential(nn.Linear(cfg.freq_dim, d, **fk), nn.SiLU(), nn.Linear(d, d, **fk))
        self.time_projection = nn.Sequential(nn.SiLU(), nn.Linear(d, 6 * d, **fk))
        self.blocks = nn.ModuleList(
            [WanBlock(d, cfg.ffn_dim, cfg.num_heads, cfg.eps, **fk) for _ in range(cfg.num_layers)]
        )
        self.head = Head(d, cfg.out_dim * math.prod(cfg.patch_size), cfg.eps, **fk)
        self.rope = RopeCache(cfg.head_dim)
        self.token_ops: TokenOps = EAGER  # set_token_ops
        # Dtype of the bulk GEMMs; None = the dtype of the patch embedding weight.
        self.compute_dtype: Optional[torch.dtype] = None
        # Optional per-block hooks (block swap prefetch, cancellation): called with the block index.
        self.before_block: Optional[Callable[[int], None]] = None
        self.after_block: Optional[Callable[[int], None]] = None
        # Sequence parallelism (parallel/ulysses.py): this process's share of the tokens; None = all of them.
        self.seq_parallel = None
        # Optional block runner (speed/block_graphs.py, CUDA graphs): `begin(model, kv_cache, hs, e0s, ctxs, cam,
        # rope, film, dtype)` once the cache has planned the chunk returns None (run the blocks here) or an object
        # whose `run(i, block, kv_layer)` runs block i and returns the residual streams.
        self.block_runner = None

    # ---- helpers -------------------------------------------------------------------------------------
    def dtype_for_compute(self) -> torch.dtype:
        return self.compute_dtype or self.patch_embedding.weight.dtype

    def set_compute_dtype(self, dtype: Optional[torch.dtype] = None) -> None:
        """Run the GEMMs, attention, the camera FiLM and the K/V cache made from now on in `dtype` (float16 for
        fp16-accumulating GEMMs: no cast around any GEMM), or in the load's dtype again (None). The quantized linears
        (those with a `compute_dtype`) dequantize their weights straight into it; the float32 parts (residual stream,
        time modulation, head) stay float32. The other parameters keep their load dtype: block swap packs them into
        flat buffers of that dtype, and bf16 -> fp16 -> bf16 is not exact for tiny values; the few that meet the
        activations (biases, q/k RMSNorm gains, a [dim] vector each) are cast where they are used."""
        quantized = [m for m in self.modules() if m is not self and hasattr(m, "compute_dtype")]
        if dtype is not None:
            plain = [n for n, m in self.named_modules() if isinstance(m, nn.Linear) and not hasattr(m, "compute_dtype")
                     and m.weight.dtype != dtype]
            if plain:
                raise ValueError(f"compute dtype {dtype}: {plain[0]} is a float linear holding "
                                 f"{self.get_submodule(plain[0]).weight.dtype} weights; only a model with quantized "
                                 "linears (NF4) computes in another dtype than its weights'")
        for m in (self, *quantized):
            if "_load_compute_dtype" not in m.__dict__:  # first switch: remember what the load set
                m._load_compute_dtype = m.compute_dtype
            m.compute_dtype = m._load_compute_dtype if dtype is None else dtype

    def set_token_chunk(self, tokens: Optional[int]) -> None:
        """Tokens per chunk in the blocks' per-token phases (None = whole sequence at once; more memory)."""
        for blk in self.blocks:
            blk.token_chunk = tokens

    def set_token_ops(self, ops: TokenOps) -> None:
        """The per-token phase functions of every block and the head: eager, or compiled (the compile option,
        see speed/options.py). Shared function objects, so every expert reuses the same compiled code."""
        self.token_ops = ops
        for blk in self.blocks:
            blk.ops = ops

    def set_seq_parallel(self, sp) -> None:
        """Split every forward's tokens over ranks (a `parallel.ulysses.SequenceParallel`), or None to stop."""
        self.seq_parallel = sp
        for blk in self.blocks:
            blk.seq_parallel = sp

    def time_modulation(self, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """e [B, dim] and e0 [B, 6, dim] in float32: one row per sample instead of per token (spec §2.7)."""
        sin = sinusoidal_embedding(self.cfg.freq_dim, t)
        e = linear_fp32(self.time_embedding[2], F.silu(linear_fp32(self.time_embedding[0], sin)))
        e0 = linear_fp32(self.time_projection[1], F.silu(e)).unflatten(1, (6, self.cfg.dim))
        return e, e0

    def camera_tokens(self, camera: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Control tensor [B, 384 (Plücker) or 448 (Act), F, H, W] -> control tokens [B, L, dim] (spec §2.4 step 5)."""
        _, p, q = self.cfg.patch_size
        expected = self.cfg.control_tensor_channels
        if camera.dim() != 5 or camera.shape[1] != expected:
            raise ValueError(
                f"control tensor {tuple(camera.shape)} has {camera.shape[1] if camera.dim() > 1 else '?'} channels; "
                f"this model ({self.cfg.control_kind} control, {self.cfg.control_channels} per pixel) takes {expected}"
            )
        tokens = rearrange(camera, "b c f (h q) (w r) -> b (f h w) (c q r)", q=p, r=q)
        pe = self.patch_embedding_wancamctrl(as_compute(tokens, dtype))
        return pe + self.c2ws_hidden_states_layer2(F.silu(self.c2ws_hidden_states_layer1(pe)))

    # ---- forward -------------------------------------------------------------------------------------
    def forward(
        self,
        x: torch.Tensor,
        t: torch.Tensor,
        context: Union[torch.Tensor, Sequence[torch.Tensor]],
        y: torch.Tensor,
        camera: Optional[torch.Tensor] = None,
        *,
        kv_cache: Optional[KVCache] = None,
        start_frame: int = 0,
        cache_final: bool = True,
        layered: bool = False,
        shared_input: bool = False,
        film: Optional[FilmCache] = None,
    ) -> torch.Tensor:
        """Velocity prediction.

        x: noisy latent [B, 16, F, H, W]; t: integer timesteps [B] (or a scalar); context: text embeddings
        ([B, <=512, text_dim] or a list of [L_i, text_dim]); y: I2V conditioning [B or 1, 20, F, H, W];
        camera: the packed control tensor on the latent grid (the 8x8 pixels of each latent cell live in the
        channels, spec §3): Plücker [B or 1, 384, F, H, W] for Cam/Fast, ray directions + WASD [B or 1, 448, F, H, W]
        for Act (fast-act spec §6); or None (camera layers skipped).
        Causal (Fast) use: kv_cache holds the K/V of earlier chunks; x is the chunk whose first latent frame is
        `start_frame` of the video (RoPE and cache slots follow it); cache_final says whether the K/V written now
        are the ones later chunks read (the context pass) or will be overwritten (denoising steps). Without a
        cache the model attends over x alone (the base model).
        layered (the base model's "layered" CFG): the B samples run one after the other inside each block
        (`WanBlock.forward_layered`): the memory of one sample's forward plus one float32 residual stream per
        extra sample, each layer's weights prepared once for all samples, the camera FiLM computed once (camera
        must have batch 1), and results bit-identical to B separate forwards. shared_input (layered only): the
        caller knows every sample has the same latent, t, y and camera (CFG's cond/uncond pair; only the text
        differs), so the embeddings and block 0's self-attention and FiLM run once.
        film: a camera FiLM cache (wan/dit/film_cache.py) for a caller that calls this model again and again over
        the same camera tensor (the sampler): the blocks it covers store their camera (1 + scale, shift) in the
        first forward and read them in later ones, bit-identical; once every block reads them the camera tokens
        are not even computed. Ignored without a camera.
        Returns float32 [B, 16, F, H, W].
        """
        dtype = self.dtype_for_compute()
        bsz = x.shape[0]
        t = torch.as_tensor(t, device=x.device).reshape(-1)
        _check_batch("timestep t", t.shape[0], bsz)
        t = t.expand(bsz)
        _check_batch("conditioning y", y.shape[0], bsz)
        if y.shape[0] != bsz:
            y = y.expand(bsz, *y.shape[1:])
        if x.dim() != 5 or y.dim() != 5 or x.shape[2:] != y.shape[2:]:
            raise ValueError(f"latent {tuple(x.shape)} and conditioning y {tuple(y.shape)} differ in size")
        if x.shape[1] + y.shape[1] != self.cfg.in_dim:
            raise ValueError(
                f"latent x has {x.shape[1]} channels and y {y.shape[1]}; the DiT takes {self.cfg.out_dim} + "
                f"{self.cfg.in_dim - self.cfg.out_dim} (noise | mask 4 | image latent 16)"
            )
        if any(n % p for n, p in zip(x.shape[2:], self.cfg.patch_size)):
            # The strided patch conv would silently drop the last row/column.
            raise ValueError(f"latent size {tuple(x.shape[2:])} must be divisible by the patch {self.cfg.patch_size}")
        if layered and kv_cache is not None:
            raise ValueError("layered=True is the base model's CFG mode; the causal K/V cache path runs one pass")
        if shared_input and not layered:
            raise ValueError("shared_input=True needs layered=True")
        if layered and camera is not None and camera.shape[0] != 1:
            raise ValueError(f"layered=True shares the camera between the samples: give the camera tensor with "
                             f"batch 1, not {camera.shape[0]}")
        # The samples as the blocks see them: the whole batch at once, or (layered) one batch-1 slice each, so
        # every GEMM has the row count of a single forward.
        samples = [slice(i, i + 1) for i in range(bsz)] if layered else [slice(None)]
        inputs = samples[:1] if shared_input else samples

        # Input order: noise 16 | mask 4 | image latent 16 (spec §2.4 step 1).
        hs = [self.patch_embedding(torch.cat([x[s], y[s]], dim=1).to(self.patch_embedding.weight.dtype))
              for s in inputs]
        grid = tuple(hs[0].shape[2:])
        # [B, L, dim] with each token's channels side by side: the conv's [B, dim, L] transposed would leave the
        # residual stream channel-strided, and every per-token kernel (norms, modulation, gated residuals) reading
        # it against row-major operands uncoalesced (and each LayerNorm copying it to rows first). The values are
        # the same: each op on the stream is per element, and the norms read a contiguous copy either way.
        for i, h in enumerate(hs):  # one copy each, the conv's output freed as its copy is made
            rows = h.flatten(2).transpose(1, 2)
            hs[i] = rows.contiguous() if rows.dtype == dtype else rows.to(dtype, memory_format=torch.contiguous_format)
        del h, rows

        mod = [self.time_modulation(t[s]) for s in inputs]
        es = [m[0] for m in mod] * (len(samples) // len(inputs))
        e0s = [m[1] for m in mod] * (len(samples) // len(inputs))
        del mod
        ctxs = [None] * len(samples)
        if kv_cache is None or not kv_cache.text_ready:  # a cache holding every layer's text K/V needs no context
            ctx = pad_context(context, self.cfg.text_len).to(x.device)
            _check_batch("text context", ctx.shape[0], bsz)
            if ctx.shape[-1] != self.cfg.text_dim:
                raise ValueError(f"text embeddings are {ctx.shape[-1]} wide; the DiT takes {self.cfg.text_dim} (umT5-XXL)")
            if layered:  # each sample's text through the embedding alone, as in its own forward
                ctx = ctx.expand(bsz, -1, -1) if ctx.shape[0] != bsz else ctx
                ctxs = [self.text_embedding(as_compute(ctx[s], dtype)) for s in samples]
            else:
                ctx = self.text_embedding(as_compute(ctx, dtype))
                ctxs = [ctx.expand(bsz, -1, -1) if ctx.shape[0] != bsz else ctx]
                del ctx

        cam = None
        if camera is None:
            film = None
        else:
            _check_batch("camera tensor", camera.shape[0], bsz)
            _, p, q = self.cfg.patch_size
            if camera.dim() != 5 or camera.shape[2] * (camera.shape[3] // p) * (camera.shape[4] // q) != hs[0].shape[1]:
                raise ValueError(
                    f"camera tensor {tuple(camera.shape)} does not give the latent's {hs[0].shape[1]} tokens; build "
                    "it for the same frames and size"
                )
        if film is not None:
            local = hs[0].shape[1] if self.seq_parallel is None else self.seq_parallel.shard(hs[0].shape[1])[1]
            film.begin(self, camera, (camera.shape[0], local, self.cfg.dim), dtype, x.device)
        if camera is not None and (film is None or not film.complete(len(self.blocks))):
            cam = self.camera_tokens(camera.to(x.device), dtype)
        rope = self.rope.get(grid, x.device, frame_offset=start_frame)
        if kv_cache is not None:
            if start_frame < 0:
                raise ValueError(f"start_frame={start_frame} must be >= 0")
            if kv_cache.batch != bsz or kv_cache.num_layers != len(self.blocks):
                raise ValueError(f"K/V cache for batch {kv_cache.batch} and {kv_cache.num_layers} layers cannot serve "
                                 f"batch {bsz} on a model with {len(self.blocks)} blocks")
            kv_cache.begin(start_frame * grid[1] * grid[2], hs[0].shape[1], final=cache_final)
        elif start_frame:
            raise ValueError("start_frame needs a kv_cache (it places a chunk inside a longer video)")
        sp = self.seq_parallel
        if sp is not None:  # this rank's share of the tokens (the cache above counts the whole chunk)
            split = [sp.scatter(h, cam, rope) for h in hs]
            hs, cam, rope = [p[0] for p in split], split[0][1], split[0][2]
            del split

        runner = self.block_runner
        graphed = None if runner is None else runner.begin(self, kv_cache, hs, e0s, ctxs, cam, rope, film, dtype)
        try:
            for i, block in enumerate(self.blocks):
                if self.before_block is not None:
                    self.before_block(i)
                if graphed is not None:
                    hs = graphed.run(i, block, kv_cache.layer(i), None if film is None else film.layer(i))
                else:
                    hs = block.forward_layered(hs, e0s, ctxs, cam, rope, dtype, inplace=True,
                                               kv=None if kv_cache is None else kv_cache.layer(i),
                                               film=None if film is None else film.layer(i))
                if self.after_block is not None:
                    self.after_block(i)
        except BaseException:
            if kv_cache is not None:
                kv_cache.abort()
            raise
        if kv_cache is not None:
            kv_cache.end()

        chunk = self.blocks[0].token_chunk if len(self.blocks) else None
        outs = []
        for j in range(len(hs)):
            out = self.head(hs[j], es[j], chunk, self.token_ops)  # [B, L, 64] fp32
            hs[j] = None  # this sample's residual stream is done
            outs.append(out if sp is None else sp.gather(out))
        out = outs[0] if len(outs) == 1 else torch.cat(outs)
        del outs
        f, hh, ww = grid
        pt, ph, pw = self.cfg.patch_size
        return rearrange(
            out, "b (f h w) (p q r c) -> b c (f p) (h q) (w r)", f=f, h=hh, w=ww, p=pt, q=ph, r=pw
        ).float()


def _check_batch(what: str, n: int, bsz: int) -> None:
    # Inputs shared by the whole batch (CFG's cond/uncond pair) may come with batch 1 and are broadcast.
    if n not in (1, bsz):
        raise ValueError(f"{what} has batch {n} but the latent x has batch {bsz}; give {bsz} or 1")


# ---- state dict checks ----------------------------------------------------------------------------------
class StateDictMismatch(ValueError):
    """A checkpoint does not fit the model: names every missing, unexpected or mis-shaped key."""


def check_state_dict_shapes(
    model: nn.Module, shapes: Mapping[str, Sequence[int]], source: str = "checkpoint", strict: bool = True
) -> None:
    """Compare checkpoint key -> shape with the model's; raise StateDictMismatch naming each problem."""
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    missing = sorted(set(expected) - set(shapes))
    unexpected = sorted(set(shapes) - set(expected)) if strict else []
    wrong = sorted(k for k in set(expected) & set(shapes) if tuple(shapes[k]) != expected[k])
    if not (missing or unexpected or wrong):
        return
    lines = [f"{source} does not match the model:"]
    for k in wrong[:20]:
        lines.append(f"  shape mismatch for {k}: checkpoint {tuple(shapes[k])} vs model {expected[k]}")
    for k in missing[:20]:
        lines.append(f"  missing key {k} (model expects shape {expected[k]})")
    for k in unexpected[:20]:
        lines.append(f"  unexpected key {k} {tuple(shapes[k])}")
    extra = len(wrong) + len(missing) + len(unexpected) - (len(lines) - 1)
    if extra > 0:
        lines.append(f"  ... and {extra} more")
    lines.append("Check that config.json belongs to these weights and that the file is a LingBot-World expert.")
    raise StateDictMismatch("\n".join(lines))


def load_dit_state_dict(model: WanDiT, sd: Mapping[str, torch.Tensor], source: str = "state dict") -> None:
    """Strict load with readable errors (plain tensors; NF4 goes through loaders/)."""
    check_state_dict_shapes(model, {k: v.shape for k, v in sd.items()}, source)
    model.load_state_dict(sd, strict=True, assign=any(p.is_meta for p in model.parameters()))
