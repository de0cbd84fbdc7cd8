"""The algorithm registry (seer.trainer.algorithms): every entry against numbers worked out by hand,
the config keys (old ones included), plug-ins by path, and one trainer step per correction mode."""

from __future__ import annotations

import math

import pytest
import torch

from seer.trainer import algorithms as alg
from seer.trainer.algorithms import AlgorithmError, Algorithms, Group
from seer.trainer.config import TrainerConfig
from seer.types import Branch, PromptSpec, Sample

def flat(nested) -> list[float]:
    return [x for row in nested for x in row]


# ---- advantage estimators --------------------------------------------------------------------
# Group A: rewards 0, 2, 4 (mean 2, unbiased std 2). Group B: 3, 3 (all equal). Group C: 1, 0
# (mean 0.5, unbiased std sqrt(1/2)).
GROUPS = [Group((0.0, 2.0, 4.0)), Group((3.0, 3.0)), Group((1.0, 0.0))]


def test_grpo_divides_by_the_group_std_and_zeroes_all_equal_groups():
    c = 0.5 / math.sqrt(0.5)  # = sqrt(1/2)
    assert flat(alg.grpo(GROUPS, eps=0.0)) == pytest.approx([-1.0, 0.0, 1.0, 0.0, 0.0, c, -c])


def test_dr_grpo_subtracts_the_group_mean_only():
    assert flat(alg.dr_grpo(GROUPS)) == pytest.approx([-2.0, 0.0, 2.0, 0.0, 0.0, 0.5, -0.5])


def test_rloo_subtracts_the_mean_of_the_other_samples():
    # A: 0 - (2+4)/2 = -3, 2 - (0+4)/2 = 0, 4 - (0+2)/2 = 3; C: 1 - 0 = 1, 0 - 1 = -1
    assert flat(alg.rloo(GROUPS)) == pytest.approx([-3.0, 0.0, 3.0, 0.0, 0.0, 1.0, -1.0])


def test_reinforce_pp_baseline_whitens_the_group_centred_rewards_over_the_batch():
    # centred: -2 0 2 | 0 0 | .5 -.5 -> batch mean 0, unbiased std sqrt((4+4+.25+.25)/6)
    s = math.sqrt(8.5 / 6)
    assert flat(alg.reinforce_pp_baseline(GROUPS, eps=0.0)) == pytest.approx(
        [-2 / s, 0.0, 2 / s, 0.0, 0.0, 0.5 / s, -0.5 / s])


# ---- policy losses ---------------------------------------------------------------------------
# Five tokens, old log-probs 0, ratios r and per-token advantages A:
R = [1.5, 0.5, 1.1, 0.5, 5.0]
A = [1.0, 1.0, -1.0, -1.0, -1.0]


def _loss(name: str, high=None, **args):
    lp = torch.log(torch.tensor([R])).requires_grad_(True)
    fn = alg.lookup("policy_loss", name, args)
    terms = fn(lp, torch.zeros(1, 5), torch.tensor([A]), torch.ones(1, 5), clip_eps_low=0.2, clip_eps_high=high)
    terms.loss.sum().backward()
    return terms, lp.grad[0].tolist()


def test_ppo_clip_takes_the_pessimistic_branch():
    # A>0: max(-1.5, -1.2) = -1.2 (clipped), max(-.5, -.8) = -.5; A<0: max(1.1, 1.1), max(.5, .8) = .8, max(5, 1.2) = 5
    t, grad = _loss("ppo_clip")
    assert t.loss[0].tolist() == pytest.approx([-1.2, -0.5, 1.1, 0.8, 5.0], abs=1e-6)
    assert t.clipped[0].tolist() == [1.0, 0.0, 0.0, 1.0, 0.0]
    # d(-A r)/dlogp = -A r on unclipped tokens, 0 on clipped ones
    assert grad == pytest.approx([0.0, -0.5, 1.1, 0.0, 5.0], abs=1e-6)


