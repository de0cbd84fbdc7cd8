"""Per-step timing inside a vLLM 0.32 CPU instance, patched in through vLLM's own class hooks.

Two classes, named on the server's command line (nothing in vLLM or Seer changes):

* ``--scheduler-cls bench.harness.spec_probe.TimedScheduler`` (engine-core process): times
  ``schedule`` and ``update_from_output`` and, through ``EngineCore._process_engine_step``, the
  whole engine step and its ``post_step`` (where vLLM hands the proposer's drafts to the scheduler);
  one JSON line per step in ``$SEER_SPEC_PROBE_DIR/engine.jsonl``.
* ``--worker-cls bench.harness.spec_probe.TimedCPUWorker`` (worker process, a separate process under
  vLLM's multiprocessing executor): wraps the model runner's ``_update_states``,
  ``_prepare_inputs``, ``_model_forward``, ``_sample`` (the rejection sampler when drafts were
  scheduled), ``_bookkeeping_sync`` and ``propose_draft_token_ids`` and, for Seer's DGDS proposer,
  its appends, policy and drafting calls plus the CPU time of its client's background thread;
  one JSON line per step in ``worker.jsonl``.

Both clocks are ``time.perf_counter`` (CLOCK_MONOTONIC, shared by the processes), so
``bench.spec_breakdown`` joins a worker step to the engine step that contains it. The worker also
reads ``$SEER_SPEC_PROBE_DIR/gamma`` (when it changes) to force the DGDS proposer's draft length:
``adaptive`` (Algorithm 1, the default), a fixed 0..gamma_max, or ``off`` (vLLM's speculative
path with the proposer not called at all: what vLLM itself adds), so one instance serves every
variant of the benchmark.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.worker.cpu_worker import CPUWorker

OUT_ENV = "SEER_SPEC_PROBE_DIR"
_now = time.perf_counter


def _out(name: str):
    d = os.environ.get(OUT_ENV)
    if not d:
        return None
    os.makedirs(d, exist_ok=True)
    return open(os.path.join(d, name), "a", buffering=1)  # line-buffered: the server is killed at the end


class TimedScheduler(Scheduler):
    """vLLM's scheduler, timed; also times the engine step around it (engine-core process)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._probe_out = _out("engine.jsonl")
        self._probe_rec: dict = {}
        _patch_engine_core(self)

    def schedule(self, *args: Any, **kwargs: Any):
        t0 = _now()
        out = super().schedule(*args, **kwargs)
        t1 = _now()
        spec = out.scheduled_spec_decode_tokens
        n = out.num_scheduled_tokens
        prefill_rows = sum(1 for rid, k in n.items() if k > 1 + len(spec.get(rid, ())))
        self._probe_rec = dict(t0=t0, schedule_s=t1 - t0, rows=len(n), tokens=out.total_num_scheduled_tokens,
                               spec_tokens=sum(len(v) for v in spec.values()), spec_rows=len(spec),
                               new_rows=len(out.scheduled_new_reqs), prefill_rows=prefill_rows)
        return out

    def update_from_output(self, *args: Any, **kwargs: Any):
        t0 = _now()
        out = super().update_from_output(*args, **kwargs)
        self._probe_rec["update_s"] = _now() - t0
        return out


def _patch_engine_core(scheduler: TimedScheduler) -> None:
    from vllm.v1.engine import core

    cls = core.EngineCoreProc  # the busy loop's class (post_step is inherited from EngineCore)
    if getattr(cls, "_seer_probe", False):
        return
    step, post = cls._process_engine_step, cls.post_step

    def post_step(self, model_executed: bool) -> None:
        t0 = _now()
        post(self, model_executed)
        self._seer_post_s = _now() - t0

    def process_engine_step(self) -> bool:
        t0 = _now()
        self._seer_post_s = 0.0
        executed = step(self)
        t1 = _now()
        sched = self.scheduler
        rec = getattr(sched, "_probe_rec", None)
        out = getattr(sched, "_probe_out", None)
        if executed and rec and out is not None:
            rec.update(step_t0=t0, step_s=t1 - t0, post_s=self._seer_post_s)
            out.write(json.dumps(rec) + "\n")
        sched._probe_rec = {}
        return executed

    cls._process_engine_step = process_engine_step
    cls.post_step = post_step
    cls._seer_probe = True


class TimedCPUWorker(CPUWorker):
    """vLLM's CPU worker whose model runner is timed per step (worker process)."""

    def load_model(self, *args: Any, **kwargs: Any) -> Any:
        result = super().load_model(*args, **kwargs)
        _RunnerProbe(self.model_runner)
        return result


