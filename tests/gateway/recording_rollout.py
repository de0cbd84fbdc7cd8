"""seer-run's gateway rollout, recording what the instances returned and what the trainer gets.

Named by `rollout.function` in tests/kvpool/test_gateway_run.py: it wraps every instance to record each
chunk (its prompt ids, the tokens and log-probs returned), runs the built-in gateway rollout, and
writes the chunks and the batch's samples as JSON under $SEER_GATEWAY_RECORD; the test rebuilds the
samples and makes the trainer's sequences of them with the trainer's own code.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path
from seer.rollout.gateway import gateway_rollout


class _Recorded:
    def __init__(self, backend, log: list) -> None:
        self._b, self._log, self.name = backend, log, backend.name

    async def generate(self, req):
        res = await self._b.generate(req)
        self._log.append({"prompt": list(req.prompt_ids), "out": list(res.token_ids), "lp": list(res.logprobs),
                          "instance": res.instance})
        return res

    def __getattr__(self, name):
        return getattr(self._b, name)


async def recording_gateway_rollout(ctx, req):
    chunks: list = []
    batch = await gateway_rollout(replace(ctx, backends=[_Recorded(b, chunks) for b in ctx.backends]), req)
    out = Path(os.environ["SEER_GATEWAY_RECORD"]) / f"iter_{req.iteration}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "chunks": chunks,
        "samples": [{"request_id": s.request_id, "group_id": s.group_id, "sample_index": s.sample_index,
                     "prompt_ids": s.prompt.prompt_ids,
                     "response_ids": s.response_ids, "loss_mask": s.loss_mask, "logprobs": s.logprobs,
                     "session": s.branch.session, "path": list(s.branch.path), "reward": s.reward,
                     "instances": s.instances} for s in batch.samples],
        "extra": {k: v for k, v in batch.stats.extra.items() if k.startswith(("gateway", "agent", "chunks"))},
    }))
    return batch
