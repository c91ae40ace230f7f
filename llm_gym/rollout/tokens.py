"""Token-in/token-out: an episode held as token ids, and its training samples.

The :class:`TokenTracker` keeps the ids a model policy generates from. It starts from the chat
template's rendering of the opening messages; each assistant turn appends exactly the sampled ids
(``env_mask`` 1, the sampler's logprobs); each environment reply appends only the template's delta
(``env_mask`` 0): the new rendering's text after the text the held ids stand for. When the template
rewrites history, so that the held text is no longer a prefix of the new rendering (Qwen3's
template drops earlier ``<think>`` blocks, for example), the tracker closes the current sample and
starts a new one from the full new rendering, so ids always match what the generator saw.

Assistant turns are rendered with their raw sampled text as ``content`` (no structured
``tool_calls``), so the template reproduces exactly what the model wrote; a template that renders
a tool-using history only with structured calls (gpt-oss, Mistral v0.3) gets past calls parsed
(:mod:`llm_gym.policies.template_history`) and writes them its own way, which starts a new
sample at such a turn. Either way the ids trained are the sampled ones, as sampled.

An opening (the messages an episode starts from) is rendered and tokenized once per tokenizer
and content (:class:`OpeningCache`): a group's episodes open alike, so each distinct opening is
rendered and encoded once (its cost: ``benchmarks/results/README.md``).
"""

from __future__ import annotations

import json
import threading
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from llm_gym.actions import ActionFormat, get_action_format
from llm_gym.core.types import Message, ToolSpec
from llm_gym.errors import ChatTemplateError, TokenizerError
from llm_gym.policies.chat import prefix_past_limit, render_chat
from llm_gym.policies.template_tools import check_template_tools, layout_for

__all__ = ["OpeningCache", "TokenSample", "TokenTracker", "episode_to_samples"]


@dataclass
class TokenSample:
    """One training sequence: a prompt and a completion with a loss mask.

    Shapes: ``completion_ids``, ``env_mask``, ``logprobs``, ``turn_index`` and
    ``policy_versions`` all have length T. Its rewards are its episode's
    (:attr:`~llm_gym.rollout.Episode.reward`, :attr:`~llm_gym.rollout.Episode.per_turn_rewards`,
    indexed by ``turn_index``); the trainer's batch adds the advantages.
    """

    prompt_ids: list[int]
    """The context before the first sampled token (mask 0, never trained)."""
    completion_ids: list[int] = field(default_factory=list)
    """Everything after the prompt: sampled tokens and the environment's deltas, interleaved."""
    env_mask: list[int] = field(default_factory=list)
    """1 = sampled by the policy (trained), 0 = context from the environment."""
    logprobs: list[float] = field(default_factory=list)
    """The sampler's logprob of each sampled token; 0.0 under environment tokens."""
    turn_index: list[int] = field(default_factory=list)
    """The assistant turn each completion token belongs to; -1 under environment tokens."""
    policy_versions: list[int] = field(default_factory=list)
    """The weight version that sampled each token (async training); -1 under environment
    tokens and where the policy's weights are not versioned."""

    @property
    def num_policy_tokens(self) -> int:
        """Tokens that train (``env_mask`` 1)."""
        return sum(self.env_mask)


def _encode(tokenizer: Any, text: str) -> list[int]:
    try:
        return list(tokenizer.encode(text, add_special_tokens=False))
    except Exception as exc:
        raise TokenizerError(f"the tokenizer could not encode the episode's text: {exc}") from exc


def _decode(tokenizer: Any, ids: list[int]) -> str:
    try:
        return tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    except Exception as exc:
        raise TokenizerError(f"the tokenizer could not decode sampled ids: {exc}") from exc


