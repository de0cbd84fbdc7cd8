"""The chunk timeline: what build_trace makes of chunk events passes the checker of the trace
event format, and the checker catches what the viewers would reject or misdraw."""

from __future__ import annotations

import copy
import json

import pytest

from seer.scheduler.events import ChunkEvent
from seer.types import Telemetry
from seer.watch.trace import build_trace, check_trace, chunk_slices, write_trace


def chunk(rid: str, k: int, inst: str, a: float, b: float, *, migrated=False, tokens=16, cached=0) -> ChunkEvent:
    return ChunkEvent(rid, f"{rid}-c{k}", 0, 0, k, inst, "fifo", 16, 64, 4 + 16 * k, cached, tokens, "length",
                      migrated, a, b, a, b, False)


def sample_trace() -> dict:
    chunks = [chunk("g0-s0", 0, "i0", 10.0, 11.0), chunk("g0-s1", 0, "i0", 10.2, 10.8),  # overlap on i0
              chunk("g0-s2", 0, "i0", 10.5, 12.0), chunk("g0-s0", 1, "i1", 11.0, 11.5, migrated=True, cached=20)]
    tel = [Telemetry("i0", 10.1, 0.25, 1000, 3, 0, 0), Telemetry("i1", 10.1, 0.0, 1000, 0, 0, 0),
           Telemetry("i1", 11.2, 0.5, 1000, 1, 2, 0, spec_num_drafts=0),
           Telemetry("i0", 11.2, 0.5, 1000, 1, 0, 0)]
    phases = [("rollout", 9.9, 12.2), ("generate", 10.0, 12.0), ("reward tail", 12.0, 12.1), ("training", 12.2, 14.0)]
    return build_trace(chunks, tel, phases, instances=["i0", "i1"], dropped=[("i1", "dead", 11.6)])


def test_a_built_trace_passes_and_overlapping_chunks_of_an_instance_get_separate_lanes(tmp_path):
    trace = sample_trace()
    assert check_trace(trace) == []
    slices = chunk_slices(trace)
    assert sorted((s["request"], s["chunk"], s["instance"]) for s in slices) == [
        ("g0-s0", 0, "i0"), ("g0-s0", 1, "i1"), ("g0-s1", 0, "i0"), ("g0-s2", 0, "i0")]
    lanes = {ev["name"]: ev["tid"] for ev in trace["traceEvents"] if ev["ph"] == "X" and ev["cat"] != "phase"}
    assert len({lanes["g0-s0-c0"], lanes["g0-s1-c0"], lanes["g0-s2-c0"]}) == 3  # three at once on i0
    moved = [s for s in slices if s["migrated"]]
    assert [(s["prefix_cached"], s["prefix_recomputed"]) for s in moved] == [(20, 0)]
    assert min(ev["ts"] for ev in trace["traceEvents"] if "ts" in ev) == 0  # relative to the earliest phase
    path = write_trace(tmp_path / "t.trace.json", trace)
    assert json.loads(path.read_text()) == trace and b" " not in path.read_bytes().split(b'"otherData"')[0][:200]


def test_chunks_that_follow_each_other_share_a_lane():
    chunks = [chunk(f"g0-s{k}", 0, "i0", float(k), float(k + 1)) for k in range(5)]
    trace = build_trace(chunks)
    assert {ev["tid"] for ev in trace["traceEvents"] if ev["ph"] == "X" and ev.get("cat") == "chunk"} == {1}
    assert check_trace(trace) == []


def _broken(edit) -> list[str]:
    trace = copy.deepcopy(sample_trace())
    edit(trace["traceEvents"])
    return check_trace(trace)


def _first(events, ph, cat=None):
    return next(ev for ev in events if ev["ph"] == ph and (cat is None or ev.get("cat") == cat))


@pytest.mark.parametrize("edit, message", [
    (lambda evs: _first(evs, "X", "chunk").pop("ts"), "ts must be"),
    (lambda evs: _first(evs, "X", "chunk").__setitem__("dur", -1), "dur must be"),
    (lambda evs: _first(evs, "X", "chunk").__setitem__("ph", "Q"), "unknown ph"),
    (lambda evs: _first(evs, "X", "chunk").__setitem__("pid", "i0"), "pid must be an integer"),
    (lambda evs: _first(evs, "C").__setitem__("args", {"kv_usage": "high"}), "numeric series"),
    (lambda evs: _first(evs, "M").__setitem__("args", {}), "args.name"),
    (lambda evs: _first(evs, "X", "chunk").__setitem__("tid", 999), "no thread_name"),
    (lambda evs: evs.append({"ph": "X", "pid": 0, "tid": 0, "name": "late", "ts": 2.25e6, "dur": 1e6}), "without nesting"),
    (lambda evs: evs.append({"ph": "B", "pid": 0, "tid": 0, "name": "open", "ts": 1.0}), "never ended"),
    (lambda evs: _first(evs, "X", "chunk").__setitem__("ts", float("nan")), "ts must be"),
])
def test_the_checker_names_what_a_viewer_would_reject(edit, message):
    errors = _broken(edit)
    assert any(message in e for e in errors), errors


