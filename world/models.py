"""The model registry: one entry per LingBot-World model, with everything that makes it that model.

An entry gives the model's DiT config (full size), its control (Plücker camera or Act rays + keys), how it samples
(the base models' flow-UniPC schedule, or a causal model's chunk recipe: chunk size, step indices, shift, camera
form), its window and sink defaults, where its files are (folders in a checkpoint, the hub repository), how it is
recognised from its weights, its licence and its demo. Nothing else in the package names these constants: the
doors list the registry's names, and the assembly (world/assembly.py) reads the entry.

Adding a model with the same maths is one entry here (plus, where it has new maths, the code in wan/). A model is
recognised from what its files hold, never from a folder name (`detect.py`).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Optional

from ..wan.dit.model import DiTConfig
from ..wan.sampling.recipe import ChunkRecipe

BASE, CAUSAL = "base", "causal"


@dataclass(frozen=True)
class Licence:
    name: str
    url: str
    commercial: bool  # may the weights be used commercially

    def line(self) -> str:
        """How the pack says it where a model is picked or named (docs, --help, tooltips, the log)."""
        terms = "" if self.commercial else " (non-commercial use only; adaptations shared alike)"
        return f"weights licensed {self.name}{terms}: {self.url}"


APACHE = Licence("Apache-2.0", "https://www.apache.org/licenses/LICENSE-2.0", True)
CC_BY_NC_SA = Licence("CC BY-NC-SA 4.0", "https://creativecommons.org/licenses/by-nc-sa/4.0/", False)


@dataclass(frozen=True)
class BaseSchedule:
    """The base models' sampling: flow-UniPC over two experts with classifier-free guidance (spec §6)."""

    steps: int  # the release's default
    shift: float = 10.0
    guide_scale: float = 5.0
    boundary: float = 0.947  # the high-noise expert while t >= boundary * 1000


@dataclass(frozen=True)
class ModelFiles:
    """Where a model's files are. `official`: where the release's DiT may be inside a checkpoint folder ("" = the
    folder itself), best first. Our stored copies of the first are beside it: D_bnb_nf4 (`convert-expert`), D_fp8
    and D_int8 (`convert-fp8`, `convert-int8`). `shared_files`: the T5 / VAE / tokenizer come in the same download
    (False: they are borrowed from another LingBot-World download, as for the v2 1.3B)."""

    hub_repo: str
    official: tuple[str, ...] = ()
    shared_files: bool = True
    has_config: bool = True  # the release's DiT folder holds a config.json (the v2 1.3B's does not)
    experts: tuple[tuple[str, tuple[str, ...]], ...] = ()  # base models: (("high", dirs), ("low", dirs))
    hub_note: str = ""  # where the download goes, for the docs and messages
    hub_dir: str = ""  # where the repository's root goes in a models folder ("" = a folder of the release's name)

    @property
    def official_dir(self) -> str:
        return self.official[0]

    def stored_dir(self, weights: str) -> str:
        """The folder of our stored copy in `weights` ("nf4" | "fp8" | "int8") of the official DiT folder."""
        return self.official_dir + {"nf4": "_bnb_nf4", "fp8": "_fp8", "int8": "_int8"}[weights]

    @property
    def dit_dirs(self) -> tuple[str, ...]:
        """Where to look for the DiT with NF4 weights, best first: our NF4 copy, then the release's folder(s)."""
        return (self.stored_dir("nf4"), *self.official) if self.official else ()


@dataclass(frozen=True)
class Demo:
    """The model's tiny random-weight demo: its folder's name under the demo cache, and its defaults."""

    folder: str
    frames: int  # a short video of a few chunks
    out: str  # the video `generate --demo` writes (each model its own, so no demo replaces another's)
    size: str = "64*112"


@dataclass(frozen=True)
class ModelEntry:
    name: str  # what --model and the nodes call it
    title: str
    kind: str  # BASE | CAUSAL
    control: str  # "camera" | "act"
    dit: DiTConfig  # the full-size config (the demo's is tiny)
    files: ModelFiles
    licence: Licence
    demo: Demo
    recipe: Optional[ChunkRecipe] = None  # causal models
    schedule: Optional[BaseSchedule] = None  # base models
    play_window: int = 21  # the player's window and sink (bounded memory for endless play)
    play_sink: int = 3
    aliases: tuple[str, ...] = ()
    release_name: str = ""  # how upstream names it
    notes: tuple[str, ...] = field(default=(), compare=False)

    @property
    def causal(self) -> bool:
        return self.kind == CAUSAL

    @property
    def window(self) -> Optional[int]:
        """The release's K/V window (latent frames; None: the whole video); base models have no cache."""
        return self.recipe.window if self.recipe is not None else None

    @property
    def sink(self) -> int:
        return self.recipe.sink if self.recipe is not None else 0

    @property
    def hub_dir(self) -> str:
        """The folder (relative to a models folder) that a download of the model's hub repository fills."""
        return self.files.hub_dir or self.release_name

    @property
    def generation(self) -> str:
        return self.name.split("-")[0]

    def describe(self) -> str:
        """One line for the log when the model is loaded: what it is and its licence."""
        how = self.recipe.describe() if self.recipe is not None else f"{self.schedule.steps} flow-UniPC steps"
        return f"{self.title} ({how}); {self.licence.line()}"