class OpeningCache:
    """Rendered text and ids of recent openings, per tokenizer (held weakly), keyed by the
    content that decides them: the messages, tool specs, template arguments and action format
    (it writes the tools of a template that cannot) as JSON, the chat template itself and the
    vocabulary's size (tokens added later change the ids). Content that is not plain JSON is
    never cached, nor a rendering longer than ``max_chars`` (memory stays bounded whatever an
    environment opens with). Thread-safe. A template that reads the clock (``strftime_now``)
    keeps its first render's date while the opening is cached."""

    def __init__(self, size: int = 256, max_chars: int = 16_384) -> None:
        self.size = size
        self.max_chars = max_chars
        self._lock = threading.Lock()
        self._by_tokenizer: weakref.WeakKeyDictionary[Any, OrderedDict[str, Any]]
        self._by_tokenizer = weakref.WeakKeyDictionary()

    @staticmethod
    def key(
        tokenizer: Any,
        messages: Sequence[Message],
        tool_specs: Sequence[ToolSpec],
        kwargs: dict[str, Any],
        action_format: str = "hermes",
    ) -> str | None:
        """The cache key, or None when any part is not plain JSON."""
        template = getattr(tokenizer, "chat_template", None)
        try:
            content = json.dumps([messages, tool_specs, kwargs, action_format], sort_keys=True)
            if not isinstance(template, str):  # None, or a dict of named templates
                template = json.dumps(template, sort_keys=True)
            vocabulary = len(tokenizer)
        except (TypeError, ValueError):
            return None
        return f"{hash(template)}:{vocabulary}:{content}"

    def get(self, tokenizer: Any, key: str) -> tuple[str, tuple[int, ...]] | None:
        with self._lock:
            try:
                entries = self._by_tokenizer.get(tokenizer)
            except TypeError:  # a tokenizer that cannot be held weakly
                return None
            found = entries.get(key) if entries is not None else None
            if found is not None:
                entries.move_to_end(key)
            return found

    def put(self, tokenizer: Any, key: str, value: tuple[str, tuple[int, ...]]) -> None:
        if len(value[0]) > self.max_chars:
            return
        with self._lock:
            try:
                entries = self._by_tokenizer.setdefault(tokenizer, OrderedDict())
            except TypeError:
                return
            entries[key] = value
            entries.move_to_end(key)
            while len(entries) > self.size:
                entries.popitem(last=False)


OPENINGS = OpeningCache()
"""The openings every :class:`TokenTracker` shares."""


class TokenTracker:
    """The token stream of one episode, built turn by turn (see the module docstring)."""

    def __init__(
        self,
        tokenizer: Any,
        tool_specs: Sequence[ToolSpec] | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        *,
        action_format: str | ActionFormat = "hermes",
        template_tools: str = "fallback",
    ) -> None:
        self.tokenizer = tokenizer
        self.tool_specs = list(tool_specs or [])
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.action_format = get_action_format(action_format)
        """Writes the tools as text for a template that cannot render them."""
        self.template_tools = check_template_tools(template_tools)
        layout_for(  # refused here under "require", before any opening comes from the cache
            tokenizer,
            self.tool_specs,
            template_tools=self.template_tools,
            chat_template_kwargs=self.chat_template_kwargs,
            action_format=self.action_format,
        )
        self.samples: list[TokenSample] = []
        self._text = ""
        self._raw: list[Message] = []
        self.overflow_tokens: int | None = None
        """When an environment reply was too long for the limit given to
        :meth:`add_environment`: the tokens the context would have held at least (its tokens
        so far and those of the reply's prefix that was read); else None."""

    def _render(self, messages: Sequence[Message]) -> str:
        """The template's text for ``messages``; whatever the template raises is a
        :class:`~llm_gym.errors.ChatTemplateError` (its episode ends as ``TEMPLATE``)."""
        try:
            return render_chat(
                self.tokenizer,
                messages,
                self.tool_specs,
                add_generation_prompt=True,
                chat_template_kwargs=self.chat_template_kwargs,
                action_format=self.action_format,
                template_tools=self.template_tools,
            )
        except ChatTemplateError:
            raise
        except Exception as exc:
            raise ChatTemplateError(
                f"the chat template failed to render the episode's conversation: "
                f"{type(exc).__name__}: {exc}"
            ) from exc

    def start(self, messages: Sequence[Message]) -> None:
        """Begin with the opening messages."""
        self._raw = list(messages)
        key = OPENINGS.key(
            self.tokenizer,
            self._raw,
            self.tool_specs,
            self.chat_template_kwargs,
            self.action_format.name,
        )
        found = OPENINGS.get(self.tokenizer, key) if key is not None else None
        if found is None:
            text = self._render(self._raw)
            found = (text, tuple(_encode(self.tokenizer, text)))
            if key is not None:
                OPENINGS.put(self.tokenizer, key, found)
        self._text = found[0]
        self.samples = [TokenSample(prompt_ids=list(found[1]))]

    @property
    def current(self) -> TokenSample:
        """The sample being built."""
        return self.samples[-1]

    @property
    def context_ids(self) -> list[int]:
        """The exact ids the policy continues from: the current sample's prompt and completion."""
        sample = self.current
        return sample.prompt_ids + sample.completion_ids

    @property
    def context_length(self) -> int:
        """``len(context_ids)`` without building the list."""
        return len(self.current.prompt_ids) + len(self.current.completion_ids)

    def add_generation(
        self,
        token_ids: Sequence[int],
        logprobs: Sequence[float] | None,
        text: str,
        turn: int,
        policy_versions: Sequence[int] | None = None,
    ) -> None:
        """Append one assistant turn: the sampled ids (mask 1), their logprobs and weight
        versions (when known), and its raw text."""
        sample = self.current
        sample.completion_ids.extend(int(t) for t in token_ids)
        sample.env_mask.extend([1] * len(token_ids))
        lp = list(logprobs) if logprobs is not None else [0.0] * len(token_ids)
        if len(lp) != len(token_ids):
            raise ValueError(
                f"Expected one logprob per sampled token, got {len(lp)} for {len(token_ids)}."
            )
        versions = list(policy_versions) if policy_versions is not None else None
        if versions is not None and len(versions) != len(token_ids):
            raise ValueError(
                f"Expected one policy version per sampled token, got {len(versions)} for "
                f"{len(token_ids)}."
            )
        sample.logprobs.extend(float(x) for x in lp)
        sample.turn_index.extend([turn] * len(token_ids))
        sample.policy_versions.extend(
            [-1] * len(token_ids) if versions is None else [int(v) for v in versions]
        )
        self._text += _decode(self.tokenizer, list(token_ids))
        self._raw.append({"role": "assistant", "content": text})

    def add_environment(self, messages: Sequence[Message], limit: int | None = None) -> bool:
        """Append the environment's reply. Returns True when it started a new sample.

        With a ``limit`` (tokens of context), a reply that a prefix of its text already shows
        too long for it is not tokenized further: :attr:`overflow_tokens` is set and the stream
        stays as it was. The tokenizer reads a bounded prefix, so a reply of any size costs the
        event loop at most the encoding of that prefix."""
        self._raw.extend(messages)
        full = self._render(self._raw)
        if full.startswith(self._text):
            room = None if limit is None else limit - self.context_length
            past = (
                None
                if room is None
                else prefix_past_limit(self.tokenizer, full[len(self._text) :], room)
            )
            if past is not None:
                self.overflow_tokens = self.context_length + past[1]
                return False
            delta = _encode(self.tokenizer, full[len(self._text) :])
            sample = self.current
            sample.completion_ids.extend(delta)
            sample.env_mask.extend([0] * len(delta))
            sample.logprobs.extend([0.0] * len(delta))
            sample.turn_index.extend([-1] * len(delta))
            sample.policy_versions.extend([-1] * len(delta))
            self._text = full
            return False
        past = None if limit is None else prefix_past_limit(self.tokenizer, full, limit)
        if past is not None:
            self.overflow_tokens = past[1]
            return False
        self._text = full
        self.samples.append(TokenSample(prompt_ids=_encode(self.tokenizer, full)))
        return True

    def finish(self) -> list[TokenSample]:
        """The samples with at least one sampled token."""
        return [s for s in self.samples if s.num_policy_tokens > 0]


