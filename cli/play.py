"""`lingbot-world play`: one resident Fast-model session played live in the browser (player/).

Parses the flags into typed settings, checks everything that is quick (the image, the out dir, the port, the
model files' headers) before the model loads, then hands the loaded session to the player's server.
"""
from __future__ import annotations

import logging
import sys
from dataclasses import replace
from pathlib import Path
from typing import Optional

from ..world.models import causal_models
from .errors import UsageError
from .requests import PlayRequest

TIMINGS_ESTIMATE_BYTES = 32 * 1024**2  # ~250 bytes a row, 100k rows at most (player/timings.py)

log = logging.getLogger("lingbot_world.play")
DEMO_SIZE = "64*112"


def add_parser(sub) -> None:
    from ..player.options import DEFAULT_PORT, LOCAL_HOST

    p = sub.add_parser(
        "play", help="play the Fast model live in the browser (keys in, video out)",
        description="Load the Fast model once and play it in a browser page: WASD move, IJKL look; the keys held "
        "while a chunk plays decide the next one. The page can pause, rewind to a chunk boundary, save the clip "
        "and render the played path with the base Cam model or the Fast model at 720p. `--demo` plays the tiny "
        "random-weight demo checkpoint on the CPU (the picture is noise; the whole path is real).")
    from .requests import add_speed_args, model_choices

    src = p.add_argument_group("inputs")
    src.add_argument("--model", choices=model_choices()[1:], default="fast",
                     help="the causal model to play: " + "; ".join(
                         f"{e.name}: {e.title} ({e.licence.line()})" for e in causal_models()))
    src.add_argument("--ckpt-dir", type=Path, help="checkpoint folder with the model (its NF4 copy or release folder: "
                     "lingbot_world_fast*/, transformers*/), the umT5 encoder and the VAE")
    src.add_argument("--assets-dir", type=Path, default=None, metavar="DIR",
                     help="a LingBot-World download holding the umT5 encoder, tokenizer and VAE, when --ckpt-dir lacks "
                          "them (the v2 1.3B ships its DiT only)")
    src.add_argument("--demo", action="store_true", help="play the tiny demo checkpoint (built on first use) on "
                     "the CPU at 64*112 with the demo's image and prompt")
    src.add_argument("--demo-dir", type=Path, default=None, help="where the demo checkpoint is built and cached")
    src.add_argument("--image", type=Path, default=None, help="start image (or pick/upload one in the page)")
    src.add_argument("--prompt", default=None, help="text prompt (or write it in the page)")
    gen = p.add_argument_group("generation")
    gen.add_argument("--seed", type=int, default=42, help="noise seed (the render uses the same)")
    gen.add_argument("--size", default=None, help="max area H*W, aspect from the image (default 480*832; demo "
                     f"{DEMO_SIZE})")
    gen.add_argument("--window", type=int, default=None, metavar="LATENT_FRAMES",
                     help="latent frames kept in the K/V cache (bounded memory for endless play; default the model's: "
                          "v1 Fast 21, v2 18; 0: the whole video)")
    gen.add_argument("--sink", type=int, default=None, metavar="LATENT_FRAMES",
                     help="first latent frames never evicted from the window (default the model's: v1 Fast 3, v2 6)")
    gen.add_argument("--weights", choices=("nf4", "fp8", "int8"), default="nf4",
                     help="the Fast model's weights: nf4, or its stored FP8 copy (`lingbot-world convert-fp8`; "
                          "Ada/Hopper GPUs, emulated on the CPU) or INT8 copy (`lingbot-world convert-int8`; "
                          "Ampere GPUs and newer, and the CPU)")
    gen.add_argument("--kv-cache", choices=("auto", "gpu", "host"), default="auto",
                     help="where the K/V cache lives: gpu, host (pinned RAM, streamed), auto")
    gen.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (demo: cpu)")
    gen.add_argument("--noise", choices=("auto", "cuda", "cpu"), default="auto",
                     help="noise generator (auto: cuda on a GPU), as for generate")
    gen.add_argument("--t5-device", choices=("auto", "cuda", "cpu"), default="auto",
                     help="where the text encoder child runs")
    gen.add_argument("--cache-dir", type=Path, default=None,
                     help="prompt-embedding cache folder (default: ~/.cache/lingbot-world/text)")
    gen.add_argument("--tiny-vae", type=Path, default=None, metavar="PATH",
                     help="play with a tiny decoder (taew2_1.safetensors or lighttaew2_1.safetensors, as in ComfyUI's "
                          "models/vae_approx): preview quality, a fraction of the VAE's decode time and memory. The "
                          "page's render of the path still decodes with the VAE")
    gen.add_argument("--no-preview", action="store_true",
                     help="with --tiny-vae, do not show each chunk's preview (its frames after the first denoising "
                          "step, replaced by the real ones when they come)")
    add_speed_args(p)  # --speed draft: the preset made for real-time play (3 steps, window 15, FP8 K/V cache);
    # --chunk-steps 2 plays it about a quarter faster
    srv = p.add_argument_group("server")
    srv.add_argument("--port", type=int, default=DEFAULT_PORT, help="port of the page (0: any free port)")
    srv.add_argument("--host", default=LOCAL_HOST, help="address to listen on; anything but 127.0.0.1 lets other "
                     "machines reach the page (they still need the token)")
    srv.add_argument("--no-browser", action="store_true", help="only print the URL, do not open a browser")
    srv.add_argument("--out-dir", type=Path, default=Path("lingbot_play"),
                     help="where saves, uploads and renders go (nothing is written anywhere else)")
    srv.add_argument("--timings", type=Path, default=None, metavar="FILE.json",
                     help="at exit, write every played chunk's latency as JSON: the page's own clock (key -> "
                          "screen, request -> screen, fps) beside the server's (first frame, chunk time)")
    p.set_defaults(func=run)


