"""Routing capture inside a vLLM worker: the experts every MoE layer chose for every token (R3).

vLLM 0.32's own capture (`enable_return_routed_experts`) needs Model Runner V2, hence Triton, so it
does not start on CPU. Seer records the routing itself, with two hooks on the worker's one runner
(installed by `SeerWeightExtension.seer_routing_enable` through `/collective_rpc`, never at import):

* every MoE router's `capture_fn` (vLLM's `BaseRouter` calls it with the step's top-k ids, before
  any EPLB mapping) copies the ids of the step's real tokens into a per-layer slot;
* `runner._prepare_inputs` notes the step's layout first: which request owns which rows, and at
  which position each request's rows start (`num_computed_tokens` at the step's start).

At the next step (or a take), the step's rows go to each request's row store, indexed by position.
Only tokens the engine computed get rows: a prefix-cache hit or KV loaded from the pool starts the
request's positions later. A position computed again (speculative tokens that were rejected, a
preempted request recomputed) overwrites its row, so a store holds what the KV cache now holds.

The driver takes a finished chunk's rows by its request id (`seer_routing_take`); what nobody
takes (an aborted chunk, a driver that went away) is dropped `FINISHED_TTL_S` after the engine
finished or aborted its request, `TTL_S` after its last write, or oldest first once the stores
hold more than the byte cap. Off (nothing installed, zero cost)
unless enabled.
"""

from __future__ import annotations

import base64
import json
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

TTL_S = 300.0  # rows nobody took within this long after their last write are dropped
FINISHED_TTL_S = 30.0  # ... and this long after the engine finished or aborted their request
DEFAULT_CAP_BYTES = 256 * 2**20  # all stores of one worker together


@dataclass
class _Rows:
    """One request's rows: positions [lo, hi), row i at buf[i - lo]."""

    lo: int
    hi: int
    buf: np.ndarray  # [capacity, layers, top_k]
    touched: float
    finished: float | None = None  # when the engine finished (or aborted) the request

    def write(self, pos: int, rows: np.ndarray, now: float) -> None:
        n = len(rows)
        if pos > self.hi:  # a step's rows were lost in between: keep only what is contiguous
            self.lo = self.hi = pos
        if pos < self.lo:  # recomputed from further back (a preempted request lost its cache)
            pad = np.zeros((self.lo - pos, *self.buf.shape[1:]), self.buf.dtype)
            self.buf = np.concatenate([pad, self.buf[: self.hi - self.lo]])
            self.lo = pos
        end = pos + n - self.lo
        if end > len(self.buf):
            grown = np.zeros((max(end, 2 * len(self.buf)), *self.buf.shape[1:]), self.buf.dtype)
            grown[: self.hi - self.lo] = self.buf[: self.hi - self.lo]
            self.buf = grown
        self.buf[pos - self.lo: end] = rows
        # rows past this write are stale (rejected speculative tokens): this write is the newest
        self.hi = pos + n
        self.touched = now

    @property
    def nbytes(self) -> int:
        return self.buf.nbytes


