"""The training endpoint (:mod:`llm_gym.serving.recording`) and agent episodes
(:mod:`llm_gym.serving.agent_episodes`), with a scripted sampler on the tiny model: what the
model continued from and sampled is recorded per episode, continuations reuse their ids token
for token, and whatever an agent does ends as an episode outcome."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from llm_gym.core.env import TruncationCause  # noqa: E402
from llm_gym.core.task import Task  # noqa: E402
from llm_gym.envs.tool_use_game import ToolUseGameEnv, get_tasks  # noqa: E402
from llm_gym.serving.agent_episodes import AgentLoop, AgentRun, run_agent_groups  # noqa: E402
from llm_gym.serving.generation import TokenOut  # noqa: E402
from llm_gym.serving.openai_server import ChatCompletionServer  # noqa: E402

CALL = '<tool_call>\n{"name": "lookup", "arguments": {"key": "Velmora.population"}}\n</tool_call>'
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look up a fact.",
            "parameters": {"type": "object", "properties": {"key": {"type": "string"}}},
        },
    }
]


def logprob_of(position: int) -> float:
    """The scripted sampler's logprob of its ``position``-th token (each one distinct)."""
    return -0.01 * (position + 1)


@pytest.fixture
def replies(monkeypatch: pytest.MonkeyPatch, small_model) -> list[str]:
    """The texts the model "writes", one per generation in order (the last one repeats)."""
    tokenizer = small_model[1]
    texts: list[str] = []

    def fake(model, prompt_ids, sampling, *, eos_ids, pad_id, on_token) -> None:
        text = texts.pop(0) if len(texts) > 1 else texts[0]
        ids = [*tokenizer.encode(text, add_special_tokens=False), eos_ids[0]]
        for position, token_id in enumerate(ids[: sampling.max_tokens]):
            logprob = logprob_of(position) if sampling.logprobs is not None else None
            if on_token(TokenOut(token_id, logprob)):
                return

    monkeypatch.setattr("llm_gym.serving.engine.sample_tokens", fake)
    return texts


def server_for(small_model, **record: Any) -> ChatCompletionServer:
    model, tokenizer = small_model
    return ChatCompletionServer(model, tokenizer, model_name="tiny", record=record or True)


@pytest.fixture
def served(small_model, replies) -> Iterator[ChatCompletionServer]:
    with server_for(small_model) as server:
        yield server


def client(server: ChatCompletionServer, episode: str | None = None, **kw: Any) -> Any:
    url = server.url if episode is None else server.url.replace("/v1", f"/episodes/{episode}/v1")
    return openai.OpenAI(base_url=url, api_key=kw.pop("api_key", "x"), max_retries=0, **kw)


def chat(api: Any, messages: list[dict[str, Any]], **kw: Any) -> Any:
    return api.chat.completions.create(model="tiny", messages=messages, max_tokens=40, **kw)


def test_a_continued_conversation_reuses_its_ids_and_trains_what_was_sampled(
    served, replies
) -> None:
    replies[:] = [f"Let me look.\n{CALL}", "12345"]
    api = client(served, "ep-1")
    messages = [{"role": "user", "content": "How many live in Velmora?"}]
    first = chat(api, messages, tools=TOOLS)
    assert first.choices[0].finish_reason == "tool_calls"
    assert first.choices[0].logprobs is None  # recorded, not sent: the client asked for none
    reply = first.choices[0].message.model_dump(exclude_none=True)
    call_id = reply["tool_calls"][0]["id"]
    messages += [reply, {"role": "tool", "tool_call_id": call_id, "content": "4021"}]
    second = chat(api, messages, tools=TOOLS)
    assert second.choices[0].message.content == "12345"

    record = served.recorder.close("ep-1")
    one, two = record.calls
    held = one.prompt_ids + one.completion_ids
    assert two.prompt_ids[: len(held)] == held  # the first call's ids, token for token
    assert one.completion_ids[-1] in served.engine.eos_ids
    assert [len(one.logprobs), len(two.logprobs)] == [
        len(one.completion_ids),
        len(two.completion_ids),
    ]
    assert one.logprobs == [logprob_of(i) for i in range(len(one.completion_ids))]
    (sample,) = record.samples
    assert sample.prompt_ids == one.prompt_ids
    assert sample.prompt_ids + sample.completion_ids == two.prompt_ids + two.completion_ids
    trained = [t for t, m in zip(sample.completion_ids, sample.env_mask, strict=True) if m]
    assert trained == one.completion_ids + two.completion_ids
    sampled_logprobs = [p for p, m in zip(sample.logprobs, sample.env_mask, strict=True) if m]
    assert sampled_logprobs == one.logprobs + two.logprobs
    assert record.tool_specs == TOOLS
    assert record.messages[-1]["content"] == "12345"


def test_a_rewritten_history_starts_a_new_sample(served, replies) -> None:
    replies[:] = ["first", "second"]
    api = client(served, "ep-2")
    chat(api, [{"role": "user", "content": "one"}])
    # the agent drops the reply and asks something else: not a continuation
    chat(api, [{"role": "user", "content": "another question"}])
    record = served.recorder.close("ep-2")
    assert len(record.samples) == 2
    assert record.samples[1].prompt_ids == record.calls[1].prompt_ids


