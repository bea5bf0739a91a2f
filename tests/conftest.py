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
