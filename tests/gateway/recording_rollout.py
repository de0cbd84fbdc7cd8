"""seer-run's gateway rollout, recording what the instances returned and what the trainer gets.

Named by `rollout.function` in tests/kvpool/test_gateway_run.py: it wraps every instance to record each
chunk (its prompt ids, the tokens and log-probs returned), runs the built-in gateway rollout, builds
the trainer's sequences from the batch exactly as the trainer does, and writes all three as JSON
under $SEER_GATEWAY_RECORD for the test to compare.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

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
    from seer.trainer.trainer import Trainer

    chunks: list = []
    batch = await gateway_rollout(replace(ctx, backends=[_Recorded(b, chunks) for b in ctx.backends]), req)
    seqs = Trainer.sequences_from_batch(SimpleNamespace(config=SimpleNamespace(normalize_adv_std=True)), batch)
    out = Path(os.environ["SEER_GATEWAY_RECORD"]) / f"iter_{req.iteration}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "chunks": chunks,
        "samples": [{"request_id": s.request_id, "group_id": s.group_id, "prompt_ids": s.prompt.prompt_ids,
                     "response_ids": s.response_ids, "loss_mask": s.loss_mask, "logprobs": s.logprobs,
                     "session": s.branch.session, "path": list(s.branch.path), "reward": s.reward,
                     "instances": s.instances} for s in batch.samples],
        "train": [{"prompt_ids": t.prompt_ids, "response_ids": t.response_ids, "loss_mask": t.loss_mask,
                   "rollout_logprobs": t.rollout_logprobs, "advantage": t.advantage} for t in seqs],
        "extra": {k: v for k, v in batch.stats.extra.items() if k.startswith(("gateway", "agent", "chunks"))},
    }))
    return batch
