"""One iteration's timeline in the Chrome trace event format, which Perfetto (ui.perfetto.dev)
and chrome://tracing open, and the project's checker of that format.

Tracks: a "driver" process with the iteration's phases (rollout, reward tail, training, weight
push, checkpoint), a "trainer" process with a thread per rank (its train step), and one process per instance whose threads are lanes of concurrent chunks (a
thread's slices must nest, and chunks on one instance overlap), with counter tracks for its KV
usage, running and waiting requests and, when speculating, its acceptance length. One slice per
chunk: request, group, turn, tokens, migrated or not, prefix tokens from the cache/pool vs recomputed.
Multi-turn rollouts add tool-wait slices (a trajectory waiting for its environment) in lanes of
their own under the instance its last turn ran on ("tool waits N" threads, category "tool_wait").
The simulator (seer.sim) writes the same format from its own chunk events.
"""

from __future__ import annotations

import heapq
import json
import math
from collections.abc import Iterable, Sequence
from pathlib import Path

from seer.rundir import atomic_write_text

DRIVER_PID = 0
WAIT_TID = 100_000  # tool-wait lanes of an instance come after its chunk lanes


def _us(t: float, t0: float) -> float:
    return round((t - t0) * 1e6, 3)


def _meta(pid: int, tid: int | None, kind: str, value) -> dict:
    ev = {"ph": "M", "pid": pid, "name": kind, "args": {"sort_index" if kind.endswith("sort_index") else "name": value}}
    if tid is not None:
        ev["tid"] = tid
    return ev


def _lanes(chunks: Sequence) -> list[int]:
    """A lane per chunk such that the chunks of one lane never overlap: as few lanes as the
    instance's peak concurrency (the lane freed earliest is reused)."""
    order = sorted(range(len(chunks)), key=lambda i: (chunks[i].dispatch_time, chunks[i].complete_time))
    free: list[tuple[float, int]] = []  # (end time, lane)
    lane_of = [0] * len(chunks)
    n = 0
    for i in order:
        c = chunks[i]
        if free and free[0][0] <= c.dispatch_time:
            _, lane = heapq.heappop(free)
        else:
            lane, n = n, n + 1
        lane_of[i] = lane
        heapq.heappush(free, (c.complete_time, lane))
    return lane_of


def chunk_args(c) -> dict:
    return {
        "request": c.request_id, "group": c.group_id, "sample": c.sample_index, "chunk": c.chunk_index,
        "turn": getattr(c, "turn", 0),
        "tokens": c.new_tokens, "prompt_tokens": c.prompt_tokens, "prefix_cached": c.cached_prefix_tokens,
        "prefix_recomputed": c.prompt_tokens - c.cached_prefix_tokens, "migrated": c.migrated,
        "reason": c.reason, "finish": c.finish_reason, "kv_tokens": c.kv_tokens, "last": c.request_finished,
    }


