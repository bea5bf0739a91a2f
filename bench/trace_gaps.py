"""What the host was doing while the GPU's compute stream sat idle: gaps attributed to Python frames.

`compute_stream_gaps` (bench_speed) says how long the compute stream idles; this says why, from a chrome trace
of `torch.profiler` run with `with_stack=True`:

- a gap whose next kernel was launched only after the stream went idle is **host-bound**: the GPU had nothing
  queued. It is charged to the chain of this package's Python frames the launching thread was in when the stream
  went idle (the innermost frames say which code kept the host busy);
- a gap whose next kernel was already launched is a **wait** on another stream (an event: a K/V or weight upload).

`compute_stream` and `idle_gaps` find the busiest stream and walk its kernels' gaps; speed_profile.compute_stream_gaps
(gaps by size, from the profiler's events) uses them too.

    trace = json.load(open("chunk.trace.json"))
    host_gap_sources(trace, package="lingbot_world")  # {"host_bound_s", "queued_wait_s", "by_frames": [...]}
"""
from __future__ import annotations

from typing import Iterable

LAUNCH_SLACK_US = 5.0  # a launch this close before the stream went idle still left the GPU nothing queued
FRAMES_KEPT = 3  # innermost package frames that name a gap's source


def compute_stream(spans_by_stream: dict) -> tuple:
    """(stream, its spans sorted by start) of the busiest stream; spans are (start, end, ...) tuples."""
    stream, spans = max(spans_by_stream.items(), key=lambda kv: sum(sp[1] - sp[0] for sp in kv[1]))
    return stream, sorted(spans, key=lambda sp: sp[0])


def idle_gaps(spans: list) -> tuple:
    """(busy time, end, [(idle from, gap length, index of the span that ends the gap)]) of start-sorted spans."""
    busy, gaps, end = 0.0, [], spans[0][0]
    for i, (s, e, *_) in enumerate(spans):
        if s > end:
            gaps.append((end, s - end, i))
        busy += max(0.0, e - max(s, end))
        end = max(end, e)
    return busy, end, gaps


def _frames_at(py_events: list, queries: list[tuple[float, int]]) -> dict:
    """{query index: [names of the Python frames active at its time on its thread, outermost first]}.
    Python frames nest on a thread, so one sweep with a stack per thread finds them all."""
    out: dict = {}
    events = sorted(py_events, key=lambda e: (e["ts"], -e.get("dur", 0.0)))
    order = sorted(range(len(queries)), key=lambda i: queries[i][0])
    stacks: dict = {}
    j = 0
    for qi in order:
        t, tid = queries[qi]
        while j < len(events) and events[j]["ts"] <= t:
            ev = events[j]
            stack = stacks.setdefault(ev["tid"], [])
            while stack and stack[-1]["ts"] + stack[-1].get("dur", 0.0) <= ev["ts"]:
                stack.pop()
            stack.append(ev)
            j += 1
        stack = stacks.get(tid, [])
        out[qi] = [e["name"] for e in stack if e["ts"] + e.get("dur", 0.0) > t]
    return out


def _short(name: str, package: str) -> str:
    """'/x/y/lingbot_world/world/session.py(259): run_part' -> 'world/session.py(259): run_part'."""
    cut = name.find(package + "/")
    return name[cut + len(package) + 1:] if cut >= 0 else name


def host_gap_sources(trace: dict, *, package: str = "lingbot_world", min_gap_us: float = 50.0,
                     top: int = 15) -> dict:
    """Compute-stream gaps of at least `min_gap_us`, split into host-bound and queued waits; host-bound seconds
    summed by the innermost FRAMES_KEPT frames of `package` active on the launching thread as the GPU went idle."""
    events: Iterable[dict] = trace.get("traceEvents", [])
    kernels, launches, py = {}, {}, []
    for ev in events:
        if ev.get("ph") != "X":
            continue
        cat = ev.get("cat", "")
        if cat == "kernel":
            kernels.setdefault(ev["args"].get("stream"), []).append((ev["ts"], ev["ts"] + ev.get("dur", 0.0), ev))
        elif cat in ("cuda_runtime", "cuda_driver") and "correlation" in ev.get("args", {}):
            launches[ev["args"]["correlation"]] = ev
        elif cat == "python_function":
            py.append(ev)
    if not kernels:
        return {}
    _, spans = compute_stream(kernels)
    host_gaps, queued = [], 0.0
    for idle_from, gap, i in idle_gaps(spans)[2]:
        if gap < min_gap_us:
            continue
        launch = launches.get(spans[i][2]["args"].get("correlation"))
        if launch is not None and launch["ts"] >= idle_from - LAUNCH_SLACK_US:
            host_gaps.append((gap, idle_from, launch["tid"]))
        else:
            queued += gap
    frames = _frames_at(py, [(t, tid) for _, t, tid in host_gaps])
    by: dict = {}
    for i, (gap, _, _) in enumerate(host_gaps):
        mine = [_short(n, package) for n in frames.get(i, []) if package + "/" in n]
        key = " > ".join(mine[-FRAMES_KEPT:]) or "(outside the package)"
        count, total = by.get(key, (0, 0.0))
        by[key] = (count + 1, total + gap)
    ranked = sorted(by.items(), key=lambda kv: -kv[1][1])
    return {"min_gap_us": min_gap_us, "gaps": len(host_gaps),
            "host_bound_s": round(sum(g for g, _, _ in host_gaps) / 1e6, 6), "queued_wait_s": round(queued / 1e6, 6),
            "by_frames": [{"frames": k, "gaps": n, "seconds": round(s / 1e6, 6)} for k, (n, s) in ranked[:top]]}
