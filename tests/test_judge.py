"""Judged rewards: the rubric's score and parse rules on hand-computed examples, the prompt, and
the judge against a scripted OpenAI-compatible endpoint on loopback (retries, timeouts, cache,
group mode, fallback and failure counts, the reward function)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from llm_gym.errors import InvalidArgumentError
from llm_gym.judge import (
    Criterion,
    Judge,
    JudgeReplyError,
    JudgeReward,
    JudgeSettings,
    Rubric,
    parse_group_verdicts,
    parse_verdict,
    render_messages,
)
from tests.scripted_endpoint import ScriptedEndpoint, scripted_endpoint

RUBRIC = [
    {"name": "explains", "question": "Does the reply explain the decision?", "weight": 3},
    {"name": "clarity", "question": "How clear is the reply?", "kind": "scale", "weight": 1},
]
OPENING = [{"role": "system", "content": "rules"}, {"role": "user", "content": "Refund order A1."}]


def reply(content: Any) -> dict[str, Any]:
    """A chat completion whose message is ``content``."""
    message = {"role": "assistant", "content": content}
    return {"choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}


@pytest.fixture
def endpoint() -> Iterator[ScriptedEndpoint]:
    with scripted_endpoint() as server:
        yield server


def settings(url: str, **overrides: Any) -> JudgeSettings:
    return JudgeSettings(base_url=url, model="judge", rubric=RUBRIC, **overrides)


def conversation(answer: str) -> tuple[list[Any], list[Any]]:
    return OPENING, [{"role": "assistant", "content": answer}]


# --- the rubric: score and parse rules ------------------------------------------------------------


def test_the_score_is_the_weighted_mean_of_the_answers() -> None:
    rubric = Rubric.of(RUBRIC)
    # explains yes (1.0, weight 3), clarity 6/10 (weight 1): (3 + 0.6) / 4 = 0.9
    assert parse_verdict('{"explains": true, "clarity": 6}', rubric) == {
        "explains": 1.0,
        "clarity": 0.6,
    }
    assert rubric.score({"explains": 1.0, "clarity": 0.6}) == 0.9
    # no (0.0) and 10/10: (0 + 1) / 4 = 0.25
    assert rubric.score(parse_verdict('{"EXPLAINS": "no", "clarity": "10"}', rubric)) == 0.25


def test_the_verdict_is_found_in_fences_and_prose() -> None:
    rubric = Rubric.of(RUBRIC)
    fenced = 'Here you go:\n```json\n{"explains": 1, "clarity": 0}\n```\nThanks.'
    prose = 'I think {"explains": "yes", "clarity": 5.5} is fair.'
    assert parse_verdict(fenced, rubric) == {"explains": 1.0, "clarity": 0.0}
    assert parse_verdict(prose, rubric) == {"explains": 1.0, "clarity": 0.55}


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ('{"explains": true}', "no answer for criterion 'clarity'"),
        ('{"explains": true, "clarity": 11}', "out of range"),
        ('{"explains": true, "clarity": -1}', "out of range"),
        ('{"explains": true, "clarity": NaN}', "out of range"),
        ('{"explains": true, "clarity": 1e999}', "out of range"),
        ('{"explains": 2, "clarity": 3}', "expected true/false"),
        ('{"explains": "maybe", "clarity": 3}', "expected true/false"),
        ('{"explains": true, "clarity": true}', "expected a number"),
        ('{"explains": true, "clarity": [1]}', "expected a number"),
        ("[1, 2]", "not an object"),
        ("no json here", "holds no JSON"),
        ("x" * 30, "over the 20 read"),
    ],
)
def test_refused_verdicts_name_what_is_wrong(text: str, match: str) -> None:
    with pytest.raises(JudgeReplyError, match=match):
        parse_verdict(text, Rubric.of(RUBRIC), max_chars=20 if text.startswith("x") else 20_000)


def test_a_group_reply_is_read_attempt_by_attempt() -> None:
    rubric = Rubric.of(RUBRIC)
    text = json.dumps({"1": {"explains": True, "clarity": 10}, "3": {"explains": "no"}})
    first, second, third = parse_group_verdicts(text, rubric, 3)
    assert first == {"explains": 1.0, "clarity": 1.0}
    assert isinstance(second, JudgeReplyError) and "attempt 2" in str(second)
    assert isinstance(third, JudgeReplyError) and "'clarity'" in str(third)
    with pytest.raises(JudgeReplyError, match="not an object keyed by attempt"):
        parse_group_verdicts("[]", rubric, 2)


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ([], "at least one criterion"),
        ("Is it good?", "must be a list"),
        ([{"name": "a", "question": "A?"}, {"name": "A", "question": "B?"}], "unique"),
        ([{"name": "1a", "question": "A?"}], "identifier"),
        ([{"name": "a", "question": " "}], "needs a question"),
        ([{"name": "a", "question": "A?", "kind": "likert"}], "kind must be one of"),
        ([{"name": "a", "question": "A?", "weight": 0}], "weight must be a finite number > 0"),
        ([{"name": "a", "question": "A?", "weight": float("inf")}], "finite number"),
        ([{"name": "a", "question": "A?", "wieght": 2}], "unknown keys"),
        ([3], "mapping or a question"),
    ],
)
def test_bad_rubrics_are_refused(spec: Any, match: str) -> None:
    with pytest.raises(InvalidArgumentError, match=match):
        Rubric.of(spec)


def test_plain_questions_are_yes_no_criteria() -> None:
    rubric = Rubric.of(["Polite?", "Correct?"])
    assert rubric.criteria == (Criterion("c1", "Polite?"), Criterion("c2", "Correct?"))


# --- the prompt -----------------------------------------------------------------------------------


def test_the_transcript_shows_calls_and_results_and_leaves_the_system_prompt_out() -> None:
    messages = [
        *OPENING,
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "1", "type": "function",
             "function": {"name": "get_order", "arguments": '{"order_id": "A1"}'}}]},
        {"role": "tool", "name": "get_order", "tool_call_id": "1", "content": "delivered"},
        {"role": "assistant", "content": [{"type": "text", "text": "Refunded."}]},
    ]  # fmt: skip
    assert render_messages(messages) == (
        "[user] Refund order A1.\n"
        '[assistant calls get_order] {"order_id": "A1"}\n'
        "[tool get_order] delivered\n"
        "[assistant] Refunded."
    )


# --- the judge on a scripted endpoint -------------------------------------------------------------


def test_episode_mode_sends_the_rubric_and_schema_and_scores(endpoint: ScriptedEndpoint) -> None:
    endpoint.respond = lambda body: (200, reply('{"explains": true, "clarity": 6}'))
    judge = Judge(settings(endpoint.url, max_tokens=64))
    [judgement] = judge.judge([conversation("Refunded $20 since it arrived broken.")])
    assert judgement.score == 0.9 and judgement.error is None
    body = endpoint.requests[0]["body"]
    assert endpoint.requests[0]["path"] == "/v1/chat/completions"
    assert body["model"] == "judge" and body["max_tokens"] == 64 and body["temperature"] == 0
    assert body["response_format"]["json_schema"]["schema"]["required"] == ["explains", "clarity"]
    prompt = body["messages"][1]["content"]
    assert "- explains (yes/no, weight 3): Does the reply explain" in prompt
    assert "[assistant] Refunded $20" in prompt and "rules" not in prompt


def test_the_cache_answers_a_repeated_request(endpoint: ScriptedEndpoint) -> None:
    endpoint.respond = lambda body: (200, reply('{"explains": false, "clarity": 2}'))
    judge = Judge(settings(endpoint.url, cache_size=1))
    first = judge.judge([conversation("a")])[0]
    again = judge.judge([conversation("a")])[0]
    assert (first.score, again.score, again.cached) == (0.05, 0.05, True)
    judge.judge([conversation("b")])  # evicts "a" (cache_size 1)
    judge.judge([conversation("a")])
    assert len(endpoint.requests) == 3
    metrics = judge.stats.take()
    assert metrics["judge/requests"] == 3 and metrics["judge/cache_hits"] == 1
    assert metrics["judge/episodes"] == 4 and metrics["judge/failures"] == 0
    assert judge.stats.take()["judge/episodes"] == 0  # taking resets


def test_server_errors_are_retried_then_fall_back_and_are_counted(
    endpoint: ScriptedEndpoint,
) -> None:
    answers = iter([(503, {"error": "busy"}), (200, reply('{"explains": 1, "clarity": 10}'))])
    endpoint.respond = lambda body: next(answers)
    judge = Judge(settings(endpoint.url, max_retries=1))
    assert judge.judge([conversation("a")])[0].score == 1.0
    assert judge.stats.take()["judge/retries"] == 1

    endpoint.respond = lambda body: (500, {"error": "down"})
    reward = JudgeReward(settings(endpoint.url, max_retries=1, fallback=0.25, cache_size=0))
    assert reward(prompts=[OPENING], completions=[[{"role": "assistant", "content": "b"}]]) == [
        0.25
    ]
    metrics = reward.take_metrics()
    assert metrics["judge/failures"] == 1 and metrics["judge/failures_endpoint"] == 1
    assert metrics["judge/failure_ratio"] == 1.0


def test_a_slow_judge_times_out_into_the_fallback(endpoint: ScriptedEndpoint) -> None:
    def slow(body: dict[str, Any]) -> tuple[int, Any]:
        time.sleep(1.0)
        return 200, reply('{"explains": true, "clarity": 5}')

    endpoint.respond = slow
    judge = Judge(settings(endpoint.url, timeout_s=0.2, max_retries=0))
    start = time.perf_counter()
    [judgement] = judge.judge([conversation("a")])
    assert judgement.score is None and judgement.error.startswith("timeout")
    assert time.perf_counter() - start < 1.5  # one attempt and its one timeout retry
    assert judge.stats.take()["judge/failures_timeout"] == 1


def test_group_mode_ranks_a_group_in_one_request(endpoint: ScriptedEndpoint) -> None:
    def grade(body: dict[str, Any]) -> tuple[int, Any]:
        prompt = body["messages"][1]["content"]
        n = prompt.count("\nAttempt ")
        verdicts = {str(i + 1): {"explains": i % 2 == 0, "clarity": 2 * i} for i in range(n)}
        return 200, reply(json.dumps(verdicts))

    endpoint.respond = grade
    reward = JudgeReward(settings(endpoint.url, mode="group"))
    other = [{"role": "user", "content": "Refund order B2."}]
    prompts = [OPENING, OPENING, other, OPENING]
    completions = [[{"role": "assistant", "content": f"reply {i}"}] for i in range(4)]
    # task A: attempts 1-3 (samples 0, 1, 3): explains yes/no/yes, clarity 0/2/4
    # -> (3 + 0) / 4, (0 + 0.2) / 4, (3 + 0.4) / 4; task B alone: its own episode request
    endpoint_calls = len(endpoint.requests)
    values = reward(prompts=prompts, completions=completions)
    assert len(endpoint.requests) - endpoint_calls == 2
    group_body = next(r["body"] for r in endpoint.requests if "Attempt 3" in str(r["body"]))
    assert group_body["max_tokens"] == 3 * 256
    schema = group_body["response_format"]["json_schema"]["schema"]
    assert set(schema["required"]) == {"1", "2", "3"}
    assert values[0] == 0.75 and values[1] == 0.05 and values[3] == 0.85
    assert values[2] is None  # the lone episode's request is no group: the reply fails its rules
    assert reward.take_metrics()["judge/failures_reply"] == 1


def test_settings_are_checked_and_the_key_comes_from_the_environment(
    endpoint: ScriptedEndpoint, monkeypatch: pytest.MonkeyPatch
) -> None:
    for bad, match in (
        ({"base_url": "ftp://x"}, "http"),
        ({"mode": "pairwise"}, "mode must be one of"),
        ({"fallback": float("nan")}, "finite number"),
        ({"max_retries": -1}, "int >= 0"),
        ({"timeout_s": 0}, "timeout_s must be > 0"),
    ):
        with pytest.raises(InvalidArgumentError, match=match):
            JudgeSettings(**{"base_url": endpoint.url, "model": "j", "rubric": RUBRIC, **bad})
    with pytest.raises(InvalidArgumentError, match="unknown keys"):
        JudgeSettings.of({"base_url": endpoint.url, "model": "j", "rubric": RUBRIC, "wieght": 1})
    with pytest.raises(InvalidArgumentError, match="needs"):
        JudgeSettings.of({"base_url": endpoint.url, "model": "j"})
    monkeypatch.setenv("JUDGE_KEY", "sk-judge")
    endpoint.respond = lambda body: (200, reply('{"explains": true, "clarity": 1}'))
    Judge(settings(endpoint.url, api_key_env="JUDGE_KEY")).judge([conversation("a")])
    assert endpoint.requests[-1]["headers"]["Authorization"] == "Bearer sk-judge"


# --- our own server as the judge ------------------------------------------------------------------


def test_llm_gym_serve_judges_with_the_verdicts_schema(small_model_dir) -> None:
    """``llm-gym serve`` (the small test model) enforces the verdict's JSON schema, so even an
    untrained judge gives a verdict the parse rules accept: a score on the rubric's grid."""
    pytest.importorskip("uvicorn")
    from llm_gym.serving.openai_server import serve

    rubric = [{"name": "polite", "question": "Is the reply polite?"},
              {"name": "clear", "question": "How clear is it?", "kind": "scale"}]  # fmt: skip
    with serve(small_model_dir, model_name="tiny", device="cpu") as server:
        judge = Judge(JudgeSettings(base_url=server.url, model="tiny", rubric=rubric,
                                    max_tokens=48, mode="group"))  # fmt: skip
        judged = judge.judge([conversation("Refunded."), conversation("No.")])
    metrics = judge.stats.take()
    assert metrics["judge/requests"] == 1 and metrics["judge/failures"] == 0, judged
    for judgement in judged:
        assert judgement.values["polite"] in (0.0, 1.0)
        assert judgement.values["clear"] * 10 == int(judgement.values["clear"] * 10)
        assert judgement.score == (judgement.values["polite"] + judgement.values["clear"]) / 2