def build_trace(chunks: Sequence, telemetry: Sequence = (), phases: Iterable[tuple[str, float, float]] = (), *,
                instances: Sequence[str] = (), dropped: Iterable[tuple[str, str, float]] = (),
                t0: float | None = None, metadata: dict | None = None, nodes: dict[str, str] | None = None,
                ranks: Sequence[tuple[str, float, float]] = (), waits: Sequence = ()) -> dict:
    """The trace of one rollout from the scheduler's ChunkEvents (or anything with their fields),
    Telemetry samples and (name, start, end) phases, all on one clock in seconds. `nodes` (instance
    -> node address) names each instance's track with its node and sorts the tracks node by node;
    `ranks` ((label, start, end) per trainer rank) are the train step's slices, a thread per rank.
    `waits` (seer.scheduler.events.EnvWait, or anything with its fields) are multi-turn tool waits."""
    starts = [c.dispatch_time for c in chunks] + [p[1] for p in phases] + [t.time for t in telemetry]
    if t0 is None:
        t0 = min(starts) if starts else 0.0
    names = list(dict.fromkeys([*instances, *(c.instance for c in chunks), *(t.instance for t in telemetry)]))
    nodes = nodes or {}
    node_order = list(dict.fromkeys(nodes[n] for n in names if n in nodes))
    names.sort(key=lambda n: node_order.index(nodes[n]) if n in nodes else len(node_order))  # stable
    pid_of = {n: i + 1 for i, n in enumerate(names)}
    events: list[dict] = [_meta(DRIVER_PID, None, "process_name", "driver"),
                          _meta(DRIVER_PID, None, "process_sort_index", 0),
                          _meta(DRIVER_PID, 0, "thread_name", "phases")]
    for name, a, b in sorted(phases, key=lambda p: (p[1], -p[2])):
        events.append({"ph": "X", "pid": DRIVER_PID, "tid": 0, "name": name, "cat": "phase",
                       "ts": _us(a, t0), "dur": round(max(0.0, b - a) * 1e6, 3)})
    by_instance: dict[str, list] = {n: [] for n in names}
    for c in chunks:
        by_instance[c.instance].append(c)
    for name in names:
        pid = pid_of[name]
        label = f"{name} on {nodes[name]}" if name in nodes else name
        events += [_meta(pid, None, "process_name", label), _meta(pid, None, "process_sort_index", pid)]
        mine = by_instance[name]
        lanes = _lanes(mine)
        for lane in sorted(set(lanes)):
            events += [_meta(pid, lane + 1, "thread_name", f"chunks {lane}"), _meta(pid, lane + 1, "thread_sort_index", lane)]
        for c, lane in zip(mine, lanes):
            events.append({"ph": "X", "pid": pid, "tid": lane + 1, "name": c.chunk_id,
                           "cat": "chunk,migrated" if c.migrated else "chunk",
                           "ts": _us(c.dispatch_time, t0), "dur": round(max(0.0, c.complete_time - c.dispatch_time) * 1e6, 3),
                           "args": chunk_args(c)})
        mine_waits = [w for w in waits if w.instance == name]
        wait_lanes = _lanes(mine_waits)
        for lane in sorted(set(wait_lanes)):
            tid = WAIT_TID + lane
            events += [_meta(pid, tid, "thread_name", f"tool waits {lane}"), _meta(pid, tid, "thread_sort_index", tid)]
        for w, lane in zip(mine_waits, wait_lanes):
            events.append({"ph": "X", "pid": pid, "tid": WAIT_TID + lane, "name": f"{w.request_id} tool",
                           "cat": "tool_wait", "ts": _us(w.dispatch_time, t0),
                           "dur": round(max(0.0, w.complete_time - w.dispatch_time) * 1e6, 3),
                           "args": {"request": w.request_id, "group": w.group_id, "sample": w.sample_index,
                                    "turn": w.turn}})
    prev: dict[str, object] = {}
    for t in sorted(telemetry, key=lambda t: t.time):
        pid, ts = pid_of[t.instance], _us(t.time, t0)
        events.append({"ph": "C", "pid": pid, "name": "kv_usage", "ts": ts, "args": {"kv_usage": round(t.kv_usage, 4)}})
        events.append({"ph": "C", "pid": pid, "name": "requests", "ts": ts,
                       "args": {"running": t.num_running, "waiting": t.num_waiting}})
        p = prev.get(t.instance)
        drafts = t.spec_num_drafts - p.spec_num_drafts if p is not None else 0
        if drafts > 0:  # mean tokens per verification step since the previous sample (bonus token included)
            accepted = t.spec_num_accepted_tokens - p.spec_num_accepted_tokens
            events.append({"ph": "C", "pid": pid, "name": "acceptance_length", "ts": ts,
                           "args": {"acceptance_length": round(1 + accepted / drafts, 3)}})
        prev[t.instance] = t
    if ranks:  # after the instances: a "trainer" process, a thread per rank
        pid = len(names) + 1
        events += [_meta(pid, None, "process_name", "trainer"), _meta(pid, None, "process_sort_index", pid)]
        for k, (label, a, b) in enumerate(ranks):
            events += [_meta(pid, k, "thread_name", label), _meta(pid, k, "thread_sort_index", k),
                       {"ph": "X", "pid": pid, "tid": k, "name": "train step", "cat": "train",
                        "ts": _us(a, t0), "dur": round(max(0.0, b - a) * 1e6, 3)}]
    for name, why, when in dropped:
        events.append({"ph": "i", "s": "p", "pid": pid_of.get(name, DRIVER_PID), "tid": 0, "name": f"dropped: {why}",
                       "ts": _us(when, t0)})
    # t0 on the host's monotonic clock: samples taken outside the run (a benchmark reading /proc)
    # line up with the trace's slices through it.
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"t0_monotonic_s": round(t0, 6), **(metadata or {})}}


