"""What the DGDS proposer changes on the vLLM 0.32 model runner it serves, so that a step whose
rows got no draft costs what a step without speculation costs (docs/dgds.md, "Step breakdown").

* ``attach_drafts``: the step's output carries its drafts, for ``seer.dgds.vllm.executor``
  (no per-step RPC to fetch them; harmless with vLLM's own executor).
* ``plain_sampling_without_drafts``: vLLM builds speculative metadata for every step once
  speculation is configured (``gpu_model_runner._prepare_inputs``, ``use_spec_decode`` is just
  ``speculative_config is not None``), so its rejection sampler ran on steps with no draft at all,
  about a millisecond per step on one CPU core. With no draft in the step, the bonus token is all
  there is to sample, which is what vLLM's plain sampler does; the step samples with it instead.
* ``plain_inputs_without_drafts``: and such a step's inputs are prepared without the speculative
  metadata (a per-row loop and its tensors, up to 0.75 ms at 32 rows here).
* ``flush_rows_leaving``: the proposer hands a row's tokens to the draft client every few tokens,
  not every step (vLLM's ``token_ids_cpu`` holds them meanwhile); before the runner removes the
  step's finished and unscheduled requests from its batch, their last tokens are handed over.

Both wrap instance attributes of the one runner (idempotent), never vLLM's classes.
"""

from __future__ import annotations

from typing import Any

DRAFTS_ATTR = "seer_draft_token_ids"  # read by seer.dgds.vllm.executor.DgdsExecutor


def install(runner: Any) -> None:
    """The hooks on ``runner`` (a vLLM v1 GPU/CPU model runner)."""
    attach_drafts(runner)
    plain_sampling_without_drafts(runner)
    plain_inputs_without_drafts(runner)
    flush_rows_leaving(runner)


def flush_rows_leaving(runner: Any) -> None:
    """Wrap ``runner._update_states``: first ``runner.drafter.rows_leaving(scheduler_output)``
    (the rows vLLM is about to drop still hold their tokens then). Sets ``_seer_rows_leaving``."""
    if getattr(runner, "_seer_rows_leaving", False):
        return
    update = runner._update_states
    drafter = runner.drafter

    def _update_states(scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        drafter.rows_leaving(scheduler_output)
        return update(scheduler_output, *args, **kwargs)

    runner._update_states = _update_states
    runner._seer_rows_leaving = True


def plain_inputs_without_drafts(runner: Any) -> None:
    """Wrap ``runner._prepare_inputs``: a step with no draft scheduled prepares its inputs as a
    non-speculating runner does (no speculative metadata, one logits row per request), by hiding
    the speculative config for that call only (``_prepare_inputs`` reads it once, to choose).

    Not for models with recurrent state (hybrid or attention-free): vLLM keeps zero-draft decode
    rows on the speculative path there on purpose (their state offset), so those keep vLLM's way.
    """
    if getattr(runner, "_seer_plain_inputs", False):
        return
    mc = getattr(runner, "model_config", None)
    if mc is None or getattr(mc, "is_hybrid", False) or getattr(mc, "is_attention_free", False):
        return
    prepare = runner._prepare_inputs

    def _prepare_inputs(scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        if scheduler_output.scheduled_spec_decode_tokens or runner.speculative_config is None:
            return prepare(scheduler_output, *args, **kwargs)
        spec = runner.speculative_config
        runner.speculative_config = None
        try:
            return prepare(scheduler_output, *args, **kwargs)
        finally:
            runner.speculative_config = spec

    runner._prepare_inputs = _prepare_inputs
    runner._seer_plain_inputs = True


def attach_drafts(runner: Any) -> None:
    """Wrap ``runner.sample_tokens`` (worker process) so its output carries the step's drafts:
    vLLM's ``DraftTokenIds``, or None when no row has one. Idempotent."""
    if getattr(runner, "_seer_attach_drafts", False):
        return
    from vllm.v1.outputs import ModelRunnerOutput

    sample = runner.sample_tokens

    def sample_tokens(*args: Any, **kwargs: Any) -> Any:
        out = sample(*args, **kwargs)
        if type(out) is ModelRunnerOutput:
            drafts = runner.take_draft_token_ids()  # local: the lists the proposer returned
            if drafts is not None and not any(drafts.draft_token_ids):
                drafts = None
            setattr(out, DRAFTS_ATTR, drafts)
        return out

    runner.sample_tokens = sample_tokens
    runner._seer_attach_drafts = True


def plain_sampling_without_drafts(runner: Any) -> None:
    """Wrap ``runner._sample``: a step whose speculative metadata holds no draft token samples
    with the runner's plain sampler (same logits rows: one per request; same output shape)."""
    if getattr(runner, "_seer_plain_sampling", False):
        return
    sample = runner._sample

    def _sample(logits: Any, spec_decode_metadata: Any) -> Any:
        if spec_decode_metadata is not None and spec_decode_metadata.max_spec_len == 0:
            runner.input_batch.update_async_output_token_ids()
            return runner.sampler(logits=logits, sampling_metadata=runner.input_batch.sampling_metadata)
        return sample(logits, spec_decode_metadata)

    runner._sample = _sample
    runner._seer_plain_sampling = True
