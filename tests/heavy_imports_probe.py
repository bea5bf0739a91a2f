"""Runs the real CLI (`lingbot_world.cli.main`) in this process with its background imports observed; used by
tests/test_heavy_imports.py in a fresh interpreter (the imports must not be loaded yet).

    python heavy_imports_probe.py serial OUT.json -- generate ...
        No import thread. Recorded: the modules the main thread imported between the start of the background
        imports and their join, and the imports' closure from the very state they start in (computed in a fork
        taken at that moment). The process ends at the join (exit code 0): what follows is not observed.
    python heavy_imports_probe.py slow OUT.json -- generate ...
        The real background imports, each module of theirs slowed down, and held inside one of their deepest
        modules (GATE_MODULE, with the import locks of bitsandbytes and torch._inductor taken) until the main thread
        reaches the join: both threads import at the same time through the main thread's whole start-up by
        construction, not by timing. Recorded: which thread loaded each module, whether the imports were still
        running when the main thread joined, and whether the gate had to give up (GATE_TIMEOUT_S: the main thread
        never joined, e.g. it was itself waiting for a lock the import thread holds).
"""
import importlib
import json
import os
import sys
import threading
import time

mode, out = sys.argv[1], sys.argv[2]
argv = sys.argv[sys.argv.index("--") + 1:]

from lingbot_world import cli  # noqa: E402
from lingbot_world.world import heavy_imports  # noqa: E402

record: dict = {"mode": mode}
Base = heavy_imports.BackgroundImports


class Serial(Base):
    def __init__(self, modules=heavy_imports.HEAVY_MODULES, background=True):
        super().__init__(modules, background=False)
        record["asked_background"] = background
        self._start = set(sys.modules)
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the closure of the imports from exactly this state
            os.close(read)
            for name in self.modules:
                importlib.import_module(name)
            with os.fdopen(write, "wb") as f:
                f.write(json.dumps(sorted(set(sys.modules) - self._start)).encode())
            os._exit(0)
        os.close(write)
        self._child = (pid, read)

    def wait(self):
        record["main_before_join"] = sorted(set(sys.modules) - self._start)
        record["join_thread"] = threading.current_thread().name
        pid, read = self._child
        with os.fdopen(read, "rb") as f:
            record["closure"] = json.loads(f.read())
        os.waitpid(pid, 0)
        with open(out, "w") as f:
            json.dump(record, f)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


GATE_MODULE = "torch._inductor.compile_fx"  # deep in bitsandbytes' import closure (the test checks it is in it)
GATE_TIMEOUT_S = 120.0
main_joined = threading.Event()
imports_done = threading.Event()


class SlowFinder:
    """First on sys.meta_path: sees every module a thread loads (not the ones found in sys.modules)."""

    loaded_by: dict = {}

    def find_spec(self, name, path=None, target=None):
        thread = threading.current_thread().name
        self.loaded_by.setdefault(name, thread)
        if thread == "lingbot-imports":
            time.sleep(0.002)
            if name == GATE_MODULE and not main_joined.wait(GATE_TIMEOUT_S):
                record["gate_timed_out"] = True
        return None


class Slow(Base):
    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        record["background"] = self.background

    def _import(self):
        super()._import()
        imports_done.set()

    def wait(self):
        main_joins()
        super().wait()


def main_joins():
    """The main thread's first join of the imports: BackgroundImports.wait, or ModelLoad.result when the load (and
    its wait) runs on a thread of its own. Opens the gate."""
    if threading.current_thread() is threading.main_thread() and not main_joined.is_set():
        record["imports_running_at_join"] = not imports_done.is_set()
        record["main_before_join"] = sorted(n for n, t in SlowFinder.loaded_by.items() if t == "MainThread")
        main_joined.set()


def joins_first(result):
    def wrapped(self):
        main_joins()
        return result(self)
    return wrapped


if mode == "serial":
    heavy_imports.BackgroundImports = Serial
else:
    from lingbot_world.world import model_load

    sys.meta_path.insert(0, SlowFinder())
    heavy_imports.BackgroundImports = Slow
    model_load.ModelLoad.result = joins_first(model_load.ModelLoad.result)
code = cli.main(argv)
record["rc"] = code
if mode == "slow":
    record["loaded_by_imports"] = sorted(n for n, t in SlowFinder.loaded_by.items() if t == "lingbot-imports")
with open(out, "w") as f:
    json.dump(record, f)
sys.exit(code)
