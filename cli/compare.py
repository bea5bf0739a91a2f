"""`lingbot-world compare`: what each speed preset costs in quality, measured on your own weights.

The same image, prompt, keys and seed run through two or more presets (`--preset`, below) for
`--chunks` chunks, one model in memory at a time (world/compare.py); every chunk of every preset is compared with
the first preset's: PSNR and SSIM of the decoded frames, the drift of the K/V cache (cosine and relative L2,
averaged over layers). Prints the table, writes `compare.json` (every number) and `compare.png` (both over the
chunks) in `--out-dir`. Everything that is quick is checked before the first model loads.

A `--preset` spec is a speed preset's name, optionally followed by a colon and comma-separated options that change it:

    exact                       draft:steps=2               draft:steps=2,tiny-vae
    auto:compile=off            fast:compute=bf16           exact:tiny-vae

- steps=2|3|4: denoising calls per chunk over the preset's (`--chunk-steps`);
- tiny-vae: decode with the tiny decoder given by `--tiny-vae PATH` (`--tiny-vae` on `play` / `generate`);
- compile=, compute=, attention=: the speed flag of that name over the preset's (`--compile` ...).

The label of a preset in the table, the JSON and the plot is its spec as written (options in the order given).
"""
from __future__ import annotations

import logging
import math
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ..world.speed import ATTENTION_CHOICES, CHUNK_STEP_CHOICES, COMPILE_CHOICES, COMPUTE_CHOICES, PRESET_NAMES
from .errors import UsageError
from .requests import DEFAULT_CHUNKS, CompareRequest

log = logging.getLogger("lingbot_world.compare")
DEMO_SIZE = "64*112"
JSON_NAME, PNG_NAME = "compare.json", "compare.png"
JSON_ESTIMATE_BYTES = 4 * 1024**2
PNG_ESTIMATE_BYTES = 2 * 1024**2
DEFAULT_PRESETS = ("exact", "draft", "draft:steps=2")
FLAG_CHOICES = {"compile": COMPILE_CHOICES, "compute": COMPUTE_CHOICES, "attention": ATTENTION_CHOICES}
SPEC_HELP = ("NAME[:OPTION,...]: a speed preset (exact, auto, fast, draft) and what changes in it: steps=2|3|4, "
             "tiny-vae (decode with --tiny-vae PATH), compile=, compute=, attention= (the speed flags)")


@dataclass(frozen=True)
class PresetSpec:
    """One `--preset`: the preset, its steps per chunk (None: the preset's), the speed flags put over it, whether
    it decodes with the tiny decoder, and its label (the spec as given)."""

    label: str
    preset: str
    steps: Optional[int] = None
    flags: tuple = ()  # ((name, value), ...) over the preset's options
    tiny_vae: bool = False


def parse_preset(spec: str) -> PresetSpec:
    """A `--preset` value -> PresetSpec; UsageError (one line) for anything else."""
    text = spec.strip()
    name, _, rest = text.partition(":")
    name = name.strip().lower()
    if name not in PRESET_NAMES:
        raise UsageError(f"--preset {spec!r}: no preset {name!r}; use one of {', '.join(PRESET_NAMES)}, optionally "
                         "with options, e.g. draft:steps=2,tiny-vae")
    steps, flags, tiny, options = None, {}, False, []
    if ":" in text and not rest.strip():
        raise UsageError(f"--preset {spec!r}: nothing after the colon; give options (steps=2, tiny-vae, ...) or "
                         f"drop it")
    for raw in rest.split(",") if rest.strip() else ():
        option = raw.strip().lower()
        key, eq, value = (part.strip() for part in option.partition("="))
        if key == "tiny-vae" and not eq:
            tiny = _once(spec, key, tiny, True)
        elif key == "steps" and eq:
            if value not in {str(s) for s in CHUNK_STEP_CHOICES}:
                raise UsageError(f"--preset {spec!r}: steps={value}; a chunk takes "
                                 f"{', '.join(map(str, CHUNK_STEP_CHOICES))} steps")
            steps = _once(spec, key, steps, int(value))
        elif key in FLAG_CHOICES and eq:
            if value not in FLAG_CHOICES[key]:
                raise UsageError(f"--preset {spec!r}: {key}={value}; use one of {', '.join(FLAG_CHOICES[key])}")
            flags[key] = _once(spec, key, flags.get(key), value)
        else:
            raise UsageError(f"--preset {spec!r}: unknown option {raw.strip()!r}; use steps=2|3|4, tiny-vae, "
                             "compile=, compute= or attention=")
        options.append(f"{key}={value}" if eq else key)
    label = name + (":" + ",".join(options) if options else "")
    return PresetSpec(label, name, steps, tuple(flags.items()), tiny)


