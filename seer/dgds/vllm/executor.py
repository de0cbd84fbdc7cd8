"""An optional vLLM executor that saves a speculating engine one worker round trip per step.

vLLM 0.32 runs CPU-side drafters (``ngram``, ``custom_class``) after the step's sampling, and the
engine then asks the worker for the drafts in a second RPC (``EngineCore.post_step`` ->
``take_draft_token_ids``), every step, drafts or not. On a one-core CPU instance that round trip
through the executor's shared-memory queues was most of what a zero-draft step cost over a plain
one (docs/dgds.md, "Step breakdown"). Async scheduling, vLLM's own way to skip it, refuses these
drafters (and the CPU platform turns it off).

The DGDS proposer attaches the step's drafts to the ``ModelRunnerOutput`` the worker returns anyway
(``seer.dgds.vllm.runner_hooks.attach_drafts``: an attribute the executor's pickle carries); this executor takes them from
there, so ``take_draft_token_ids`` needs no RPC, and a step without drafts hands the scheduler
nothing. With vLLM's own executor the attribute is ignored and the RPC runs as before.

    --distributed-executor-backend seer.dgds.vllm.executor.DgdsExecutor
"""

from __future__ import annotations

from typing import Any

from vllm.v1.executor.multiproc_executor import MultiprocExecutor

from seer.dgds.vllm.runner_hooks import DRAFTS_ATTR

_MISSING = object()


class DgdsExecutor(MultiprocExecutor):
    """vLLM's multiprocessing executor, reading the step's drafts from the step's own output."""

    _seer_drafts: Any = _MISSING

    def sample_tokens(self, grammar_output: Any, non_block: bool = False) -> Any:
        out = super().sample_tokens(grammar_output, non_block)
        if non_block:  # a future (batch queue): leave the drafts to the RPC
            self._seer_drafts = _MISSING
            return out
        d = getattr(out, "__dict__", {}).pop(DRAFTS_ATTR, _MISSING)
        self._seer_drafts = d
        return out

    def take_draft_token_ids(self) -> Any:
        d, self._seer_drafts = self._seer_drafts, _MISSING
        if d is _MISSING:
            return super().take_draft_token_ids()
        return d