def run(args) -> int:
    """The one reader of `play`'s namespace: everything below takes the typed request."""
    from .progress import cli_logging

    request = PlayRequest.from_args(args)
    with cli_logging(False):
        return _run(request)


def _run(request: PlayRequest) -> int:
    from ..player.driver import SessionDriver
    from ..player.guard import RequestGuard, is_loopback
    from ..player.loading import LoadingServer
    from ..player.options import PlayerOptions
    from ..player.standalone import bind, host_check, page_url, serve
    from ..world.speed import log_speed_plan, played_speed_plan
    from ..world.assembly import check_start_image, check_tiny_vae
    from .checks import check_cache_dir, check_size, noise_source, resolve_device

    # quick checks first: flags, image, out dir, port, model files (headers); the model loads last
    if request.demo and request.ckpt_dir is not None:
        raise UsageError("give either --demo or --ckpt-dir, not both")
    if not request.demo and request.ckpt_dir is None:
        raise UsageError("--ckpt-dir is required (the folder with the Fast model), or use --demo")
    if request.window is not None and request.window < 0:
        raise UsageError(f"--window {request.window}: use a positive number of latent frames (0: the whole video)")
    if request.sink is not None and not 0 <= request.sink < (request.window or 1 << 30):
        raise UsageError(f"--sink {request.sink}: use 0 .. --window - 1")
    if not 0 <= request.port <= 65535:
        raise UsageError(f"--port {request.port}: use 0 .. 65535")
    image, prompt = request.image, request.prompt
    size, device_name = request.size, request.device
    if request.demo:
        from ..world.demos import demo_inputs

        demo_image, demo_prompt = demo_inputs()
        image, prompt = image or demo_image, prompt or demo_prompt
        size = size or DEMO_SIZE
        device_name = "cpu" if device_name == "auto" else device_name
    size = size or "480*832"
    check_size(size)
    check_cache_dir(request.cache_dir)
    device = resolve_device(device_name)
    if request.tiny_vae is not None:
        check_tiny_vae(request.tiny_vae, "--tiny-vae")
    noise = noise_source(request.noise, device)
    speed = played_speed_plan(request.speed_flags, device)  # a played video is long: compile pays off
    if image is not None:
        image = check_start_image(image)  # unreadable or not a picture: one line now
    out_dir = _out_dir(request.out_dir)
    timings = _timings_target(request.timings, image)
    if not is_loopback(request.host):
        print(f"warning: --host {request.host}: the player is reachable from other machines on that network (anyone "
              "with the printed URL and its token can drive it)", file=sys.stderr, flush=True)
    sock = bind(request.host, request.port)
    loading = None
    try:
        from ..world import ModelSource, TextSettings, WorldFiles, WorldSettings, open_session
        from ..world.assembly import check_weights_mode
        from ..world.settings import MODEL_DEFAULT

        check_weights_mode(request.weights, device)  # one line before the demo is built or a header read
        files = WorldFiles.find(ModelSource(model=request.model, ckpt_dir=request.ckpt_dir, demo=request.demo,
                                            demo_dir=request.demo_dir, assets_dir=request.assets_dir),
                                request.weights)
        window = MODEL_DEFAULT if request.window is None else (request.window or None)
        settings = WorldSettings(size=size, seed=request.seed, noise=noise, window=window,
                                 sink=MODEL_DEFAULT if request.sink is None else request.sink,
                                 kv_cache=request.kv_cache, speed=speed, weights=request.weights,
                                 tiny_vae=request.tiny_vae, play=True,
                                 text=TextSettings(device=request.t5_device, cache_dir=request.cache_dir))
        log_speed_plan(speed, log)
        options = PlayerOptions(out_dir=out_dir, image=image, prompt=prompt or "", timings_out=timings,
                                hosts=host_check(request.host, sock))
        loading = LoadingServer(sock, RequestGuard(options.token, options.hosts), options.title).start()
        session = open_session(files, settings, device=device)  # checks every file's header first
        # the render replays the played keys with the session's window and sink (the model's, the preset's cap), and
        # its kernels as the session fitted them to the model (compile auto is `graphs` for a narrow one)
        options = replace(options, render=_render_source(request, size, device_name, noise, session.speed or speed,
                                                         session.settings))
        print(f"player page: {page_url(options, sock)} (it says loading until the model is ready)", flush=True)
        driver = SessionDriver(session, prompt=prompt or "", image=image, write_video=write_frames,
                               previews=not request.no_preview)
        try:
            progress = LoadProgress(loading)
            print(f"loading {session.opened.checked.entry.title}...", flush=True)
            session.load(progress=progress)
            progress.done()
            if image is not None and prompt:
                loading.status = "encoding the prompt and the start image"
                driver.start_now(image, prompt)
        except BaseException:
            driver.close()
            raise
        loading.stop()
        stopped_by = serve(driver, options, sock, open_browser=not request.no_browser,
                           log=lambda line: print(line, flush=True))
    finally:
        if loading is not None:
            loading.stop()
        sock.close()
    return _exit_for(stopped_by)


