"""A judge behind an OpenAI-compatible ``/chat/completions`` endpoint (``llm-gym serve``, vLLM,
a hosted model), scoring episodes against a :class:`~llm_gym.judge.rubric.Rubric`.

:class:`Judge` sends the requests of :mod:`llm_gym.judge.prompt` (one per episode, or one per
group), reads the reply by the parse rules of :mod:`llm_gym.judge.rubric` and returns a
:class:`Judgement` per episode. The endpoint is reached through
:class:`~llm_gym.policies.http.JsonClient`: ``timeout_s`` bounds one attempt, connection errors,
timeouts, HTTP 429 and 5xx are retried ``max_retries`` times with backoff, the answer is read up
to a cap. With ``response_format`` the request asks for the verdict's JSON schema (``llm-gym
serve`` and vLLM enforce it by constrained decoding; an endpoint without structured output may
refuse it: set ``response_format: false`` there).

**A judge error ends nothing.** An endpoint that fails, times out or answers something the
parse rules refuse gives the episodes it judged a :class:`Judgement` without a score and with
the reason; the caller falls back (``fallback``) and :class:`JudgeStats` counts the failure.
**Cache**: the scores of successful requests are kept by the request's content (model, messages,
settings that change the answer), least recently used first out past ``cache_size``.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import os
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from llm_gym.aio import run_sync
from llm_gym.errors import InvalidArgumentError
from llm_gym.judge.prompt import Messages, episode_request, group_request
from llm_gym.judge.rubric import JudgeReplyError, Rubric, parse_group_verdicts, parse_verdict
from llm_gym.policies.http import EndpointError, JsonClient, MalformedResponseError

__all__ = ["JUDGE_MODES", "Judge", "JudgeSettings", "JudgeStats", "Judgement", "shared_judge"]

JUDGE_MODES = ("episode", "group")
"""One request per episode, or one per group of episodes of the same task."""
_REPLY_BYTES_PER_CHAR = 4


@dataclass(frozen=True)
class JudgeSettings:
    """Where the judge is, what it is asked, and what a failure gives."""

    base_url: str
    """The API root (``http://127.0.0.1:8000/v1``); requests go to ``/chat/completions``."""
    model: str
    """The served model's name."""
    rubric: Rubric
    """The criteria (a list in a config: :meth:`Rubric.of`)."""
    mode: str = "episode"
    """``episode`` (a request per episode) or ``group`` (a request per group, ranked side by
    side)."""
    weight: float = 1.0
    """How much the judged score counts where it is added (the trainer:
    ``reward += weight * score``)."""
    fallback: float | None = None
    """The judged score of an episode the judge failed on (None: no judged score, so nothing is
    added)."""
    api_key_env: str | None = None
    """The environment variable holding the API key, sent as a bearer token (None: none)."""
    timeout_s: float = 60.0
    """Deadline of one attempt, in seconds (a timed-out attempt is retried)."""
    max_retries: int = 2
    """Retries after a connection error, HTTP 429 or 5xx."""
    max_tokens: int = 256
    """The reply's token budget per episode (a group's request asks for this times its size)."""
    temperature: float = 0.0
    """The judge's sampling temperature."""
    response_format: bool = True
    """Ask for the verdict's JSON schema (structured output)."""
    max_reply_chars: int = 20_000
    """Longest reply read (per episode; a group's reply may be this times its size)."""
    max_transcript_chars: int = 12_000
    """Longest transcript shown to the judge (the middle is left out beyond it)."""
    max_concurrency: int = 4
    """Requests in flight at once."""
    cache_size: int = 4096
    """Successful requests remembered (0: no cache)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "rubric", Rubric.of(self.rubric))
        if not isinstance(self.base_url, str) or not self.base_url.startswith(
            ("http://", "https://")
        ):
            raise InvalidArgumentError(
                "judge base_url must be an http(s) URL of an OpenAI-compatible API root "
                f"('http://127.0.0.1:8000/v1'), actual value: {self.base_url!r:.100}."
            )
        if not isinstance(self.model, str) or not self.model:
            raise InvalidArgumentError(
                f"judge model must be the served model's name, actual value: {self.model!r:.80}."
            )
        if self.mode not in JUDGE_MODES:
            raise InvalidArgumentError(
                f"judge mode must be one of {list(JUDGE_MODES)}, actual value: {self.mode!r:.40}."
            )
        numbers = {"weight": self.weight, "timeout_s": self.timeout_s,
                   "temperature": self.temperature}  # fmt: skip
        if self.fallback is not None:
            numbers["fallback"] = self.fallback
        for name, value in numbers.items():
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
            ):
                raise InvalidArgumentError(
                    f"judge {name} must be a finite number, actual value: {value!r:.40}."
                )
        if self.timeout_s <= 0 or self.temperature < 0:
            raise InvalidArgumentError(
                f"judge timeout_s must be > 0 and temperature >= 0, actual values: "
                f"{self.timeout_s!r}, {self.temperature!r}."
            )
        least = {"max_retries": 0, "max_tokens": 1, "max_reply_chars": 1,
                 "max_transcript_chars": 1, "max_concurrency": 1, "cache_size": 0}  # fmt: skip
        for name, low in least.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise InvalidArgumentError(
                    f"judge {name} must be an int >= {low}, actual value: {value!r:.40}."
                )
        if self.api_key_env is not None and not isinstance(self.api_key_env, str):
            raise InvalidArgumentError(
                "judge api_key_env must name an environment variable (the key itself is never "
                f"stored in a config), actual value: {type(self.api_key_env).__name__}."
            )

    @classmethod
    def of(cls, spec: Any) -> JudgeSettings:
        """Settings from a config mapping (its keys are the fields), or settings as they are."""
        if isinstance(spec, JudgeSettings):
            return spec
        if not isinstance(spec, Mapping):
            raise InvalidArgumentError(
                "judge must be a mapping {base_url, model, rubric, ...} (llm_gym.judge."
                f"JudgeSettings), actual value: {spec!r:.100}."
            )
        known = {f.name for f in fields(cls)}
        unknown = sorted(str(k) for k in spec if k not in known)
        if unknown:
            raise InvalidArgumentError(
                f"judge has unknown keys {unknown}; the keys are {sorted(known)}."
            )
        missing = [k for k in ("base_url", "model", "rubric") if k not in spec]
        if missing:
            raise InvalidArgumentError(f"judge needs {missing} (an endpoint and a rubric).")
        return cls(**spec)


@dataclass(frozen=True)
class Judgement:
    """The judge's answer about one episode."""

    score: float | None
    """The rubric's score in [0, 1]; None when the judge failed."""
    values: dict[str, float] = field(default_factory=dict)
    """Each criterion's value in [0, 1] (empty on failure)."""
    error: str | None = None
    """Why the judge failed (None on success)."""
    cached: bool = False
    """The score came from the cache."""


class JudgeStats:
    """Counters of a :class:`Judge` (thread-safe); :meth:`take` reads and resets them."""

    KEYS = ("requests", "episodes", "failures", "cache_hits", "retries")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(self.KEYS, 0)
        self.reasons: dict[str, int] = {}
        """Failures by kind since the last take: ``timeout``, ``endpoint`` (a refusal, a
        connection error), ``malformed`` (an answer that is no chat completion) and ``reply``
        (a reply the parse rules refuse)."""

    def add(self, **counts: int) -> None:
        with self._lock:
            for key, value in counts.items():
                self._counts[key] += value

    def fail(self, kind: str, episodes: int) -> None:
        with self._lock:
            self._counts["failures"] += episodes
            self.reasons[kind] = self.reasons.get(kind, 0) + episodes

    def take(self) -> dict[str, float]:
        """``judge/requests``, ``judge/episodes``, ``judge/failures``, ``judge/failure_ratio``,
        ``judge/cache_hits``, ``judge/retries`` and ``judge/failures_<kind>`` since the last
        take."""
        with self._lock:
            counts, reasons = dict(self._counts), dict(self.reasons)
            self._counts = dict.fromkeys(self.KEYS, 0)
            self.reasons = {}
        out = {f"judge/{k}": float(v) for k, v in counts.items()}
        out["judge/failure_ratio"] = counts["failures"] / max(1, counts["episodes"])
        out.update({f"judge/failures_{k}": float(v) for k, v in reasons.items()})
        return out


class Judge:
    """Scores episodes with a judge endpoint (see the module docstring)."""

    def __init__(self, settings: JudgeSettings | Mapping[str, Any]) -> None:
        self.settings = s = JudgeSettings.of(settings)
        self.stats = JudgeStats()
        self._cache: OrderedDict[str, list[dict[str, float]]] = OrderedDict()
        self._cache_lock = threading.Lock()
        key_env = s.api_key_env

        def headers() -> dict[str, str]:  # read at every attempt: the key is never stored
            key = os.environ.get(key_env) if key_env else None
            return {"Authorization": f"Bearer {key}"} if key else {}

        self._client = JsonClient(
            s.base_url.rstrip("/") + "/chat/completions",
            headers=headers,
            label=f"for judge model {s.model!r}",
            max_concurrency=s.max_concurrency,
            max_retries=s.max_retries,
            request_timeout_s=s.timeout_s,
            backoff_base_s=0.25,
            backoff_max_s=5.0,
            max_response_bytes=_REPLY_BYTES_PER_CHAR * s.max_reply_chars + 65_536,
        )

    def __repr__(self) -> str:
        return f"Judge({self.settings.base_url!r}, model={self.settings.model!r})"

    def close(self) -> None:
        """Close the endpoint's connections."""
        self._client.close()

    def judge(self, conversations: Sequence[tuple[Messages, Messages]]) -> list[Judgement]:
        """:meth:`judge_async` from synchronous code."""
        return run_sync(self.judge_async(conversations))

    async def judge_async(
        self, conversations: Sequence[tuple[Messages, Messages]]
    ) -> list[Judgement]:
        """One :class:`Judgement` per ``(opening, completion)`` conversation. In ``group``
        mode, conversations with the same opening are judged together (one request each
        group); in ``episode`` mode, one request each."""
        conversations = list(conversations)
        self.stats.add(episodes=len(conversations))
        if self.settings.mode == "episode":
            return list(await asyncio.gather(*(self._one(o, c) for o, c in conversations)))
        groups: dict[str, list[int]] = {}
        for i, (opening, _) in enumerate(conversations):
            groups.setdefault(_digest(list(opening)), []).append(i)
        out: list[Judgement | None] = [None] * len(conversations)
        members = list(groups.values())
        results = await asyncio.gather(
            *(self._group([conversations[i] for i in idx]) for idx in members)
        )
        for idx, judged in zip(members, results, strict=True):
            for i, judgement in zip(idx, judged, strict=True):
                out[i] = judgement
        return out  # type: ignore[return-value]

    async def _one(self, opening: Messages, completion: Messages) -> Judgement:
        s = self.settings
        messages = episode_request(s.rubric, opening, completion, s.max_transcript_chars)
        return (await self._ask(messages, 1, s.rubric.schema()))[0]

    async def _group(self, members: Sequence[tuple[Messages, Messages]]) -> list[Judgement]:
        s = self.settings
        if len(members) == 1:  # nothing to compare: the episode's own request
            return [await self._one(*members[0])]
        completions = [c for _, c in members]
        messages = group_request(s.rubric, members[0][0], completions, s.max_transcript_chars)
        return await self._ask(messages, len(members), s.rubric.group_schema(len(members)))

    async def _ask(
        self, messages: list[dict[str, str]], n: int, schema: dict[str, Any]
    ) -> list[Judgement]:
        s = self.settings
        payload: dict[str, Any] = {
            "model": s.model,
            "messages": messages,
            "max_tokens": s.max_tokens * n,
            "temperature": s.temperature,
        }
        if s.response_format:
            payload["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "verdict", "schema": schema},
            }
        key = _digest([payload, s.rubric.criteria, s.max_reply_chars])
        cached = self._cached(key)
        if cached is not None:
            self.stats.add(cache_hits=n)
            return [Judgement(s.rubric.score(v), v, cached=True) for v in cached]
        self.stats.add(requests=1)
        try:
            reply = await self._client.post(payload, parse=_reply_text)
        except EndpointError as exc:
            kind = (
                "timeout"
                if isinstance(exc, TimeoutError)
                else "malformed"
                if isinstance(exc, MalformedResponseError)
                else "endpoint"
            )
            self.stats.fail(kind, n)
            return [Judgement(None, error=f"{kind}: {exc}")] * n
        self.stats.add(retries=reply.retries)
        try:
            if n == 1:
                verdicts: list[Any] = [parse_verdict(reply.body, s.rubric, s.max_reply_chars)]
            else:
                verdicts = parse_group_verdicts(reply.body, s.rubric, n, s.max_reply_chars * n)
        except JudgeReplyError as exc:
            verdicts = [exc] * n
        failed = sum(isinstance(v, JudgeReplyError) for v in verdicts)
        if failed:
            self.stats.fail("reply", failed)
        else:
            self._store(key, verdicts)
        return [
            Judgement(None, error=f"reply: {v}")
            if isinstance(v, JudgeReplyError)
            else Judgement(s.rubric.score(v), v)
            for v in verdicts
        ]

    def _cached(self, key: str) -> list[dict[str, float]] | None:
        with self._cache_lock:
            found = self._cache.get(key)
            if found is not None:
                self._cache.move_to_end(key)
            return found

    def _store(self, key: str, verdicts: list[dict[str, float]]) -> None:
        if self.settings.cache_size == 0:
            return
        with self._cache_lock:
            self._cache[key] = verdicts
            while len(self._cache) > self.settings.cache_size:
                self._cache.popitem(last=False)


def _digest(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, default=repr, ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _reply_text(body: Any) -> str:
    """The reply's text from a chat completion (``choices[0].message.content``)."""
    choices = body.get("choices") if isinstance(body, dict) else None
    choice = choices[0] if isinstance(choices, list) and choices else None
    message = choice.get("message") if isinstance(choice, dict) else None
    content = message.get("content") if isinstance(message, dict) else None
    if not isinstance(content, str):
        raise MalformedResponseError(
            f"The judge's answer has no choices[0].message.content text: {str(body)[:120]!r}.",
            status=200,
        )
    return content


_SHARED: dict[JudgeSettings, Judge] = {}
_SHARED_LOCK = threading.Lock()


def shared_judge(settings: JudgeSettings | Mapping[str, Any]) -> Judge:
    """The process's one :class:`Judge` for these settings (environments built per episode
    share its connections, cache and counters)."""
    settings = JudgeSettings.of(settings)
    with _SHARED_LOCK:
        if settings not in _SHARED:
            _SHARED[settings] = Judge(settings)
        return _SHARED[settings]
