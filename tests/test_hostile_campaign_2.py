"""The second hostile-input campaign: what got past the first (``test_hostile_campaign.py``).

What broke before the fix, and the fix:

* Model output: a tool call whose arguments nest 900 levels around a ``"\\ud800"`` escape made
  ``parse`` (and ``TextEnv.step``) raise RecursionError: ``clean_json`` recursed. The text
  walkers of ``llm_gym.core.text`` and ``freeze_message`` now use an explicit stack (a cycle is a
  named error).
* Environment output: a message nested 950 deep, or holding itself, raised RecursionError out of
  ``TextEnv.step``; a message without a string ``role`` was a KeyError there; a reset that
  returned text was an AttributeError. Now ``check_messages`` names the reset or step, and the
  episode ends as ENV.
* Scoring: an int target past the float range made every numeric reply an OverflowError (ENV
  truncation); ``10**20`` matched ``10**20 + 1`` at ``rel_tol=0``. Ints are compared exactly.
* The calculator's error for arguments with 100,000 fields was 989,036 characters long.
* ``llm-gym serve``: a 30 MB body of ``[],`` took 2.3 GB and 37 s before its 400 (values are now
  counted in the text first); a tool call's ``arguments`` string holding ``\\ud800`` was a 500
  (it now goes through the body's own rules, and stays text when it breaks one); a 3 MB prompt
  took 9 s to tokenize in the one model thread before the context check refused it (a prefix of
  twice the context's characters is read first).
* ``serve-env``: a 2 MB ``content`` refused by the action model came back whole in the error
  (WebSocket frame and HTTP 422); errors now carry type, loc and msg only.
* ``gym.make(id, max_turn=3)`` was a TypeError that listed nothing allowed; ``tasks=[5]`` was an
  AttributeError at reset.
* Configs: ``grpo: {learning_rate: "x"}``, ``beta: "0.1"``, ``max_turns: true``, a NaN
  ``failed_parse_reward`` and a seed past numpy's range were accepted (they failed in training,
  after the model was built and warm-started), ``per_device_train_batch_size: 0`` was a
  ZeroDivisionError, a ``grpo`` key typo a TypeError after SFT; ``sft: {batch_size: 0}`` and its
  kin were accepted. Fields are now checked against their annotations
  (``trainers.field_types``), the pipeline builds the GRPO config before any model work.

Left by the campaign and fixed in the session after it (the last section):

* An env (not a ``ToolEnv``, whose tool results are capped) replying 10 MB took 17 s of the
  rollout's event loop to tokenize before the context check cut the episode: the token tracker
  now reads a prefix first (``prefix_past_limit``, shared with ``llm-gym serve``), ~0.5 s.
* ``llm-gym serve``: 200,000 one-letter messages took the chat template 4 s to render before the
  context check; more messages and tools than the context has tokens are refused unrendered.
* ``serve-env``: OpenEnv's ``ResetRequest`` reads ``seed`` in pydantic's lax mode (``true`` was
  task 1, ``"12"`` task 12); a reset's seed must now be a JSON integer, over HTTP and WebSocket.
* ``answers_match`` read at most 64 characters as a number, so a 71-digit target never matched
  its own digits; a reply may now take the target's digits and 24 more.

Not ours: ``gym.make(id, render_mode=5)`` is an AttributeError inside gymnasium's ``make``
(``CartPole-v1`` too), before any llm_gym code runs.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import gymnasium as gym
import pytest

import llm_gym  # noqa: F401 - registers the environments
from llm_gym import Env, StepResult, Task, TruncationCause
from llm_gym.actions import get_action_format
from llm_gym.core import answers_match, clean_json, freeze_message
from llm_gym.errors import InvalidArgumentError, ToolArgumentError
from llm_gym.gym.text_env import TextEnv
from llm_gym.policies import Generation, Policy
from llm_gym.rollout import collect_groups

# --- model output: deeply nested tool-call arguments ---------------------------------------------

DEEP_SURROGATE = "[" * 900 + '"\\ud800"' + "]" * 900


@pytest.mark.parametrize("format_name", ["hermes", "json"])
def test_deep_arguments_with_an_escaped_surrogate_parse(format_name: str) -> None:
    body = '{"name": "calculator", "arguments": {"expression": ' + DEEP_SURROGATE + "}}"
    text = f"<tool_call>{body}</tool_call>" if format_name == "hermes" else body
    parsed = get_action_format(format_name).parse(text)  # raised RecursionError
    assert parsed.is_tool_calls or parsed.is_failure
    json.dumps(parsed.message, ensure_ascii=False).encode("utf-8")
    answer = get_action_format("json").parse('{"answer": ' + DEEP_SURROGATE + "}")
    assert answer.is_final and "\ufffd" in answer.message["content"]


def test_clean_json_walks_any_depth_copies_shared_values_and_refuses_cycles() -> None:
    deep = json.loads(DEEP_SURROGATE)
    cleaned = clean_json(deep)
    for _ in range(900):
        cleaned = cleaned[0]
    assert cleaned == "\ufffd"
    shared = ["x\ud800"]
    assert clean_json({"a": shared, "b": (shared,)}) == {"a": ["x\ufffd"], "b": (["x\ufffd"],)}
    ok = ["fine"]
    assert clean_json([ok, ok]) == [ok, ok]  # shared and valid: an equal copy
    cycle: list[Any] = ["\ud800"]
    cycle.append(cycle)
    with pytest.raises(InvalidArgumentError, match="contains itself"):
        clean_json(cycle)
    assert freeze_message({"role": "tool", "content": "x", "deep": json.loads(DEEP_SURROGATE)})


def test_a_deep_surrogate_argument_is_an_episode_outcome() -> None:
    env = gym.make("ToolUseGame-v0")
    try:
        env.reset(seed=0)
        action = '{"name": "lookup", "arguments": {"key": ' + DEEP_SURROGATE + "}}"
        observation, reward, _, _, info = env.step(f"<tool_call>{action}</tool_call>")
        assert "tool_error" in observation or info.get("truncation_cause") == "parse_failure"
        assert math.isfinite(reward)
    finally:
        env.close()


# --- what an environment returns -----------------------------------------------------------------


class Say(Policy):
    async def act(self, requests):
        return [Generation(text="hello") for _ in requests]


def odd_env(opening: Any = None, reply: Any = None) -> type[Env]:
    """An env whose reset returns ``opening`` (when given) and whose step appends ``reply``."""

    class Odd(Env):
        def __init__(self, task: Task | None = None) -> None:
            self._messages: list[Any] = [{"role": "user", "content": "hi"}]

        async def reset(self, task: Task) -> Any:
            return opening if opening is not None else list(self._messages)

        async def step(self, message: Any) -> StepResult:
            self._messages = [*self._messages, message, reply]
            return StepResult(False, False, list(self._messages))

        tool_specs = []  # type: ignore[assignment]

        @property
        def messages(self) -> list:
            return list(self._messages)

    return Odd


def _cycle() -> dict[str, Any]:
    message: dict[str, Any] = {"role": "tool", "content": "x\ud800"}
    message["self"] = message
    return message


BAD_REPLIES = {
    "nested 950 deep": (
        {"role": "tool", "content": "x", "extra": json.loads("[" * 950 + "]" * 950)},
        None,
    ),
    "a cycle": (_cycle(), "contains itself"),
    "no role, two keys": ({"content": "x", "name": "y"}, "a string 'role'"),
    "a numeric role": ({"role": 1, "content": "x"}, "a string 'role'"),
}


@pytest.mark.parametrize("name", list(BAD_REPLIES))
def test_an_odd_env_message_ends_the_episode_or_passes_never_raises(name: str) -> None:
    reply, error = BAD_REPLIES[name]
    text_env = TextEnv(odd_env(reply=reply), tasks=[Task("x")])
    text_env.reset(seed=0)
    _, reward, terminated, truncated, info = text_env.step("hello")  # raised before
    assert reward == 0.0 and not terminated
    assert truncated == (error is not None)
    json.dumps(info["messages"][:2])
    [[episode]] = collect_groups(odd_env(reply=reply), [Task("x")], Say(), max_turns=2)
    if error is not None:
        assert episode.truncation_cause is TruncationCause.ENV and error in episode.error


@pytest.mark.parametrize("opening", ["hello", ["hi"], 5, [{"content": "x"}], {"role": "u"}])
def test_a_reset_that_returns_no_message_list_is_named(opening: Any) -> None:
    with pytest.raises(InvalidArgumentError, match=r"Odd\.reset"):
        TextEnv(odd_env(opening=opening), tasks=[Task("x")]).reset(seed=0)
    [[episode]] = collect_groups(odd_env(opening=opening), [Task("x")], Say(), max_turns=2)
    assert episode.truncation_cause is TruncationCause.ENV and "Odd.reset" in episode.error


# --- scoring: numbers a float cannot hold --------------------------------------------------------


def test_answers_match_compares_big_integers_exactly() -> None:
    assert not answers_match("5", 10**400)  # raised OverflowError
    assert answers_match(str(10**60 + 1), 10**60 + 1, rel_tol=0.0)
    assert not answers_match(str(10**60), 10**60 + 1, rel_tol=0.0)
    assert not answers_match("2.5", -(10**400))
    assert not answers_match(str(10**20), 10**20 + 1, rel_tol=0.0)  # matched before
    assert not answers_match("9007199254740993", 2**53, rel_tol=0.0)
    assert answers_match("1e20", 10**20, rel_tol=0.0)
    assert answers_match("42.0000001", 42.0) and not answers_match("42.0000001", 42)
    assert not answers_match("3", math.nan)


@pytest.mark.parametrize("env_id", ["Math-v0", "ToolUseGame-v0"])
def test_a_huge_target_scores_zero_instead_of_ending_as_env(env_id: str) -> None:
    env = gym.make(env_id)
    try:
        env.reset(options={"task": Task("How many?", target=10**400)})
        _, reward, terminated, truncated, info = env.step("5")
        assert (reward, terminated, truncated) == (0.0, True, False), info
    finally:
        env.close()


# --- tools ---------------------------------------------------------------------------------------


def test_calculator_errors_stay_short() -> None:
    from llm_gym.tools.calculator import CalculatorTool

    tool = CalculatorTool()
    many = json.dumps({f"k{i}": 1 for i in range(100_000)})
    with pytest.raises(ToolArgumentError, match="and 99990 more") as caught:
        asyncio.run(tool.execute(many))
    assert len(str(caught.value)) < 400  # was 989,036 characters
    with pytest.raises(ToolArgumentError, match="must be a string, got null. Call"):
        asyncio.run(tool.execute('{"expression": null}'))


# --- serving: bodies and the JSON inside them ----------------------------------------------------


def test_a_body_of_a_million_empty_lists_is_refused_before_decoding() -> None:
    from llm_gym.serving.body import MAX_JSON_VALUES, decode_json_body
    from llm_gym.serving.protocol import APIError

    raw = b'{"model": "m", "messages": [' + b"[]," * 1_100_000 + b"[]]}"
    start = time.perf_counter()
    with pytest.raises(APIError, match="too many JSON values") as caught:
        decode_json_body(raw)
    assert caught.value.status == 400 and time.perf_counter() - start < 0.5
    ids = b'{"model": "m", "prompt": [' + b"1," * 200_000 + b"1]}"  # a long prompt of ids
    assert len(decode_json_body(ids)["prompt"]) == 200_001 < MAX_JSON_VALUES


@pytest.mark.parametrize(
    "arguments",
    ['{"x": "\\ud800"}', '{"x": NaN}', '{"x": ' + "[" * 900 + "]" * 900 + "}", "not json"],
)
def test_tool_call_arguments_that_break_the_body_rules_stay_text(arguments: str) -> None:
    from llm_gym.serving.chat_protocol import parse_chat_request

    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": arguments}}
    message = {"role": "assistant", "content": "", "tool_calls": [call]}
    request = parse_chat_request({"model": "m", "messages": [message]}, "m")
    assert request.messages[0]["tool_calls"][0]["function"]["arguments"] == arguments
    ok = {**call, "function": {"name": "f", "arguments": '{"x": [1]}'}}
    request = parse_chat_request({"model": "m", "messages": [{**message, "tool_calls": [ok]}]}, "m")
    assert request.messages[0]["tool_calls"][0]["function"]["arguments"] == {"x": [1]}


# --- serve-env: refused input is not echoed ------------------------------------------------------


@pytest.fixture(scope="module")
def env_server() -> Any:
    pytest.importorskip("openenv")
    from llm_gym.integrations.openenv_server import serve_env

    with serve_env("ToolUseGame-v0", port=0, max_sessions=2) as running:
        yield running


def test_serve_env_validation_errors_do_not_echo_the_input(env_server: Any) -> None:
    import httpx
    from websockets.asyncio.client import connect

    huge = "x" * 2_000_000
    step = {"type": "step", "data": {"message": {"content": huge}}}

    async def over_ws(url: str) -> list[str]:
        async with connect(url.replace("http://", "ws://") + "/ws", max_size=None) as ws:
            answers = []
            for frame in ({"type": "reset", "data": {"seed": 0}}, step):
                await ws.send(json.dumps(frame))
                answers.append(await asyncio.wait_for(ws.recv(), 10))
            return answers

    _, refused = asyncio.run(over_ws(env_server.url))
    assert len(refused) < 600 and "string_too_long" in refused
    for path, body in (("/step", {"action": {"message": {"content": huge}}}),
                       ("/reset", {"episode_id": "e" * 100_000})):  # fmt: skip
        answer = httpx.post(env_server.url + path, json=body, timeout=10)
        assert answer.status_code == 422 and len(answer.text) < 600, answer.text[:200]
        assert answer.json()["detail"][0]["type"] == "string_too_long"


# --- gym.make arguments --------------------------------------------------------------------------


def test_gym_make_names_an_unknown_argument_and_what_is_taken() -> None:
    with pytest.raises(InvalidArgumentError, match="Did you mean 'max_turns'") as caught:
        gym.make("ToolUseGame-v0", max_turn=3)
    assert "env_kwargs" in str(caught.value) and "'split'" in str(caught.value)
    with pytest.raises(InvalidArgumentError, match=r"'dataset'.*'max_turns'"):
        gym.make("RG-ChainSum-v0", zzz=1)  # a subclass: its keywords and TextEnv's


def test_tasks_that_are_not_tasks_are_named_when_the_env_is_made() -> None:
    with pytest.raises(InvalidArgumentError, match=r"tasks\[1\] must be a Task"):
        gym.make("ToolUseGame-v0", tasks=[Task("a"), 5])
    with pytest.raises(InvalidArgumentError, match=r"tasks\['train'\] must be a sequence"):
        gym.make("ToolUseGame-v0", tasks={"train": 5})
    env = gym.make("ToolUseGame-v0", tasks=lambda split: [5])  # a source is code too
    with pytest.raises(InvalidArgumentError, match="task 0 of the 'train' split"):
        env.reset(seed=0)
    assert gym.make("ToolUseGame-v0", tasks=["What is 2 + 2?"]).reset(seed=0)[0]


# --- configs -------------------------------------------------------------------------------------

GRPO_FIELDS = {
    "learning_rate as text": ({"learning_rate": "x"}, "learning_rate must be a number"),
    "beta as text": ({"beta": "0.1"}, "beta must be a number"),
    "max_turns true": ({"max_turns": True}, "max_turns must be an integer or null"),
    "NaN failed_parse_reward": ({"failed_parse_reward": math.nan}, "not NaN"),
    "no rows a device": ({"per_device_train_batch_size": 0}, "must divide the rows"),
    "negative temperature": ({"temperature": -1.0}, "temperature must be a finite number"),
    "top_p 0": ({"top_p": 0}, r"top_p must be a number in \(0, 1\]"),
    "seed past numpy": ({"seed": 2**40}, "seed must be an integer in"),
}


@pytest.fixture(scope="module")
def grpo_config() -> Any:
    pytest.importorskip("trl")
    from trainers import GRPOConfig

    return GRPOConfig


@pytest.mark.parametrize("name", list(GRPO_FIELDS))
def test_grpo_config_values_of_the_wrong_type_or_range_are_named(grpo_config, name) -> None:
    fields, message = GRPO_FIELDS[name]
    with pytest.raises(InvalidArgumentError, match=message):
        grpo_config(output_dir="unused", model="tiny", use_cpu=True, episodes_per_task=2, **fields)


def test_the_pipeline_names_a_grpo_typo_before_any_model_work(grpo_config, tmp_path) -> None:
    from trainers.pipeline import build_grpo_config
    from trainers.pipeline_config import PipelineConfig

    config = PipelineConfig(output_dir=str(tmp_path), grpo={"max_turnz": 3})
    with pytest.raises(InvalidArgumentError, match="Did you mean 'max_turns'"):
        build_grpo_config(config, "tiny", max_turns=3, use_cpu=True)
    config = PipelineConfig(output_dir=str(tmp_path), grpo={"output_dir": "x"})
    with pytest.raises(InvalidArgumentError, match="grpo may not set"):
        build_grpo_config(config, "tiny", max_turns=3, use_cpu=True)
    source = (Path(__file__).parents[1] / "trainers" / "pipeline.py").read_text()
    early = source.index("build_grpo_config(config, config.model")
    assert early < source.index("build_tiny_model(")  # checked before the model is built


CONFIGS = {
    "sft batch 0": ("sft: {batch_size: 0}", "sft.batch_size must be an integer >= 1"),
    "sft episodes text": ("sft: {episodes: many}", "sft.episodes must be an integer"),
    "sft learning rate NaN": ("sft: {learning_rate: .nan}", "sft.learning_rate must be a"),
    "sft scheduler typo": ("sft: {lr_scheduler_type: cosin}", "'cosine', 'linear' or"),
    "sft options a list": ("sft: {oracle_options: [1]}", "sft.oracle_options must be a"),
    "evaluation episodes true": ("evaluation: {episodes: true}", "evaluation.episodes"),
    "evaluation split a number": ("evaluation: {split: 3}", "evaluation.split must be a str"),
    "seed past numpy": ("seed: 1099511627776", r"seed must be an integer in \[0, 4294967295\]"),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_config_values_are_checked_at_load(name: str, tmp_path: Path) -> None:
    from trainers.pipeline_config import load_config

    text, message = CONFIGS[name]
    path = tmp_path / "config.yaml"
    path.write_text(text)
    with pytest.raises(InvalidArgumentError, match=message) as caught:
        load_config(path)
    assert str(caught.value).startswith(f"{path}: ")


@dataclass
class Settings:
    steps: int = 1
    rate: float = 0.5
    name: str | None = None
    mode: Literal["a", "b"] = "a"
    other: list[int] | dict[str, int] | None = None  # a container: not checked here


def test_check_field_types_reads_plain_annotations_only() -> None:
    from trainers.field_types import check_field_types

    check_field_types(Settings(steps=3, rate=2, name=Path("x"), other="any"))  # type: ignore[arg-type]
    for fields, message in (({"steps": True}, "steps must be an integer"),
                            ({"rate": "0.1"}, "rate must be a number"),
                            ({"rate": math.nan}, r"rate must be a number \(not NaN\)"),
                            ({"name": 5}, "name must be a string or null"),
                            ({"mode": "c"}, "mode must be 'a' or 'b'")):  # fmt: skip
        with pytest.raises(InvalidArgumentError, match=message):
            check_field_types(Settings(**fields))


# --- llm-gym serve: a prompt far past the context is refused after reading a prefix --------------


class _CountingTokenizer:
    """A tokenizer that counts the characters it is asked to encode."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer, self.read = tokenizer, 0

    def get_vocab(self) -> dict[str, int]:
        return self.tokenizer.get_vocab()

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        self.read += len(text)
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens)