def test_clip_higher_raises_only_the_upper_bound_to_daposs_028_or_clip_eps_high():
    t, _ = _loss("clip_higher")
    assert t.loss[0, 0].item() == pytest.approx(-1.28, abs=1e-6)  # max(-1.5, -1.28)
    assert t.loss[0, 3].item() == pytest.approx(0.8, abs=1e-6)  # the lower bound is still 1 - 0.2
    t, _ = _loss("ppo_clip", high=0.4)  # the old key, clip_eps_high, on plain ppo_clip
    assert t.loss[0, 0].item() == pytest.approx(-1.4, abs=1e-6)


def test_dual_clip_bounds_the_loss_of_a_huge_ratio_under_a_negative_advantage():
    t, grad = _loss("dual_clip")  # c = 3: min(max(5, 1.2), 3) = 3; 1.1 and .8 stay (below 3)
    assert t.loss[0].tolist() == pytest.approx([-1.2, -0.5, 1.1, 0.8, 3.0], abs=1e-6)
    assert grad[4] == 0.0 and t.clipped[0, 4].item() == 1.0  # a constant: no gradient through the bound
    t, _ = _loss("dual_clip", clip_c=10.0)
    assert t.loss[0, 4].item() == pytest.approx(5.0, abs=1e-5)


def test_gspo_clips_the_geometric_mean_ratio_of_each_sequence():
    # row 0: token ratios 2, .5, 4 -> s = (2 * .5 * 4)^(1/3) = 4^(1/3) = 1.5874, A = 1: max(-1.5874, -1.2) = -1.2
    # row 1: ratios 1.1, 1 (and a masked 100) -> s = 1.1^(1/2) = 1.04881, A = -1: 1.04881, unclipped
    lp = torch.log(torch.tensor([[2.0, 0.5, 4.0], [1.1, 1.0, 100.0]])).requires_grad_(True)
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    t = alg.gspo(lp, torch.zeros(2, 3), torch.tensor([[1.0], [-1.0]]), mask, clip_eps_low=0.2, clip_eps_high=None)
    s1 = 1.1 ** 0.5
    assert flat((t.loss * mask).tolist()) == pytest.approx([-1.2] * 3 + [s1, s1, 0.0], abs=1e-5)
    (t.loss * mask).sum().backward()
    # the token ratio sg(s) p / sg(p) has d/dlogp = s: row 1's gradient is -A s per token, row 0 is clipped
    assert flat(lp.grad.tolist()) == pytest.approx([0.0] * 3 + [s1, s1, 0.0], abs=1e-5)


def test_cispo_truncates_the_weight_but_keeps_every_tokens_gradient():
    # r = 1.5, .5 with A = 1, -1: w = clip(r, .8, 1.2) = 1.2, .8; loss = -w A log r
    lp = torch.log(torch.tensor([[1.5, 0.5]])).requires_grad_(True)
    t = alg.cispo(lp, torch.zeros(1, 2), torch.tensor([[1.0, -1.0]]), torch.ones(1, 2), clip_eps_low=0.2,
                  clip_eps_high=None)
    assert t.loss[0].tolist() == pytest.approx([-1.2 * math.log(1.5), 0.8 * math.log(0.5)], abs=1e-6)
    t.loss.sum().backward()
    assert lp.grad[0].tolist() == pytest.approx([-1.2, 0.8], abs=1e-6)  # PPO would give 0 to both (clipped)
    assert t.clipped[0].tolist() == [1.0, 1.0]