def episode_to_samples(
    episode: Any,
    tokenizer: Any,
    *,
    tool_specs: Sequence[ToolSpec] | None = None,
    chat_template_kwargs: dict[str, Any] | None = None,
    template_tools: str = "fallback",
) -> list[TokenSample]:
    """Training samples of a finished :class:`~llm_gym.rollout.Episode`.

    Replays the episode through a :class:`TokenTracker`: turns that carry sampled ``token_ids``
    use them as they are (with their logprobs); turns from policies without tokens (oracle,
    HTTP endpoints) are tokenized from their text, followed by the template's end-of-turn token.
    When the loop already built samples with the same tokenizer, those are returned.
    """
    if episode.samples:
        return list(episode.samples)
    specs = tool_specs if tool_specs is not None else episode.tool_specs
    tracker = TokenTracker(
        tokenizer,
        specs,
        chat_template_kwargs,
        action_format=episode.action_format,
        template_tools=template_tools,
    )
    opening = episode.messages[: episode.num_opening_messages]
    tracker.start(opening)
    for index, turn in enumerate(episode.turns):
        if turn.token_ids is not None:
            ids, logprobs, versions = turn.token_ids, turn.logprobs, turn.policy_versions
        else:
            ids, logprobs = _encode(tokenizer, turn.text) + _end_of_turn(tokenizer), None
            versions = None
        tracker.add_generation(ids, logprobs, turn.text, index, versions)
        if turn.env_messages:
            tracker.add_environment(turn.env_messages)
    return tracker.finish()


def _end_of_turn(tokenizer: Any) -> list[int]:
    eos = getattr(tokenizer, "eos_token_id", None)
    return [int(eos)] if eos is not None else []
