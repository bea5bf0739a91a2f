"""Shared fixtures. The official example inputs the tests use ship in the repository (assets/examples, see its
NOTICE.md), so a fresh clone runs every CPU test."""
import importlib.util
import os
from pathlib import Path
from types import ModuleType

import pytest
import torch


def _share_the_cores() -> None:
    """pytest-xdist's workers (`python -m pytest -n 2`) split the machine's cores between them: each worker, and every
    process it starts (OMP_NUM_THREADS is inherited), computes with its share. Two workers computing with every core
    each oversubscribe them: torch's OpenMP threads spin waiting for a thread the other worker keeps off the CPU, and
    a tiny model's tests took 4 to 20 times as long (five of the slowest files on 2 cores: 368 s, 98 s so shared).
    One thread count in a worker and its children also keeps their results comparable bit for bit (an in-process
    batch run beside a player server). An OMP_NUM_THREADS set by the caller is kept."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers < 2 or "OMP_NUM_THREADS" in os.environ:
        return
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    threads = max(1, cores // workers)
    os.environ["OMP_NUM_THREADS"] = str(threads)
    torch.set_num_threads(threads)


_share_the_cores()

_SIBLINGS: dict[Path, ModuleType] = {}


def load_sibling(name: str) -> ModuleType:
    """tests/<name>.py, run once per process and shared: tests/ is no package and pytest imports its files apart
    (--import-mode=importlib), so a test file reaches another's helpers by path, and this one as tests.conftest."""
    path = Path(__file__).resolve().parent / f"{name}.py"
    if path not in _SIBLINGS:
        spec = importlib.util.spec_from_file_location(name.replace("/", "."), path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _SIBLINGS[path] = module
    return _SIBLINGS[path]


EXAMPLES = Path(__file__).resolve().parents[1] / "assets" / "examples"


@pytest.fixture(scope="session")
def examples_dir() -> Path:
    """The release's example folders 00..03 and 05 (image, poses, intrinsics, key files, prompt)."""
    assert EXAMPLES.is_dir(), f"{EXAMPLES} is missing: the repository's example inputs were not checked out"
    return EXAMPLES


@pytest.fixture(scope="session", autouse=True)
def _history_in_a_temp_folder(tmp_path_factory):
    """Long played videos in tests move old chunks to disk (world/history.py): into the test run's temp folder,
    never the user's ~/.cache."""
    os.environ.setdefault("LINGBOT_HISTORY_DIR", str(tmp_path_factory.mktemp("history")))
    yield


@pytest.fixture(autouse=True)
def _deterministic():
    torch.manual_seed(0)
    yield


def _randomise_dit(model: torch.nn.Module, gen: torch.Generator) -> None:
    """Non-trivial values everywhere: norm gains around 1, weights ~1/sqrt(fan_in), everything else O(0.1-1)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=gen))
            elif p.dim() >= 2 and "modulation" not in name:
                p.copy_(torch.randn(p.shape, generator=gen) / p[0].numel() ** 0.5)
            else:
                p.copy_(0.3 * torch.randn(p.shape, generator=gen))


@pytest.fixture(scope="session")
def randomise_dit():
    """`randomise_dit(model, generator)`: random weights for the DiT tests (every parameter, norms included)."""
    return _randomise_dit


def _make_velocity(seed: int = 1, channels: int = 4):
    """A fixed nonlinear flow field v(x, t): random channel mix + tanh, so the multistep history matters."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(channels, channels, generator=g) / 2

    def velocity(x: torch.Tensor, t: int) -> torch.Tensor:
        s = t / 1000.0
        mixed = torch.einsum("oc,bc...->bo...", w.to(x.dtype), x)
        return torch.tanh(mixed * (0.5 + s)) + 0.3 * s * x - (1 - s) * torch.sin(x)

    noise = torch.randn(1, channels, 2, 3, 5, generator=g)
    return velocity, noise


@pytest.fixture(scope="session")
def make_velocity():
    """`make_velocity(seed)` -> (velocity(x, t), noise): the scheduler tests' flow field."""
    return _make_velocity


@pytest.fixture(scope="session")
def demo_ckpt(tmp_path_factory) -> Path:
    """The tiny demo checkpoint (real on-disk formats, random weights: the base Cam experts with v1 Fast inside, as
    the release), built once per session. Read-only: tests that damage files copy it first (`copy_demo`)."""
    from lingbot_world.world.files import WorldFiles

    root = tmp_path_factory.mktemp("demo") / "ckpt"
    WorldFiles.demo(root)
    return root


@pytest.fixture
def copy_demo(demo_ckpt, tmp_path):
    """`copy_demo()` -> a private copy of the demo checkpoint (a few MB) to damage."""
    import shutil

    def make(name: str = "ckpt") -> Path:
        dst = tmp_path / name
        shutil.copytree(demo_ckpt, dst)
        return dst

    return make


@pytest.fixture(scope="session")
def demo_text_cache(demo_ckpt) -> Path:
    """A prompt cache holding the demo prompt and the default negative prompt, so CLI tests that are not about
    text encoding skip the child process (`--cache-dir` this)."""
    from lingbot_world.loaders.checkpoint_dir import find_checkpoint_files
    from lingbot_world.loaders.demo_checkpoint import DEMO_PROMPT
    from lingbot_world.text_encoder.encode import encode_prompts
    from lingbot_world.wan.text.prompts import DEFAULT_NEGATIVE_PROMPT

    cache = demo_ckpt / "text_cache"
    files = find_checkpoint_files(demo_ckpt)
    encode_prompts(files.t5, files.tokenizer, [DEMO_PROMPT, DEFAULT_NEGATIVE_PROMPT], device="cpu", cache_dir=cache)
    return cache
