"""Multi-turn samples: tokens the environment wrote into a response are not trained on."""

from __future__ import annotations

import pytest

from seer.trainer.batching import TrainSequence, collate


def test_loss_mask_zeroes_environment_tokens_and_all_ones_is_the_default():
    plain = TrainSequence(prompt_ids=[1, 2], response_ids=[5, 6, 7, 8], advantage=1.0)
    turns = TrainSequence(prompt_ids=[1, 2], response_ids=[5, 6, 7, 8], advantage=1.0, loss_mask=[1, 0, 0, 1])
    mb = collate([plain, turns], [0, 1])
    # response token k sits at position p+k and is predicted from position p+k-1 (p = 2)
    assert mb.mask[0, 1:5].tolist() == [1.0, 1.0, 1.0, 1.0]
    assert mb.mask[1, 1:5].tolist() == [1.0, 0.0, 0.0, 1.0]
    assert mb.mask[:, 0].tolist() == [0.0, 0.0]  # the prompt is never a target
    assert mb.num_tokens == 6


def test_a_loss_mask_of_the_wrong_length_is_an_error():
    bad = TrainSequence(prompt_ids=[1], response_ids=[5, 6], loss_mask=[1])
    with pytest.raises(ValueError, match="loss_mask has 1 entries for 2 response tokens"):
        collate([bad], [0])
