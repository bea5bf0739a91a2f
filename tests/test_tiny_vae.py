"""The tiny Wan2.1 decoder (wan/vae/tiny.py, loaders/tiny_vae_files.py) against the format's formulas written out
here independently: the whole video at once, every block over all its frames with the memory shifted in time."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from lingbot_world.loaders.tiny_vae_files import TinyVAEFileError, load_tiny_decoder, tiny_config
from lingbot_world.wan.vae.tiny import (TinyConfig, TinyDecoder, TinyStreamingDecoder, tiny_context_latents,
                                        tiny_decode_bytes, tiny_decoder_reach)

CFG = TinyConfig(widths=(8, 6, 5, 4))


def random_state(cfg: TinyConfig = CFG, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    with torch.device("meta"):
        shapes = {k: v.shape for k, v in TinyDecoder(cfg).state_dict().items()}
    return {k: torch.randn(s, generator=g) * (0.5 / max(1, (s[1] * s[2] * s[3]) ** 0.5) if len(s) == 4 else 0.1)
            for k, s in shapes.items()}


def reference_decode(sd: dict, z: torch.Tensor) -> torch.Tensor:
    """z [1, 16, T, h, w] -> frames [1, 3, 1 + 4(T-1), 8h, 8w] in [-1, 1]: the format's layers, whole video."""
    x = z[0].transpose(0, 1)  # [T, 16, h, w]
    x = torch.tanh(x / 3) * 3
    x = F.relu(F.conv2d(x, sd["decoder.1.weight"], sd["decoder.1.bias"], padding=1))
    for blocks, grow, proj, s in (((3, 4, 5), 7, 8, 1), ((9, 10, 11), 13, 14, 2), ((15, 16, 17), 19, 20, 2)):
        for i in blocks:
            past = torch.cat([torch.zeros_like(x[:1]), x[:-1]])  # frame t sees frame t-1's input (none at t=0)
            h = torch.cat([x, past], 1)
            for j in (0, 2, 4):
                h = F.conv2d(h, sd[f"decoder.{i}.conv.{j}.weight"], sd[f"decoder.{i}.conv.{j}.bias"], padding=1)
                if j < 4:
                    h = F.relu(h)
            x = F.relu(h + x)
        x = F.interpolate(x, scale_factor=2, mode="nearest")
        x = F.conv2d(x, sd[f"decoder.{grow}.conv.weight"])
        t, c = x.shape[0], x.shape[1] // s
        x = x.reshape(t * s, c, *x.shape[2:])  # frame t's channel group j is output frame t*s + j
        x = F.conv2d(x, sd[f"decoder.{proj}.weight"], padding=1)
    x = F.conv2d(F.relu(x), sd["decoder.22.weight"], sd["decoder.22.bias"], padding=1).clamp(0, 1)
    return (x[3:] * 2 - 1).transpose(0, 1).unsqueeze(0)


def model_of(sd: dict, cfg: TinyConfig = CFG) -> TinyDecoder:
    m = TinyDecoder(cfg)
    m.load_state_dict(sd)
    return m.eval()


def latent(frames: int = 7, seed: int = 1) -> torch.Tensor:
    return torch.randn(1, 16, frames, 3, 5, generator=torch.Generator().manual_seed(seed))


def test_streamed_decode_matches_the_formulas():
    sd = random_state()
    z = latent(7)
    ref = reference_decode(sd, z)
    out = TinyStreamingDecoder(model_of(sd)).decode(z)
    assert out.shape == (1, 3, 1 + 4 * 6, 24, 40) == ref.shape
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    assert out.min() >= -1 and out.max() <= 1 and out.std() > 0.01  # not a constant picture


def test_chunked_and_frame_by_frame_decodes_are_the_whole_decode_bit_for_bit():
    sd = random_state()
    z = latent(9)
    m = model_of(sd)
    whole = TinyStreamingDecoder(m).decode(z)
    for sizes in ((3, 3, 3), (1,) * 9, (2, 4, 3)):
        d = TinyStreamingDecoder(m)
        parts, at = [], 0
        for n in sizes:
            parts.append(d.decode(z[:, :, at:at + n]))
            at += n
        assert [p.shape[2] for p in parts][0] == 1 + 4 * (sizes[0] - 1)
        assert torch.equal(torch.cat(parts, 2), whole)
        assert d.frames == whole.shape[2]


