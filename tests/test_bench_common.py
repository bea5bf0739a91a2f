"""The case-based benchmark drivers' shared plumbing (bench/common.py): their common arguments, --cases, the case
loop under a wall-clock budget (skip, errors, saving, clean-up), one case's child process (its JSON line, a crash,
a time box that kills the whole process group) and the child side's JSON result."""
import argparse
import json
import os
import subprocess
import textwrap
import time
from types import SimpleNamespace

import pytest

from lingbot_world.bench import bench_fast, bench_parallel, bench_pipeline, bench_speed, speed_profile
from lingbot_world.bench.common import CaseLoop, add_case_arguments, child_main, parse_cases, run_case_child

CASES = {"a": {}, "b": {}, "c": {}}


def _parser(**kw) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bench_x")
    defaults = dict(tiny_help="tiny run", budget_s=100.0, min_case_s=10.0, workdir="/tmp/wd",
                    workdir_help="where things go", keep_help="keep things")
    add_case_arguments(p, CASES, ["a", "b"], **{**defaults, **kw})
    return p


def test_common_arguments_take_each_drivers_defaults_and_help():
    p = _parser(cases_note=" (default: a and b)", time_box=("--case-s", 42.0, "time box of one case"))
    args = p.parse_args([])
    assert (args.tiny, args.device, args.out, args.fresh, args.keep, args.child) == (False, None, None, False,
                                                                                      False, None)
    assert (args.cases, args.budget_s, args.case_s, args.min_case_s, args.workdir) == ("a,b", 100.0, 42.0, 10.0,
                                                                                        "/tmp/wd")
    text = p.format_help()
    for snippet in ("tiny run", "comma-separated subset of a,b,c (default: a and b)", "time box of one case",
                    "where things go", "keep things", "wall-clock budget; later cases are skipped",
                    "do not start a case with less budget left"):
        assert snippet in " ".join(text.split()), snippet
    assert "--child" not in text  # the children's flag stays hidden
    flags = [a.option_strings[0] for a in p._actions if a.option_strings and a.option_strings[0] != "-h"]
    assert flags == ["--tiny", "--device", "--out", "--fresh", "--cases", "--budget-s", "--case-s", "--min-case-s",
                     "--workdir", "--keep", "--child"]
    assert p.parse_args(["--child", "spec.json"]).child == "spec.json"
    assert not hasattr(_parser().parse_args([]), "case_s")  # no time-box flag unless the driver has one


def test_cases_are_parsed_and_an_unknown_one_is_one_usage_line(capsys):
    p = _parser()
    assert parse_cases(p, " a, c ,,", CASES) == ["a", "c"]
    with pytest.raises(SystemExit) as e:
        parse_cases(p, "a,nope", CASES)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == "bench_x: error: unknown case(s) ['nope']; choose from a, b, c"


@pytest.mark.parametrize("module", [bench_fast, bench_parallel, bench_pipeline, bench_speed])
def test_every_driver_rejects_an_unknown_case_before_any_work(module, capsys, tmp_path):
    with pytest.raises(SystemExit):
        module.main(["--cases", "nope", "--out", str(tmp_path / "r.json"), "--workdir", str(tmp_path / "w")])
    assert "unknown case(s) ['nope']" in capsys.readouterr().err
    assert not (tmp_path / "r.json").exists() and not (tmp_path / "w").exists()


def _args(tmp_path, **kw):
    base = dict(tiny=True, out=str(tmp_path / "res.json"), fresh=False, cases=["a", "b", "c"], budget_s=100.0,
                min_case_s=10.0, keep=False, child=None)
    return SimpleNamespace(**{**base, **kw})


