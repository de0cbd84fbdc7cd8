"""Run-config defaults that depend on what is trained."""

import pytest

from seer.config import EMBEDDED_MODEL_TRAINER, ConfigError, load_config
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


@pytest.mark.parametrize("overrides, key", [
    (["task.loader=tests.plugins_for_tests:sums"], "task.reward"),
    (["task.loader=tests.plugins_for_tests:sums", "task.dataset=README.md", "task.reward=seer.tasks.running_sum:score"],
     "task.loader"),
    (["task.loader_args.n=3"], "task.loader_args"),
    (["task.loader=tests.plugins_for_tests:nothing_here", "task.reward=seer.tasks.running_sum:score"], "task.loader"),
    (["task.loader=tests.plugins_for_tests:sums", "task.loader_args.rows=3", "task.reward=seer.tasks.running_sum:score"],
     "task.loader_args"),
    (["task.chat_template=no/such/template.jinja"], "task.chat_template"),
])
def test_task_plug_points_are_checked_at_load_naming_the_key(overrides, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(overrides=overrides)


def test_a_loader_and_a_chat_template_by_key():
    cfg = load_config(overrides=["task.loader=tests.plugins_for_tests:chats", "task.loader_args.n=5",
                                 "task.reward=tests.plugins_for_tests:reward_by_length",
                                 "task.chat_template={{ messages[0]['content'] }}"])
    assert (cfg.task.loader, cfg.task.loader_args, cfg.task.chat_template) == (
        "tests.plugins_for_tests:chats", {"n": 5}, "{{ messages[0]['content'] }}")


AGENT = "task.agent=tests.gateway.agents_for_tests:calc_agent"


@pytest.mark.parametrize("override, key, words", [
    ("rollout.dynamic_sampling=true", "rollout.dynamic_sampling", "not supported with task.agent"),
    ("trainer.reward_shaping=overlong", "trainer.reward_shaping", "tool results and user turns"),
])
def test_what_agent_tasks_do_not_implement_is_refused_at_load_naming_the_key(override, key, words):
    """Both were accepted and then ignored (dynamic sampling) or measured the wrong tokens (shaping)."""
    with pytest.raises(ConfigError, match=words) as e:
        load_config(overrides=[AGENT, override])
    assert repr(key) in str(e.value)
    load_config(overrides=[override])  # without an agent both stay available
    load_config(overrides=[AGENT])


def test_overlong_shaping_never_penalises_past_dapos_full_penalty():
    from seer.trainer.algorithms import overlong

    assert overlong([1.0, 1.0], [100, 500], max_tokens=100, buffer_tokens=20) == pytest.approx([0.0, 0.0])
