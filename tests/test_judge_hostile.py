"""A judge's answers treated as hostile: huge, malformed, out of range, not a chat completion.
Each gives a clear outcome (the fallback, counted by kind), never a crash or a score outside
[0, 1]."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from llm_gym.judge import Judge, JudgeReward, JudgeSettings
from tests.test_judge import OPENING, RUBRIC, ScriptedEndpoint, conversation, reply


@pytest.fixture
def endpoint() -> Iterator[ScriptedEndpoint]:
    server = ScriptedEndpoint()
    yield server
    server.close()


NESTED = "[" * 100_000 + "]" * 100_000


@pytest.mark.parametrize(
    ("answer", "kind"),
    [
        (reply("x" * 50_000), "reply"),  # over max_reply_chars
        (reply('{"explains": true, "clarity": 99}'), "reply"),  # out of range
        (reply('{"explains": true, "clarity": 1e400}'), "reply"),  # inf
        (reply('{"explains": true, "clarity": 100000000000000000000000000000}'), "reply"),
        (reply(NESTED[:20_000]), "reply"),  # deep nesting within the cap
        (reply(None), "malformed"),  # content is no text
        (reply(["a"]), "malformed"),
        ({"choices": []}, "malformed"),
        ({"error": "no"}, "malformed"),
        ([1, 2, 3], "malformed"),
        (b"not json at all", "malformed"),
        (b'{"choices": [' + b" " * 200_000 + b"]}", "malformed"),  # over the byte cap
    ],
)
def test_hostile_answers_fall_back_and_are_counted(
    endpoint: ScriptedEndpoint, answer: Any, kind: str
) -> None:
    endpoint.respond = lambda body: (200, answer)
    settings = JudgeSettings(
        base_url=endpoint.url, model="j", rubric=RUBRIC, fallback=0.0, max_reply_chars=10_000,
        max_retries=0,
    )  # fmt: skip
    reward = JudgeReward(Judge(settings))
    assert reward(prompts=[OPENING], completions=["an answer"]) == [0.0]
    metrics = reward.take_metrics()
    assert metrics["judge/failures"] == 1 and metrics[f"judge/failures_{kind}"] == 1


def test_a_refusing_or_absent_endpoint_falls_back(endpoint: ScriptedEndpoint) -> None:
    endpoint.respond = lambda body: (404, {"error": {"message": "no such model"}})
    judge = Judge(JudgeSettings(base_url=endpoint.url, model="j", rubric=RUBRIC))
    [judgement] = judge.judge([conversation("a")])
    assert judgement.score is None and "no such model" in judgement.error
    url = endpoint.url
    endpoint.close()
    gone = Judge(JudgeSettings(base_url=url, model="j", rubric=RUBRIC, max_retries=0))
    [judgement] = gone.judge([conversation("a")])
    assert judgement.score is None and judgement.error.startswith("endpoint")


def test_a_group_reply_with_one_bad_entry_fails_only_that_attempt(
    endpoint: ScriptedEndpoint,
) -> None:
    endpoint.respond = lambda body: (
        200,
        reply('{"1": {"explains": true, "clarity": 10}, "2": {"explains": "perhaps"},'
              ' "3": "ten"}'),
    )  # fmt: skip
    settings = JudgeSettings(base_url=endpoint.url, model="j", rubric=RUBRIC, mode="group")
    reward = JudgeReward(Judge(settings))
    values = reward(prompts=[OPENING] * 3, completions=["a", "b", "c"])
    assert values == [1.0, None, None]
    assert reward.take_metrics()["judge/failures_reply"] == 2


def test_hostile_transcripts_are_sent_bounded(endpoint: ScriptedEndpoint) -> None:
    endpoint.respond = lambda body: (200, reply('{"explains": true, "clarity": 3}'))
    settings = JudgeSettings(
        base_url=endpoint.url, model="j", rubric=RUBRIC, max_transcript_chars=1000
    )
    completion = [
        {"role": "assistant", "content": "\ud800 lone surrogate " + "z" * 1_000_000},
        {"role": "tool", "content": None},
        {"role": "assistant", "tool_calls": [{"function": "not a mapping"}, 7]},
        "not a message",
    ]
    [judgement] = Judge(settings).judge([(OPENING, completion)])
    assert judgement.score == 0.825
    sent = endpoint.requests[-1]["body"]["messages"][1]["content"]
    assert len(sent) < 2000 and "characters left out" in sent