def test_case_loop_records_results_and_errors_saves_after_every_case_and_cleans_up(tmp_path, capsys):
    workdir = tmp_path / "w"
    expert = workdir / "expert_bnb_nf4"
    expert.mkdir(parents=True)
    (expert / "model.safetensors").write_bytes(b"x")
    (workdir / "out_a.safetensors").write_bytes(b"y")  # not the loop's to remove
    (tmp_path / "res.json").write_text(json.dumps({"bench": "x", "cases": {"old": {"s_per_step": 1.0}}}))
    finished, seen = [], []

    def finish(res):
        finished.append(sorted(res["cases"]))
        res.update(summary={"n": len(res["cases"])}, targets={})

    loop = CaseLoop(_args(tmp_path), "x", "cpu", finish, notes=["n"], config={"dim": 8})
    assert list(loop.res)[:8] == ["bench", "cases", "machine", "device", "tiny", "config", "args", "notes"]
    assert "child" not in loop.res["args"]

    def run_case(name, seconds):
        (workdir / f"spec_{name}.json").write_text("{}")
        on_disk = json.loads((tmp_path / "res.json").read_text())["cases"]
        seen.append((name, sorted(on_disk), seconds))
        if name == "b":
            raise RuntimeError("no card")
        return {"child_seconds": 0.5, "s_per_step": 2.0}

    res = loop.run(run_case, workdir, written=[expert])
    assert res["cases"]["old"] == {"s_per_step": 1.0}  # an earlier call's case is kept
    assert res["cases"]["a"] == {"child_seconds": 0.5, "s_per_step": 2.0}
    assert res["cases"]["b"] == {"error": "RuntimeError: no card"}  # recorded; the next case still ran
    assert "c" in res["cases"]
    # saved after every case: each case saw the ones before it on disk
    assert [s[1] for s in seen] == [["old"], ["a", "old"], ["a", "b", "old"]]
    assert all(0 < s[2] <= 100.0 for s in seen)
    on_disk = json.loads((tmp_path / "res.json").read_text())
    assert on_disk["summary"] == {"n": 4} and "parent_peak_rss" in on_disk and "elapsed_seconds" in on_disk
    assert finished[-1] == ["a", "b", "c", "old"]
    assert not expert.exists() and not list(workdir.glob("spec_*.json"))
    assert (workdir / "out_a.safetensors").exists()
    out = capsys.readouterr().out
    assert "[a] ok in 0.5 s, 2.0 s/step" in out and "[b] RuntimeError: no card" in out


def test_case_loop_skips_cases_below_the_minimum_budget_and_keeps_experts_with_keep(tmp_path, capsys):
    workdir = tmp_path / "w"
    expert = workdir / "expert_bnb_nf4"
    expert.mkdir(parents=True)
    ran = []
    loop = CaseLoop(_args(tmp_path, budget_s=100.0, min_case_s=10.0, keep=True, fresh=True), "x", "cpu",
                    lambda res: None, notes=[])

    def run_case(name, seconds):
        ran.append((name, seconds))
        loop.t_start -= 95.0  # the first case takes 95 s of the budget: 5 s left, below --min-case-s
        return {"child_seconds": 95.0}

    res = loop.run(run_case, workdir, written=[expert], time_box=4.0)
    assert [n for n, _ in ran] == ["a"] and ran[0][1] == 4.0  # the time box below the budget left
    for name in ("b", "c"):
        assert res["cases"][name]["error"] in ("skipped: 5 s of the budget left", "skipped: 4 s of the budget left")
    assert expert.exists()  # --keep
    assert "[b] skipped (budget)" in capsys.readouterr().out


def test_case_loop_saves_and_cleans_up_when_a_case_ends_the_call(tmp_path):
    workdir = tmp_path / "w"
    workdir.mkdir()

    def run_case(name, seconds):
        (workdir / f"spec_{name}.json").write_text("{}")
        raise KeyboardInterrupt

    loop = CaseLoop(_args(tmp_path, fresh=True), "x", "cpu", lambda res: None, notes=[])
    with pytest.raises(KeyboardInterrupt):
        loop.run(run_case, workdir)
    assert "parent_peak_rss" in json.loads((tmp_path / "res.json").read_text())
    assert not list(workdir.glob("spec_*.json"))


# ---- the child process -----------------------------------------------------------------------------------------
FAKE_DRIVER = textwrap.dedent('''
    import json, os, subprocess, sys, time
    spec = json.loads(open(sys.argv[sys.argv.index("--child") + 1]).read())
    if spec["kind"] == "ok":
        print("some log line")
        print(json.dumps({"value": 3}))
    elif spec["kind"] == "crash":
        sys.stderr.write("Traceback: it broke\\n")
        sys.exit(3)
    else:  # hang, with a grandchild that must not outlive the time box
        g = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        open(spec["pid_file"], "w").write(f"{os.getpid()} {g.pid}")
        time.sleep(60)
''')


@pytest.fixture
def fake_driver(tmp_path, monkeypatch):
    (tmp_path / "fake_driver.py").write_text(FAKE_DRIVER)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    return "fake_driver"


def test_run_case_child_reads_the_last_json_line_and_records_a_crash(tmp_path, fake_driver):
    r = run_case_child({"case": "one", "kind": "ok", "device": "cpu"}, tmp_path, 30, fake_driver)
    assert r["value"] == 3 and r["child_seconds"] >= 0 and "error" not in r
    assert json.loads((tmp_path / "spec_one.json").read_text())["kind"] == "ok"
    r = run_case_child({"case": "two", "kind": "crash", "device": "cpu"}, tmp_path, 30, fake_driver)
    assert r["error"] == "child exited 3 without a result" and "it broke" in r["stderr_tail"]


