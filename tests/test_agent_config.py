"""The trainer's agent fields (:mod:`trainers.grpo.config.agent`) and how an agent is resolved
(:func:`trainers.grpo.agent_rollouts.resolve_agent`): refused before any model loads, with the
field and the remedy named."""

from __future__ import annotations

import pytest

pytest.importorskip("trl")

from llm_gym.errors import InvalidArgumentError
from trainers import GRPOConfig
from trainers.grpo.agent_rollouts import resolve_agent


def config(**fields) -> GRPOConfig:
    return GRPOConfig(
        output_dir="unused", episodes_per_task=2, report_to="none", wandb_project=None,
        use_cpu=True, **fields,
    )  # fmt: skip


async def good_agent(base_url, task):
    return 1.0


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"agent": "no_colon"}, "agent"),
        ({"agent": "a:b:c"}, "agent"),
        ({"agent": ":f"}, "agent"),
        ({"agent": 3}, "agent"),
        ({"agent_timeout_s": 0}, "agent_timeout_s"),
        ({"agent_timeout_s": float("nan")}, "agent_timeout_s"),
        ({"agent_timeout_s": True}, "agent_timeout_s"),
        ({"agent": "m:f", "use_vllm": True}, "use_vllm"),
    ],
    ids=repr,
)
def test_bad_agent_fields_are_refused_naming_the_field(fields, named) -> None:
    with pytest.raises(InvalidArgumentError, match=f"^{named} must be"):
        config(**fields)


def test_an_agent_reference_resolves_under_the_reference_rules() -> None:
    assert resolve_agent(None, config()) is None
    assert resolve_agent(good_agent, config()) is good_agent
    with pytest.raises(InvalidArgumentError, match="trust"):
        resolve_agent(None, config(agent="os:system"))


def test_an_agent_that_cannot_take_base_url_and_task_is_refused() -> None:
    async def one_argument(base_url):
        return 0.0

    with pytest.raises(InvalidArgumentError, match=r"take \(base_url, task\)"):
        resolve_agent(one_argument, config())
    with pytest.raises(InvalidArgumentError, match="callable"):
        resolve_agent("not callable at all", config())


def test_an_agent_with_async_training_is_accepted() -> None:
    assert config(agent="m:f", max_steps_off_policy=1).is_async
    assert resolve_agent(good_agent, config(max_steps_off_policy=1)) is good_agent


def test_a_callable_agent_with_vllm_is_refused() -> None:
    args = config()
    args.use_vllm = True  # the field's own check refuses it with an agent reference
    with pytest.raises(InvalidArgumentError, match="use_vllm False"):
        resolve_agent(good_agent, args)