# ---- train-inference corrections -------------------------------------------------------------
# pi_old / pi_rollout per token: row 0 = .25, 1.5, 3 (product 1.125); row 1 = 4, 4 and a token
# without a rollout log-prob (mask 0).
RHO = torch.tensor([[0.25, 1.5, 3.0], [4.0, 4.0, 50.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])


def _weights(name: str, **args):
    algos = Algorithms(estimator=alg.grpo, policy_loss=alg.ppo_clip,
                       correction=alg.lookup("rollout_correction", name, args))
    return algos.correction_weights(torch.zeros(2, 3), -torch.log(RHO), MASK).tolist()


def test_token_tis_truncates_each_tokens_ratio_at_the_cap():
    assert flat(_weights("token_tis")) == pytest.approx([0.25, 1.5, 2.0, 2.0, 2.0, 1.0])
    assert flat(_weights("token_tis", cap=5.0)) == pytest.approx([0.25, 1.5, 3.0, 4.0, 4.0, 1.0])


def test_seq_tis_weights_a_sequence_by_its_truncated_ratio_product():
    assert flat(_weights("seq_tis")) == pytest.approx([1.125] * 3 + [2.0, 2.0, 1.0])  # 16 truncated to 2


def test_token_mask_rejects_tokens_whose_ratio_leaves_the_band():
    assert _weights("token_mask") == [[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]
    assert _weights("token_mask", low=0.2, high=5.0) == [[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]]


def test_seq_mask_rejects_sequences_whose_geometric_mean_ratio_leaves_the_band():
    # row 0: 1.125^(1/3) = 1.040 kept; row 1: (4 * 4)^(1/2) = 4 rejected (the unmasked token is not counted)
    assert _weights("seq_mask") == [[1.0, 1.0, 1.0], [0.0, 0.0, 1.0]]


# ---- reward shaping --------------------------------------------------------------------------

def test_overlong_shaping_penalises_linearly_inside_the_buffer():
    # L_max 100, buffer 20: no penalty up to 80, then -(L - 80) / 20: 90 -> -.5, 100 -> -1
    assert alg.overlong([1.0] * 4, [50, 80, 90, 100], max_tokens=100) == pytest.approx([1.0, 1.0, 0.5, 0.0])
    assert alg.overlong([0.0], [95], max_tokens=100, buffer_tokens=10, penalty=2.0) == pytest.approx([-1.0])


# ---- config keys -----------------------------------------------------------------------------

def _sample(group: int, i: int, reward: float, n_tokens: int = 3, branch: Branch | None = None) -> Sample:
    return Sample(group_id=group, sample_index=i, request_id=f"g{group}-s{i}",
                  prompt=PromptSpec(group, "", [1], {}), response_ids=[5] * n_tokens, logprobs=[], finish_reason="stop",
                  start_time=0.0, finish_time=0.0, instances=[], reward=reward, branch=branch)


def test_the_defaults_are_grpo_ppo_clip_no_correction_no_shaping():
    algos = Algorithms.from_config(TrainerConfig())
    assert algos.names == {"advantage_estimator": "grpo", "policy_loss": "ppo_clip", "rollout_correction": "none",
                           "reward_shaping": "none"}
    assert algos.correction is None and algos.shaping is None


def test_an_old_config_yaml_keeps_its_meaning(tmp_path):
    """A run directory's config.yaml from before the registry: normalize_adv_std false and
    clip_eps_high, none of the new keys. It still means Dr. GRPO with clip-higher."""
    from seer.config import load_config

    (tmp_path / "config.yaml").write_text(
        "iterations: 2\ntrainer:\n  lr: 0.0002\n  clip_eps_low: 0.2\n  clip_eps_high: 0.28\n"
        "  loss_agg: token-mean\n  old_logprobs: recomputed\n  normalize_adv_std: false\n  kl_coef: 0.0\n"
        "  mini_batches: 2\n")
    cfg = load_config(tmp_path / "config.yaml")
    algos = Algorithms.from_config(cfg.trainer)
    assert algos.names["advantage_estimator"] == "dr_grpo"
    groups = [[_sample(0, 0, 0.0), _sample(0, 1, 2.0), _sample(0, 2, 4.0)]]
    assert flat(algos.advantages(groups)) == pytest.approx([-2.0, 0.0, 2.0])  # not divided by the std (2)
    lp = torch.log(torch.tensor([[1.5]]))
    t = algos.loss(lp, torch.zeros(1, 1), torch.tensor([[1.0]]), torch.ones(1, 1), cfg.trainer)
    assert t.loss.item() == pytest.approx(-1.28, abs=1e-6)
    with pytest.raises(AlgorithmError, match="normalize_adv_std"):
        Algorithms.from_config(TrainerConfig(normalize_adv_std=False, advantage_estimator="rloo"))


@pytest.mark.parametrize("override, key", [
    ("trainer.policy_loss=ppo", "trainer.policy_loss"),
    ("trainer.advantage_estimator=no.such.module:fn", "trainer.advantage_estimator"),
    ("trainer.policy_loss_args={bogus: 1}", "trainer.policy_loss_args"),
    ("trainer.rollout_correction=token_tis", "trainer.rollout_correction"),  # with old_logprobs: rollout below
    ("trainer.rollout_correction_args={cap: 2}", "trainer.rollout_correction_args"),  # given without a correction
])
def test_bad_algorithm_settings_are_config_errors_naming_the_key(override, key):
    from seer.config import ConfigError, load_config

    extra = ["trainer.old_logprobs=rollout"] if override.endswith("token_tis") else []
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(None, [override, *extra])


def test_reward_shaping_reads_rollout_max_tokens_and_shapes_before_the_estimator():
    algos = Algorithms.from_config(TrainerConfig(reward_shaping="overlong", advantage_estimator="dr_grpo",
                                                 max_response_tokens=100))
    # lengths 50 and 100 with reward 1 each: shaped to 1 and 0, so the all-equal group becomes informative
    group = [_sample(0, 0, 1.0, n_tokens=50), _sample(0, 1, 1.0, n_tokens=100)]
    assert flat(algos.advantages([group])) == pytest.approx([0.5, -0.5])


def test_an_estimator_by_path_sees_each_samples_branch():
    """The gateway's hook: a group of more than G samples, several leaves of one session."""
    algos = Algorithms.from_config(TrainerConfig(advantage_estimator="tests.plugins_for_tests:per_session_baseline"))
    s = [_sample(0, 0, 1.0, branch=Branch("a", (0,))), _sample(0, 1, 0.0, branch=Branch("a", (1,))),
         _sample(0, 2, 0.0, branch=Branch("b", (0,)))]
    # session a's mean 0.5 and b's 0 count once each: baseline 0.25
    assert flat(algos.advantages([s])) == pytest.approx([0.75, -0.25, -0.25])


# ---- through a trainer step ------------------------------------------------------------------

@pytest.mark.parametrize("loss", ["gspo", "cispo", "dual_clip"])
def test_each_policy_loss_trains_a_real_step(tiny_qwen2, loss):
    from tests.trainer.test_grpo import BAD, GOOD, make_batch, seq_logprob
    from seer.trainer import Trainer

    trainer = Trainer(tiny_qwen2, TrainerConfig(lr=3e-3, policy_loss=loss, max_tokens_per_micro_batch=16))
    before = seq_logprob(trainer, GOOD[0])
    m = trainer.train_step(make_batch(trainer, GOOD + BAD, [1.0, 1.0, 0.0, 0.0]))
    assert m.grad_norm > 0 and seq_logprob(trainer, GOOD[0]) > before


def test_a_correction_that_rejects_every_token_leaves_no_gradient(tiny_qwen2):
    """Rollout log-probs far from the trainer's: token_mask rejects every token, token_tis keeps them."""
    from tests.trainer.test_grpo import BAD, GOOD, make_batch
    from seer.trainer import Trainer

    for name, zero in (("token_mask", True), ("token_tis", False)):
        trainer = Trainer(tiny_qwen2, TrainerConfig(lr=3e-3, rollout_correction=name))
        m = trainer.train_step(make_batch(trainer, GOOD + BAD, [1.0, 1.0, 0.0, 0.0], logprob_shift=-3.0))
        assert (m.grad_norm == 0.0) == zero, (name, m.grad_norm)
        # pi_old / pi_rollout = e^3 on every token: truncated to the cap (2), or rejected (0)
        assert m.extra["rollout_is_weight_mean"] == pytest.approx(0.0 if zero else 2.0, abs=1e-5)
        assert m.record()["rollout_is_weight_mean"] == m.extra["rollout_is_weight_mean"]


def test_print_config_names_every_registry_entry_of_each_key():
    """`seer-run --print-config` is the config's help: each key's line lists the registry's names,
    so an entry added to the registry without its help fails here."""
    from seer.config_help import config_keys, one_line

    helps = {k.key: one_line(k.description) for k in config_keys()}  # the printed line, as cut
    for kind, table in alg._TABLES.items():
        for name in table:
            assert name in helps[f"trainer.{kind}"], (kind, name)