def test_run_case_child_kills_the_whole_process_group_at_the_time_box(tmp_path, fake_driver):
    pid_file = tmp_path / "pids"
    t0 = time.perf_counter()
    r = run_case_child({"case": "h", "kind": "hang", "device": "cpu", "pid_file": str(pid_file)}, tmp_path, 2,
                       fake_driver)
    assert time.perf_counter() - t0 < 20
    assert r["error"] == "timeout after 2 s (time box)"
    for pid in pid_file.read_text().split():
        _assert_gone(int(pid))


def _assert_gone(pid: int) -> None:
    for _ in range(50):  # reaped by init once killed
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    with open(f"/proc/{pid}/stat") as f:  # a zombie where init does not reap: killed all the same
        assert f.read().split()[2] == "Z", f"process {pid} outlived its case"


def test_run_case_child_leaves_no_process_behind_when_the_parent_is_interrupted(tmp_path, fake_driver, monkeypatch):
    pid_file = tmp_path / "pids"

    def communicate(self, *args, **kw):  # Ctrl-C once the case runs (its grandchild started)
        for _ in range(200):
            if pid_file.is_file() and pid_file.read_text():
                break
            time.sleep(0.05)
        raise KeyboardInterrupt

    monkeypatch.setattr(subprocess.Popen, "communicate", communicate)
    with pytest.raises(KeyboardInterrupt):
        run_case_child({"case": "h", "kind": "hang", "device": "cpu", "pid_file": str(pid_file)}, tmp_path, 60,
                       fake_driver)
    for pid in pid_file.read_text().split():  # the case's process and the one it started
        _assert_gone(int(pid))


def _child_json(tmp_path, capsys, children, rank=None, device="cpu"):
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"case": "x", "kind": "k", "device": device}))
    assert child_main(str(spec), children, rank=rank) == 0
    out = capsys.readouterr().out.strip()
    return json.loads(out.splitlines()[-1]) if out else None


def test_child_main_prints_the_result_or_the_error_as_one_json_line(tmp_path, capsys):
    r = _child_json(tmp_path, capsys, {"k": lambda spec: {"s_per_step": 1.5}})
    assert r["s_per_step"] == 1.5 and "peak_rss" in r

    def boom(spec):
        raise ValueError("bad shape [1, 2]")

    r = _child_json(tmp_path, capsys, {"k": boom})
    assert r["error"] == "ValueError: bad shape [1, 2]" and "boom" in r["traceback"]

    def oom(spec):
        raise __import__("torch").OutOfMemoryError("CUDA out of memory. Tried 2 GiB\nmore text")

    assert _child_json(tmp_path, capsys, {"k": oom})["error"] == "OOM: CUDA out of memory. Tried 2 GiB"


def test_child_main_of_a_rank_names_it_and_only_rank_0_prints_a_result(tmp_path, capsys):
    assert _child_json(tmp_path, capsys, {"k": lambda spec: {}}, rank=1) is None
    assert _child_json(tmp_path, capsys, {"k": lambda spec: {"v": 1}}, rank=0)["v"] == 1

    def boom(spec):
        raise RuntimeError("collective timed out")

    assert _child_json(tmp_path, capsys, {"k": boom}, rank=1)["error"] == "rank 1: RuntimeError: collective timed out"


def test_drivers_keep_their_flags_and_defaults(monkeypatch):
    """The GPU commands in BENCHMARKS.md keep working: each driver's flags and defaults as before the move."""
    class Parsed(Exception):
        pass

    def stop(parser, argv=None):  # the parser each main() builds, before it parses anything
        raise Parsed(parser)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", stop)

    def parsed(module):
        with pytest.raises(Parsed) as e:
            module.main([])
        return {a.dest: a.default for a in e.value.args[0]._actions if a.dest != "help"}

    fast, par, pipe, speed = (parsed(m) for m in (bench_fast, bench_parallel, bench_pipeline, bench_speed))
    assert (fast["budget_s"], fast["min_case_s"], fast["workdir"]) == (500.0, 30.0, "/tmp/lingbot_fast_bench")
    assert fast["cases"] == ",".join(bench_fast.DEFAULT_CASES) and "fast480_profile" not in fast["cases"]
    assert (par["budget_s"], par["case_s"], par["min_case_s"]) == (540.0, 150.0, 30.0)
    assert par["cases"] == ",".join(bench_parallel.CASES) and par["workdir"] == "/tmp/lingbot_parallel_bench"
    assert (pipe["budget_s"], pipe["min_case_s"], pipe["workdir"]) == (540.0, 25.0, "/tmp/lingbot_pipeline_bench")
    assert (speed["budget_s"], speed["case_timeout_s"], speed["min_case_s"]) == (530.0, 300.0, 40.0)
    assert speed["workdir"] == "/tmp/lingbot_speed_bench"
    for d in (fast, par, pipe, speed):
        assert {"tiny", "device", "out", "fresh", "cases", "budget_s", "min_case_s", "workdir", "keep",
                "child"} <= set(d)
    assert {"t5_seconds", "switch_seconds", "context_gib", "timed_steps"} <= set(fast)
    assert {"fast_chunks", "comm_iters", "collective_timeout"} <= set(par)
    assert {"layers", "blocks_on_gpu", "cfg_mode", "token_chunk", "vae_tiled", "vae_encode_s"} <= set(pipe)
    assert {"cap_gib", "no_profile", "no_small_run", "token_chunk"} <= set(speed)


