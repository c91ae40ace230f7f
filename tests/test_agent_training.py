"""Training your own agent, unchanged, on ToolUseGame (slow: a few GRPO steps each).

Three agents, each written the way its framework's documentation writes one and given the
environment's tools as the framework's own tools: the official ``openai`` client with its own
tool loop, the OpenAI Agents SDK (its chat-completions model) and a LangGraph ReAct agent on
``ChatOpenAI``. Each trains two steps of ``train_multi_turn(agent=...)`` on the tiny model, and
every trained sample equals, token for token, what the engine sampled for the agent's calls.
"""

from __future__ import annotations

import json
import warnings
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")

from llm_gym.core.task import Task  # noqa: E402
from llm_gym.envs.tool_use_game import ToolUseGameEnv, get_tasks  # noqa: E402
from tests.conftest import StopAfter  # noqa: E402

pytestmark = pytest.mark.slow

MAX_TOKENS = 192
"""Tokens per reply the agents ask for. A trained model's lookup call is about 32; the untrained
model's forced calls write arguments of random length, and at 48 tokens most of them are cut
before the call closes (a cut forced reply without a whole call ends as text), so a run could
hold no tool call at all. At 192 most calls close."""


async def openai_client_agent(base_url: str, task: Task) -> str:
    """The official client and a hand-written tool loop; the first reply must call a tool."""
    env = ToolUseGameEnv()
    messages: list[dict[str, Any]] = await env.reset(task)
    client = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0)
    for turn in range(3):
        reply = await client.chat.completions.create(
            model="my-agent-model",
            messages=messages,
            tools=env.tool_specs,
            tool_choice="required" if turn == 0 else "auto",
            max_tokens=MAX_TOKENS,
        )
        message = reply.choices[0].message
        if not message.tool_calls:
            return message.content or ""
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            content, _ = await env.call_tool(call.function.name, call.function.arguments)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": content})
    return ""


async def agents_sdk_agent(base_url: str, task: Task) -> str:
    """An ``agents.Agent`` whose tools are ``FunctionTool`` s over the env's tools."""
    import agents

    env = ToolUseGameEnv()
    system, user = await env.reset(task)

    def invoke(name: str) -> Any:
        async def on_invoke(context: Any, arguments: str) -> str:
            content, _ = await env.call_tool(name, arguments)
            return content

        return on_invoke

    tools = [
        agents.FunctionTool(
            name=spec["function"]["name"],
            description=spec["function"]["description"],
            params_json_schema=spec["function"]["parameters"],
            on_invoke_tool=invoke(spec["function"]["name"]),
            strict_json_schema=False,
        )
        for spec in env.tool_specs
    ]
    client = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0)
    agent = agents.Agent(
        name="player",
        instructions=system["content"],
        model=agents.OpenAIChatCompletionsModel(model="my-agent-model", openai_client=client),
        tools=tools,
        model_settings=agents.ModelSettings(max_tokens=MAX_TOKENS, tool_choice="required"),
    )
    result = await agents.Runner.run(
        agent,
        user["content"],
        max_turns=3,
        run_config=agents.RunConfig(tracing_disabled=True),
    )
    return str(result.final_output)


