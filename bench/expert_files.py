"""The random full-size NF4 experts the case-based drivers run (community layout, made in a child process on the
device, reused from --workdir when their config matches): where they go, and making them within the budget."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

from .common import CaseLoop
from .pipeline_setup import GiB

PACKAGE = __name__.rsplit(".bench.", 1)[0]  # the package's import name (its child imports from it)


def expert_paths(workdir: Path, names: tuple = ("high", "low")) -> dict:
    """Where the random base experts go in --workdir (the community layout's folder names)."""
    return {n: workdir / f"{n}_noise_model_bnb_nf4" for n in names}


def random_experts(loop: CaseLoop, paths: dict, configs: dict, device: str, wanted: Optional[dict] = None,
                   label: str = "experts") -> dict:
    """A case-based driver's random experts: write_random_experts on `wanted` (default: all of `paths`) within the
    budget left, announced on stdout, recorded in the results under `label` and saved; their "paths" name every
    folder of `paths` (the cases' specs refer to them)."""
    workdir = next(iter(paths.values())).parent
    print(f"[{label}] {'tiny' if loop.args.tiny else 'full-size'} random NF4 {label} in {workdir} ...", flush=True)
    experts = write_random_experts(paths if wanted is None else wanted, configs, device,
                                   timeout=max(60.0, loop.remaining()))
    experts["paths"] = {n: str(p) for n, p in paths.items()}
    loop.res[label] = experts
    print(f"[{label}] {'reused' if experts.get('reused') else 'made in %s s' % experts.get('seconds')}", flush=True)
    loop.save()
    return experts


def write_random_experts(paths: dict, configs: dict, device: str, timeout: float) -> dict:
    """Random NF4 experts (community layout, made on `device` in a child process) at `paths`, one per name with
    `configs[name]`; folders whose config.json already matches are reused. Returns {"paths", "reused"|"made"}."""
    paths = {n: Path(p) for n, p in paths.items()}
    info: dict = {"paths": {k: str(v) for k, v in paths.items()}}
    todo = {n: p for n, p in paths.items()
            if not ((p / "model.safetensors").is_file() and (p / "config.json").is_file()
                    and json.loads((p / "config.json").read_text()) == configs[n].to_json())}
    if not todo:
        info["reused"] = True
        return info
    from ..loaders.nf4_writer import nf4_expert_bytes

    workdir = next(iter(todo.values())).parent
    workdir.mkdir(parents=True, exist_ok=True)
    need = sum(nf4_expert_bytes(configs[n]) for n in todo) + 2 * GiB
    free = shutil.disk_usage(workdir).free
    if free < need:
        raise RuntimeError(f"{workdir} has {free / 1e9:.1f} GB free; the experts need {need / 1e9:.1f} GB. "
                           "Pass --workdir on a bigger disk.")
    code = (
        f"import json,sys,time;from pathlib import Path;from {PACKAGE}.wan.dit.model import DiTConfig;"
        f"from {PACKAGE}.bench.bench_nf4_load import make_full_size_expert as mk;"
        "jobs=json.loads(sys.argv[1]);out={}\n"
        "for i,(n,(p,c)) in enumerate(jobs.items()):\n"
        "    out[n]=mk(Path(p),sys.argv[2],seed=i,cfg=DiTConfig.from_json(c))\n"
        "print(json.dumps(out))"
    )
    jobs = {n: (str(p), configs[n].to_json()) for n, p in todo.items()}
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code, json.dumps(jobs), device],
                          capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"making the random experts failed:\n{proc.stderr[-3000:]}")
    info["made"] = json.loads(proc.stdout.strip().splitlines()[-1])
    info["seconds"] = round(time.perf_counter() - t0, 1)
    return info
