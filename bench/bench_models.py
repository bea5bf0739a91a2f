"""The benchmarks' view of the model registry (world/models.py): what a benchmark of a causal model runs, full size
on a GPU or tiny on the CPU (`--tiny`, the smoke runs CI makes).

    model     full size                                          tiny (--tiny)
    v1-fast   the 14B DiT, chunks of 3; 480x832, 81 frames       DiT.tiny, chunks of 3; 64x112, 33 frames
              = 7 chunks; window 21 + sink 3 (issue 26: the      = 3 chunks; window 6 + sink 1 (the 3rd chunk
              whole video, nothing evicted)                      evicts)
    v2-14b    the 14B DiT, chunks of 4; 480x832, 77 frames       DiT.tiny, chunks of 4; 64x112, 45 frames
              = 5 chunks; the play window 18 + sink 6 (the 5th   = 3 chunks; window 10 + sink 2 (the 3rd
              chunk evicts)                                      chunk evicts)
    v2-1.3b   the 1.3B DiT (1536 wide, 30 blocks), as v2-14b     as v2-14b

Each model's random NF4 expert has a folder of its own in a benchmark's --workdir (v1 Fast keeps the name it always
had, lingbot_world_fast_bnb_nf4, so the experts earlier calls left are reused; the others <model>_bnb_nf4), so the
experts of several models can sit in one workdir. The chunk recipe (chunk size, schedule, the fewer-step variants
the speed levers pick, the camera form) is the registry's own: a benchmark of a model runs its maths, only its
weights are random.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional

from ..wan.dit.model import DiTConfig
from ..wan.sizes import height_width
from ..wan.sampling.recipe import ChunkRecipe
from ..world.models import V1_FAST, ModelEntry, causal_models, model

DEFAULT_MODEL = "fast"
SIZE = (480, 832)  # issue 26's and the v2 release's size: 30 x 52 tokens per latent frame
TINY_SIZE = (64, 112)
TINY_CHUNKS = 3
TINY_WINDOW = {3: (6, 1), 4: (10, 2)}  # chunk frames -> (window, sink): the 3rd chunk evicts, a chunk or two roll
_WEIGHTS_SUFFIX = {"nf4": "_bnb_nf4", "fp8": "_fp8", "int8": "_int8"}


@dataclass(frozen=True)
class BenchModel:
    entry: ModelEntry
    tiny: bool
    cfg: DiTConfig  # the model's full-size causal config, or the tiny one
    window: int  # latent frames the K/V cache keeps (the model's play window; tiny: TINY_WINDOW)
    sink: int
    chunks: int  # chunks of the benchmarks' video (v1 7 = 81 frames, v2 5 = 77 frames)
    size: tuple[int, int]  # (height, width)

    @property
    def name(self) -> str:
        return self.entry.name

    @property
    def recipe(self) -> ChunkRecipe:
        return self.entry.recipe

    @property
    def chunk_frames(self) -> int:
        return self.recipe.chunk_frames

    @property
    def chunk_video_frames(self) -> int:
        """Video frames a chunk adds (v1 12, v2 16): the frames per second of a chunk's time."""
        return self.recipe.chunk_video_frames

    @property
    def latent_frames(self) -> int:
        return self.chunks * self.chunk_frames

    def video(self, chunks: Optional[int] = None) -> tuple[int, int, int]:
        """(frames, height, width) of a video of `chunks` chunks (default: the benchmarks' video)."""
        return (self.recipe.first_part_frames(chunks or self.chunks), *self.size)

    def folder(self, weights: str = "nf4") -> str:
        """The random expert's folder name in a workdir (weights "nf4", or a stored "fp8" / "int8" copy)."""
        prefix = "lingbot_world_fast" if self.entry == V1_FAST else self.name
        return prefix + _WEIGHTS_SUFFIX[weights]

    def expert_dir(self, workdir, weights: str = "nf4") -> Path:
        return Path(workdir) / self.folder(weights)

    def fps(self, chunk_s: float) -> float:
        return self.chunk_video_frames / chunk_s

    def describe(self) -> dict:
        """What a result JSON records of the model a benchmark ran."""
        frames, h, w = self.video()
        return {"model": self.name, "recipe": self.recipe.to_json(), "window": self.window, "sink": self.sink,
                "video": {"frames": frames, "height": h, "width": w, "chunks": self.chunks,
                          "latent_frames": self.latent_frames}}


def bench_model(name: str = DEFAULT_MODEL, tiny: bool = False) -> BenchModel:
    """The benchmark setup of the causal registry model `name` (or an alias); KeyError / ValueError otherwise."""
    entry = model(name)
    if not entry.causal:
        raise ValueError(f"{entry.name} is a base model; the chunk benchmarks run the causal ones: "
                         f"{', '.join(model_names())}")
    chunk = entry.recipe.chunk_frames
    if tiny:
        from .pipeline_setup import bench_config

        window, sink = TINY_WINDOW[chunk]
        return BenchModel(entry, True, replace(bench_config(True), causal=True), window, sink, TINY_CHUNKS,
                          TINY_SIZE)
    # v1: issue 26's 81 frames (7 chunks of 3); v2: 77 frames (5 chunks of 4), the last past the 18-frame window
    chunks = 7 if chunk == 3 else 5
    return BenchModel(entry, False, entry.dit, entry.play_window, entry.play_sink, chunks, SIZE)


def spec_recipe(spec: dict) -> ChunkRecipe:
    """The chunk recipe a benchmark's child runs: its spec's ("recipe", a BenchModel's), v1 Fast's where it names
    none (the benchmarks of v1 Fast alone: bench_fast, bench_parallel)."""
    return ChunkRecipe.from_json(spec["recipe"]) if spec.get("recipe") else V1_FAST.recipe


def model_names() -> list[str]:
    """The causal models' registry names, for --model's help."""
    return [e.name for e in causal_models()]


def add_model_argument(p) -> None:
    p.add_argument("--model", default=DEFAULT_MODEL,
                   help=f"the causal model of the registry: {', '.join(model_names())} (default {DEFAULT_MODEL}, "
                        "v1 Fast); its full-size DiT with random weights, its chunk recipe, window and sink")


def parse_bench_size(p, text: str) -> tuple[int, int]:
    """--size H*W as (height, width), both multiples of 16 (the latent's 8x and the patch's 2x); else one usage line."""
    hw = height_width(text)
    if hw is None:
        p.error(f"--size {text}: give H*W, e.g. 304*528")
    h, w = hw
    if h % 16 or w % 16:
        p.error(f"--size {text}: height and width must be positive multiples of 16 (e.g. 304*528, 480*832)")
    return h, w


def parse_model(p, name: str, tiny: bool) -> BenchModel:
    """--model as a BenchModel; an unknown or base model ends the call with one usage line."""
    try:
        return bench_model(name, tiny)
    except (KeyError, ValueError) as e:
        p.error(str(e).strip("'\""))
