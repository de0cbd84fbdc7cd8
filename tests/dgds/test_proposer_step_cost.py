"""The DGDS proposer feeds Algorithm 1's step-cost model decode steps only (no vLLM engine).

A step that prefilled (a request seen for the first time, a resumed one, a partial prefill) spent
time on prompt tokens the model does not count, and after an idle engine its gap holds the idle
time too; such samples inflated the fit's fixed term several-fold on one CPU core, so drafting
looked nearly free (docs/dgds.md, "Speculation on one CPU core at batch ~32").
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import numpy as np
import pytest

from seer.dgds.vllm.settings import ProposerSettings
from seer.dgds.vllm.proposer import DgdsProposer


class _Runner:
    def __init__(self, proposer):
        self.drafter = proposer
        self.input_batch = SimpleNamespace(req_ids=[], num_prompt_tokens=np.zeros(8, dtype=np.int64))


@pytest.fixture
def proposer():
    cfg = SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=4),
                          model_config=SimpleNamespace(max_model_len=512))
    p = DgdsProposer(cfg, ProposerSettings(gamma_max=4, fetch_interval_s=0.01))
    p.policy.cost.decay = 1.0  # count samples exactly
    runner = _Runner(p)
    p.bind_runner(runner)
    yield p, runner
    p.close()


def _step(p, runner, rows, sampled, lengths, gap_s=0.0):
    """One engine step: rows (request ids), what each sampled, each row's tokens so far."""
    time.sleep(gap_s)
    runner.input_batch.req_ids = list(rows)
    runner.input_batch.num_prompt_tokens[:len(rows)] = 4
    tokens = np.tile(np.arange(64, dtype=np.int64), (len(rows), 1))
    p.propose(sampled, np.array(lengths), tokens)


GAP_S = 0.5  # the idle gap before each prefill step: far longer than a decode step, even on a loaded machine


def test_only_decode_steps_are_samples_of_the_step_cost(proposer):
    p, runner = proposer
    n = lambda: p.policy.cost._n  # noqa: E731
    _step(p, runner, ["g0-s0", "g0-s1"], [[7], [8]], [5, 5])  # both prefilled in this step
    assert n() == 0
    _step(p, runner, ["g0-s0", "g0-s1"], [[9], [9]], [6, 6])  # a decode step of known rows
    assert n() == 1
    _step(p, runner, ["g0-s0", "g0-s1", "g0-s2"], [[1], [2], [3]], [7, 7, 5], gap_s=GAP_S)  # s2 joins
    assert n() == 1
    _step(p, runner, ["g0-s0", "g0-s1", "g0-s3"], [[1], [2], []], [8, 8, 0])  # s3 partial prefill
    assert n() == 1
    _step(p, runner, ["g0-s0", "g0-s1"], [[1], [2]], [9, 9])  # s2 finished, s3 preempted: decode only
    assert n() == 2
    _step(p, runner, ["g0-s0", "g0-s1", "g0-s3"], [[3], [4], [5]], [10, 10, 6], gap_s=GAP_S)  # s3 resumes
    assert n() == 2
    # the prefill steps' long gaps never reached the fit: with one of them among its two samples,
    # their mean would be at least GAP_S / 2 (whatever the machine's load does to the decode steps)
    assert p.policy.cost._sy / p.policy.cost._n < GAP_S / 2