class RoutingRecorder:
    """The capture state of one worker's runner."""

    def __init__(self, runner: Any, cap_bytes: int = DEFAULT_CAP_BYTES, ttl_s: float = TTL_S) -> None:
        import torch

        routers = _moe_routers(runner.get_model())
        if not routers:
            raise ValueError("routing capture: the served model has no MoE layer (routing replay is for MoE models)")
        self.layer_ids = sorted(routers)
        first = routers[self.layer_ids[0]]
        self.top_k = int(first.top_k)
        self.num_experts = int(first.global_num_experts)
        self.dtype = "uint8" if self.num_experts <= 256 else "uint16"
        self._torch_dtype = torch.uint8 if self.dtype == "uint8" else torch.int16  # ids < 2^15: same bits
        self.cap_bytes = int(cap_bytes)
        self.ttl_s = float(ttl_s)
        self.stores: dict[str, _Rows] = {}
        self._layout: list[tuple[str, int, int]] | None = None
        self._step: list[Any] = [None] * len(self.layer_ids)
        self.stats = {"steps": 0, "tokens": 0, "capture_s": 0.0, "flush_s": 0.0, "dropped_requests": 0,
                      "incomplete_steps": 0, "short_steps": 0}
        self._runner = runner
        self._bind(routers)
        self._wrap_prepare(runner)

    def _bind(self, routers: dict[int, Any]) -> None:
        if sorted(routers) != self.layer_ids:
            raise RuntimeError(f"routing capture: the model's MoE layers changed: {sorted(routers)} != {self.layer_ids}")
        for slot, lid in enumerate(self.layer_ids):
            routers[lid].set_capture_fn(self._capture_fn(slot))

    # ---- in the forward pass -------------------------------------------------------------
    def _capture_fn(self, slot: int):
        def capture(topk_ids: Any) -> None:
            if self._layout is None or self._step[slot] is not None:
                return  # a warm-up or dummy run, or a second call within one step
            t0 = time.perf_counter()
            n = self._tokens
            if topk_ids.shape[0] < n:  # this rank routed a shard of the step (sequence parallel): file nothing
                self._layout = None
                self.stats["short_steps"] += 1
                return
            self._step[slot] = topk_ids[:n].to("cpu", self._torch_dtype)
            self.stats["capture_s"] += time.perf_counter() - t0

        return capture

    def _wrap_prepare(self, runner: Any) -> None:
        prepare = runner._prepare_inputs

        def _prepare_inputs(scheduler_output: Any, num_scheduled_tokens: Any, *args: Any, **kwargs: Any) -> Any:
            self.flush()
            now = time.monotonic()
            for rid in getattr(scheduler_output, "finished_req_ids", ()) or ():
                store = self.stores.get(rid)
                if store is not None and store.finished is None:
                    store.finished = now  # finished or aborted: the driver takes it now, or never
            batch = runner.input_batch
            k = batch.num_reqs
            starts = batch.num_computed_tokens_cpu[:k].tolist()
            counts = [int(c) for c in num_scheduled_tokens[:k]]
            self._layout = list(zip(batch.req_ids[:k], map(int, starts), counts))
            self._tokens = sum(counts)
            return prepare(scheduler_output, num_scheduled_tokens, *args, **kwargs)

        runner._prepare_inputs = _prepare_inputs

    # ---- between steps -------------------------------------------------------------------
    def flush(self) -> None:
        """File the last step's rows under their requests (the step ran to its end by now)."""
        layout, self._layout = self._layout, None
        step, self._step = self._step, [None] * len(self.layer_ids)
        if layout is None:
            return
        if any(s is None for s in step):
            # no forward ran (a step that only moved KV), or a weight reload rebuilt the routers:
            # bind again, so that the next steps record (the driver recomputes what this one lost)
            self.stats["incomplete_steps"] += 1
            self._bind(_moe_routers(self._runner.get_model()))
            return
        t0 = time.perf_counter()
        rows = np.stack([s.numpy() for s in step], axis=1)  # [tokens, layers, top_k]
        if self.dtype == "uint16":
            rows = rows.view(np.uint16)
        now = time.monotonic()
        at = 0
        for rid, start, n in layout:
            if n <= 0:
                continue
            store = self.stores.get(rid)
            if store is None:
                store = self.stores[rid] = _Rows(start, start, np.zeros((max(n, 64), *rows.shape[1:]), rows.dtype), now)
            store.write(start, rows[at: at + n], now)
            at += n
        self.stats["steps"] += 1
        self.stats["tokens"] += at
        self._evict(now, {rid for rid, _, _ in layout})
        self.stats["flush_s"] += time.perf_counter() - t0

    def _evict(self, now: float, active: set[str]) -> None:
        old = [rid for rid, s in self.stores.items() if rid not in active and (
            now - s.touched > self.ttl_s or (s.finished is not None and now - s.finished > FINISHED_TTL_S))]
        total = sum(s.nbytes for s in self.stores.values())
        if total > self.cap_bytes:
            for rid, s in sorted(self.stores.items(), key=lambda kv: kv[1].touched):
                if total <= self.cap_bytes:
                    break
                if rid not in active and rid not in old:
                    old.append(rid)
                    total -= s.nbytes
        for rid in old:
            del self.stores[rid]
        self.stats["dropped_requests"] += len(old)

    def take(self, caller_ids: list[str]) -> dict:
        """Pop the rows of the requests whose caller ids are given (vLLM wraps ids: seer.request_ids)."""
        from seer.request_ids import caller_request_id

        self.flush()
        wanted = set(caller_ids)
        out: dict[str, dict] = {}
        for rid in list(self.stores):
            cid = caller_request_id(rid)
            if cid in wanted:
                s = self.stores.pop(rid)
                out[cid] = {"start": s.lo, "tokens": s.hi - s.lo,
                            "data": base64.b64encode(np.ascontiguousarray(s.buf[: s.hi - s.lo]).tobytes()).decode()}
        return out

    def header(self) -> dict:
        return {"layers": len(self.layer_ids), "top_k": self.top_k, "dtype": self.dtype,
                "num_experts": self.num_experts}


def _moe_routers(model: Any) -> dict[int, Any]:
    """{layer index: router} of every MoE layer whose router takes a capture callback."""
    from vllm.model_executor.layers.fused_moe.runner.moe_runner import MoERunner
    from vllm.model_executor.layers.fused_moe.router.base_router import BaseRouter

    out = {}
    for module in model.modules():
        if not isinstance(module, MoERunner):
            continue
        if module.is_monolithic or not isinstance(module.router, BaseRouter):
            raise ValueError(f"routing capture: MoE layer {module.layer_name} uses a kernel that routes inside "
                             f"itself ({type(module.router).__name__}); Seer's capture needs vLLM's router")
        out[int(module.layer_id)] = module.router
    return out


def enable(worker: Any, cap_bytes: int) -> str:
    """Install the recorder on `worker`'s runner (idempotent); returns its header as JSON."""
    runner = worker.model_runner
    rec = getattr(runner, "_seer_routing", None)
    if rec is None:
        rec = runner._seer_routing = RoutingRecorder(runner, cap_bytes)
    return json.dumps(rec.header())


def take(worker: Any, ids_json: str) -> str:
    rec = getattr(worker.model_runner, "_seer_routing", None)
    if rec is None:
        raise RuntimeError("routing capture is not enabled on this instance (seer_routing_enable)")
    return json.dumps({**rec.header(), "requests": rec.take(json.loads(ids_json))})


def stats(worker: Any) -> str:
    rec = getattr(worker.model_runner, "_seer_routing", None)
    return json.dumps(None if rec is None else {**rec.stats, "stored_requests": len(rec.stores),
                                                 "stored_bytes": sum(s.nbytes for s in rec.stores.values())})
