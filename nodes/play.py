"""LingBot Play (Wan): the live player inside ComfyUI, on the loaded Fast model, the I2V condition and the text.

The node opens one World session per node (the model through ComfyUI's model management: nodes/adapters/fast_host.py),
and the page of `lingbot-world play` (player/) is served on ComfyUI's own server under
/lingbot_world/play/<node id>/ behind a per-session token; web/lingbot_play.js opens it in a panel. The keys
played so far come back as the node's `actions` output (an action string: LingBot Actions -> LingBot Fast Sampler
with rule "continuable" and the same seed / window / sink re-renders the played path), and the played video's
state as its `state` output (LingBot Fast Continue goes on from it with new keys, exactly as playing on would).
The session keeps playing after the node ran, so the state holds a copy of its K/V cache, taken between two chunks
on the session's own thread together with the action string. Queue again after playing to send the new keys down
the graph. With `tiny_vae`, a tiny decoder from ComfyUI's vae_approx folder (TAEHV taew2_1 / lighttaew2_1)
decodes the played frames instead of the VAE (wan/vae/tiny.py). "Free model and node cache" (and any change of
the node's inputs) closes the session: it lives as long as ComfyUI keeps the node's I2V input in its cache (the
session holds no reference to that object, so it dies with ComfyUI's node cache).
"""
from __future__ import annotations

import itertools
import logging
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ..world.machine import RAM_MARGIN, available_ram_bytes, gb
from ..world.settings import MODEL_DEFAULT
from .adapters import model_fetch
from .adapters.comfy_paths import NO_TINY_VAE
from .adapters.fast_host import FAST_MODEL, FAST_STATE, NOISE_SOURCES, FastModel, condition_track, open_fast_world
from .adapters.fast_state_store import FastStateHandle, state_line, state_output_used
from .adapters.payloads import CATEGORY, I2V, TEXT, I2VCondition, TextEmbeds
from .adapters.ui_hints import hide_if

log = logging.getLogger(__name__)

ROUTE = "/lingbot_world/play"
OUT_SUBDIR = "lingbot_play"
_serials = itertools.count(1)
NOTHING_PLAYED = ("LingBot Play had played no chunk when it ran (its state starts after the first chunk): play in "
                  "its panel, then queue again")
NOT_KEPT = ("LingBot Play kept no state: nothing took its state output when it last ran. Play one more chunk, then "
            "queue again")


@dataclass
class _Open:
    """One node's open player: its inputs' identity, the session's driver, the page's routes."""

    key: tuple
    driver: object  # player.driver.SessionDriver
    player: object  # player.routes.Player
    serial: int = 0


_open: dict[str, _Open] = {}