def test_episode_ids_come_from_the_header_the_body_the_url_or_the_api_key(served, replies) -> None:
    replies[:] = ["ok"]
    question = [{"role": "user", "content": "hi"}]
    chat(client(served, default_headers={"X-Episode-Id": "by-header"}), question)
    chat(client(served), question, extra_body={"episode_id": "by-body"})
    chat(client(served, "by-path"), question)
    chat(client(served, api_key="episode:by-key"), question)
    for name in ("by-header", "by-body", "by-path", "by-key"):
        assert len(served.recorder.close(name).calls) == 1, name


@pytest.mark.parametrize("bad", ["", "x" * 129, "a b", "ép", "../x", 7, None, ["list"]], ids=repr)
def test_a_bad_episode_id_is_a_400_naming_it(served, replies, bad) -> None:
    replies[:] = ["ok"]
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "episode_id": bad}
    answer = httpx.post(f"{served.url}/chat/completions", json=body, timeout=30)
    assert answer.status_code == 400
    assert answer.json()["error"]["param"] == "episode_id"


def test_conversations_without_an_id_are_told_apart_by_their_messages(served, replies) -> None:
    replies[:] = ["alpha", "beta", "gamma"]
    api = client(served)
    opening = [{"role": "user", "content": "same opening"}]
    a = chat(api, opening).choices[0].message.content
    b = chat(api, opening).choices[0].message.content  # a second conversation, same opening
    chat(api, [*opening, {"role": "assistant", "content": b}, {"role": "user", "content": "go"}])
    first = served.recorder.close("conversation-1")
    second = served.recorder.close("conversation-2")
    assert [c.message["content"] for c in first.calls] == [a]
    assert [c.message["content"] for c in second.calls] == [b, "gamma"]


def test_streaming_is_refused_with_the_remedy(served, replies) -> None:
    replies[:] = ["ok"]
    with pytest.raises(openai.BadRequestError, match="stream=false"):
        chat(client(served, "s"), [{"role": "user", "content": "hi"}], stream=True)


def test_open_only_serves_the_opened_episodes_and_their_limits(small_model, replies) -> None:
    replies[:] = ["ok"]
    with server_for(small_model, open_only=True, max_calls=2) as server:
        question = [{"role": "user", "content": "hi"}]
        with pytest.raises(openai.BadRequestError, match="needs an episode id"):
            chat(client(server), question)
        with pytest.raises(openai.BadRequestError, match="no open episode"):
            chat(client(server, "never-opened"), question)
        server.recorder.open("e")
        api = client(server, "e")
        chat(api, question)
        chat(api, question)
        with pytest.raises(openai.BadRequestError, match="turn limit"):
            chat(api, question)
        record = server.recorder.close("e")
        assert record.truncation is TruncationCause.MAX_TURNS and len(record.calls) == 2
        with pytest.raises(openai.BadRequestError, match="no open episode"):
            chat(api, question)  # closed: nothing more is recorded


def test_a_prompt_past_max_model_length_ends_the_episode_as_context_overflow(
    small_model, replies
) -> None:
    replies[:] = ["ok"]
    with server_for(small_model, max_model_length=64) as server:
        api = client(server, "long")
        with pytest.raises(openai.BadRequestError, match="context"):
            chat(api, [{"role": "user", "content": "word " * 200}])
        record = server.recorder.close("long")
        assert record.truncation is TruncationCause.CONTEXT_OVERFLOW
        assert record.overflow_tokens > 64 and not record.calls


# --- agent episodes ---------------------------------------------------------------------------


async def scripted_agent(base_url: str, task: Task) -> Any:
    """Plain httpx: one call, then the behaviour the task's prompt names."""
    body = {"model": "tiny", "messages": [{"role": "user", "content": task.prompt}]}
    async with httpx.AsyncClient(timeout=30) as http:
        answer = await http.post(f"{base_url}/chat/completions", json=body)
        answer.raise_for_status()
    behaviour = task.metadata["behaviour"]
    if behaviour == "raise":
        raise RuntimeError("the agent broke")
    if behaviour == "hang":
        await asyncio.sleep(60)
    if behaviour == "bad":
        return {"not": "a reward"}
    if behaviour == "answer":
        return str(task.target)  # a final answer (a str): the env grades it
    return 0.25