def _v1_recipe() -> ChunkRecipe:
    # v1 image2video_fast.py:208 passes [0, 179, 358, 679]: timesteps 999, 978, 947, 825 at shift 10
    return ChunkRecipe(3, (0, 179, 358, 679), 10.0, ((3, (0, 358, 679)), (2, (0, 679))), "v1")


def _v2_recipe(shift: float) -> ChunkRecipe:
    # v2 image2video.py:393: [0, 250, 500, 750]; 3 steps drop the step closest to its neighbour (250), 2 keep the
    # first and the last, as for v1; the release's command keeps a window of 18 latent frames with a sink of 6
    return ChunkRecipe(4, (0, 250, 500, 750), shift, ((3, (0, 500, 750)), (2, (0, 750))), "v2", window=18, sink=6)


A14B = DiTConfig()  # 5120 wide, 40 heads, 40 layers (Wan2.2 I2V-A14B)
V2_1_3B_DIT = DiTConfig(dim=1536, ffn_dim=8960, num_heads=12, num_layers=30)
ACT_CONTROL_IN = 7 * 64 * 4

_BASE_EXPERTS = (("high", ("high_noise_model_bnb_nf4", "high_noise_model")),
                 ("low", ("low_noise_model_bnb_nf4", "low_noise_model")))

MODELS: dict[str, ModelEntry] = {}


def _add(entry: ModelEntry) -> ModelEntry:
    for name in (entry.name, *entry.aliases):
        if name in MODELS:
            raise ValueError(f"two registry entries are called {name!r}")
        MODELS[name] = entry
    return entry


V1_BASE_CAM = _add(ModelEntry(
    "v1-base-cam", "LingBot-World Base (Cam)", BASE, "camera", A14B,
    ModelFiles("robbyant/lingbot-world-base-cam", (), experts=_BASE_EXPERTS),
    APACHE, Demo("demo-v1", 17, "lingbot_demo.mp4"), schedule=BaseSchedule(steps=70), release_name="lingbot-world-base-cam"))
V1_BASE_ACT = _add(ModelEntry(
    "v1-base-act", "LingBot-World Base (Act)", BASE, "act", replace(A14B, control_in=ACT_CONTROL_IN),
    ModelFiles("robbyant/lingbot-world-base-act", (), experts=_BASE_EXPERTS),
    APACHE, Demo("demo-v1-act", 17, "lingbot_demo.mp4"), schedule=BaseSchedule(steps=20), release_name="lingbot-world-base-act"))
V1_FAST = _add(ModelEntry(
    "v1-fast", "LingBot-World Fast", CAUSAL, "camera", replace(A14B, causal=True),
    ModelFiles("robbyant/lingbot-world-fast", ("lingbot_world_fast",),
               hub_note="the release puts lingbot_world_fast/ inside lingbot-world-base-cam/",
               hub_dir="lingbot-world-base-cam/lingbot_world_fast"),
    APACHE, Demo("demo-v1", 33, "lingbot_demo_fast.mp4"), recipe=_v1_recipe(), aliases=("fast",), release_name="lingbot-world-fast"))
V2_14B = _add(ModelEntry(
    "v2-14b", "LingBot-World v2 14B (causal-fast)", CAUSAL, "camera", replace(A14B, causal=True),
    ModelFiles("robbyant/lingbot-world-v2-14b-causal-fast", ("transformers",)),
    CC_BY_NC_SA, Demo("demo-v2-14b", 45, "lingbot_demo_v2-14b.mp4"), recipe=_v2_recipe(10.0), play_window=18,
    play_sink=6,
    release_name="lingbot-world-v2-14b-causal-fast"))
V2_1_3B = _add(ModelEntry(
    "v2-1.3b", "LingBot-World v2 1.3B (causal-fast)", CAUSAL, "camera", replace(V2_1_3B_DIT, causal=True),
    ModelFiles("robbyant/lingbot-world-v2-1.3b-causal-fast", ("transformers", ""),
               shared_files=False, has_config=False,
               hub_note="DiT only (six F32 shards, no config.json); the umT5 encoder, tokenizer and VAE come from a "
                        "v2 14B or v1 download"),
    CC_BY_NC_SA, Demo("demo-v2-1.3b", 45, "lingbot_demo_v2-1.3b.mp4"), recipe=_v2_recipe(5.0), play_window=18,
    play_sink=6,
    aliases=("v2-1b3",), release_name="lingbot-world-v2-1.3b-causal-fast"))


def entries() -> list[ModelEntry]:
    """Every model once, in the registry's order."""
    seen: list[ModelEntry] = []
    for e in MODELS.values():
        if e not in seen:
            seen.append(e)
    return seen


def causal_models() -> list[ModelEntry]:
    return [e for e in entries() if e.causal]


def model(name: str) -> ModelEntry:
    """The entry called `name` (or one of its aliases); one line naming the choices otherwise."""
    entry = MODELS.get(name)
    if entry is None:
        raise KeyError(f"no model called {name!r}; the models are {', '.join(e.name for e in entries())}")
    return entry


def legacy_recipe() -> ChunkRecipe:
    """What a Fast state file written before the recipe was recorded used: only v1 Fast wrote those."""
    return V1_FAST.recipe
