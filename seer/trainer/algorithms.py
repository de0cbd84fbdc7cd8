"""The algorithm registry: advantage estimators, policy losses, train-inference corrections and
reward shaping, each chosen by name or by `module:function` path (seer.plugins' resolver).

Config keys (`trainer.*`, one default each = Seer's behaviour before the registry):

- `advantage_estimator` (grpo) + `advantage_args`: rewards of each group -> one advantage per sample.
- `policy_loss` (ppo_clip) + `policy_loss_args`: per-token surrogate loss, left unreduced.
- `rollout_correction` (none) + `rollout_correction_args`: per-token weights from pi_old / pi_rollout.
- `reward_shaping` (none) + `reward_shaping_args`: rewards and response lengths -> shaped rewards.

Old keys keep working: `normalize_adv_std: false` is `advantage_estimator: dr_grpo`, and
`clip_eps_high` is read by every clipped loss (`clip_higher` names DAPO's preset of it).

Every entry is a plain function. Estimators and shaping work on Python floats and never import
torch, so the config checks names and arguments at load time without loading torch; losses and
corrections take the trainer's per-token tensors ([B, T], one row per sequence, aligned with the
targets, `mask` 1 on trained response tokens), whatever the micro-batch layout was.

Formulas follow verl (verl/trainer/ppo/core_algos.py, rollout_corr_helper.py) and slime
(slime/utils/ppo_utils.py, slime/backends/megatron_utils/loss.py); each docstring's first line says
the formula.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from seer.plugins import PluginError, check_arguments, is_path, resolve
from seer.trainer.config import TrainerConfig

if TYPE_CHECKING:
    import torch

    from seer.trainer.losses import PolicyLossTerms
    from seer.types import Sample

EPS = 1e-6  # the std guard of GRPO-style normalisation (verl's and TRL's epsilon)


class AlgorithmError(PluginError):
    """A registry name or path that does not resolve, or arguments its function does not take."""


# ---- advantage estimators -------------------------------------------------------------------
# An estimator takes the batch's groups and returns one advantage per sample, in the same nesting.
# It sees whole groups (and the batch), so group-level baselines and batch-level whitening both fit.

@dataclass(frozen=True)
class Group:
    """What an estimator sees of one group: its samples' (shaped) rewards, and the samples themselves.

    `samples` carries each sample's `branch` (seer.types.Branch): an agent session's gateway makes
    groups of more than G samples, several leaves of one session's call tree. A built-in estimator is
    given one entry per session (``Algorithms.advantages`` spreads its advantage over the leaves); an
    estimator given by path sees every leaf and reads `samples[i].branch` to choose for itself.
    """

    rewards: tuple[float, ...]
    samples: tuple[Sample, ...] = ()  # empty where a caller has rewards only (tests, benchmarks)


def _all_equal(r: Sequence[float]) -> bool:
    return len(r) < 2 or max(r) == min(r)


def grpo(groups: Sequence[Group], *, eps: float = EPS) -> list[list[float]]:
    """GRPO: A_i = (r_i - mean_g r) / (std_g r + eps), std unbiased; all-equal or one-sample groups get 0."""
    out = []
    for g in groups:
        r = g.rewards
        if _all_equal(r):
            out.append([0.0] * len(r))
            continue
        mean = math.fsum(r) / len(r)
        std = math.sqrt(math.fsum((x - mean) ** 2 for x in r) / (len(r) - 1))
        out.append([(x - mean) / (std + eps) for x in r])
    return out


def dr_grpo(groups: Sequence[Group]) -> list[list[float]]:
    """Dr. GRPO: A_i = r_i - mean_g r (no std division: no difficulty bias; arXiv 2503.20783)."""
    return [[0.0] * len(g.rewards) if _all_equal(g.rewards) else
            [x - math.fsum(g.rewards) / len(g.rewards) for x in g.rewards] for g in groups]


def rloo(groups: Sequence[Group]) -> list[list[float]]:
    """RLOO: A_i = r_i - mean_{j != i} r_j = G/(G-1) (r_i - mean_g r); a one-sample group gets 0."""
    out = []
    for g in groups:
        r, n = g.rewards, len(g.rewards)
        if _all_equal(r):
            out.append([0.0] * n)
            continue
        total = math.fsum(r)
        out.append([x - (total - x) / (n - 1) for x in r])
    return out


def reinforce_pp_baseline(groups: Sequence[Group], *, eps: float = EPS) -> list[list[float]]:
    """REINFORCE++ (group baseline): a_i = r_i - mean_g r, then whitened over the batch: (a - mean_B a) / (std_B a + eps).

    verl whitens over tokens (each sample's a_i counted once per response token, masked_whiten);
    here over samples, as the outcome reward is one number per sample. std_B is unbiased.
    """
    centred = dr_grpo(groups)
    flat = [a for g in centred for a in g]
    if len(flat) < 2:
        return [[0.0] * len(g) for g in centred]
    mean = math.fsum(flat) / len(flat)
    std = math.sqrt(math.fsum((a - mean) ** 2 for a in flat) / (len(flat) - 1))
    return [[(a - mean) / (std + eps) for a in g] for g in centred]


ADVANTAGE_ESTIMATORS: dict[str, Callable[..., list[list[float]]]] = {
    "grpo": grpo, "dr_grpo": dr_grpo, "rloo": rloo, "reinforce_pp_baseline": reinforce_pp_baseline,
}


# ---- policy losses --------------------------------------------------------------------------
# fn(logprobs, old_logprobs, advantages, mask, *, clip_eps_low, clip_eps_high, **args) -> PolicyLossTerms
# (per-token loss to minimise, whether the clip was active, the ratio); the trainer aggregates.

DUAL_CLIP_C = 3.0  # dual-clip PPO's lower bound on -A r for A < 0 (Ye et al. 2020; verl's clip_ratio_c)
DAPO_CLIP_EPS_HIGH = 0.28  # DAPO's clip-higher upper bound, when trainer.clip_eps_high is not set


def ppo_clip(logprobs, old_logprobs, advantages, mask, *, clip_eps_low: float, clip_eps_high: float | None,
             clip_c: float | None = None) -> PolicyLossTerms:
    """PPO-clip: max(-A r, -A clip(r, 1-eps_low, 1+eps_high)), r = exp(logp - logp_old); dual-clip: min(that, -A c) where A < 0."""
    from seer.trainer.losses import PolicyLossTerms, ppo_clip_terms

    terms = ppo_clip_terms(logprobs, old_logprobs, advantages, clip_eps_low, clip_eps_high)
    if clip_c is None:
        return terms
    import torch

    if clip_c <= 1.0:
        raise ValueError(f"dual-clip's clip_c must be > 1, got {clip_c}")
    bounded = torch.minimum(terms.loss, -advantages * clip_c)
    loss = torch.where(advantages < 0, bounded, terms.loss)
    clipped = torch.where((advantages < 0) & (bounded < terms.loss), torch.ones_like(loss), terms.clipped)
    return PolicyLossTerms(loss=loss, clipped=clipped, ratio=terms.ratio)


def clip_higher(logprobs, old_logprobs, advantages, mask, *, clip_eps_low: float,
                clip_eps_high: float | None) -> PolicyLossTerms:
    """DAPO clip-higher: PPO-clip with eps_high > eps_low (trainer.clip_eps_high, else 0.28) so rare tokens can grow."""
    high = DAPO_CLIP_EPS_HIGH if clip_eps_high is None else clip_eps_high
    return ppo_clip(logprobs, old_logprobs, advantages, mask, clip_eps_low=clip_eps_low, clip_eps_high=high)


def dual_clip(logprobs, old_logprobs, advantages, mask, *, clip_eps_low: float, clip_eps_high: float | None,
              clip_c: float = DUAL_CLIP_C) -> PolicyLossTerms:
    """Dual-clip PPO: for A < 0, min(max(-A r, -A clip(r)), -A c) bounds the loss of a huge ratio (c = 3)."""
    return ppo_clip(logprobs, old_logprobs, advantages, mask, clip_eps_low=clip_eps_low,
                    clip_eps_high=clip_eps_high, clip_c=clip_c)


def gspo(logprobs, old_logprobs, advantages, mask, *, clip_eps_low: float, clip_eps_high: float | None) -> PolicyLossTerms:
    """GSPO: s = exp(mean_t(logp - logp_old)) per sequence, token ratio sg(s) * p/sg(p); max(-A s, -A clip(s, 1-eps_low, 1+eps_high)).

    The sequence ratio is the geometric mean of the token ratios over the sequence's trained tokens
    (arXiv 2507.18071; verl's compute_policy_loss_gspo). The paper aggregates seq-mean-token-mean
    (`trainer.loss_agg`), and its clip range is far narrower than PPO's (3e-4 / 4e-4).
    """
    import torch

    from seer.trainer.losses import PolicyLossTerms

    high = clip_eps_low if clip_eps_high is None else clip_eps_high
    m = mask.to(logprobs.dtype)
    log_s = ((logprobs - old_logprobs) * m).sum(-1, keepdim=True) / m.sum(-1, keepdim=True).clamp_min(1.0)
    log_ratio = (logprobs - logprobs.detach() + log_s.detach()).clamp(max=10.0)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_eps_low, 1.0 + high)
    return PolicyLossTerms(loss=torch.maximum(unclipped, clipped), clipped=(clipped > unclipped).to(logprobs.dtype),
                           ratio=ratio)


def cispo(logprobs, old_logprobs, advantages, mask, *, clip_eps_low: float, clip_eps_high: float | None) -> PolicyLossTerms:
    """CISPO: -sg(clip(r, 1-eps_low, 1+eps_high)) A log p: the clip truncates the weight, every token keeps its gradient.

    MiniMax-M1 (arXiv 2506.13585) bounds only the top (eps_low large); verl and slime clip both sides.
    """
    import torch

    from seer.trainer.losses import PolicyLossTerms

    high = clip_eps_low if clip_eps_high is None else clip_eps_high
    ratio = torch.exp((logprobs - old_logprobs).clamp(-20.0, 20.0))
    weight = torch.clamp(ratio, 1.0 - clip_eps_low, 1.0 + high).detach()
    return PolicyLossTerms(loss=-weight * advantages * logprobs, clipped=(weight != ratio.detach()).to(logprobs.dtype),
                           ratio=ratio)


POLICY_LOSSES: dict[str, Callable[..., PolicyLossTerms]] = {
    "ppo_clip": ppo_clip, "clip_higher": clip_higher, "dual_clip": dual_clip, "gspo": gspo, "cispo": cispo,
}


# ---- train-inference corrections ------------------------------------------------------------
# fn(old_logprobs, rollout_logprobs, mask, **args) -> per-token weights [B, T], detached: the
# policy loss is multiplied by them. 0 rejects a token (it still counts in the aggregation's
# denominator, like a zero advantage, so DP's global normalisers stay exact). `mask` is 1 where a
# trained token has a rollout log-prob; elsewhere a weight is 1.

def _log_rho(old_logprobs, rollout_logprobs, mask):
    return ((old_logprobs - rollout_logprobs) * mask).clamp(-20.0, 20.0)


def token_tis(old_logprobs, rollout_logprobs, mask, *, cap: float = 2.0):
    """Token TIS: w_t = min(pi_old / pi_rollout, C) per token (verl rollout_is=token, slime's TIS; C = 2)."""
    import torch

    return torch.clamp(torch.exp(_log_rho(old_logprobs, rollout_logprobs, mask)), max=cap).detach()


def seq_tis(old_logprobs, rollout_logprobs, mask, *, cap: float = 2.0):
    """Sequence TIS: w = min(prod_t pi_old / pi_rollout, C) for every token of the sequence (verl rollout_is=sequence)."""
    import torch

    log_w = _log_rho(old_logprobs, rollout_logprobs, mask).sum(-1, keepdim=True)
    return torch.clamp(torch.exp(log_w.clamp(max=20.0)), max=cap).expand_as(old_logprobs).detach()


def token_mask(old_logprobs, rollout_logprobs, mask, *, low: float = 0.5, high: float = 2.0):
    """Token masking (MIS / ICEPOP-style): w_t = 1 if low <= pi_old / pi_rollout <= high, else 0."""
    rho = _log_rho(old_logprobs, rollout_logprobs, mask).exp()
    return ((rho >= low) & (rho <= high)).to(old_logprobs.dtype).detach()


def seq_mask(old_logprobs, rollout_logprobs, mask, *, low: float = 0.5, high: float = 2.0):
    """Sequence masking: every token of a sequence gets 0 if its geometric-mean ratio exp(mean_t log rho_t) leaves [low, high] (verl seq_mean_k1)."""
    m = mask.to(old_logprobs.dtype)
    geo = (_log_rho(old_logprobs, rollout_logprobs, m).sum(-1, keepdim=True) / m.sum(-1, keepdim=True).clamp_min(1.0)).exp()
    return ((geo >= low) & (geo <= high)).to(old_logprobs.dtype).expand_as(old_logprobs).detach()


ROLLOUT_CORRECTIONS: dict[str, Callable | None] = {
    "none": None, "token_tis": token_tis, "seq_tis": seq_tis, "token_mask": token_mask, "seq_mask": seq_mask,
}


# ---- reward shaping -------------------------------------------------------------------------
# fn(rewards, lengths, *, max_tokens, **args) -> shaped rewards (one per sample; lengths in tokens).

def overlong(rewards: Sequence[float], lengths: Sequence[int], *, max_tokens: int, buffer_tokens: int | None = None,
             penalty: float = 1.0) -> list[float]:
    """DAPO overlong shaping: r + max(-penalty, min(0, -(L - (L_max - B)) / B * penalty)); B = buffer_tokens (default L_max / 5, DAPO's 4096 of 20480).

    A length past L_max gets DAPO's full -penalty, never more (config load refuses shaping for agent
    tasks, whose samples' lengths are not bounded by L_max)."""
    buf = max(1, max_tokens // 5) if buffer_tokens is None else buffer_tokens
    if not 0 < buf <= max_tokens:
        raise ValueError(f"overlong shaping's buffer_tokens must be in (0, {max_tokens}], got {buf}")
    expected = max_tokens - buf
    return [r + max(-penalty, min(0.0, -(n - expected) / buf * penalty)) for r, n in zip(rewards, lengths, strict=True)]


REWARD_SHAPINGS: dict[str, Callable | None] = {"none": None, "overlong": overlong}


# ---- resolution -----------------------------------------------------------------------------

# What the trainer always passes each kind (a plug-in must take these keywords).
_GIVEN = {
    "advantage_estimator": {"groups": ()},
    "policy_loss": {k: None for k in ("logprobs", "old_logprobs", "advantages", "mask", "clip_eps_low", "clip_eps_high")},
    "rollout_correction": {"old_logprobs": None, "rollout_logprobs": None, "mask": None},
    "reward_shaping": {"rewards": (), "lengths": (), "max_tokens": 0},
}
_TABLES = {"advantage_estimator": ADVANTAGE_ESTIMATORS, "policy_loss": POLICY_LOSSES,
           "rollout_correction": ROLLOUT_CORRECTIONS, "reward_shaping": REWARD_SHAPINGS}


def lookup(kind: str, name: str, args: Mapping[str, Any] | None = None) -> Callable | None:
    """The function `trainer.<kind>` names (a registry name or `module:function`), checked to take
    `trainer.<kind>_args`; None for a `none` entry. AlgorithmError names the key."""
    table, key = _TABLES[kind], f"trainer.{kind}"
    if is_path(name):
        fn = resolve(name, key=key, error=AlgorithmError)
    elif name in table:
        fn = table[name]
    else:
        raise AlgorithmError(f"{key} {name!r} is not one of {', '.join(table)} (or a 'package.module:function' path)")
    args = dict(args or {})
    if fn is None:
        if args:
            raise AlgorithmError(f"trainer.{kind}_args given, but {key} is {name!r}")
        return None
    try:
        check_arguments(fn, args, key=f"trainer.{kind}_args", given=_GIVEN[kind], fn_key=key)
    except PluginError as e:
        raise AlgorithmError(str(e)) from None
    return functools.partial(fn, **args) if args else fn


def estimator_name(cfg: TrainerConfig) -> str:
    """`trainer.advantage_estimator`, with the old key: `normalize_adv_std: false` turns grpo into dr_grpo."""
    if cfg.normalize_adv_std:
        return cfg.advantage_estimator
    if cfg.advantage_estimator in ("grpo", "dr_grpo"):
        return "dr_grpo"
    raise AlgorithmError(f"trainer.normalize_adv_std: false is the old name of advantage_estimator dr_grpo; it "
                         f"does not apply to {cfg.advantage_estimator!r} (drop it)")


@dataclass(frozen=True)
class Algorithms:
    """The run's choices, resolved once (config load checks them; each trainer rank resolves them)."""

    estimator: Callable[..., list[list[float]]]
    policy_loss: Callable[..., PolicyLossTerms]
    correction: Callable | None = None
    shaping: Callable | None = None
    max_tokens: int | None = None  # overlong shaping's L_max (rollout.max_tokens)
    names: dict[str, str] = field(default_factory=dict)
    per_session: bool = True  # built-in estimators count a gateway session once (see advantages)

    @classmethod
    def from_config(cls, cfg: TrainerConfig) -> Algorithms:
        shaping = lookup("reward_shaping", cfg.reward_shaping, cfg.reward_shaping_args)
        if shaping is not None and not cfg.max_response_tokens:
            raise AlgorithmError("trainer.reward_shaping needs trainer.max_response_tokens (seer-run sets it from "
                                 "rollout.max_tokens)")
        if cfg.rollout_correction != "none" and cfg.old_logprobs == "rollout":
            raise AlgorithmError("trainer.rollout_correction corrects pi_old / pi_rollout; with old_logprobs: rollout "
                                 "that ratio is 1 (the PPO ratio already is pi / pi_rollout): use one or the other")
        est = estimator_name(cfg)
        return cls(
            estimator=lookup("advantage_estimator", est, cfg.advantage_args),
            policy_loss=lookup("policy_loss", cfg.policy_loss, cfg.policy_loss_args),
            correction=lookup("rollout_correction", cfg.rollout_correction, cfg.rollout_correction_args),
            shaping=shaping,
            max_tokens=cfg.max_response_tokens,
            per_session=not is_path(est),
            names={"advantage_estimator": est, "policy_loss": cfg.policy_loss,
                   "rollout_correction": cfg.rollout_correction, "reward_shaping": cfg.reward_shaping},
        )

    def advantages(self, groups: Sequence[Sequence[Sample]]) -> list[list[float]]:
        """One advantage per sample of each group (a missing reward counts as 0), shaping first."""
        views, leaves = [], []
        for samples in groups:
            rewards = [0.0 if s.reward is None else float(s.reward) for s in samples]
            if self.shaping is not None:
                rewards = self.shaping(rewards, [len(s.response_ids) for s in samples], max_tokens=self.max_tokens)
            # Gateway sessions (docs/agents-gateway.md, "Branches"): for a built-in estimator a group is
            # its G sessions however many leaves each left, so it sees one entry per session (its
            # first leaf) and every leaf takes its session's advantage: a session that branched often
            # neither moves the baseline nor gains weight. An estimator given by path sees every leaf
            # with its `branch` and chooses for itself.
            first: dict[str, int] = {}
            owner = [first.setdefault(s.branch.session if s.branch is not None and self.per_session
                                      else f"{i}", i) for i, s in enumerate(samples)]
            reps = sorted(set(owner))
            leaves.append([reps.index(o) for o in owner])
            views.append(Group(tuple(rewards[i] for i in reps), tuple(samples[i] for i in reps)))
        per_entry = self.estimator(views)
        if [len(a) for a in per_entry] != [len(v.rewards) for v in views]:
            raise ValueError(f"advantage estimator {self.names.get('advantage_estimator')!r} returned "
                             f"{[len(a) for a in per_entry]} advantages for groups of {[len(v.rewards) for v in views]}")
        return [[adv[j] for j in idx] for adv, idx in zip(per_entry, leaves)]

    def loss(self, logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
             cfg: TrainerConfig) -> PolicyLossTerms:
        return self.policy_loss(logprobs, old_logprobs, advantages, mask, clip_eps_low=cfg.clip_eps_low,
                                clip_eps_high=cfg.clip_eps_high)

    def correction_weights(self, old_logprobs, rollout_logprobs, mask) -> torch.Tensor | None:
        """Per-token weights (None with rollout_correction none); 1 where `mask` is 0."""
        if self.correction is None:
            return None
        m = mask.to(old_logprobs.dtype)
        w = self.correction(old_logprobs, rollout_logprobs, m)
        return w * m + (1.0 - m)


def check_config(cfg: TrainerConfig, max_tokens: int) -> None:
    """Config-load check of every `trainer.*` algorithm key (names, paths, arguments) with the run's
    rollout.max_tokens; imports no torch."""
    import dataclasses

    Algorithms.from_config(dataclasses.replace(cfg, max_response_tokens=max_tokens))