def write_trace(path: str | Path, trace: dict) -> Path:
    """Compact JSON (no spaces): the trace of a large rollout stays a few bytes per field."""
    return atomic_write_text(path, json.dumps(trace, separators=(",", ":"), allow_nan=False))


# ---- checker ------------------------------------------------------------------------------

PHASES = {"X", "B", "E", "C", "M", "i", "I"}
METADATA = {"process_name": "name", "thread_name": "name", "process_sort_index": "sort_index",
            "thread_sort_index": "sort_index", "process_labels": "labels"}
_EPS_US = 0.01  # rounding of ts and dur to 1 ns


def check_trace(trace) -> list[str]:
    """What is wrong with `trace` as a Chrome trace (JSON object format); [] when nothing.

    The documented rules the viewers rely on: a `traceEvents` list; every event a `ph` of the
    known kinds with its required fields (`name`, numeric `ts` in µs, integer `pid`/`tid`,
    `dur` >= 0 for complete events, numeric `args` for counters, `name`/`sort_index` for
    metadata); B/E balanced per thread; complete events on one thread properly nested. And this
    project's own: every process and thread an event uses is named by a metadata event.
    """
    errors: list[str] = []
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        return ["not a JSON object with a traceEvents list"]
    if trace.get("displayTimeUnit", "ms") not in ("ms", "ns"):
        errors.append(f"displayTimeUnit must be ms or ns, got {trace['displayTimeUnit']!r}")
    try:
        json.dumps(trace, allow_nan=False)
    except (TypeError, ValueError) as e:
        errors.append(f"not serializable as strict JSON: {e}")
    named_p, named_t, used_p, used_t = set(), set(), set(), set()
    slices: dict[tuple, list[tuple[float, float, int]]] = {}
    stacks: dict[tuple, list[str]] = {}

    def num(v) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)

    for i, ev in enumerate(trace["traceEvents"]):
        where = f"event {i}"
        if not isinstance(ev, dict):
            errors.append(f"{where}: not an object")
            continue
        ph = ev.get("ph")
        if ph not in PHASES:
            errors.append(f"{where}: unknown ph {ph!r}")
            continue
        if ph != "E" and not (isinstance(ev.get("name"), str) and ev["name"]):
            errors.append(f"{where} ({ph}): name must be a non-empty string")
        if not isinstance(ev.get("pid"), int) or isinstance(ev.get("pid"), bool):
            errors.append(f"{where} ({ph}): pid must be an integer")
            continue
        if "args" in ev and not isinstance(ev["args"], dict):
            errors.append(f"{where} ({ph}): args must be an object")
        if "cat" in ev and not isinstance(ev["cat"], str):
            errors.append(f"{where} ({ph}): cat must be a string")
        pid = ev["pid"]
        if ph == "M":
            key = METADATA.get(ev.get("name"))
            if key is None:
                errors.append(f"{where}: unknown metadata {ev.get('name')!r}")
                continue
            arg = (ev.get("args") or {}).get(key)
            if key == "name" and not (isinstance(arg, str) and arg):
                errors.append(f"{where} ({ev['name']}): args.name must be a non-empty string")
            if key == "sort_index" and not (isinstance(arg, int) and not isinstance(arg, bool)):
                errors.append(f"{where} ({ev['name']}): args.sort_index must be an integer")
            if ev["name"].startswith("thread"):
                if not isinstance(ev.get("tid"), int):
                    errors.append(f"{where} ({ev['name']}): tid must be an integer")
                named_t.add((pid, ev.get("tid")))
            else:
                named_p.add(pid)
            continue
        if not num(ev.get("ts")) or ev["ts"] < 0:
            errors.append(f"{where} ({ph}): ts must be a finite number of µs >= 0, got {ev.get('ts')!r}")
            continue
        used_p.add(pid)
        if ph == "C":
            args = ev.get("args")
            if not isinstance(args, dict) or not args or not all(num(v) for v in args.values()):
                errors.append(f"{where} (C {ev.get('name')}): args must hold numeric series values")
            continue
        tid = ev.get("tid")
        if not isinstance(tid, int) or isinstance(tid, bool):
            errors.append(f"{where} ({ph}): tid must be an integer")
            continue
        if ph in ("i", "I"):
            if ev.get("s", "t") not in ("g", "p", "t"):
                errors.append(f"{where} (instant): s must be g, p or t")
            if ev.get("s", "t") == "t":
                used_t.add((pid, tid))
            continue
        used_t.add((pid, tid))
        if ph == "X":
            if not num(ev.get("dur")) or ev["dur"] < 0:
                errors.append(f"{where} (X {ev.get('name')}): dur must be a finite number >= 0")
                continue
            slices.setdefault((pid, tid), []).append((ev["ts"], ev["ts"] + ev["dur"], i))
        elif ph == "B":
            stacks.setdefault((pid, tid), []).append(ev["name"])
        elif ph == "E":
            if not stacks.get((pid, tid)):
                errors.append(f"{where}: E without a matching B on pid {pid} tid {tid}")
            else:
                stacks[(pid, tid)].pop()
    for (pid, tid), open_ in stacks.items():
        if open_:
            errors.append(f"pid {pid} tid {tid}: B events never ended: {open_}")
    for (pid, tid), spans in slices.items():
        open_ends: list[tuple[float, int]] = []  # enclosing slices, innermost last
        for a, b, i in sorted(spans, key=lambda s: (s[0], -s[1])):
            while open_ends and open_ends[-1][0] <= a + _EPS_US:
                open_ends.pop()
            if open_ends and b > open_ends[-1][0] + _EPS_US:
                errors.append(f"event {i}: overlaps event {open_ends[-1][1]} on pid {pid} tid {tid} without nesting")
            open_ends.append((b, i))
    for pid in sorted(used_p - named_p):
        errors.append(f"pid {pid} has no process_name metadata")
    for pid, tid in sorted(used_t - named_t):
        errors.append(f"pid {pid} tid {tid} has no thread_name metadata")
    return errors