def test_agent_outcomes_become_episode_records(small_model, replies) -> None:
    replies[:] = ["thinking"]
    game = get_tasks("val")[0]
    tasks = [
        Task(game.prompt, target=game.target, metadata={**game.metadata, "behaviour": kind})
        for kind in ("reward", "answer", "raise", "hang", "bad")
    ]
    with server_for(small_model, open_only=True) as server:
        run = AgentRun(scripted_agent, ToolUseGameEnv, server.engine.action_format, timeout_s=3.0)
        base = server.url.removesuffix("/v1")
        start = time.perf_counter()
        groups = asyncio.run(
            run_agent_groups(run, server.recorder, base, tasks, episodes_per_task=2, key="t")
        )
        assert time.perf_counter() - start < 30  # the hung agents were cut at 3 s
    by_kind = {t.metadata["behaviour"]: g for t, g in zip(tasks, groups, strict=True)}
    assert [len(g) for g in groups] == [2] * 5
    reward, answer = by_kind["reward"][0], by_kind["answer"][0]
    assert reward.reward == 0.25 and reward.terminated and reward.num_turns == 1
    assert answer.reward == 1.0 and answer.terminated  # graded by ToolUseGame
    assert len(answer.samples) == 1  # it trains with its episode's reward
    (sample,) = reward.samples
    trained = [t for t, m in zip(sample.completion_ids, sample.env_mask, strict=True) if m]
    assert trained == reward.turns[0].token_ids
    assert by_kind["raise"][0].truncation_cause is TruncationCause.ENV
    assert "the agent broke" in by_kind["raise"][0].error
    assert by_kind["hang"][0].truncation_cause is TruncationCause.DEADLINE
    assert by_kind["bad"][0].truncation_cause is TruncationCause.ENV
    assert "expected a reward" in by_kind["bad"][0].error
    assert {e.reward for e in by_kind["raise"] + by_kind["hang"] + by_kind["bad"]} == {0.0}
    assert not server.recorder._episodes  # every episode was closed
    assert json.dumps(reward.metrics) and reward.metrics["agent_calls"] == 1


def test_a_plain_agent_that_never_returns_and_one_that_ignores_cancel_end_at_the_time_limit(
    small_model, replies
) -> None:
    replies[:] = ["ok"]

    def stuck(base_url: str, task: Task) -> float:  # a plain function: runs in a thread
        time.sleep(30)
        return 1.0

    async def stubborn(base_url: str, task: Task) -> float:
        for _ in range(30):
            try:
                await asyncio.sleep(1)
            except asyncio.CancelledError:
                continue  # ignores its cancellation
        return 1.0

    loop = AgentLoop()
    with server_for(small_model, open_only=True) as server:
        base = server.url.removesuffix("/v1")
        for agent in (stuck, stubborn):
            run = AgentRun(agent, ToolUseGameEnv, server.engine.action_format, timeout_s=1.0)
            start = time.perf_counter()
            (group,) = loop.run(
                run_agent_groups(run, server.recorder, base, [Task("q")], episodes_per_task=1,
                                 key=agent.__name__)
            )  # fmt: skip
            assert time.perf_counter() - start < 10, agent.__name__
            assert group[0].truncation_cause is TruncationCause.DEADLINE
    loop.close()


def test_responses_api_calls_are_recorded_in_their_episode(served, replies) -> None:
    replies[:] = ["a reply"]
    url = served.url.replace("/v1", "/episodes/resp/v1")
    body = {"model": "any-name", "input": "hello", "max_output_tokens": 20}
    answer = httpx.post(f"{url}/responses", json=body, timeout=30)
    assert answer.status_code == 200, answer.text
    (call,) = served.recorder.close("resp").calls
    assert call.message["content"] == "a reply"
    assert call.completion_ids[-1] in served.engine.eos_ids


def test_a_versioned_endpoint_swaps_a_staged_version_in_before_the_next_call(
    small_model, replies
) -> None:
    """An async replica's endpoint: a version staged between two calls is swapped in when the
    next call starts (not before), and each call's tokens record the version that sampled
    them, in the call and in the training sample."""
    import copy

    import torch

    from llm_gym.policies.weights import VersionedWeights

    replies[:] = ["first", "second"]
    model, tokenizer = small_model
    replica = copy.deepcopy(model)
    weights = VersionedWeights(replica, version=3)
    newer = [(name, p.detach() + 1.0) for name, p in replica.named_parameters()]
    with ChatCompletionServer(
        replica, tokenizer, model_name="tiny", record=True, weights=weights
    ) as server:
        assert server.engine.lock is weights.in_use  # a SYNCHRONOUS swap waits for a call
        api = client(server, "ep-v")
        messages = [{"role": "user", "content": "one"}]
        first = chat(api, messages)
        weights.stage(newer, 4)
        name, tensor = newer[0]
        assert not torch.equal(dict(replica.named_parameters())[name], tensor)  # staged only
        messages += [first.choices[0].message.model_dump(exclude_none=True)]
        messages += [{"role": "user", "content": "two"}]
        chat(api, messages)
        record = server.recorder.close("ep-v")
    assert weights.version == 4 and torch.equal(dict(replica.named_parameters())[name], tensor)
    one, two = record.calls
    assert one.policy_versions == [3] * len(one.completion_ids)
    assert two.policy_versions == [4] * len(two.completion_ids)
    (sample,) = record.samples
    trained = [v for v, m in zip(sample.policy_versions, sample.env_mask, strict=True) if m]
    assert trained == one.policy_versions + two.policy_versions


def test_an_unversioned_endpoint_records_no_versions(served, replies) -> None:
    replies[:] = ["ok"]
    chat(client(served, "ep-u"), [{"role": "user", "content": "hi"}])
    (call,) = served.recorder.close("ep-u").calls
    assert call.policy_versions is None