def test_the_checker_rejects_a_trace_without_an_event_list():
    assert check_trace([]) == ["not a JSON object with a traceEvents list"]
    assert check_trace({"traceEvents": [], "displayTimeUnit": "s"}) == ["displayTimeUnit must be ms or ns, got 's'"]


def test_a_rollout_function_that_keeps_no_chunks_still_gets_a_valid_timeline(tmp_path):
    """A custom rollout.function returns a batch without chunk events: the trace has the driver's
    phases and the instances, and passes the checker."""
    from rich.console import Console

    from seer.types import IterationStats, RolloutBatch
    from seer.watch.config import LoggingConfig
    from seer.watch.run import RunWatch

    watch = RunWatch(LoggingConfig(backends=()), tmp_path, Console(file=open(tmp_path / "out", "w")), config={},
                     start_step=0)
    with watch:
        watch.begin_iteration(0, 4)
        with watch.phase("rollout"):
            pass
        with watch.phase("training", "training on iteration 0"):
            pass
        batch = RolloutBatch([], IterationStats(0, "custom", 0.1, 0, 0.0, 0.0, 0, 0))
        watch.end_iteration(0, {"instances": [{"name": "inst0"}], "policy": "custom"}, batch, 1,
                            tmp_path / "rollouts" / "iter_0000.jsonl")
    trace = json.loads((tmp_path / "rollouts" / "iter_0000.trace.json").read_text())
    assert check_trace(trace) == [] and chunk_slices(trace) == []
    assert [ev["name"] for ev in trace["traceEvents"] if ev.get("cat") == "phase"] == ["rollout", "training"]
    assert "training on iteration 0: done in" in (tmp_path / "out").read_text()


def test_tracks_name_their_nodes_and_are_sorted_node_by_node():
    chunks = [chunk("g0-s0", 0, "i0", 1.0, 2.0), chunk("g0-s1", 0, "i1", 1.0, 2.0), chunk("g0-s2", 0, "i2", 1.0, 2.0)]
    trace = build_trace(chunks, instances=["i0", "i1", "i2"],
                        nodes={"i0": "127.0.0.3", "i1": "127.0.0.4", "i2": "127.0.0.3"})
    assert check_trace(trace) == []
    named = sorted((ev["pid"], ev["args"]["name"]) for ev in trace["traceEvents"]
                   if ev["ph"] == "M" and ev["name"] == "process_name")
    assert [n for _, n in named] == ["driver", "i0 on 127.0.0.3", "i2 on 127.0.0.3", "i1 on 127.0.0.4"]
    assert sorted(s["instance"] for s in chunk_slices(trace)) == ["i0", "i1", "i2"]  # the instance, not the label


def test_trainer_ranks_get_a_track_each_after_the_instances():
    chunks = [chunk("g0-s0", 0, "i0", 1.0, 2.0)]
    ranks = [("rank 0 on 127.0.0.3", 2.5, 3.0), ("rank 1 on 127.0.0.4", 2.5, 3.25)]
    trace = build_trace(chunks, phases=[("training", 2.5, 3.3)], instances=["i0"], ranks=ranks)
    assert check_trace(trace) == []
    evs = trace["traceEvents"]
    [pid] = [ev["pid"] for ev in evs if ev["ph"] == "M" and ev["name"] == "process_name" and ev["args"]["name"] == "trainer"]
    threads = {ev["tid"]: ev["args"]["name"] for ev in evs if ev["ph"] == "M" and ev["name"] == "thread_name" and ev["pid"] == pid}
    assert threads == {0: "rank 0 on 127.0.0.3", 1: "rank 1 on 127.0.0.4"}
    steps = sorted((ev["tid"], ev["dur"]) for ev in evs if ev["ph"] == "X" and ev["pid"] == pid)
    assert steps == [(0, 500000.0), (1, 750000.0)]
    assert pid > max(ev["pid"] for ev in evs if ev["ph"] == "X" and ev.get("cat", "").startswith("chunk"))