def test_a_decoder_started_mid_video_with_its_context_continues_exactly():
    reach = tiny_decoder_reach(CFG)
    assert reach == tiny_decoder_reach(TinyConfig())  # the time structure alone decides it
    assert 3 <= reach <= 12
    sd = random_state(seed=3)
    m = model_of(sd)
    z = latent(18, seed=4)
    whole = TinyStreamingDecoder(m).decode(z)
    start = 15  # decode latent frames 15.. after warming up on the frames before
    n = tiny_context_latents(CFG, start)
    assert n == reach
    d = TinyStreamingDecoder(m)
    d.decode(z[:, :, start - n:start])
    tail = d.decode(z[:, :, start:])
    first = 1 + 4 * (start - 1)
    assert torch.equal(tail, whole[:, :, first:])
    # one frame less of context is not enough: the reach is not overstated
    short = TinyStreamingDecoder(m)
    short.decode(z[:, :, start - reach + 1:start])
    assert not torch.equal(short.decode(z[:, :, start:]), whole[:, :, first:])
    assert tiny_context_latents(CFG, 2) == 2


def test_a_fork_decodes_from_where_the_decoder_is_and_leaves_it_as_it_was():
    m = model_of(random_state(seed=5))
    z, other = latent(9, seed=6), latent(3, seed=7)
    whole = TinyStreamingDecoder(m).decode(z)
    for before in (0, 3):  # a fork of a fresh decoder trims the video's first frames like the decoder would
        d = TinyStreamingDecoder(m)
        head = d.decode(z[:, :, :before]) if before else None
        memory = {k: v.clone() for k, v in d.memory.items()}
        fork = d.fork()
        first = 0 if before == 0 else 1 + 4 * (before - 1)
        preview = fork.decode(z[:, :, before:before + 3])
        assert torch.equal(preview, whole[:, :, first:fork.frames])
        fork.decode(other)  # the fork goes on with latents the video never has
        fork.close()
        assert d.latent_frames == before and d.memory.keys() == memory.keys()
        assert all(torch.equal(d.memory[k], v) for k, v in memory.items())
        rest = d.decode(z[:, :, before:])  # the decoder itself goes on exactly as if there had been no fork
        assert torch.equal(rest if head is None else torch.cat([head, rest], 2), whole)


def test_a_chunk_that_does_not_continue_the_video_is_refused():
    d = TinyStreamingDecoder(model_of(random_state()))
    d.decode(latent(3))
    with pytest.raises(ValueError, match="does not continue"):
        d.decode(torch.randn(1, 16, 3, 4, 5))
    with pytest.raises(ValueError, match="16, T, h, w"):
        d.decode(torch.randn(1, 48, 3, 3, 5))


def _write(tmp_path, sd: dict, name: str = "taew2_1.safetensors") -> str:
    path = tmp_path / name
    save_file({k: v.contiguous() for k, v in sd.items()}, str(path))
    return str(path)


def test_files_in_the_real_format_load_with_their_widths(tmp_path):
    full = TinyConfig()
    sd = random_state(full, seed=5)
    encoder = {"encoder.0.weight": torch.randn(64, 3, 3, 3)}  # a file may hold the encoder too: ignored
    wide = dict(sd)
    wide["decoder.7.conv.weight"] = torch.cat([torch.randn(256, 256, 1, 1), sd["decoder.7.conv.weight"]])
    for name, tensors in (("taew2_1.safetensors", {**sd, **encoder}),
                          ("lighttaew2_1.safetensors", {"taehv_" + k: v for k, v in sd.items()}),
                          ("wide.safetensors", wide)):
        m = load_tiny_decoder(_write(tmp_path, tensors, name))
        assert m.cfg == TinyConfig(raw_latents=True)  # float32 tensors: LightTAE's input, whatever the name
        for k, v in sd.items():  # a wider grow layer keeps its last frames' channels
            assert torch.equal(m.state_dict()[k], v), (name, k)
    torch.save({k: v.half() for k, v in sd.items()}, tmp_path / "lighttaew2_1.pth")
    m = load_tiny_decoder(tmp_path / "lighttaew2_1.pth", dtype=torch.bfloat16)
    assert m.dtype == torch.bfloat16 and m.cfg == full  # float16 tensors: taew2_1's input, whatever the name


def test_bad_files_are_refused_in_one_line_naming_the_file(tmp_path):
    sd = random_state()
    with pytest.raises(FileNotFoundError, match="taew2_1.safetensors"):
        load_tiny_decoder(tmp_path / "nope.safetensors")
    other = dict(sd, **{"decoder.1.weight": torch.randn(8, 48, 3, 3)})
    with pytest.raises(TinyVAEFileError, match="48-channel latents.*taew2_1"):
        load_tiny_decoder(_write(tmp_path, other, "taew2_2.safetensors"))
    with pytest.raises(TinyVAEFileError, match="full Wan VAE"):
        load_tiny_decoder(_write(tmp_path, {"decoder.middle.0.residual.0.gamma": torch.ones(3)}, "vae.safetensors"))
    broken = {k: v for k, v in sd.items() if k != "decoder.16.conv.2.weight"}
    with pytest.raises(TinyVAEFileError, match="missing decoder.16.conv.2.weight") as e:
        load_tiny_decoder(_write(tmp_path, broken, "broken.safetensors"))
    assert "broken.safetensors" in str(e.value) and "\n" not in str(e.value)
    (tmp_path / "junk.safetensors").write_bytes(b"not a file")
    with pytest.raises(TinyVAEFileError, match="not a readable safetensors"):
        load_tiny_decoder(tmp_path / "junk.safetensors")
    torch.save({"decoder.1.weight": object()}, tmp_path / "pickled.pth")
    with pytest.raises(TinyVAEFileError, match="weights_only=True"):
        load_tiny_decoder(tmp_path / "pickled.pth")
    with pytest.raises(TinyVAEFileError, match="expected .safetensors or .pth"):
        load_tiny_decoder(_write(tmp_path, sd, "taew2_1.bin"))


