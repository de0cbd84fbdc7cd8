"""save_checkpoint / load_checkpoint restore everything --resume needs."""

from __future__ import annotations

import torch

from seer.trainer import Trainer, TrainerConfig
from seer.trainer.batching import TrainSequence

SEQS = [
    TrainSequence([1, 2, 3], [4, 5, 6], advantage=1.0),
    TrainSequence([1, 2, 3], [7, 8], advantage=-1.0),
]


def test_checkpoint_round_trip_resumes_identically(tiny_qwen2, tmp_path):
    cfg = TrainerConfig(lr=1e-2)
    a = Trainer(tiny_qwen2, cfg)
    a.train_sequences(SEQS)
    a.train_sequences(SEQS)
    a.save_checkpoint(tmp_path / "ckpt")

    b = Trainer(tiny_qwen2, cfg)
    assert b.load_checkpoint(tmp_path / "ckpt") == 2 == b.iteration
    for (name, pa), pb in zip(a.model.named_parameters(), b.model.parameters()):
        assert torch.equal(pa, pb), name
    state_a, state_b = a.optimizer.state_dict()["state"], b.optimizer.state_dict()["state"]
    assert state_a.keys() == state_b.keys() and len(state_a) > 0
    for k in state_a:
        assert torch.equal(state_a[k]["exp_avg_sq"], state_b[k]["exp_avg_sq"])

    # the next step from the restored trainer is the same step (Adam moments included)
    ma, mb = a.train_sequences(SEQS), b.train_sequences(SEQS)
    assert ma.iteration == mb.iteration == 3
    for pa, pb in zip(a.model.parameters(), b.model.parameters()):
        assert torch.allclose(pa, pb, atol=1e-7, rtol=0)

    fresh = Trainer(tiny_qwen2, cfg)  # without the restored moments the step differs
    saved = torch.load(tmp_path / "ckpt" / "trainer_state.pt", weights_only=False)
    fresh.load_state_dict({**saved, "optimizer": {"state": {}, "param_groups": saved["optimizer"]["param_groups"]}})
    fresh.train_sequences(SEQS)
    assert any(not torch.allclose(pf, pa, atol=1e-6) for pf, pa in zip(fresh.model.parameters(), a.model.parameters()))
