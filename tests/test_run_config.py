"""Run-config defaults that depend on what is trained."""

from seer.config import EMBEDDED_MODEL_TRAINER, load_config
from seer.trainer.config import TrainerConfig


def test_embedded_model_gets_its_tuned_trainer_settings():
    cfg = load_config()
    assert cfg.model.path is None
    assert (cfg.trainer.lr, cfg.trainer.mini_batches) == (EMBEDDED_MODEL_TRAINER["lr"], EMBEDDED_MODEL_TRAINER["mini_batches"])


def test_user_checkpoint_falls_back_to_llm_defaults_unless_set(tmp_path):
    cfg = load_config(overrides=[f"model.path={tmp_path}"])
    assert (cfg.trainer.lr, cfg.trainer.mini_batches) == (TrainerConfig.lr, TrainerConfig.mini_batches)
    cfg = load_config(overrides=[f"model.path={tmp_path}", "trainer.lr=3e-6"])
    assert cfg.trainer.lr == 3e-6 and cfg.trainer.mini_batches == TrainerConfig.mini_batches