class LoadProgress:
    """progress(done_bytes, total_bytes) of the model's load: the loading page's status, and a console line at a
    further tenth when a few seconds have passed since the last (a quick load prints none)."""

    EVERY_S = 3.0

    def __init__(self, loading, what: str = "the Fast model", clock=None):
        import time

        self.loading, self.what, self.clock = loading, what, clock or time.monotonic
        self.t0 = self.said_at = self.clock()
        self.tenths = 0

    def __call__(self, done: int, total: int) -> None:
        if total <= 0:
            return
        share, now = min(done / total, 1.0), self.clock()
        amount = f"{total / 1e9:.1f} GB" if total >= 1e9 else f"{total / 1e6:.0f} MB"
        self.loading.status = f"{self.what}: {share:.0%} of {amount}"
        if int(share * 10) > self.tenths and now - self.said_at >= self.EVERY_S:
            self.tenths, self.said_at = int(share * 10), now
            print(f"loading {self.what}: {share:.0%} of {amount}, {now - self.t0:.0f} s", flush=True)

    def done(self) -> None:
        self.loading.status = f"{self.what} is loaded"


def _exit_for(signum: int) -> int:
    """The server stopped cleanly on a signal: the same outcome as any command stopped by it (130, 143, 129)."""
    import signal

    from .errors import Terminated

    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    if signum:
        raise Terminated(signum)
    return 0


def _render_source(request: PlayRequest, size: str, device_name: str, noise: str, speed, played):
    """How the page's "render this path" replays the played keys: the same model, files, seed, window and sink
    (`played`: the session's settings), speed flags."""
    from ..player.options import RenderSource

    if request.demo:
        checkpoint = ("--demo",) + (("--demo-dir", str(Path(request.demo_dir).resolve())) if request.demo_dir else ())
    else:
        checkpoint = ("--ckpt-dir", str(Path(request.ckpt_dir).expanduser().resolve()))
    if request.cache_dir is not None:
        checkpoint += ("--cache-dir", str(Path(request.cache_dir).resolve()))
    if request.speed is not None:  # the render replays with the played preset (its window cap included)
        checkpoint += ("--speed", request.speed)
    if request.assets_dir is not None:
        checkpoint += ("--assets-dir", str(Path(request.assets_dir).expanduser().resolve()))
    return RenderSource(checkpoint, request.seed, size, played.window if played.window is not None else 0,
                        played.sink, device=device_name, model=played.model_name or request.model,
                        demo=request.demo, noise=noise, fast_weights=request.weights,
                        fast_speed_args=("--compile", speed.compile, "--compute", speed.compute,
                                         "--attention", speed.attention)
                        + (("--chunk-steps", str(request.chunk_steps)) if request.chunk_steps else ()))


def write_frames(frames, path: Path, fps: int) -> Path:
    """The session's uint8 frames to a video file, atomically (the same writer and encoder as `generate`)."""
    from .video_out import VideoWriter, plan_output

    writer = VideoWriter(plan_output(Path(path)), fps)
    try:
        for batch in frames:
            writer.append_frames(batch)
    except BaseException:
        writer.abort()
        raise
    return writer.close()


def _timings_target(path: Optional[Path], image: Optional[Path]) -> Optional[Path]:
    """--timings: checked like every output target (cli/outputs.py) before the model loads."""
    if path is None:
        return None
    from .outputs import OutputSpec, check_outputs

    inputs = [("--image", image)] if image is not None else []
    return check_outputs([OutputSpec("--timings", Path(path).expanduser(), TIMINGS_ESTIMATE_BYTES)], inputs)[0]


def _out_dir(path: Path) -> Path:
    import os

    out = Path(path).expanduser().resolve()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"--out-dir {path}: cannot create it ({e.strerror})") from None
    if not os.access(out, os.W_OK):
        raise UsageError(f"--out-dir {path}: not writable; pick a folder you can write to")
    return out