def test_a_prompt_far_past_the_context_is_refused_from_a_prefix(small_model: Any) -> None:
    from llm_gym.policies.chat import longest_token
    from llm_gym.serving.completions import encode_within
    from llm_gym.serving.protocol import APIError

    tokenizer = small_model[1]
    counting = _CountingTokenizer(tokenizer)
    text = "The area of Vantis is 79. " * 100_000  # 2.6 M characters: seconds to tokenize whole
    with pytest.raises(APIError) as refused:
        encode_within(counting, text, 4096, "messages")
    assert refused.value.status == 400 and refused.value.param == "messages"
    assert "context of 4096 tokens" in refused.value.message
    assert counting.read == 2 * longest_token(tokenizer) * 4097 < len(text) / 10
    short = "The area of Vantis is 79."
    expected = tokenizer.encode(short, add_special_tokens=False)
    assert encode_within(counting, short, 4096, "messages") == expected
    part = text[:20_000]  # no context known: read whole, as before
    assert encode_within(tokenizer, part, None, "prompt") == tokenizer.encode(part)


def test_a_tokenizer_that_shrinks_text_still_gets_its_long_prompt_read_whole() -> None:
    from llm_gym.serving.completions import encode_within

    class Shrinking:  # 100 characters a token: the prefix fits, so the whole text is read
        def get_vocab(self) -> dict[str, int]:
            return {"a": 0}

        def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
            return [0] * (len(text) // 100 + 1)

    assert len(encode_within(Shrinking(), "a" * 10_000, 20, "messages")) == 101


# --- the campaign's leftovers, fixed later -------------------------------------------------------


def test_an_env_reply_far_past_the_context_is_cut_after_reading_a_prefix(small_model) -> None:
    tokenizer = small_model[1]
    read = {"characters": 0}

    class Counting(Say):  # a policy whose tokenizer counts what it is asked to encode
        async def act(self, requests):
            return [Generation(text="hello", token_ids=[5, 6], logprobs=[0.0, 0.0])] * len(requests)

    class CountingTokenizer:
        def __init__(self) -> None:
            self.chat_template = tokenizer.chat_template

        def __getattr__(self, name: str) -> Any:
            return getattr(tokenizer, name)

        def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
            read["characters"] += len(text)
            return tokenizer.encode(text, add_special_tokens=add_special_tokens)

    flood = {"role": "user", "content": "The area of Vantis is 79. " * 400_000}  # 10 MB
    start = time.perf_counter()
    [[episode]] = collect_groups(
        odd_env(reply=flood), [Task("x")], Counting(), max_turns=3,
        tokenizer=CountingTokenizer(), max_model_length=4096, max_new_tokens=64,
    )  # fmt: skip
    assert episode.truncation_cause is TruncationCause.CONTEXT_OVERFLOW
    assert len(episode.turns) == 1 and episode.samples[0].num_policy_tokens == 2
    assert read["characters"] < 1_000_000  # 17 s to tokenize the 10 MB whole, before
    assert time.perf_counter() - start < 10
    assert episode.overflow_tokens > 4096 - 64  # what the reply needed, at least: the soft
    trainers = pytest.importorskip("trainers.advantages")  # overlong penalty sees it in full
    outcome = trainers.EpisodeOutcome.of(episode)
    assert outcome.total_tokens == episode.overflow_tokens
    assert trainers.shaped_reward(
        outcome, max_model_length=4096, max_turns=3, overlong_buffer=512,
        overlong_penalty_factor=1.0, max_new_tokens=64,
    ) == -1.0  # fmt: skip
    [[fits]] = collect_groups(  # a reply that fits joins the stream as before
        odd_env(reply={"role": "user", "content": "short"}), [Task("x")], Counting(),
        max_turns=2, tokenizer=tokenizer, max_model_length=4096, max_new_tokens=64,
    )  # fmt: skip
    assert fits.truncation_cause is TruncationCause.MAX_TURNS
    last = fits.samples[-1]
    assert "short" in tokenizer.decode(last.prompt_ids + last.completion_ids)


@pytest.fixture(scope="module")
def chat_server(small_model_dir) -> Any:
    pytest.importorskip("uvicorn")
    from llm_gym.serving.openai_server import serve

    with serve(small_model_dir, model_name="tiny", device="cpu", port=0) as server:
        yield server


def test_more_messages_than_the_context_has_tokens_are_refused_unrendered(
    chat_server, monkeypatch
) -> None:
    import httpx

    context = chat_server.engine.context
    rendered = []
    render = chat_server.engine.tokenizer.apply_chat_template
    monkeypatch.setattr(
        chat_server.engine.tokenizer,
        "apply_chat_template",
        lambda messages, **kw: rendered.append(len(messages)) or render(messages, **kw),
    )
    body = {"model": "tiny", "messages": [{"role": "user", "content": "a"}] * 200_000}
    answer = httpx.post(chat_server.url + "/chat/completions", json=body, timeout=60)
    assert answer.status_code == 400, answer.text[:300]
    error = answer.json()["error"]
    assert error["param"] == "messages" and f"context of {context} tokens" in error["message"]
    assert rendered == []  # the template took 4 s to render them, before
    body.update(messages=body["messages"][:3], max_tokens=1)
    assert httpx.post(chat_server.url + "/chat/completions", json=body, timeout=60).is_success
    assert rendered == [3]


@pytest.mark.parametrize("seed", [True, "12", 1.0])
def test_serve_env_takes_only_a_json_integer_seed(env_server: Any, seed: Any) -> None:
    import httpx
    from websockets.asyncio.client import connect

    answer = httpx.post(env_server.url + "/reset", json={"seed": seed}, timeout=10)
    assert answer.status_code == 422 and "integer seed" in answer.text  # pydantic's lax mode
    assert json.dumps(seed) in answer.json()["detail"]  # took true as 1 and "12" as 12

    async def over_ws(url: str) -> list[Any]:
        async with connect(url.replace("http://", "ws://") + "/ws") as ws:
            answers = []
            for data in ({"seed": seed}, {"seed": 3}):
                await ws.send(json.dumps({"type": "reset", "data": data}))
                answers.append(json.loads(await asyncio.wait_for(ws.recv(), 10)))
            return answers

    refused, opened = asyncio.run(over_ws(env_server.url))
    assert refused["type"] == "error" and "integer seed" in refused["data"]["message"]
    assert opened["type"] == "observation"  # the session goes on
    assert httpx.post(env_server.url + "/reset", json={"seed": 3}, timeout=10).is_success


def test_an_integer_target_of_any_length_can_be_matched() -> None:
    for target in (10**70, -(10**200) + 7, 10**4000):
        assert answers_match(str(target), target)  # over 64 characters never matched, before
        assert not answers_match(str(target + 1), target, rel_tol=0.0, abs_tol=0.0)
        assert answers_match(f"{target:,}", target)
    assert answers_match("1" + "0" * 300, 1e300)
    start = time.perf_counter()
    assert not answers_match("9" * 1_000_000, 5)  # a long reply is still not converted
    assert not answers_match("9" * 5_000, 10**4000)  # past the target's digits and 24
    assert time.perf_counter() - start < 0.1


def test_freeze_message_is_the_iterative_copy_at_any_depth() -> None:
    from llm_gym.core.types import FrozenMessage, rebuild_nested

    def build(container: Any, kids: list[Any]) -> Any:
        if isinstance(container, dict):
            return FrozenMessage(zip(kids[::2], kids[1::2], strict=True))
        return tuple(kids)

    def iterative(message: Any) -> Any:  # what freeze_message returned for every message
        return rebuild_nested(message, lambda leaf: leaf, build)

    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    shared = [1, 2]
    for message in (
        {"role": "assistant", "content": "x", "tool_calls": [call, call]},  # recursion's path
        {"role": "tool", "content": "x", "a": shared, "b": (shared, {(1, 2): None})},
        {"role": "tool", "content": "x", "deep": json.loads("[" * 500 + "]" * 500)},  # the loop's
    ):
        frozen = freeze_message(message)
        assert frozen == iterative(message) and type(frozen) is FrozenMessage
    looped: dict[str, Any] = {"role": "tool", "content": "x"}
    looped["tool_calls"] = [{"again": looped}]
    with pytest.raises(InvalidArgumentError, match="contains itself"):
        freeze_message(looped)
