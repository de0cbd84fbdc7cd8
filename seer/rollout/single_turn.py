"""The default rollout function: single-turn divided rollout over the fleet.

It joins the scheduler's driver (divided rollout and the configured policy), the asynchronous
reward runner and the iteration's statistics into a typed RolloutBatch. The contract it
implements (RolloutRequest, RolloutContext, RolloutFunction) is seer.rollout.base's; with
`RolloutRequest.dynamic` (rollout.dynamic_sampling) it runs seer.rollout.dynamic's rounds.
"""

from __future__ import annotations

import time

from seer.rollout.base import RolloutContext, RolloutRequest, driver_args, dropped_instances
from seer.rollout.dynamic import run_rounds
from seer.rollout.stats import stats_from_result
from seer.scheduler import RolloutDriver
from seer.types import RolloutBatch


async def single_turn_rollout(ctx: RolloutContext, req: RolloutRequest) -> RolloutBatch:
    """Every sample of `req.prompts`, rewarded, with the iteration's stats. Returns once the last
    reward is in. Instances the driver had to drop are in `RolloutBatch.dropped`."""
    driver = RolloutDriver(list(ctx.backends), ctx.scheduler)

    async def run_round(prompts, round_index: int, stop_when):
        result = await driver.run(prompts, **driver_args(ctx, req, round_index), on_sample_finished=ctx.rewards.submit,
                                  stop_when=stop_when)
        await ctx.rewards.wait_all()
        return result

    result, samples, counts = await run_rounds(req, run_round)
    names = [b.name for b in ctx.backends]
    phases = [("generate", result.start_time, result.end_time), ("reward tail", result.end_time, time.monotonic())]
    stats = stats_from_result(result, req.iteration, names)
    stats.extra.update(counts)
    return RolloutBatch(samples=samples, stats=stats, chunks=result.chunks, telemetry=result.telemetry, phases=phases,
                        dropped=dropped_instances(result))
