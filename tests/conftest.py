"""Shared fixtures. The official examples live in ../shared beside the checkout (CI clones it there)."""
from pathlib import Path

import pytest
import torch

SHARED = Path(__file__).resolve().parents[2] / "shared"


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    if not SHARED.is_dir():
        pytest.skip(f"{SHARED} not found: the shared materials are not beside this checkout")
    return SHARED


@pytest.fixture(scope="session")
def examples_dir(shared_dir) -> Path:
    d = shared_dir / "examples" / "lingbot"
    if not d.is_dir():
        pytest.skip(f"{d} not found")
    return d


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
