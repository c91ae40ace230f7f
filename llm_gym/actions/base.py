"""The action-format interface, its parse results and the format registry.

An *action format* is the contract between an environment and an LLM about how the model writes
tool calls in plain text. It works in both directions:

* :meth:`ActionFormat.parse` turns the model's raw assistant text into a structured assistant
  :class:`~llm_gym.core.types.Message` (with OpenAI-style ``tool_calls`` when it called tools).
  Parsing never raises on model output: malformed tool calls come back as a
  :attr:`ParseKind.PARSE_FAILURE` with a short reason the environment can show to the model.
* The ``render_*`` methods turn tool specs, tool calls and tool results back into the text the
  model sees, so prompts and few-shot transcripts use exactly the syntax ``parse`` accepts.

The rules every built-in format shares (what a tool call is, its ids, the JSON encoding the model
sees) live in :mod:`llm_gym.actions.codec`.
"""

from __future__ import annotations

import abc
import difflib
import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from llm_gym.actions.grammar import GrammarUnsupportedError, Lark
from llm_gym.core.types import Message, ToolCall, ToolSpec
from llm_gym.errors import InvalidArgumentError, UnknownNameError

__all__ = [
    # results
    "ParseKind",
    "ParsedAction",
    # interface
    "ActionFormat",
    # registry
    "ACTION_FORMATS",
    "register_action_format",
    "get_action_format",
    # limits
    "MAX_TOOL_CALLS",
]

MAX_TOOL_CALLS = 32
"""The most tool calls one assistant message may hold; more is a parse failure."""


class ParseKind(enum.StrEnum):
    """What :meth:`ActionFormat.parse` found in the model's text."""

    FINAL_ANSWER = "final_answer"
    """A plain reply without any tool call."""
    TOOL_CALLS = "tool_calls"
    """One or more well-formed tool calls."""
    PARSE_FAILURE = "parse_failure"
    """Text that looked like a tool call but could not be parsed."""


@dataclass(frozen=True)
class ParsedAction:
    """The outcome of parsing one assistant reply."""

    kind: ParseKind
    """Whether the reply is a final answer, tool calls, or a failed tool call."""
    message: Message
    """Always a valid assistant message: ``{"role": "assistant", "content": str}``, plus
    ``"tool_calls"`` (a non-empty list) only when :attr:`kind` is :attr:`ParseKind.TOOL_CALLS`.
    For a final answer the content is the answer; for tool calls it is the text outside the calls
    (format-specific, often empty); for a failure it is the raw text."""
    error: str | None = None
    """For :attr:`ParseKind.PARSE_FAILURE`: a short reason, readable by a person or the model
    (e.g. ``"unclosed <tool_call> tag"``). ``None`` otherwise."""

    def __post_init__(self) -> None:
        if not isinstance(self.kind, ParseKind):
            raise InvalidArgumentError(f"kind must be a ParseKind, got {self.kind!r}")
        if self.message.get("role") != "assistant" or not isinstance(
            self.message.get("content"), str
        ):
            raise InvalidArgumentError(
                "message must be an assistant message with string content, "
                f"got {self.message!r:.200}"
            )
        has_calls = "tool_calls" in self.message
        if has_calls != (self.kind is ParseKind.TOOL_CALLS):
            raise InvalidArgumentError(
                f"message must have 'tool_calls' exactly when kind is TOOL_CALLS; kind={self.kind}"
            )
        if (self.error is not None) != (self.kind is ParseKind.PARSE_FAILURE):
            raise InvalidArgumentError(
                f"error must be set exactly when kind is PARSE_FAILURE; kind={self.kind}"
            )

    @property
    def is_final(self) -> bool:
        """Whether the reply is a final answer (no tool call)."""
        return self.kind is ParseKind.FINAL_ANSWER

    @property
    def is_tool_calls(self) -> bool:
        """Whether the reply holds well-formed tool calls."""
        return self.kind is ParseKind.TOOL_CALLS

    @property
    def is_failure(self) -> bool:
        """Whether the reply tried to call a tool but could not be parsed."""
        return self.kind is ParseKind.PARSE_FAILURE

    @property
    def tool_calls(self) -> list[ToolCall]:
        """The parsed tool calls; ``[]`` unless :attr:`kind` is :attr:`ParseKind.TOOL_CALLS`."""
        return list(self.message.get("tool_calls", []))

    @classmethod
    def final(cls, content: str) -> ParsedAction:
        """A final answer with ``content``."""
        if type(content) is not str:
            return cls(ParseKind.FINAL_ANSWER, {"role": "assistant", "content": content})
        # The hot path of every plain reply: valid by construction, so skip __post_init__.
        parsed = object.__new__(cls)
        _set = object.__setattr__
        _set(parsed, "kind", ParseKind.FINAL_ANSWER)
        _set(parsed, "message", {"role": "assistant", "content": content})
        _set(parsed, "error", None)
        return parsed

    @classmethod
    def failure(cls, raw_text: str, error: str) -> ParsedAction:
        """A parse failure of ``raw_text`` because of ``error``."""
        return cls(ParseKind.PARSE_FAILURE, {"role": "assistant", "content": raw_text}, error)

    @classmethod
    def calls(cls, tool_calls: list[ToolCall], content: str = "") -> ParsedAction:
        """Well-formed ``tool_calls`` with the surrounding text ``content``."""
        message: Message = {"role": "assistant", "content": content, "tool_calls": tool_calls}
        return cls(ParseKind.TOOL_CALLS, message)