def _once(spec: str, key: str, old, new):
    if old not in (None, False):
        raise UsageError(f"--preset {spec!r}: {key} given twice")
    return new


def parse_presets(specs) -> list[PresetSpec]:
    """Every `--preset` (the defaults without one); two or more, each label once."""
    parsed = [parse_preset(s) for s in (specs or DEFAULT_PRESETS)]
    if len(parsed) < 2:
        raise UsageError(f"--preset {parsed[0].label}: give two presets or more (the first is the reference the "
                         "others are compared with), e.g. --preset exact --preset draft:steps=2")
    seen = set()
    for p in parsed:
        if p.label in seen:
            raise UsageError(f"--preset {p.label} given twice; each preset once")
        seen.add(p.label)
    return parsed




def add_parser(sub) -> None:
    from .requests import model_choices

    p = sub.add_parser(
        "compare", help="what each speed preset costs in quality: PSNR / SSIM and K/V drift per chunk",
        description="Run the same image, prompt, keys and seed through two or more speed presets, chunk by chunk, and "
        "compare every chunk with the first preset's: PSNR and SSIM of the decoded frames, and the drift of the K/V "
        "cache (cosine similarity and relative L2, averaged over layers). Prints the table and writes compare.json "
        "and compare.png in --out-dir. One model is in memory at a time. `--demo` runs the tiny random-weight demo "
        "on the CPU (the numbers then only show the method).")
    src = p.add_argument_group("inputs")
    src.add_argument("--model", choices=model_choices()[1:], default="fast", help="the causal model")
    src.add_argument("--ckpt-dir", type=Path, help="checkpoint folder with the model, the umT5 encoder and the VAE")
    src.add_argument("--assets-dir", type=Path, default=None, metavar="DIR",
                     help="a LingBot-World download holding the umT5 encoder, tokenizer and VAE, when --ckpt-dir lacks "
                          "them (the v2 1.3B ships its DiT only)")
    src.add_argument("--demo", action="store_true", help=f"the tiny demo of --model on the CPU at {DEMO_SIZE}, with "
                     "the demo's image and prompt")
    src.add_argument("--demo-dir", type=Path, default=None, help="where the demo checkpoint is built and cached")
    src.add_argument("--image", type=Path, default=None, help="start image (required without --demo)")
    src.add_argument("--prompt", default=None, help="text prompt (required without --demo)")
    src.add_argument("--actions", default=None, metavar="KEYS_OR_PATH",
                     help="the keys, cut into the chunks: an action string such as 'w-12,wj-16,w-16' or key files "
                          "(as for generate); default: each chunk holds one of w, wj, w, wl in turn")
    cmp = p.add_argument_group("the comparison")
    cmp.add_argument("--preset", action="append", default=None, metavar="NAME[:OPTION,...]",
                     help=f"a preset to run, repeated; the first is the reference. {SPEC_HELP}. Default: "
                          f"{' '.join('--preset ' + s for s in DEFAULT_PRESETS)}")
    cmp.add_argument("--chunks", type=int, default=DEFAULT_CHUNKS, help="chunks each preset makes")
    cmp.add_argument("--kv-drift", choices=("on", "off"), default="on",
                     help="measure the K/V cache's drift: the first preset's cache is kept on disk in --out-dir at "
                          "every chunk boundary while the others run (2 x layers x tokens held x width x 2 bytes: up "
                          "to 5.2 GB a chunk for the v2 1.3B at 480*832, 23-27 GB for the 14B models; checked before "
                          "the model loads); off: frames only")
    cmp.add_argument("--tiny-vae", type=Path, default=None, metavar="PATH",
                     help="the tiny decoder (taew2_1.safetensors or lighttaew2_1.safetensors) of the presets with "
                          "the tiny-vae option")
    gen = p.add_argument_group("generation")
    gen.add_argument("--seed", type=int, default=42, help="noise seed (the same for every preset)")
    gen.add_argument("--size", default=None, help=f"max area H*W, aspect from the image (default 480*832; demo "
                     f"{DEMO_SIZE})")
    gen.add_argument("--weights", choices=("nf4", "fp8", "int8"), default="nf4",
                     help="the model's weights for every preset: nf4, or its stored FP8 / INT8 copy")
    gen.add_argument("--kv-cache", choices=("auto", "gpu", "host"), default="auto",
                     help="where the K/V cache lives: gpu, host (pinned RAM, streamed), auto")
    gen.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (demo: cpu)")
    gen.add_argument("--noise", choices=("auto", "cuda", "cpu"), default="auto",
                     help="noise generator (auto: cuda on a GPU)")
    gen.add_argument("--t5-device", choices=("auto", "cuda", "cpu"), default="auto",
                     help="where the text encoder child runs")
    gen.add_argument("--cache-dir", type=Path, default=None,
                     help="prompt-embedding cache folder (default: ~/.cache/lingbot-world/text)")
    out = p.add_argument_group("outputs")
    out.add_argument("--out-dir", type=Path, default=Path("lingbot_compare"),
                     help=f"where {JSON_NAME} and {PNG_NAME} go (the reference run's frames and cache are kept in "
                          "a temporary folder there while the others run)")
    out.add_argument("--quiet", action="store_true", help="only warnings and the table")
    p.set_defaults(func=run)