class LingBotPlay:
    """Plays the Fast model live in a panel: WASD move, IJKL look; outputs the keys played as an action string and
    the played video's state for LingBot Fast Continue."""

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "fast_model": (FAST_MODEL, {"tooltip": "From LingBot Fast Model Loader"}),
                "text": (TEXT, {"tooltip": "From LingBot Text Encode (the prompt of the played world)"}),
                "i2v": (I2V, {"tooltip": (
                    "From LingBot Image To Video with LingBot VAE Loader's VAE: its image starts the world and its "
                    "VAE decodes the frames as they are made, unless tiny_vae is chosen (its frame count does not "
                    "matter: play is endless)")}),
                # no control_after_generate: a new seed on every queue would start a new world instead of
                # sending the played keys down the graph
                "seed": ("INT", {"default": 42, "min": 0, "max": 0xFFFFFFFFFFFFFFFF, "control_after_generate": False,
                                 "tooltip": (
                    "Noise seed; the same seed, window and sink re-render the played keys exactly")}),
                "noise_source": (list(NOISE_SOURCES), {"default": "cpu", "tooltip": (
                    "cpu: the same noise on every machine; cuda: the reference's GPU generator")}),
                "window": ("INT", {"default": 0, "min": 0, "max": 10_000, "tooltip": (
                    "Latent frames kept in the K/V cache: memory stays flat however long you play. 0 = the model's "
                    "play window (v1 Fast 21 with a sink of 3, v2 18 with a sink of 6)")}),
                "sink": ("INT", {"default": 0, "min": 0, "max": 10_000, **hide_if(window=[0]), "tooltip": (
                    "With a window: the first latent frames are never evicted")}),
            },
            "optional": {
                "tiny_vae": (model_fetch.tiny_vae_choices(), {"default": NO_TINY_VAE, "tooltip": (
                    "A tiny decoder from ComfyUI/models/vae_approx (taew2_1 or lighttaew2_1) decodes the played "
                    "frames instead of the VAE: preview quality, a fraction of the VAE's decode time and about 1 GB "
                    "of VRAM instead of 4.7 GB at 480x832, so more of the K/V cache stays on the card. The played "
                    "keys re-rendered through LingBot Fast Sampler + VAE Decode use the full VAE. none: the VAE "
                    "decodes. taew2_1 and lighttaew2_1 are listed before they are installed: the download switch "
                    "fetches the one chosen")}),
                "download": model_fetch.DOWNLOAD_TINY_VAE,
            },
            "hidden": {"prompt": "PROMPT", "unique_id": "UNIQUE_ID"},
        }

    RETURN_TYPES = ("STRING", FAST_STATE)
    RETURN_NAMES = ("actions", "state")
    OUTPUT_TOOLTIPS = (
        "The keys played so far as an action string (queue again after playing to update it); "
        "LingBot Actions -> LingBot Fast Sampler (rule continuable) re-renders them",
        "The played video as it was when the node ran, for LingBot Fast Continue: new keys there go on exactly as "
        "playing on would. Holds a copy of the K/V cache in RAM (bounded by the window; window 0 copies the whole "
        "video's). Kept only when a node takes it as the node runs; before the first chunk there is nothing to "
        "continue (Continue says so)",
    )
    OUTPUT_NODE = True
    FUNCTION = "play"
    CATEGORY = CATEGORY
    DESCRIPTION = ("Opens the live player in a panel on the loaded Fast model: hold W A S D to move and I J K L to "
                   "look; the keys you hold steer the next chunk, asked for as soon as the last one is made. Pause, "
                   "rewind and save in the panel. "
                   "Queue again to send the played keys down the graph as an action string, and the played video's "
                   "state to LingBot Fast Continue. Free model and node cache closes the session.")

    @classmethod
    def VALIDATE_INPUTS(cls, tiny_vae=None, download=None):
        """A tiny decoder that is offered but not installed stops the queue with where it comes from (and asks for
        the download switch) before anything loads."""
        message = model_fetch.tiny_vae_missing(str(tiny_vae or NO_TINY_VAE), bool(download))
        return True if message is None else f"LingBot Play: {message}"

    @classmethod
    def IS_CHANGED(cls, unique_id=None, **_):
        """The keys played since the last run: queueing again after playing re-runs the node with them (its state
        output is taken in the same run, with the same keys)."""
        current = _open.get(str(unique_id))
        return current.driver.snapshot.get("action_string", "") if current is not None else ""

    def play(self, fast_model: FastModel, text: TextEmbeds, i2v: I2VCondition, seed: int = 42,
             noise_source: str = "cpu", window: int = 0, sink: int = 0, tiny_vae: str = NO_TINY_VAE,
             download: bool = False, prompt: Optional[dict] = None, unique_id: Optional[str] = None):
        if noise_source not in NOISE_SOURCES:
            raise ValueError(f"noise_source must be one of {NOISE_SOURCES}, got {noise_source!r}")
        if window and not 0 <= sink < window:  # window 0: the model's play window and sink
            raise ValueError(f"sink {sink}: use 0 .. window - 1 ({window - 1})")
        fast_model.check_text(text.positive)
        node = str(unique_id)
        key = (id(fast_model), id(text), id(i2v), int(seed), noise_source, int(window), int(sink), tiny_vae)
        current = _open.get(node)
        if current is None or current.key != key or current.driver.closed:
            close_player(node)
            current = _open[node] = _start(key, fast_model, text, i2v, int(seed), noise_source,
                                           window or MODEL_DEFAULT, sink if window else MODEL_DEFAULT, tiny_vae,
                                           bool(download))
            current.serial = next(_serials)
            weakref.finalize(i2v, _dropped, node, current.serial)  # Free (or new inputs) drops it: close
        keep = state_output_used(prompt, unique_id)
        actions, played = current.driver.call_now(lambda session: _played(session, keep))
        if played is None:
            state = FastStateHandle.empty(fast_model, i2v, NOT_KEPT if not keep else NOTHING_PLAYED)
        else:
            state = FastStateHandle.first(*played, fast_model, i2v)
            log.info("LingBot Play: %s", state_line(state.store.nbytes, shared=not state.store.evicting))
        token = current.player.options.token
        return {"ui": {"lingbot_play": [{"url": f"{ROUTE}/{node}/?token={token}", "node": node,
                                         "actions": actions}]},
                "result": (actions, state)}