# ---------------------------------------------------------------------------------------------
# The interface.
# ---------------------------------------------------------------------------------------------


class ActionFormat(abc.ABC):
    """How a model writes tool calls in text: parsing and rendering.

    Formats are stateless; one instance can serve any number of environments and threads.
    """

    name: ClassVar[str]
    """The registry name, e.g. ``"hermes"``."""

    MARKERS: ClassVar[tuple[str, ...]] = ()
    """Distinctive strings that a chat template teaching this format writes into its output: in
    the prompt it renders for tools, or in an assistant tool-call turn it renders (hermes
    ``<tool_call>``, mistral ``[TOOL_CALLS]``). :meth:`signature` tests them; empty (the default)
    means no template is recognised as teaching this format."""

    @classmethod
    def signature(cls, rendered: str) -> bool:
        """Whether a chat template's rendered output shows that the template teaches this format.

        Detection reads the text a template renders for a probe conversation (tool specs, an
        assistant tool call, a tool result), never the model's name. Several formats can share
        a marker (Qwen3-Coder's ``<tool_call>`` wraps XML, Qwen2.5's wraps JSON), so each
        format's test is specific enough that at most one built-in format matches one family's
        output; a probe should give its tool a description (a bare ``{"name": ...,
        "parameters": ...}`` spec reads like a Llama 3 call).

        Args:
            rendered: The template's output.

        Returns:
            By default, whether any of :attr:`MARKERS` occurs in ``rendered``.
        """
        return any(marker in rendered for marker in cls.MARKERS)

    def with_tool_specs(self, tool_specs: Sequence[ToolSpec]) -> ActionFormat:
        """This format, for parsing the replies of an episode that offers ``tool_specs``.

        Most formats parse without the tools and return ``self``. A format whose parsing reads
        the tools' schemas (``qwen3_coder`` types each parameter value by its JSON schema)
        returns a copy bound to them; callers that know the episode's tools call this once and
        parse with the result.

        Args:
            tool_specs: The episode's OpenAI-style tool specs.

        Returns:
            A format with the same :attr:`name`.
        """
        del tool_specs  # parsing this format needs no tool specs
        return self

    GUARDS_MARKUP: ClassVar[bool] = False
    """Whether a call closes with a tag that a raw ``<`` in an argument string could forge: the
    grammar of a call then keeps ``<`` out of plain argument strings
    (:func:`~llm_gym.actions.grammar.guard_markup`)."""

    TEXT_BEFORE_CALLS: ClassVar[bool] = False
    """Whether a reply may hold text before its calls (:meth:`text_grammar`)."""

    def call_grammar(
        self, name: str, schema: Mapping[str, Any], rule: str, lark: Lark
    ) -> list[str]:
        """The lark rules (:mod:`llm_gym.actions.grammar`) that define ``rule``: one call of the
        tool ``name`` whose arguments follow the JSON ``schema``, as this format writes it.

        Raises:
            GrammarUnsupportedError: The format cannot write a forced call (the default), or
                cannot write this name.
        """
        del name, schema, rule, lark
        raise GrammarUnsupportedError(
            f"the {self.name!r} action format writes no grammar of a tool call, so tool_choice "
            "'required' or a named tool and strict tools cannot be enforced with it; use a "
            "built-in format (hermes, json, llama3_json, mistral, qwen3_coder, harmony)."
        )

    def calls_grammar(self, call: str, parallel: bool, lark: Lark) -> str:
        """A lark expression matching the calls of one reply, each matching the rule ``call``
        (one call when ``parallel`` is false). The default: calls joined by newlines."""
        return f"{call} ({lark.text(chr(10))} {call})*" if parallel else call

    def text_grammar(self) -> str | None:
        """A lark terminal matching a reply (or the text before its calls, when
        :attr:`TEXT_BEFORE_CALLS`) that holds no call; None (the default): the format cannot
        say (strict tools are then enforced only under a forced choice)."""
        return None

    @abc.abstractmethod
    def parse(self, text: str, *, call_id_prefix: str | None = None) -> ParsedAction:
        """Parse the model's raw assistant text.

        Never raises on any ``str`` input; malformed tool calls give a parse failure. Given
        text that encodes to UTF-8, the message encodes too: a surrogate written as a JSON
        escape (``"\\ud800"``) in a name, an argument or an answer is decoded to U+FFFD
        (:func:`llm_gym.core.text.clean_text`), so the episode driver can echo it to a policy.

        Args:
            text: The raw assistant text.
            call_id_prefix: Tool-call ids become ``f"{call_id_prefix}_{i}"``; ``None`` draws a
                fresh random prefix, so ids are globally unique.

        Returns:
            The parsed action.

        Raises:
            InvalidArgumentError: ``text`` is not a ``str``.
        """

    @abc.abstractmethod
    def render_tool_calls(self, tool_calls: Sequence[ToolCall], content: str = "") -> str:
        """The assistant text a model would emit for these tool calls.

        Args:
            tool_calls: OpenAI-style tool calls.
            content: Text the model wrote besides the calls (first, when the format keeps it).

        Returns:
            Text that :meth:`parse` turns back into the same calls.

        Raises:
            InvalidArgumentError: A tool call is malformed.
        """

    @abc.abstractmethod
    def render_tool_specs(self, tool_specs: Sequence[ToolSpec]) -> str:
        """The instructions and tool list to put into a system prompt.

        Args:
            tool_specs: OpenAI-style tool specs.

        Returns:
            The text; an empty string when there are no tools.
        """

    def render_message(self, message: Message) -> str:
        """The text of an assistant message, as the model would have written it.

        Args:
            message: An assistant message.

        Returns:
            :meth:`render_tool_calls` of its tool calls if it has any, else its content.

        Raises:
            InvalidArgumentError: The message is not an assistant message.
        """
        if message.get("role") != "assistant":
            raise InvalidArgumentError(
                f"render_message takes an assistant message, got role {message.get('role')!r}"
            )
        content = message.get("content") or ""
        tool_calls = message.get("tool_calls")
        if tool_calls:
            return self.render_tool_calls(tool_calls, content)
        return content

    def render_tool_result(self, message: Message) -> str:
        """The text the model sees for a tool result.

        Args:
            message: A ``role="tool"`` message.

        Returns:
            The rendered result.

        Raises:
            InvalidArgumentError: The message is not a tool message.
        """
        _require_tool_message(message)
        return message.get("content") or ""

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def _require_tool_message(message: Message) -> None:
    if message.get("role") != "tool":
        raise InvalidArgumentError(
            f"render_tool_result takes a role='tool' message, got role {message.get('role')!r}"
        )