def run(args) -> int:
    """The one reader of `compare`'s namespace: everything below takes the typed request."""
    from .progress import cli_logging

    request = CompareRequest.from_args(args)
    with cli_logging(request.quiet):
        return _run(request)


def _run(request: CompareRequest) -> int:
    from ..world import ModelSource, TextSettings, WorldFiles, WorldSettings
    from ..world.assembly import check_weights_mode
    from ..world.compare import compare_presets
    from ..world.assembly import check_start_image
    from .checks import check_size, check_t5_device, noise_source, resolve_device

    specs = parse_presets(request.preset)
    if request.chunks < 1:
        raise UsageError(f"--chunks {request.chunks}: compare at least 1 chunk")
    if request.demo and request.ckpt_dir is not None:
        raise UsageError("give either --demo or --ckpt-dir, not both")
    if not request.demo and request.ckpt_dir is None:
        raise UsageError("--ckpt-dir is required (the folder with the model), or use --demo")
    image, prompt, size, device_name = request.image, request.prompt, request.size, request.device
    if request.demo:
        from ..world.demos import demo_inputs

        demo_image, demo_prompt = demo_inputs()
        image, prompt, size = image or demo_image, prompt or demo_prompt, size or DEMO_SIZE
        device_name = "cpu" if device_name == "auto" else device_name
    elif image is None or prompt is None:
        raise UsageError("--image and --prompt are required (or use --demo)")
    size = size or "480*832"
    check_size(size)
    _check_tiny_vae(specs, request.tiny_vae)
    device = resolve_device(device_name)
    check_t5_device(request.t5_device)
    noise = noise_source(request.noise, device)
    variants = _variants(specs, request, device)
    image = check_start_image(image)  # unreadable or not a picture: one line now
    keys = _keys(request.actions)
    targets = _targets(request, image)
    check_weights_mode(request.weights, device)  # one line before the demo is built or a header read
    files = WorldFiles.find(ModelSource(model=request.model, ckpt_dir=request.ckpt_dir, demo=request.demo,
                                        demo_dir=request.demo_dir, assets_dir=request.assets_dir), request.weights)
    settings = WorldSettings(size=size, seed=request.seed, noise=noise, kv_cache=request.kv_cache,
                             weights=request.weights, play=True,
                             text=TextSettings(device=request.t5_device, cache_dir=request.cache_dir))
    total = len(variants)
    result = compare_presets(
        files, settings, variants, image, prompt, keys, chunks=request.chunks, device=device,
        kv_drift=request.kv_drift == "on",
        store_dir=targets[0].parent, check_store=lambda n: _check_store_space(request.out_dir, targets[0].parent, n),
        on_variant=lambda i, v: log.info("preset %d/%d: %s%s", i + 1, total, v.label,
                                         " (the reference)" if i == 0 else ""),
        on_chunk=lambda i, c: log.info("  %s chunk %d: %s", variants[i].label, c.chunk, _row_values(c)))
    _write(result, targets)
    print("\n".join(table(result)), flush=True)
    print(f"wrote {targets[0]} and {targets[1]}", flush=True)
    return 0


def _check_tiny_vae(specs: list[PresetSpec], path) -> None:
    users = [s.label for s in specs if s.tiny_vae]
    if users and path is None:
        raise UsageError(f"--preset {users[0]} decodes with the tiny decoder: give its file with --tiny-vae PATH")
    if path is not None and not users:
        raise UsageError(f"--tiny-vae {path}: no --preset uses it; add the tiny-vae option to one, e.g. "
                         f"--preset {specs[-1].label}{',' if ':' in specs[-1].label else ':'}tiny-vae")
    if path is not None:
        from ..world.assembly import check_tiny_vae

        check_tiny_vae(path, "--tiny-vae")