async def langgraph_agent(base_url: str, task: Task) -> str:
    """``create_react_agent`` on ``ChatOpenAI``, the env's tools as ``StructuredTool`` s: the
    model must call one (``tool_choice="any"``), whose result is the answer (``return_direct``)."""
    from langchain_core.tools import StructuredTool
    from langchain_openai import ChatOpenAI

    with warnings.catch_warnings():  # langgraph 1 points at langchain.agents.create_agent
        warnings.simplefilter("ignore", DeprecationWarning)
        from langgraph.prebuilt import create_react_agent

    env = ToolUseGameEnv()
    system, user = await env.reset(task)

    def tool(spec: dict[str, Any]) -> Any:
        name = spec["function"]["name"]

        async def run(**arguments: Any) -> str:
            content, _ = await env.call_tool(name, json.dumps(arguments))
            return content

        return StructuredTool.from_function(
            coroutine=run,
            name=name,
            description=spec["function"]["description"],
            args_schema=spec["function"]["parameters"],
            return_direct=True,
        )

    model = ChatOpenAI(
        model="my-agent-model", base_url=base_url, api_key="unused", max_tokens=MAX_TOKENS,
        max_retries=0,
    )  # fmt: skip
    tools = [tool(s) for s in env.tool_specs]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        graph = create_react_agent(
            model.bind_tools(tools, tool_choice="any"), tools, prompt=system["content"]
        )
    state = await graph.ainvoke({"messages": [("user", user["content"])]}, {"recursion_limit": 6})
    return str(state["messages"][-1].content)


AGENTS = {
    "openai_client": (openai_client_agent, "openai"),
    "openai_agents": (agents_sdk_agent, "agents"),
    "langgraph": (langgraph_agent, "langgraph"),
}


@pytest.mark.parametrize("name", list(AGENTS))
def test_an_agent_trains_and_its_samples_are_what_the_engine_sampled(
    name, small_model_dir, tmp_path, monkeypatch
) -> None:
    agent, module = AGENTS[name]
    pytest.importorskip(module)
    if name == "langgraph":
        pytest.importorskip("langchain_openai")
    import llm_gym.serving.engine as engine_module
    import trainers.grpo.agent_rollouts as agent_rollouts
    from trainers import GRPOConfig, train_multi_turn

    sampled: list[list[int]] = []  # every generation's tokens, as the engine sampled them
    real = engine_module.sample_tokens

    def spy(model, prompt_ids, sampling, *, on_token, **kw) -> None:
        tokens: list[int] = []
        sampled.append(tokens)

        def seen(token: Any) -> bool:
            tokens.append(token.token_id)
            return on_token(token)

        real(model, prompt_ids, sampling, on_token=seen, **kw)

    monkeypatch.setattr(engine_module, "sample_tokens", spy)
    collected: list[Any] = []
    original = agent_rollouts.AgentCollector._collect

    def keep(self, *args: Any) -> Any:
        groups = original(self, *args)
        collected.extend(e for g in groups for e in g)
        return groups

    monkeypatch.setattr(agent_rollouts.AgentCollector, "_collect", keep)
    config = GRPOConfig(
        output_dir=str(tmp_path / "run"), model=str(small_model_dir), batch_size=2,
        episodes_per_task=2, num_steps=2, max_turns=3, max_model_length=1024,
        max_tokens_per_turn=MAX_TOKENS, learning_rate=1e-3, use_cpu=True, save_strategy="no",
        logging_steps=1, report_to="none", wandb_project=None, agent_timeout_s=120,
    )  # fmt: skip
    trainer = train_multi_turn(
        config, tasks=list(get_tasks("train"))[:4], env_factory=ToolUseGameEnv, agent=agent,
        callbacks=[StopAfter(2)],
    )  # fmt: skip
    assert trainer.state.global_step == 2
    assert [r["reward"] for r in trainer.state.log_history if "reward" in r]
    assert len(collected) == 8
    calls = [turn for episode in collected for turn in episode.turns]
    assert calls, [e.error for e in collected]
    generations = [tuple(ids) for ids in sampled]
    for episode in collected:
        trained = [
            token
            for sample in episode.samples
            for token, mask in zip(sample.completion_ids, sample.env_mask, strict=True)
            if mask
        ]
        assert trained == [t for turn in episode.turns for t in turn.token_ids]
        for turn in episode.turns:  # each call's ids: one generation's, as sampled
            ids = tuple(turn.token_ids)
            assert any(g[: len(ids)] == ids for g in generations)
    assert any(turn.tool_calls for turn in calls), [  # the agents' own tool loops ran
        (turn.finish_reason, turn.text) for turn in calls
    ]
