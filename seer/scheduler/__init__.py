"""Divided rollout: the request buffer, scheduling policies, and the driver that runs them.

Entry points: `SchedulerConfig` (the `scheduler.*` settings), `RolloutDriver` (async, over
InstanceBackends), `Dispatcher` (the same logic, synchronous, for simulators).
"""

from seer.scheduler.buffer import Group, Request, RequestBuffer, RequestStatus
from seer.scheduler.config import SchedulerConfig
from seer.scheduler.decisions import Decision, Dispatch, Wait
from seer.scheduler.dispatcher import ChunkTicket, Dispatcher, RolloutError
from seer.scheduler.driver import RolloutDriver, RolloutResult
from seer.scheduler.events import ChunkEvent, Progress
from seer.scheduler.placement import InstanceLoad, PlacementConfig
from seer.scheduler.policies import POLICIES, Policy, make_policy, true_lengths_from_samples

__all__ = [
    "POLICIES",
    "ChunkEvent",
    "ChunkTicket",
    "Decision",
    "Dispatch",
    "Dispatcher",
    "Group",
    "InstanceLoad",
    "PlacementConfig",
    "Policy",
    "Progress",
    "Request",
    "RequestBuffer",
    "RequestStatus",
    "RolloutDriver",
    "RolloutError",
    "RolloutResult",
    "SchedulerConfig",
    "Wait",
    "make_policy",
    "true_lengths_from_samples",
]