def chunk_slices(trace: dict) -> list[dict]:
    """The chunk slices of a trace, as their args plus instance (process name), ts and dur."""
    names = {ev["pid"]: ev["args"]["name"] for ev in trace["traceEvents"]
             if ev.get("ph") == "M" and ev.get("name") == "process_name"}
    return [{**ev["args"], "instance": names[ev["pid"]].split(" on ", 1)[0], "name": ev["name"], "ts": ev["ts"],
             "dur": ev["dur"]}
            for ev in trace["traceEvents"] if ev.get("ph") == "X" and ev.get("cat", "").startswith("chunk")]


# ---- the project's own plot of a trace, and the command line ----------------------------------

def plot_trace(trace: dict, out: str | Path, title: str | None = None) -> Path:
    """Chunks per instance lane (migrated ones darker), the driver's phases, KV usage per instance."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    evs = trace["traceEvents"]
    names = {ev["pid"]: ev["args"]["name"] for ev in evs if ev["ph"] == "M" and ev["name"] == "process_name"}
    pids = sorted(p for p in names if p != DRIVER_PID)
    lanes = {p: sorted({ev["tid"] for ev in evs if ev["ph"] == "X" and ev["pid"] == p}) for p in pids}
    fig, (ph, top, kv) = plt.subplots(3, 1, figsize=(11, 6.5), sharex=True,
                                      gridspec_kw={"height_ratios": [0.8, 3, 1]})
    row, ticks, labels = 0, [], []
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for k, p in enumerate(pids):
        base = row
        index = {tid: base + j for j, tid in enumerate(lanes[p])}
        for ev in evs:
            if ev["ph"] == "X" and ev["pid"] == p:
                cat = ev.get("cat", "")
                color = "black" if "migrated" in cat else "0.8" if cat == "tool_wait" else colors[k % len(colors)]
                top.broken_barh([(ev["ts"] / 1e6, ev["dur"] / 1e6)], (index[ev["tid"]], 0.8),
                                facecolors=color, linewidth=0)
        row += max(1, len(lanes[p])) + 1
        ticks.append(base + len(lanes[p]) / 2)
        labels.append(f"{names[p]} ({len(lanes[p])} lanes)")
        points = sorted((ev["ts"] / 1e6, ev["args"]["kv_usage"]) for ev in evs
                        if ev["ph"] == "C" and ev["pid"] == p and ev["name"] == "kv_usage")
        if points:
            kv.step(*zip(*points), where="post", label=names[p], color=colors[k % len(colors)])
    phases = [ev for ev in evs if ev["ph"] == "X" and ev["pid"] == DRIVER_PID]
    depth_max = 0
    for ev in phases:  # nested phases (generate inside rollout) one row above their parent
        depth = sum(1 for o in phases if o is not ev and o["ts"] <= ev["ts"] and
                    ev["ts"] + ev["dur"] <= o["ts"] + o["dur"] + _EPS_US and o["dur"] > ev["dur"])
        depth_max = max(depth_max, depth)
        ph.broken_barh([(ev["ts"] / 1e6, ev["dur"] / 1e6)], (-depth, 0.8), facecolors="0.8", linewidth=0.5,
                       edgecolors="0.3")
        ph.text(ev["ts"] / 1e6 + ev["dur"] / 2e6, -depth + 0.4, ev["name"], fontsize=7, ha="center", va="center")
    ph.set_ylim(-depth_max - 0.3, 1)
    ph.set_yticks([])
    ph.set_ylabel("driver", rotation=0, ha="right", va="center")
    top.set_yticks(ticks, labels)
    top.set_ylim(-1, row)
    ph.set_title(title or "chunks per instance (black: migrated, grey: tool waits)")
    kv.set_ylabel("KV usage")
    kv.set_xlabel("seconds since the iteration started")
    kv.set_ylim(0, 1)
    kv.legend(loc="upper right", fontsize=7)
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m seer.watch.trace",
                                 description="Check or plot iteration traces (rollouts/iter_N.trace.json).")
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check", help="check files against the trace event format; exit 1 on any error")
    c.add_argument("files", nargs="+", help="trace JSON files")
    p = sub.add_parser("plot", help="plot one trace as a PNG (chunks per instance lane, phases, KV usage)")
    p.add_argument("file", help="a trace JSON file")
    p.add_argument("out", help="the PNG to write")
    args = ap.parse_args(argv)
    if args.cmd == "plot":
        print(plot_trace(json.loads(Path(args.file).read_text()), args.out))
        return 0
    bad = 0
    for f in args.files:
        trace = json.loads(Path(f).read_text())
        errors = check_trace(trace)
        n = len(chunk_slices(trace)) if not errors else 0
        print(f"{f}: " + ("ok" if not errors else f"{len(errors)} errors") + (f", {n} chunk slices" if n else ""))
        for e in errors[:20]:
            print(f"  {e}")
        bad += bool(errors)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