# ---------------------------------------------------------------------------------------------
# The registry.
# ---------------------------------------------------------------------------------------------

ACTION_FORMATS: dict[str, type[ActionFormat]] = {}
"""Registered action formats by name."""

_F = TypeVar("_F", bound=type[ActionFormat])


def register_action_format(cls: _F) -> _F:
    """Class decorator: register an :class:`ActionFormat` subclass under ``cls.name``.

    Registering the same class again is a no-op.

    Args:
        cls: The format class.

    Returns:
        ``cls`` unchanged.

    Raises:
        InvalidArgumentError: ``cls`` is not an ActionFormat subclass, has no non-empty string
            ``name``, or a different class is already registered under that name.
    """
    if not (isinstance(cls, type) and issubclass(cls, ActionFormat)):
        raise InvalidArgumentError(f"only ActionFormat subclasses can be registered, got {cls!r}")
    name = cls.__dict__.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidArgumentError(
            f"{cls.__qualname__} must define its own non-empty string class attribute 'name'"
        )
    existing = ACTION_FORMATS.get(name)
    if existing is not None and existing is not cls:
        same_origin = (existing.__module__, existing.__qualname__) == (
            cls.__module__,
            cls.__qualname__,
        )
        if not same_origin:  # a reloaded module may re-register its own class
            raise InvalidArgumentError(
                f"action format name {name!r} is already taken by "
                f"{existing.__module__}.{existing.__qualname__}; choose another name"
            )
    ACTION_FORMATS[name] = cls
    return cls


def get_action_format(name: str | ActionFormat) -> ActionFormat:
    """Look up an action format.

    Args:
        name: A registered name (``"hermes"``, ``"json"``), or an :class:`ActionFormat` instance,
            which is returned as it is.

    Returns:
        A format instance.

    Raises:
        UnknownNameError: No format has that name; the message lists the names and suggests the
            closest one.
        InvalidArgumentError: ``name`` is neither a string nor an ActionFormat.
    """
    if isinstance(name, ActionFormat):
        return name
    if not isinstance(name, str):
        raise InvalidArgumentError(
            f"action format must be a name or an ActionFormat instance, got {type(name).__name__}"
        )
    cls = ACTION_FORMATS.get(name)
    if cls is None:
        known = sorted(ACTION_FORMATS)
        message = f"unknown action format {name!r}; known formats: {', '.join(map(repr, known))}."
        folded = {k.lower(): k for k in known}
        close = difflib.get_close_matches(name.strip().lower(), list(folded), n=1, cutoff=0.5)
        if close:
            message += f" Did you mean {folded[close[0]]!r}?"
        raise UnknownNameError(message)
    return cls()