def _played(session, keep: bool):
    """On the session's thread, between two chunks: the keys played and, when kept, the video's state with a copy of
    its cache (the same moment, so the state is the video of exactly that action string)."""
    actions = session.action_string()
    if not keep or session.chunks == 0:
        return actions, None
    need, free = session.snapshot_bytes(), available_ram_bytes()
    if need > free - RAM_MARGIN:
        window = session.settings.window
        fix = ("set window (21 with sink 3 keeps it bounded)" if window is None
               else f"lower window ({window} latent frames kept)")
        raise MemoryError(f"LingBot Play: its state output would copy the video's K/V cache ({gb(need)}) into RAM but "
                          f"{gb(free)} is free (keeping {gb(RAM_MARGIN)}): {fix}, which starts a new session, or "
                          "disconnect the state output")
    return actions, session.snapshot()


def _start(key, fast_model: FastModel, text: TextEmbeds, i2v: I2VCondition, seed: int, noise_source: str,
           window: Optional[int], sink: int, tiny_vae: str = NO_TINY_VAE, download: bool = False) -> _Open:
    import comfy.model_management as mm
    import folder_paths

    from ..player.driver import SessionDriver
    from ..player.options import PlayerOptions
    from ..player.routes import Player
    from ..world.controls import CameraSource
    from ..world.hosted import HostedWorld, PartRequest
    from ..world.keys import KeyTimeline
    from .adapters.progress import show_on_node

    if i2v.vae is None or i2v.image is None:
        raise ValueError("LingBot Play: connect LingBot VAE Loader's VAE to LingBot Image To Video (the player "
                         "decodes each chunk with it and encodes the conditioning of later frames)")
    opening = OpeningProgress()
    device = mm.get_torch_device()
    tiny = _load_tiny(tiny_vae, device, download)
    hosted = HostedWorld(fast_model.checked, fast_model.settings(seed=seed, noise=noise_source, rule="continuable",
                                                                  window=window, sink=sink, vae_tiled=i2v.tiled,
                                                                  play=True), device)
    settings = hosted.video(PartRequest(height=i2v.height, width=i2v.width))
    frames = settings.recipe.first_part_frames(1)  # a played video's first part: one chunk without keys
    first = hosted.first_part(CameraSource(keys=KeyTimeline.none(frames - 1)),
                              PartRequest(height=i2v.height, width=i2v.width, frames=frames), settings)
    world, _ = open_fast_world(fast_model, hosted, settings, first.latent_frames, first, i2v.vae, show=show_on_node,
                               tiny_decoder=tiny)
    try:
        if tiny is None:
            world.vae = i2v.vae.model
        opening.stage("loading the model")
        world.load()  # on ComfyUI's worker thread, with its model management; chunks then run on the player's
        opening.stage("encoding the first frame's conditioning for every later frame, once (one VAE encode: seconds "
                      "on the demo, minutes at 480p)")
        track = condition_track(i2v)
        opening.stage("starting the player")
        world.begin(track, text.positive, text.prompt)
    except BaseException:
        world.close()
        raise
    condition, context, prompt = world.condition, world.context, world.prompt
    driver = SessionDriver(world, prompt=text.prompt)
    driver.adopt(_start_frame(i2v))
    out_dir = Path(folder_paths.get_output_directory()) / OUT_SUBDIR
    options = PlayerOptions(out_dir=out_dir, prompt=text.prompt, title="LingBot Play",
                            restart=lambda session: session.begin(condition, context, prompt))
    player = Player(driver, options, prefix="")
    opening.done("session open: play in the panel (its button on this node reopens it)")
    log.info("LingBot Play: %s session open (%dx%d, window %s, sink %d, frames decoded by %s)", fast_model.entry.title,
             i2v.width, i2v.height, settings.window, settings.sink,
             "the VAE" if tiny is None else f"the tiny decoder {tiny_vae}")
    return _Open(key, driver, player)