def _variants(specs: list[PresetSpec], request: CompareRequest, device) -> list:
    """Each spec's speed plan on this device (a choice it cannot run: one line naming the preset)."""
    from ..world.compare import Variant
    from ..world.speed import DEFAULTS, SpeedFlags, played_speed_plan

    out = []
    for spec in specs:
        flags = dict(spec.flags)
        given = SpeedFlags.given(spec.preset, {**DEFAULTS, **flags}, tuple(flags), request.weights, spec.steps)
        try:  # the presets as they are played: --compile auto compiles where the compiler runs
            plan = played_speed_plan(given, device)
        except ValueError as e:
            raise UsageError(f"--preset {spec.label}: {e}") from None
        out.append(Variant(spec.label, plan, Path(request.tiny_vae).expanduser().resolve() if spec.tiny_vae else None))
    return out


def _keys(actions):
    if actions is None:
        return None
    from ..world.controls import read_keys

    try:
        return read_keys(actions)
    except ValueError as e:
        raise UsageError(f"--actions: {e}") from None


def _targets(request: CompareRequest, image: Path) -> list[Path]:
    """compare.json and compare.png in --out-dir (made if missing), checked like every output before any work."""
    from .outputs import OutputSpec, check_outputs

    out = Path(request.out_dir).expanduser()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"--out-dir {request.out_dir}: cannot create it ({e.strerror or e})") from None
    if not out.is_dir():
        raise UsageError(f"--out-dir {request.out_dir}: not a folder")
    inputs = [("--image", image)]
    if request.actions and Path(request.actions).expanduser().exists():
        inputs.append(("--actions", request.actions))
    return check_outputs([OutputSpec("--out-dir", out / JSON_NAME, JSON_ESTIMATE_BYTES),
                          OutputSpec("--out-dir", out / PNG_NAME, PNG_ESTIMATE_BYTES)], inputs)


def _check_store_space(flag_value, folder: Path, need: int) -> None:
    free = shutil.disk_usage(folder).free
    want = need + JSON_ESTIMATE_BYTES + PNG_ESTIMATE_BYTES
    if want * 1.02 > free:
        raise UsageError(f"--out-dir {flag_value}: the reference preset's frames and K/V cache are kept there while "
                         f"the others run, about {_gb(want)} for these chunks, and {_gb(free)} is free; use fewer "
                         "--chunks, a smaller --size, another --out-dir or --kv-drift off")


def _gb(n: float) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"


def _write(result, targets: list[Path]) -> None:
    """The JSON and the PNG, each whole or not at all, both made in memory first (a picture or a number that
    cannot be written fails before either file is touched); an existing one is replaced only now, after the run."""
    import io
    import json

    from ..loaders.atomic import atomic_write
    from ..world.compare_plot import plot_comparison

    text = json.dumps(result.to_json(), indent=1, allow_nan=False) + "\n"
    png = io.BytesIO()
    plot_comparison(result).save(png, format="PNG")
    with atomic_write(targets[0], "w", encoding="utf-8") as f:
        f.write(text)
    with atomic_write(targets[1], "wb") as f:
        f.write(png.getvalue())


# ---- the table --------------------------------------------------------------------------------------------------
def fmt_psnr(x: float) -> str:
    return "inf" if math.isinf(x) else f"{x:.2f}"


def _row_values(c) -> str:
    kv = f", K/V cos {c.drift.cosine:.6f}, rel L2 {c.drift.rel_l2:.5f}" if c.drift is not None else ""
    return f"PSNR {fmt_psnr(c.quality.psnr)} dB, SSIM {c.quality.ssim:.4f}{kv} ({c.seconds:.2f} s)"


def table(result) -> list[str]:
    """Per chunk, every preset against the reference (PSNR inf: identical frames)."""
    ref = result.reference.variant.label
    width = max(len("preset"), *(len(v.variant.label) + (6 if i == 0 else 0) for i, v in enumerate(result.variants)))
    lines = [f"{result.title}, {result.height}x{result.width}, seed {result.seed}: each preset against {ref} "
             "(PSNR inf = identical frames)",
             f"{'chunk':>5}  {'preset':<{width}}  {'PSNR dB':>8}  {'SSIM':>7}  {'K/V cos':>9}  {'K/V rel L2':>10}  "
             f"{'s/chunk':>7}"]
    for c in range(len(result.reference.chunks)):
        for i, v in enumerate(result.variants):
            r = v.chunks[c]
            label = v.variant.label + (" (ref)" if i == 0 else "")
            cos, rel = (f"{r.drift.cosine:.6f}", f"{r.drift.rel_l2:.5f}") if r.drift is not None else ("-", "-")
            lines.append(f"{c:>5}  {label:<{width}}  {fmt_psnr(r.quality.psnr):>8}  {r.quality.ssim:>7.4f}  "
                         f"{cos:>9}  {rel:>10}  {r.seconds:>7.2f}")
    return lines