def test_config_from_shapes_and_bytes():
    with torch.device("meta"):
        shapes = {k: tuple(v.shape) for k, v in TinyDecoder(TinyConfig()).state_dict().items()}
    assert tiny_config(shapes) == TinyConfig()
    small = tiny_decode_bytes(TinyConfig(), 480, 832)
    assert 0.3e9 < small < 1.5e9  # against ~6.4 GB for the Wan VAE's streaming decode in bf16
    assert tiny_decode_bytes(TinyConfig(), 720, 1280) > small


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_the_gpu_the_full_size_decoder_in_bf16_is_chunk_exact_and_close_to_float32(tmp_path):
    import time

    from lingbot_world.loaders.demo_checkpoint import write_random_tiny_vae

    path = write_random_tiny_vae(tmp_path / "taew2_1.safetensors", widths=(256, 128, 64, 64))
    bf16 = load_tiny_decoder(path, "cuda", torch.bfloat16)
    f32 = load_tiny_decoder(path, "cuda", torch.float32)
    z = torch.randn(1, 16, 9, 60, 104, generator=torch.Generator().manual_seed(0)).cuda()  # 480x832
    whole = TinyStreamingDecoder(bf16).decode(z)
    d = TinyStreamingDecoder(bf16)
    chunks = [d.decode(z[:, :, c:c + 3]) for c in range(0, 9, 3)]
    assert torch.equal(torch.cat(chunks, 2), whole)
    ref = TinyStreamingDecoder(f32).decode(z)
    err = ((whole - ref).norm() / ref.norm()).item()
    d = TinyStreamingDecoder(bf16)
    d.decode(z[:, :, :3])
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(3):
        d.decode(z[:, :, 3:6])
    torch.cuda.synchronize()
    per_chunk = (time.perf_counter() - t0) / 3
    print(f"\ntiny decoder on {torch.cuda.get_device_name()}: {per_chunk * 1e3:.1f} ms per 12-frame chunk at 480x832 "
          f"(bf16); bf16 vs float32 relative L2 {err:.2e}")
    assert err < 2e-2


def test_the_memory_plan_counts_the_tiny_decoder_instead_of_the_vae():
    """24 GB card, 480x832, draft's window: the VAE's streaming decode (~4.7 GB in bf16) against the tiny decoder's
    ~1 GB (plus the VAE's weights where it stays on the device to encode new start images)."""
    from lingbot_world.wan.dit.kv_cache import cache_layout
    from lingbot_world.wan.dit.model import DiTConfig
    from lingbot_world.wan.vae.footprint import vae_weight_bytes
    from lingbot_world.wan.vae.model import VAEConfig
    from lingbot_world.world.assembly import tiny_bytes
    from lingbot_world.world.plan import plan_world_memory

    with torch.device("meta"):
        tiny = TinyDecoder(TinyConfig()).to(torch.bfloat16)
    alone = tiny_bytes(tiny, 480, 832)
    assert alone == tiny_decode_bytes(TinyConfig(), 480, 832, 2)
    assert tiny_bytes(tiny, 480, 832, beside_vae=None) - alone == vae_weight_bytes(VAEConfig())
    assert tiny_bytes(None, 480, 832) is None
    layout = cache_layout(21, 30 * 52, window_frames=15, sink_frames=3)
    kw = dict(vram=24 * 2**30, ram=64 * 2**30, kv_fp8=True, decode_dtype="bf16")
    with_vae, stream = plan_world_memory(DiTConfig(), layout, torch.device("cuda"), 480, 832, **kw)
    with_tiny, stream_tiny = plan_world_memory(DiTConfig(), layout, torch.device("cuda"), 480, 832,
                                               decode_bytes=tiny_bytes(tiny, 480, 832, beside_vae=None), **kw)
    assert stream and stream_tiny
    assert with_tiny.cache_layers_on_gpu >= with_vae.cache_layers_on_gpu + 5  # ~3.2 GB more for the cache