class OpeningProgress:
    """What the node shows while a session opens: its stages on ComfyUI's bar (from 0, not the 100 % the run's
    earlier nodes left) and in words under the node."""

    STAGES = 3

    def __init__(self):
        import comfy.utils

        self.bar = comfy.utils.ProgressBar(self.STAGES)
        self.step = 0
        self.bar.update_absolute(0, self.STAGES)

    def stage(self, words: str) -> None:
        from .adapters.progress import show_on_node

        self.step += 1
        show_on_node(f"LingBot Play: {words} ({self.step}/{self.STAGES})...")
        log.info("LingBot Play: %s", words)
        self.bar.update_absolute(self.step - 1, self.STAGES)

    def done(self, words: str) -> None:
        from .adapters.progress import show_on_node

        self.bar.update_absolute(self.STAGES, self.STAGES)
        show_on_node(f"LingBot Play: {words}")


def _load_tiny(name: str, device, download: bool = False):
    """The tiny decoder chosen as tiny_vae, on `device` (None for none), downloaded first when it is offered, missing
    and the switch is on; a missing or wrong file is one line naming the input, said before the session opens."""
    if name == NO_TINY_VAE:
        return None
    from ..world.assembly import load_tiny

    try:
        return load_tiny(model_fetch.resolve_tiny_vae(name, download), device)
    except (FileNotFoundError, ValueError) as e:
        raise ValueError(f"LingBot Play: tiny_vae {name}: {e}") from None


def _start_frame(i2v: I2VCondition):
    """The start image as the page shows it before the first chunk (uint8 [H, W, 3] at the video's size)."""
    import numpy as np
    from PIL import Image

    img = ((i2v.image.float().clamp(-1, 1) + 1) / 2 * 255).to("cpu").byte().permute(1, 2, 0).numpy()
    return np.asarray(Image.fromarray(img).resize((i2v.width, i2v.height), Image.BICUBIC))


def _dropped(node: str, serial: int) -> None:
    """ComfyUI let go of the I2V output a session was opened on: close it (unless the node has a newer one)."""
    current = _open.get(node)
    if current is not None and current.serial == serial:
        # a finalizer may run on a thread that holds the model's lock (a Sampler's run): never wait here
        close_player(node, wait=False, reason="freed")


CLOSED_EVENT = "lingbot_world.play_closed"


def close_player(node: str, wait: bool = True, reason: str = "replaced") -> None:
    """Close one node's player: its page's socket and render child, then the session (after a running chunk). The
    page's panel is told first (`reason` "freed": ComfyUI dropped its node cache, so the session and its models are
    gone until the next Run), so it says so instead of "disconnected"."""
    current = _open.pop(node, None)
    if current is None:
        return
    try:
        from server import PromptServer

        loop = PromptServer.instance.loop
        import asyncio

        PromptServer.instance.send_sync(CLOSED_EVENT, {"node": node, "reason": reason})
        asyncio.run_coroutine_threadsafe(current.player.close(), loop)
    except Exception:  # no server loop (tests): nothing is connected
        pass
    current.driver.close(wait=wait)
    log.info("LingBot Play: session %s closed", node)


def register_routes(routes) -> None:
    """The page, its files, uploads and socket of every open player on ComfyUI's server (a RouteTableDef).
    Each request is handed to its node's player, which checks the token."""
    from aiohttp import web

    def handler(method: str):
        async def handle(request: web.Request):
            current = _open.get(request.match_info["node"])
            if current is None:
                raise web.HTTPNotFound(text="no LingBot Play session is open for this node: queue the workflow\n")
            return await getattr(current.player, method)(request)

        return handle

    routes.get(ROUTE + "/{node}/")(handler("page"))
    routes.get(ROUTE + "/{node}/static/{name}")(handler("static"))
    routes.get(ROUTE + "/{node}/ws")(handler("websocket"))
    routes.post(ROUTE + "/{node}/upload")(handler("upload"))
    routes.get(ROUTE + "/{node}/images")(handler("images"))


def install_routes() -> None:
    """Called once when ComfyUI loads the pack (before its server starts routing); without ComfyUI's server
    (a script loading the nodes) there is nothing to serve the page on."""
    try:
        from server import PromptServer

        routes = PromptServer.instance.routes
    except (ImportError, AttributeError):
        log.info("LingBot Play: no ComfyUI server here; the player's page is not served")
        return
    register_routes(routes)
