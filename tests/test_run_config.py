"""Run-config defaults that depend on what is trained."""

from seer.config import EMBEDDED_MODEL_TRAINER, load_config
from seer.tasks import TaskConfig
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


def test_partial_section_keeps_the_run_defaults_for_that_section():
    """`--set task.reward=…` must not reset the run's 16-prompt task to TaskConfig's 256 prompts."""
    plain = load_config()
    cfg = load_config(overrides=["task.reward=seer.tasks.running_sum:score", "trainer.lr=0", "scheduler.policy=divided"])
    assert cfg.task.num_prompts == plain.task.num_prompts != TaskConfig.num_prompts
    assert cfg.trainer.mini_batches == EMBEDDED_MODEL_TRAINER["mini_batches"] != TrainerConfig.mini_batches
    assert cfg.trainer.lr == 0
    assert cfg.scheduler.chunk_size == plain.scheduler.chunk_size and cfg.scheduler.policy == "divided"