class _RunnerProbe:
    """Wraps the runner's per-step methods as instance attributes; one record per step."""

    PARTS = ("_update_states", "_prepare_inputs", "_model_forward", "_sample", "_bookkeeping_sync",
             "propose_draft_token_ids")

    def __init__(self, runner: Any) -> None:
        self.runner = runner
        self.out = _out("worker.jsonl")
        self.rec: dict = {}
        self.gamma_path = os.path.join(os.environ.get(OUT_ENV, "."), "gamma")
        self.gamma_mtime = 0.0
        self.forced: int | None = None
        self.off = False
        # SEER_SPEC_PROBE_PROFILE=N: cProfile the sampler over N steps after 40 (profile_sample.txt)
        self.profile_left = int(os.environ.get("SEER_SPEC_PROBE_PROFILE", "0"))
        self.profile_skip = 40
        self._profiler = None
        self._client_thread: int | None = None
        self._proposer_wrapped = False
        for name in self.PARTS:
            self._wrap(name)
        execute, sample = runner.execute_model, runner.sample_tokens

        def execute_model(*a: Any, **k: Any):
            t0 = _now()
            self.rec = dict(t0=t0)
            try:
                return execute(*a, **k)
            finally:
                self.rec["execute_s"] = _now() - t0

        def sample_tokens(*a: Any, **k: Any):
            t0 = _now()
            self._maybe_wrap_proposer()
            self._read_gamma()
            try:
                return sample(*a, **k)
            finally:
                t1 = _now()
                rec = self.rec
                rec["sample_tokens_s"] = t1 - t0
                rec["t1"] = t1
                tid = self._client_thread
                if tid is not None:
                    try:
                        rec["client_cpu_s"] = time.clock_gettime(time.pthread_getcpuclockid(tid))
                    except (OSError, ProcessLookupError):
                        self._client_thread = None
                if self.out is not None:
                    self.out.write(json.dumps(rec) + "\n")
                self.rec = {}

        runner.execute_model = execute_model
        runner.sample_tokens = sample_tokens

    def _wrap(self, name: str, obj: Any = None, key: str | None = None) -> None:
        obj = self.runner if obj is None else obj
        fn = getattr(obj, name)
        key = key or name.strip("_") + "_s"
        probe = self

        def timed(*a: Any, **k: Any):
            if name == "_sample" and probe.profile_left:
                return probe.profiled(fn, a, k)
            t0 = _now()
            try:
                return fn(*a, **k)
            finally:
                probe.rec[key] = probe.rec.get(key, 0.0) + (_now() - t0)
                if name == "_sample":
                    meta = a[1] if len(a) > 1 else k.get("spec_decode_metadata")
                    probe.rec["rejection"] = meta is not None and meta.max_spec_len > 0

        setattr(obj, name, timed)

    def profiled(self, fn, a, k):
        if self.profile_skip > 0:
            self.profile_skip -= 1
            return fn(*a, **k)
        import cProfile
        import pstats

        if self._profiler is None:
            self._profiler = cProfile.Profile()
        self._profiler.enable()
        try:
            return fn(*a, **k)
        finally:
            self._profiler.disable()
            self.profile_left -= 1
            if self.profile_left == 0:
                with open(os.path.join(os.environ.get(OUT_ENV, "."), "profile_sample.txt"), "w") as f:
                    pstats.Stats(self._profiler, stream=f).sort_stats("cumulative").print_stats(40)

    def _maybe_wrap_proposer(self) -> None:
        if self._proposer_wrapped:
            return
        self._proposer_wrapped = True
        drafter = getattr(self.runner, "drafter", None)
        client = getattr(drafter, "client", None)
        if drafter is None or client is None:
            return
        self._wrap("append_many", client, "dgds_append_s")
        self._wrap("batch_speculate", client, "dgds_draft_s")
        self._wrap("_lengths", drafter, "dgds_policy_s")
        probe = self
        inner = drafter._lengths

        def lengths(*a):
            plan = inner(*a)
            if probe.forced is not None:
                from seer.dgds.policy.draft_length import DraftLengths

                plan = DraftLengths(probe.forced, probe.forced)
            probe.rec["plan"] = [plan.high, plan.low]
            return plan

        drafter._lengths = lengths
        propose = drafter.propose

        def counted(*a: Any, **k: Any):
            if probe.off:  # speculation on in vLLM, the proposer not called: vLLM's own cost
                out = [[] for _ in a[0]]
                probe.rec["drafted_rows"] = probe.rec["drafted_tokens"] = 0
                return out
            out = propose(*a, **k)
            probe.rec["drafted_rows"] = sum(1 for d in out if len(d))
            probe.rec["drafted_tokens"] = sum(len(d) for d in out)
            return out

        drafter.propose = counted
        for t in threading.enumerate():
            if t.name == "dgds-client":
                self._client_thread = t.ident

    def _read_gamma(self) -> None:
        try:
            m = os.stat(self.gamma_path).st_mtime
        except OSError:
            return
        if m == self.gamma_mtime:
            return
        self.gamma_mtime = m
        with open(self.gamma_path) as f:
            v = f.read().strip()
        self.off = v == "off"
        self.forced = None if v in ("", "adaptive", "off") else int(v)
