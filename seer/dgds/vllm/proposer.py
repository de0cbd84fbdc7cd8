"""Seer's grouped speculative decoding inside vLLM: a ``custom_class`` proposer over DGDS.

Enable on a plain vLLM server with one flag (plus ``SEER_DGDS_ADDRESS`` to share groups across
instances through ``seer-dgds serve``; see ``seer.dgds.vllm.settings`` for every knob)::

    SEER_DGDS_ADDRESS=127.0.0.1:50061 python -m vllm.entrypoints.openai.api_server --model M \\
      --speculative-config '{"method": "custom_class",
                             "model": "seer.dgds.vllm.proposer.DgdsProposer",
                             "num_speculative_tokens": 8}'

Every engine step vLLM calls ``propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu)``
with one row per running request. Row i is request ``input_batch.req_ids[i]``: the proposer needs
the model runner for that, and finds it without a worker extension (the runner is the caller of
``load_model`` and ``propose``; ``seer.dgds.vllm.worker`` binds it explicitly for those who prefer a
``--worker-cls``). For each row it

1. maps the request id to its group and sequence (``seer.request_ids``; ids without a group
   become singleton groups, i.e. per-request drafting);
2. infers how many of its previous draft tokens were accepted (the row's sampled tokens are the
   accepted drafts plus one bonus token) and feeds Algorithm 1's acceptance statistics;
3. appends the row's new tokens to the draft client (non-blocking; sent to DGDS in batches);
4. drafts from the group's local replica, with a length per row from Algorithm 1
   (``seer.dgds.policy.adaptive``): probe requests (sample ``SEER_DGDS_PROBE_INDEX``) are high priority.

Nothing here may stop decoding: a DGDS outage means empty drafts, and any unexpected error in a
step is logged once and answered with empty drafts.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from seer.dgds.policy.adaptive import AdaptiveDraftLength
from seer.dgds.policy.draft_length import DraftLengths
from seer.dgds.vllm.settings import ProposerSettings, settings_from
from seer.request_ids import RequestRef, parse_request_id
from seer.dgds.types import DraftParams, SpeculateRow
from seer.compat.vllm_cpu_fixes import apply_cpu_sampling_fixes

log = logging.getLogger("seer.dgds.vllm.proposer")
_DEBUG = open(os.environ["SEER_DGDS_DEBUG_LOG"], "a") if os.environ.get("SEER_DGDS_DEBUG_LOG") else None


def _ints_tail(ctx) -> list[int]:
    return [int(t) for t in ctx[-12:]]


_UNSTARTED = 1 << 62  # a row's appended count before its first sample (so nothing is ever due)


@dataclass
class _RowState:
    """What the proposer remembers about one running engine request."""

    ref: RequestRef
    appended_to: int = 0  # tokens of the engine sequence (prompt + output) already sent to DGDS
    limit: int = _UNSTARTED  # prompt + max_tokens: no token past it is the request's
    last_draft: int = 0  # tokens drafted for it at the previous step (0: none to verify)
    row: int = -1  # its row in the batch (-1: it left)


@dataclass(frozen=True)
class ProposerStats:
    """Counters of this proposer's own view (vLLM's /metrics has the authoritative ones)."""

    steps: int
    rows_drafted: int
    draft_tokens: int
    verified_drafts: int
    verified_draft_tokens: int
    accepted_tokens: int
    zero_draft_steps: int  # steps the policy gave no row a draft (nothing drafted, nothing looked up)
    active_requests: int


class DgdsProposer:
    """vLLM ``custom_class`` proposer: group drafts from DGDS with Algorithm 1 draft lengths."""

    def __init__(self, vllm_config: Any, settings: ProposerSettings | None = None):
        # vLLM 0.32's CPU rejection sampler samples drafted positions from a garbage temperature;
        # this runs in the worker, after vLLM registered its CPU kernels (seer.compat.vllm_cpu_fixes)
        apply_cpu_sampling_fixes()
        spec = vllm_config.speculative_config
        self.max_model_len = int(vllm_config.model_config.max_model_len)
        self.settings = settings or settings_from(
            spec.num_speculative_tokens,
            getattr(spec, "suffix_decoding_max_tree_depth", None),
            getattr(spec, "suffix_decoding_min_token_prob", None),
        )
        s = self.settings
        self._embedded = None
        address = s.address
        token = None  # a shared server's: SEER_DGDS_TOKEN, which DraftClient reads
        if address is None:
            import secrets

            from seer.dgds.server.grpc_server import DgdsServer

            token = secrets.token_urlsafe(32)
            self._embedded = DgdsServer("127.0.0.1", 0, token=token).start()
            address = self._embedded.address
        from seer.dgds.client.draft_client import DraftClient

        self.client = DraftClient(
            address,
            update_batch_tokens=s.update_batch_tokens,
            fetch_interval_s=s.fetch_interval_s,
            default_ttl_s=s.ttl_s,
            token=token,
        )
        self.policy = AdaptiveDraftLength(gamma_max=s.gamma_max, lam=s.lam)
        self._runner: Any = None
        self._rows: dict[str, _RowState] = {}
        # the batch's rows as of the last step, in order: their states and, per row, tokens sent
        # (`_done`), probe flags, the rows that have not sampled yet, the rows with drafts to verify
        self._ids: list[str] = []
        self._states: list[_RowState] = []
        self._done = np.zeros(0, dtype=np.int64)
        self._limit = np.zeros(0, dtype=np.int64)
        self._probe = np.zeros(0, dtype=bool)
        self._n_probe = 0
        self._unstarted: list[int] = []
        self._drafted: list[_RowState] = []
        self._tok: Any = None  # the last step's token_ids_cpu and num_tokens_no_spec (rows_leaving)
        self._n = np.zeros(0, dtype=np.int64)
        self._defer = 1  # tokens per row between appends: settings.update_batch_tokens once rows_leaving is hooked
        self._last_step_end: float | None = None
        self._last_step_tokens = 0
        self._last_step_drafted = 0
        self._failed_once = False
        self._counts = dict(steps=0, rows_drafted=0, draft_tokens=0, verified_drafts=0, verified_draft_tokens=0,
                            accepted_tokens=0, zero_draft_steps=0)
        self._stats_path = os.environ.get("SEER_DGDS_STATS_FILE") or None
        self._length_counts: dict[str, int] = {}  # "high,low[,rows]" -> steps (with the stats file)
        self._last_log = time.monotonic()
        log.warning(
            "Seer DGDS proposer: mode=%s dgds=%s%s gamma_max=%d adaptive=%s",
            s.mode, address, " (embedded)" if self._embedded else "", s.gamma_max, s.adaptive,
        )

    # ---- vLLM interface --------------------------------------------------------------------

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """No draft model to load; vLLM's CPU and GPU runners call this with the target model,
        from inside the runner, which is where the proposer learns which runner it serves."""
        if self._runner is None:
            self._set_runner(_calling_runner(self))

    def bind_runner(self, runner: Any) -> None:
        """Explicit binding (``seer.dgds.vllm.worker``): the runner whose ``input_batch`` row i is."""
        self._set_runner(runner)

    def _set_runner(self, runner: Any) -> None:
        """The runner, with ``seer.dgds.vllm.runner_hooks`` installed: its outputs carry the drafts
        (no per-step RPC under ``seer.dgds.vllm.executor``), and a step without drafts skips
        vLLM's rejection sampler."""
        self._runner = runner
        if runner is not None and hasattr(runner, "sample_tokens") and hasattr(runner, "take_draft_token_ids"):
            try:
                from seer.dgds.vllm import runner_hooks

                runner_hooks.install(runner)
                if getattr(runner, "_seer_rows_leaving", False):
                    self._defer = self.settings.update_batch_tokens
            except Exception:  # another vLLM layout: vLLM's own path, as without them
                log.exception("could not install Seer's zero-draft step hooks on the model runner")

    def propose(
        self,
        sampled_token_ids: Sequence[Sequence[int]],
        num_tokens_no_spec: Any,
        token_ids_cpu: Any,
        slot_mappings: Any = None,
        **_: Any,
    ) -> list[list[int]]:
        """Draft token ids for each row (variable length, possibly empty)."""
        try:
            return self._propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu)
        except Exception:  # decoding goes on without drafts
            if not self._failed_once:
                log.exception("DGDS proposer step failed; answering with empty drafts")
                self._failed_once = True
            for st in self._rows.values():
                st.last_draft = 0
            self._drafted = []
            self._ids = []  # lay the rows out afresh next step
            return [[] for _ in sampled_token_ids]

    # ---- the step -----------------------------------------------------------------------------

    def _propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu) -> list[list[int]]:
        now = time.perf_counter()
        if self._runner is None:
            self._set_runner(_calling_runner(self))
            if self._runner is None:
                raise RuntimeError("cannot find vLLM's model runner; use --worker-cls seer.dgds.vllm.worker...")
        batch = self._runner.input_batch
        b = len(sampled_token_ids)
        out: list[list[int]] = [[] for _ in range(b)]
        ids = batch.req_ids[:b]
        # did the step that just ran compute a prompt (a new or resumed request, a partial prefill)?
        prefilled = ids != self._ids and self._align(ids)
        for st in self._drafted:  # last step's drafts: how many of each were accepted
            if st.row >= 0:
                sampled = sampled_token_ids[st.row]
                accepted = max(0, min(len(sampled) - 1, st.last_draft)) if sampled else 0
                self.policy.record_verified(st.last_draft, accepted)
                self._counts["verified_drafts"] += 1
                self._counts["verified_draft_tokens"] += st.last_draft
                self._counts["accepted_tokens"] += accepted
            st.last_draft = 0
        self._drafted = []
        n = np.asarray(num_tokens_no_spec[:b], dtype=np.int64)
        appends: list[tuple[str, str, Any]] = []
        if b and min(map(len, sampled_token_ids)) == 0:  # a partial prefill: nothing sampled, nothing to draft
            prefilled = True
        if self._unstarted:
            self._first_samples(sampled_token_ids, batch, token_ids_cpu, appends)
        done = self._done
        ready = done < _UNSTARTED  # rows that sampled since they joined
        if self._unstarted or int(n.max(initial=0)) >= self.max_model_len - 1:
            ready &= n < self.max_model_len - 1
            n_ready, n_high = int(ready.sum()), int((ready & self._probe).sum())
        else:
            n_ready, n_high = b, self._n_probe
        # The step cost model T(B, g) is a decode step's: a step that also prefilled (its time has
        # prompt tokens the model does not count, and after an idle engine the idle time too) is not
        # a sample of it. Fed such steps, the fit's fixed term grew several-fold, so verifying drafts
        # looked nearly free and Algorithm 1 drafted long at low acceptance (docs/dgds.md,
        # "Speculation on one CPU core", has the figures).
        if self._last_step_end is not None and self._last_step_tokens and not prefilled:
            self.policy.record_step(self._last_step_tokens, now - self._last_step_end, self._last_step_drafted)
        lengths = self._lengths(n_high, n_ready - n_high) if n_ready else DraftLengths(0, 0)
        drafting = lengths.high > 0 or lengths.low > 0
        # A row's tokens go to the client every `_defer` tokens (vLLM's token_ids_cpu keeps them
        # meanwhile; a row leaving the batch is flushed first, `rows_leaving`), and all of them
        # before a step drafts, so that the group trees it drafts from hold every sibling's tokens.
        due = np.flatnonzero(n - done >= (1 if drafting else self._defer))
        if len(due):
            states = self._states
            for i in due.tolist():
                self._hand_over(states[i], token_ids_cpu[i], int(n[i]), int(self._limit[i]), appends)
            done[due] = n[due]
        if appends:
            self.client.append_many(appends)
        self._tok, self._n = token_ids_cpu, n
        verified = b
        drafted = 0
        if drafting:
            rows = [(i, self._states[i], int(n[i])) for i in np.flatnonzero(ready).tolist()]
            drafted = self._draft(rows, lengths, ids, token_ids_cpu, sampled_token_ids, out)
        else:  # nothing to look up for any row: the step costs what a plain step costs, plus the appends
            self._counts["zero_draft_steps"] += 1
        verified += drafted
        self._counts["steps"] += 1
        self._last_step_tokens = verified
        self._last_step_drafted = drafted
        if self._stats_path:
            self._write_stats()
        self._last_step_end = time.perf_counter()
        self._maybe_log()
        return out

    def _align(self, ids: list[str]) -> bool:
        """The batch's rows changed: finish the requests that left, start those that joined, and
        lay the per-row arrays out in the new order. True if a request joined (it prefilled)."""
        seen = set(ids)
        for rid in [r for r in self._rows if r not in seen]:
            self._finish(rid)
        joined = False
        states = []
        for i, rid in enumerate(ids):
            st = self._rows.get(rid)
            if st is None:
                st = self._start(rid)
                joined = True
            st.row = i
            states.append(st)
        self._ids, self._states = ids, states
        self._done = np.array([st.appended_to or _UNSTARTED for st in states], dtype=np.int64)
        self._limit = np.array([st.limit for st in states], dtype=np.int64)
        self._unstarted = [i for i, st in enumerate(states) if not st.appended_to]
        self._probe = np.array([st.ref.probe for st in states], dtype=bool)
        self._n_probe = int(self._probe.sum())
        return joined

    def _first_samples(self, sampled_token_ids, batch, token_ids_cpu, appends) -> None:
        """Rows that sampled their first token: the prompt goes to the tree (as a sequence of its
        own, once per request), and the row's appends count from there."""
        s = self.settings
        left = []
        for i in self._unstarted:
            if not sampled_token_ids[i]:
                left.append(i)
                continue
            st = self._states[i]
            n_prompt = int(batch.num_prompt_tokens[i])
            if s.include_prompt and st.ref.first_chunk and n_prompt > 0:
                appends.append((st.ref.group_id, f"{st.ref.sequence_id}/prompt", token_ids_cpu[i, :n_prompt]))
            st.appended_to = n_prompt
            st.limit = n_prompt + self._max_tokens(batch.req_ids[i])
            self._done[i] = n_prompt
            self._limit[i] = st.limit
        self._unstarted = left

    @staticmethod
    def _hand_over(st: _RowState, row_tokens: Any, n: int, limit: int, appends: list) -> None:
        """Queue a row's tokens not yet sent, up to its first n and never past its limit."""
        m = min(n, limit)
        if m > st.appended_to:
            appends.append((st.ref.group_id, st.ref.sequence_id, row_tokens[st.appended_to:m]))
            st.appended_to = m

    def _max_tokens(self, rid: str) -> int:
        """The request's max_tokens: a verification step can accept drafts past it, tokens vLLM
        then drops from the output and that must not enter the group's tree either."""
        req = getattr(self._runner, "requests", {}).get(rid)
        sp = getattr(req, "sampling_params", None)
        return int(sp.max_tokens) if sp is not None and sp.max_tokens is not None else _UNSTARTED

    def rows_leaving(self, scheduler_output: Any) -> None:
        """Before vLLM removes the step's finished and unscheduled requests from its batch (the
        runner's ``_update_states``, ``seer.dgds.vllm.runner_hooks``): their tokens not yet sent."""
        try:
            tok, n, done = self._tok, self._n, self._done
            if tok is None or self._defer == 1:
                return
            fin = scheduler_output.finished_req_ids
            sched = scheduler_output.num_scheduled_tokens
            appends = []
            for i, rid in enumerate(self._ids):
                if (rid in fin or rid not in sched) and done[i] < n[i]:
                    self._hand_over(self._states[i], tok[i], int(n[i]), int(self._limit[i]), appends)
                    done[i] = n[i]
            if appends:
                self.client.append_many(appends)
        except Exception:
            if not self._failed_once:
                log.exception("DGDS proposer: flushing the rows that leave the batch failed")
                self._failed_once = True

    def _draft(self, ready, lengths: DraftLengths, req_ids, token_ids_cpu, sampled_token_ids,
               out: list[list[int]]) -> int:
        """Drafts for the rows the plan gives a length (probes first when it caps the rows); one
        batched lookup in the local replicas. Returns the tokens drafted."""
        s = self.settings
        rows: list[SpeculateRow] = []
        row_index: list[int] = []
        order = ready
        if lengths.max_rows is not None:
            order = [r for r in ready if r[1].ref.probe] + [r for r in ready if not r[1].ref.probe]
        for i, st, n in order:
            if lengths.max_rows is not None and len(rows) >= lengths.max_rows:
                break
            g = lengths.high if st.ref.probe else lengths.low
            g = min(g, s.gamma_max, self.max_model_len - n - 1)
            if g <= 0:
                continue
            ctx = token_ids_cpu[i, max(0, n - s.pattern_lookup_max):n]
            rows.append(SpeculateRow(
                req_ids[i], st.ref.group_id, ctx,
                DraftParams(max_spec_tokens=g, pattern_lookup_min=s.pattern_lookup_min,
                            pattern_lookup_max=s.pattern_lookup_max, min_token_prob=s.min_token_prob),
            ))
            row_index.append(i)
        if not rows:
            return 0
        t0 = time.perf_counter()
        drafts = self.client.batch_speculate(rows)
        self.policy.record_draft(len(rows), time.perf_counter() - t0)
        if _DEBUG:
            for i, row, d in zip(row_index, rows, drafts):
                _DEBUG.write(f"{row.request_id} sampled={list(sampled_token_ids[i])} ctx={_ints_tail(row.context)} "
                             f"draft={list(d.tokens)} max={row.params.max_spec_tokens}\n")
            _DEBUG.flush()
        drafted = 0
        for i, row, d in zip(row_index, rows, drafts):
            toks = list(d.tokens)
            if toks:
                out[i] = toks
                st = self._rows[row.request_id]
                st.last_draft = len(toks)
                self._drafted.append(st)
                drafted += len(toks)
                self._counts["rows_drafted"] += 1
                self._counts["draft_tokens"] += len(toks)
        return drafted

    def _write_stats(self) -> None:
        """``SEER_DGDS_STATS_FILE``: this proposer's counters and its cost fit, rewritten after every
        step (tests and benchmarks compare them with vLLM's counters)."""
        m = self.policy.cost.model()
        d = dict(self._counts, active_requests=len(self._rows),
                 beta=[round(b, 4) for b in self.policy.acceptance.beta],
                 step_model=dict(fixed=m.fixed, per_token=m.per_token, spec_fixed=m.spec_fixed,
                                 per_draft_token=m.per_draft_token, per_drafted_row=m.per_drafted_row),
                 lengths=self._length_counts)
        tmp = f"{self._stats_path}.tmp"
        with open(tmp, "w") as f:
            json.dump(d, f)
        os.replace(tmp, self._stats_path)

    def _start(self, engine_request_id: str) -> _RowState:
        ref = parse_request_id(engine_request_id, per_request=self.settings.per_request,
                               probe_index=self.settings.probe_index)
        self.client.register_group(ref.group_id, ttl_seconds=self.settings.ttl_s)
        st = _RowState(ref)
        self._rows[engine_request_id] = st
        return st

    def _finish(self, engine_request_id: str) -> None:
        st = self._rows.pop(engine_request_id)
        st.row = -1
        self.client.finish_request(st.ref.group_id, st.ref.sequence_id)

    def _lengths(self, n_high: int, n_low: int) -> DraftLengths:
        """The step's plan for its n_high probe rows and n_low others (at least one row)."""
        g = self.settings.gamma_max
        if not self.settings.adaptive:
            return DraftLengths(g, g)
        plan = self.policy.lengths(n_high, n_low)
        if self._stats_path:
            key = f"{plan.high},{plan.low}" + ("" if plan.max_rows is None else f",{plan.max_rows}")
            self._length_counts[key] = self._length_counts.get(key, 0) + 1
        return plan

    # ---- observability ------------------------------------------------------------------------

    def stats(self) -> ProposerStats:
        return ProposerStats(active_requests=len(self._rows), **self._counts)

    def _maybe_log(self) -> None:
        now = time.monotonic()
        if now - self._last_log < 30.0:
            return
        self._last_log = now
        c = self._counts
        log.info(
            "DGDS proposer: %d steps, %d drafts (%d tokens), accepted %d of %d verified drafts' tokens; beta=%s",
            c["steps"], c["rows_drafted"], c["draft_tokens"], c["accepted_tokens"], c["verified_drafts"],
            [round(b, 2) for b in self.policy.acceptance.beta[:4]],
        )

    def close(self) -> None:
        self.client.close()
        if self._embedded is not None:
            self._embedded.stop(0.5)


def _calling_runner(proposer: DgdsProposer) -> Any:
    """The model runner up the call stack: the object whose ``drafter`` is this proposer.

    vLLM calls ``load_model`` and ``propose`` from its runner's methods and passes no runner, yet
    row i of ``propose`` is only identified by ``runner.input_batch.req_ids[i]``. Walking the stack
    finds it with no worker extension, which keeps enabling the proposer to one flag.
    """
    frame = sys._getframe(1)
    while frame is not None:
        obj = frame.f_locals.get("self")
        if obj is not None and obj is not proposer and getattr(obj, "drafter", None) is proposer \
                and hasattr(obj, "input_batch"):
            return obj
        frame = frame.f_back
    return None
