"""The suite's pytest-xdist workers split the cores (tests/conftest.py): each worker and the processes it starts
compute with cores // workers threads, unless the caller chose a thread count."""
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

CONFTEST = Path(__file__).with_name("conftest.py")


def _load_conftest_as_a_worker(monkeypatch, workers: str, cores: int, omp=None) -> None:
    """Runs conftest.py's module code as a worker of `workers` would, on a machine of `cores` cores."""
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", workers)
    if omp is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", omp)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)))
    spec = importlib.util.spec_from_file_location("conftest_as_a_worker", CONFTEST)
    spec.loader.exec_module(importlib.util.module_from_spec(spec))


@pytest.fixture
def threads_kept():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("workers,cores,threads", [("2", 2, 1), ("2", 16, 8), ("3", 8, 2), ("4", 2, 1)])
def test_each_worker_computes_with_its_share_of_the_cores(monkeypatch, threads_kept, workers, cores, threads):
    _load_conftest_as_a_worker(monkeypatch, workers, cores)
    assert torch.get_num_threads() == threads and os.environ["OMP_NUM_THREADS"] == str(threads)
    child = subprocess.run([sys.executable, "-c", "import os; print(os.environ['OMP_NUM_THREADS'])"],
                           capture_output=True, text=True, check=True)
    assert child.stdout.strip() == str(threads)  # what the worker's CLI runs, servers and ranks inherit


def test_one_process_and_a_chosen_thread_count_are_left_alone(monkeypatch, threads_kept):
    torch.set_num_threads(2)
    _load_conftest_as_a_worker(monkeypatch, "1", 16)
    assert torch.get_num_threads() == 2 and "OMP_NUM_THREADS" not in os.environ
    _load_conftest_as_a_worker(monkeypatch, "2", 16, omp="3")
    assert torch.get_num_threads() == 2 and os.environ["OMP_NUM_THREADS"] == "3"
