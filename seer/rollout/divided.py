"""The old home of the default rollout function, kept as an alias.

Every run directory's saved `config.yaml` before the rollout contract moved to seer.rollout.base
names `rollout.function: seer.rollout.divided:divided_rollout`; those configs (and plug-ins that
imported the contract from here) keep working. New code: seer.rollout.base, .single_turn, .stats.
"""

from seer.rollout.base import RolloutContext, RolloutFunction, RolloutRequest, iteration_sampling
from seer.rollout.single_turn import single_turn_rollout
from seer.rollout.stats import acceptance_length, stats_from_result

divided_rollout = single_turn_rollout

__all__ = ["RolloutContext", "RolloutFunction", "RolloutRequest", "acceptance_length", "divided_rollout",
           "iteration_sampling", "stats_from_result"]
