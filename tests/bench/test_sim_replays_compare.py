"""The simulator, given the lengths a recorded real `seer-bench compare` run replayed, ranks the
configurations as that run measured them (no processes: the real side is the recorded run)."""

import itertools

import pytest

from bench.sim.replay_compare import SPEC_BREAKDOWN, ratios

RECORDED = ["bench/results/compare/compare.json", "bench/results/compare/run_iteration/compare.json"]


@pytest.mark.parametrize("path", RECORDED)
def test_the_simulator_orders_a_recorded_real_ladder_as_it_was_measured(path):
    real, sim, about = ratios(path)
    pairs = [(a, b) for a, b in itertools.permutations(real, 2) if real[a] > 1.05 * real[b]]
    assert pairs, f"{path}: the real run separates no pair by 5% ({real})"
    for a, b in pairs:  # every pair the real run separated, the simulator orders the same way
        assert sim[a] > sim[b], f"{path} ({about}): real {a} {real[a]:.2f} > {b} {real[b]:.2f}, simulated {sim}"


# The runs whose grouped-SD row the simulator predicts within 10%. Not
# bench/results/compare/sd_context (SPEC_BREAKDOWN has it): simulated 1.12x of context against the
# measured 0.91x; the simulated SD never loses in the bulk (its Algorithm 1 stops drafting where the
# breakdown's costs say it cannot pay), the real one, which drafted around break-even then, did
# (docs/dgds.md, "Grouped SD on the ladder"). Its successors, with the policy's 10% margin, are in.
PREDICTED_SD = ["bench/results/compare/compare.json", "bench/results/compare/sd_context_margin/compare.json",
                "bench/results/compare/sd_context_margin5/compare.json"]


@pytest.mark.parametrize("path", PREDICTED_SD)
def test_the_simulator_predicts_the_grouped_sd_rows_ratio_within_10_percent(path):
    """With what verifying drafts costs here (the breakdown recorded on the run's code) and this
    model's measured acceptance, the simulated grouped-SD ratio to the run's reference is within
    10% of the measured one (issue 20, item 5)."""
    assert path in SPEC_BREAKDOWN
    real, sim, about = ratios(path)
    assert "grouped_sd" in real and "grouped_sd" in sim, about
    assert sim["grouped_sd"] == pytest.approx(real["grouped_sd"], rel=0.10), (about, real, sim)
