"""Runs the real CLI (`lingbot_world.cli.main`) in this process with its background imports observed; used by
tests/test_heavy_imports.py in a fresh interpreter (the imports must not be loaded yet).

    python heavy_imports_probe.py serial OUT.json -- generate ...
        No import thread. Recorded: the modules the main thread imported between the start of the background
        imports and their join, and the imports' closure from the very state they start in (computed in a fork
        taken at that moment). The process ends at the join (exit code 0): what follows is not observed.
    python heavy_imports_probe.py slow OUT.json -- generate ...
        The real background imports, each module of theirs slowed down so they run through the main thread's
        whole start-up. Recorded: which thread loaded each module, when the imports ended and when the main thread
        reached the join.
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
from lingbot_world.cli import heavy_imports  # noqa: E402

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


class SlowFinder:
    """First on sys.meta_path: sees every module a thread loads (not the ones found in sys.modules)."""

    loaded_by: dict = {}

    def find_spec(self, name, path=None, target=None):
        thread = threading.current_thread().name
        self.loaded_by.setdefault(name, thread)
        if thread == "lingbot-imports":
            time.sleep(0.002)
        return None


class Slow(Base):
    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        record["background"] = self.background

    def _import(self):
        super()._import()
        record["imports_done"] = time.monotonic()


def main_joins(result):
    """ModelLoad.result: where the main thread joins the load (and so the imports)."""
    def wrapped(self):
        if "main_joins" not in record and threading.current_thread() is threading.main_thread():
            record["main_joins"] = time.monotonic()
            record["main_before_join"] = sorted(n for n, t in SlowFinder.loaded_by.items() if t == "MainThread")
        return result(self)
    return wrapped


if mode == "serial":
    heavy_imports.BackgroundImports = Serial
else:
    from lingbot_world.cli import model_load

    sys.meta_path.insert(0, SlowFinder())
    heavy_imports.BackgroundImports = Slow
    model_load.ModelLoad.result = main_joins(model_load.ModelLoad.result)
code = cli.main(argv)
record["rc"] = code
if mode == "slow":
    record["loaded_by_imports"] = sorted(n for n, t in SlowFinder.loaded_by.items() if t == "lingbot-imports")
with open(out, "w") as f:
    json.dump(record, f)
sys.exit(code)