def test_compute_stream_gaps_bins_the_idle_time_of_the_busiest_stream():
    def kernel(stream, start, end, key="k"):
        return SimpleNamespace(device_type="DeviceType.CUDA", key=key, device_resource_id=stream,
                               time_range=SimpleNamespace(start=start, end=end))

    events = [kernel(7, 0, 100), kernel(7, 105, 200), kernel(7, 230, 300), kernel(7, 1300, 1400),
              kernel(7, 1350, 1380),  # overlaps the one before: no gap, no double-counted busy time
              kernel(9, 0, 50), kernel(9, 400, 1290, key="Memcpy HtoD (Pinned -> Device)"),
              SimpleNamespace(device_type="DeviceType.CPU", key="aten::mm", device_resource_id=1,
                              time_range=SimpleNamespace(start=0, end=5000))]
    g = speed_profile.compute_stream_gaps(events)
    assert g["stream"] == 7 and g["kernels"] == 5 and g["gaps"] == 3
    assert g["span_s"] == pytest.approx(1400e-6) and g["busy_s"] == pytest.approx(365e-6)
    assert g["idle_s"] == pytest.approx(1035e-6)
    assert g["idle_by_gap"] == {"0-10us": pytest.approx(5e-6), "10-50us": pytest.approx(30e-6),
                                "50-500us": 0.0, "500-infus": pytest.approx(1000e-6)}
    assert g["idle_ending_with_a_copy_s"] == pytest.approx(1000e-6)  # the 1000 us gap ends 10 us after the copy
    assert speed_profile.compute_stream_gaps([]) == {}


def test_host_gap_sources_charges_host_bound_gaps_to_the_package_frames_the_host_was_in():
    from lingbot_world.bench.trace_gaps import host_gap_sources

    pkg = "/x/site/lingbot_world/"

    def kernel(stream, ts, dur, corr):
        return {"ph": "X", "cat": "kernel", "ts": ts, "dur": dur, "args": {"stream": stream, "correlation": corr}}

    def launch(ts, corr, tid=1):
        return {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": ts, "dur": 3, "tid": tid,
                "args": {"correlation": corr}}

    def py(name, ts, dur, tid=1):
        return {"ph": "X", "cat": "python_function", "name": name, "ts": ts, "dur": dur, "tid": tid}

    events = [
        kernel(7, 0, 100, 1), launch(0, 1),
        # 400 us idle, next kernel launched at 450 (after the stream went idle at 100): host-bound, the host was
        # in session.run_part > sampler.next_chunk > model.rope at 100
        kernel(7, 500, 100, 2), launch(450, 2),
        # 300 us idle, next kernel launched at 550 (while the stream still ran): a queued wait on another stream
        kernel(7, 900, 100, 3), launch(550, 3),
        # 20 us idle (below the threshold): ignored
        kernel(7, 1020, 100, 4), launch(1015, 4),
        # 200 us idle, host-bound, the host in session.run_part > sampler.next_chunk only
        kernel(7, 1320, 10, 5), launch(1300, 5),
        kernel(9, 0, 50, 6), launch(0, 6, tid=2),  # another stream, lighter: not the compute stream
        py(pkg + "world/session.py(250): run_part", 0, 2000),
        py(pkg + "wan/sampling/fast_sampler.py(90): next_chunk", 10, 1900),
        py(pkg + "wan/dit/rope.py(40): rope_table", 60, 380),
        py("torch/nn/modules/module.py(1700): _call_impl", 70, 100),  # not the package: left out of the chain
        py(pkg + "wan/dit/rope.py(40): rope_table", 5000, 10, tid=2),  # another thread
    ]
    g = host_gap_sources({"traceEvents": events})
    assert g["gaps"] == 2
    assert g["host_bound_s"] == pytest.approx(600e-6) and g["queued_wait_s"] == pytest.approx(300e-6)
    assert g["by_frames"] == [
        {"frames": "world/session.py(250): run_part > wan/sampling/fast_sampler.py(90): next_chunk > "
                   "wan/dit/rope.py(40): rope_table", "gaps": 1, "seconds": pytest.approx(400e-6)},
        {"frames": "world/session.py(250): run_part > wan/sampling/fast_sampler.py(90): next_chunk", "gaps": 1,
         "seconds": pytest.approx(200e-6)}]
    assert host_gap_sources({"traceEvents": []}) == {}
