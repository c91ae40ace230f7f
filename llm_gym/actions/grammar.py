"""Grammars of assistant replies: a forced or named tool call, JSON output, strict arguments.

Constrained decoding (:mod:`llm_gym.policies.constraint`) follows a grammar written here, in the
lark dialect of llguidance (its ``%json {schema}`` rule matches the JSON a schema allows; ``<[N]>``
matches the special token of id ``N``). Building a grammar is pure text work; no library is needed
until it is compiled.

Every action format writes one call of a tool in its own syntax
(:meth:`~llm_gym.actions.base.ActionFormat.call_grammar`) and joins several calls its own way
(:meth:`~llm_gym.actions.base.ActionFormat.calls_grammar`); :func:`reply_grammar` composes them:

* a forced reply (``tool_choice`` ``"required"``, or one tool named): the reply is the calls and
  nothing else (one call when ``parallel`` is false or a tool is named), each call's arguments
  following its tool's schema;
* ``auto`` with a JSON answer (``response_format``): the calls, or the JSON answer;
* ``auto`` with ``strict`` tools and no JSON answer: text with no call in it, then optionally
  calls (text before calls only in the formats that keep it); tools without ``strict`` get any
  JSON object as arguments. A format that cannot say what text holds no call (``harmony``)
  refuses this;
* ``none`` (or no tools) with a JSON answer: the JSON answer alone.

Formats that close a call with a tag (``hermes``, ``qwen3_coder``, ``harmony``) write their
arguments' strings without a raw ``<`` (a string schema without its own ``pattern``, ``format``,
``enum`` or ``const`` gets the pattern :data:`NO_MARKUP`), so no argument can close the call early.

A tool's argument object takes only the properties its schema declares unless the schema says
otherwise (:func:`closed_objects`: ``additionalProperties`` false where it is absent, as OpenAI's
strict mode and vLLM's xgrammar backend do), so a forced call cannot run on with invented keys.

Schemas are bounded before any compiler sees them (:func:`check_schema`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from llm_gym.errors import InvalidArgumentError

if TYPE_CHECKING:
    from llm_gym.actions.base import ActionFormat

__all__ = [
    "ANY_OBJECT",
    "MAX_GRAMMAR_TOOLS",
    "MAX_SCHEMA_CHARS",
    "MAX_SCHEMA_DEPTH",
    "NO_MARKUP",
    "GrammarUnsupportedError",
    "Lark",
    "ToolChoice",
    "ToolGrammar",
    "check_schema",
    "guard_markup",
    "parse_tool_choice",
    "reply_grammar",
    "tagged_parameters",
]

MAX_SCHEMA_CHARS = 32_768
"""The longest schema (its compact JSON) a grammar may hold."""
MAX_SCHEMA_DEPTH = 24
"""The deepest nesting of objects and lists in a schema."""
MAX_GRAMMAR_TOOLS = 128
"""The most tools one grammar may offer."""
NO_MARKUP = "^[^<]*$"
"""The pattern given to argument strings in formats whose calls close with a tag."""
ANY_OBJECT: dict[str, Any] = {"type": "object"}
"""The arguments of a tool without a schema (or not ``strict`` under ``auto``)."""
_LITERAL_KEYS = frozenset({"enum", "const", "default", "examples"})
_SCHEMA_MAPS = frozenset({"properties", "patternProperties", "$defs", "definitions"})


class GrammarUnsupportedError(InvalidArgumentError):
    """The action format cannot write the grammar asked for (see the message for another way)."""


@dataclass(frozen=True)
class ToolChoice:
    """A checked ``tool_choice``: ``mode`` ``"auto"``, ``"none"`` or ``"required"``, and the
    one tool a named choice forces (``mode`` ``"required"``)."""

    mode: str = "auto"
    name: str | None = None

    @property
    def forced(self) -> bool:
        """Whether the reply must be tool calls."""
        return self.mode == "required"


def parse_tool_choice(value: Any, tool_names: Sequence[str]) -> ToolChoice:
    """``tool_choice`` as OpenAI's API sends it: ``None``/``"auto"``, ``"none"``,
    ``"required"`` (``"any"`` too, Anthropic's and langchain's word) or
    ``{"type": "function", "function": {"name": NAME}}`` naming one of ``tool_names``.

    Raises:
        InvalidArgumentError: Another value; a name that is not a declared tool; a forced choice
            without tools.

    Example:
        >>> parse_tool_choice({"type": "function", "function": {"name": "add"}}, ["add"])
        ToolChoice(mode='required', name='add')
    """
    if value in (None, "auto"):
        return ToolChoice()
    if value == "none":
        return ToolChoice("none")
    if value in ("required", "any"):
        choice = ToolChoice("required")
    elif (
        isinstance(value, dict)
        and value.get("type", "function") == "function"
        and isinstance(value.get("function"), dict)
        and isinstance(value["function"].get("name"), str)
    ):
        choice = ToolChoice("required", value["function"]["name"])
    else:
        raise InvalidArgumentError(
            "tool_choice must be 'auto', 'none', 'required' or {'type': 'function', "
            f"'function': {{'name': ...}}}}, actual value: {str(value)[:80]!r}."
        )
    if not tool_names:
        raise InvalidArgumentError(
            f"tool_choice {str(value)[:80]!r} forces a tool call, but no tools are declared; "
            "declare the tools or send tool_choice 'auto'."
        )
    if choice.name is not None and choice.name not in tool_names:
        known = ", ".join(repr(n) for n in list(tool_names)[:20])
        raise InvalidArgumentError(
            f"tool_choice names the tool {choice.name[:80]!r}, which is not declared; the "
            f"declared tools are {known}."
        )
    return choice


def check_schema(schema: Any, where: str) -> dict[str, Any]:
    """``schema`` when it is a JSON object within :data:`MAX_SCHEMA_CHARS` and
    :data:`MAX_SCHEMA_DEPTH`.

    Raises:
        InvalidArgumentError: Anything else (the message names ``where``).
    """
    if not isinstance(schema, dict):
        raise InvalidArgumentError(
            f"{where} must be a JSON schema object, actual value: a {type(schema).__name__}."
        )
    stack: list[tuple[Any, int]] = [(schema, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_SCHEMA_DEPTH:
            raise InvalidArgumentError(
                f"{where} nests deeper than {MAX_SCHEMA_DEPTH} levels; flatten the schema."
            )
        children = value.values() if isinstance(value, dict) else value
        stack.extend((c, depth + 1) for c in children if isinstance(c, dict | list))
    size = len(json.dumps(schema, separators=(",", ":")))
    if size > MAX_SCHEMA_CHARS:
        raise InvalidArgumentError(
            f"{where} is {size:,} characters of JSON; at most {MAX_SCHEMA_CHARS:,} are accepted."
        )
    return schema


def guard_markup(schema: Any) -> Any:
    """A copy of ``schema`` whose plain string schemas (no ``pattern``, ``format``, ``enum`` nor
    ``const``) carry the pattern :data:`NO_MARKUP`.

    Example:
        >>> guard_markup({"type": "object", "properties": {"q": {"type": "string"}}})
        {'type': 'object', 'properties': {'q': {'type': 'string', 'pattern': '^[^<]*$'}}}
    """
    if isinstance(schema, list):
        return [guard_markup(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {
        key: value if key in _LITERAL_KEYS else guard_markup(value) for key, value in schema.items()
    }
    if schema.get("type") == "string" and not {"pattern", "format", "enum", "const"} & set(out):
        out["pattern"] = NO_MARKUP
    return out


def closed_objects(schema: Any) -> Any:
    """A copy of ``schema`` whose object schemas with ``properties`` and no
    ``additionalProperties`` take no other property.

    Example:
        >>> closed_objects({"type": "object", "properties": {"q": {"type": "object",
        ...     "properties": {}}}})["properties"]["q"]["additionalProperties"]
        False
        >>> "additionalProperties" in closed_objects({"type": "object"})
        False
    """
    if isinstance(schema, list):
        return [closed_objects(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in _LITERAL_KEYS:
            out[key] = value
        elif key in _SCHEMA_MAPS and isinstance(value, dict):  # names -> schemas
            out[key] = {name: closed_objects(sub) for name, sub in value.items()}
        else:
            out[key] = closed_objects(value)
    if isinstance(schema.get("properties"), dict) and "additionalProperties" not in schema:
        out["additionalProperties"] = False
    return out


JSON_STYLE: dict[str, Any] = {
    "whitespace_flexible": False,
    "item_separator": ", ",
    "key_separator": ": ",
    "lenient": True,
}
"""How ``%json`` writes JSON: ``json.dumps``'s separators and no other whitespace (what the
formats render); keywords the compiler does not implement are ignored (``lenient``)."""


@dataclass(frozen=True)
class Lark:
    """Writes grammar text for one tokenizer: ``tokens`` maps the text of each added token to
    its id and whether it is special. A format's marker that is a special token (Mistral's
    ``[TOOL_CALLS]``, harmony's ``<|channel|>``) is matched as that token; one that is an added
    token that is not special (Qwen's ``<tool_call>``) as that token or its spelled-out text;
    any other text as text."""

    tokens: Mapping[str, tuple[int, bool]] = field(default_factory=dict)

    def text(self, value: str) -> str:
        """A lark expression matching ``value`` (markers as above)."""
        parts: list[str] = []
        rest = value
        while rest:
            hits = [(rest.find(m), m) for m in self.tokens if m and m in rest]
            if not hits:
                parts.append(json.dumps(rest))
                break
            at, marker = min(hits, key=lambda hit: (hit[0], -len(hit[1])))
            if at:
                parts.append(json.dumps(rest[:at]))
            token_id, special = self.tokens[marker]
            parts.append(
                f"<[{token_id}]>" if special else f"(<[{token_id}]> | {json.dumps(marker)})"
            )
            rest = rest[at + len(marker) :]
        return " ".join(parts) or '""'

    @staticmethod
    def json(schema: Mapping[str, Any]) -> str:
        """A rule body matching the JSON ``schema`` allows, written in :data:`JSON_STYLE` (a
        rule of its own: ``%json``)."""
        styled = {**schema, "x-guidance": JSON_STYLE}
        return "%json " + json.dumps(styled, separators=(",", ":"))

    @staticmethod
    def free_text(*forbidden: str, first: str | None = None) -> str:
        """A terminal: any text holding none of ``forbidden``; with ``first`` (a regex class),
        empty or starting with a character of it."""
        text = r"/(.|\n)*/" if first is None else rf"/({first}(.|\n)*)?/"
        for marker in forbidden:
            escaped = "".join("\\" + c if c in _REGEX_META else c for c in marker)
            text += rf" & ~/(.|\n)*{escaped}(.|\n)*/"
        return text

    def json_call(self, rule: str, head: str, schema: Mapping[str, Any], tail: str) -> list[str]:
        """The rules of a call written ``head``, the JSON arguments, ``tail`` (texts), as rule
        ``rule`` (its arguments the rule ``{rule}_args``)."""
        return [
            f"{rule}_args: {self.json(schema)}",
            f"{rule}: {self.text(head)} {rule}_args {self.text(tail)}",
        ]


_REGEX_META = frozenset("\\.+*?()|[]{}^$#&-~/")


def tagged_parameters(rule: str, schema: Mapping[str, Any], lark: Lark) -> list[str]:
    """The rules of ``rule``: arguments as ``<parameter=KEY>`` blocks (Qwen3-Coder's), one per
    declared property in its order (the required ones always, the others optionally); a string
    value is raw text without ``<`` (one of its ``enum`` when all are strings), any other value
    JSON following its schema. A schema without
    ``properties``: any keys, each value raw text.

    Raises:
        GrammarUnsupportedError: A key holding ``<``, ``>`` or a newline.
    """
    close = lark.text("\n</parameter>\n")
    text_value = r"/[^<]*\n<\/parameter>\n/"  # one terminal: the text cannot eat the newline
    properties = schema.get("properties")
    if not isinstance(properties, dict) or not properties:
        opener = f"{lark.text('<parameter=')} /[^<>\\n]+/ {lark.text('>' + chr(10))}"
        return [f"{rule}: ({opener} {text_value})*"]
    required = schema.get("required") if isinstance(schema.get("required"), list) else []
    rules, parts = [], []
    for j, (key, sub) in enumerate(properties.items()):
        if not key.strip() or any(c in key for c in "<>\n"):
            raise GrammarUnsupportedError(
                "a parameter name in the qwen3_coder format must be non-blank without '<', '>' "
                f"or a newline, got {key!r:.200}; use another action format for such names"
            )
        value = f"{rule}_{j}"
        sub = sub if isinstance(sub, dict) else {}
        words = sub.get("enum", [sub["const"]] if "const" in sub else None)
        if isinstance(words, list) and words and all(isinstance(w, str) for w in words):
            choices = " | ".join(lark.text(w) for w in words if "<" not in w) or '""'
            rules.append(f"{value}: ({choices}) {close}")  # strings are written raw
        elif sub.get("type") == "string":
            rules.append(f"{value}: {text_value}")
        else:
            rules.append(f"{value}: {lark.json(sub)} {close}")
        piece = f"{lark.text(f'<parameter={key}>' + chr(10))} {value}"
        parts.append(piece if key in required else f"({piece})?")
    return [*rules, f"{rule}: {' '.join(parts)}"]


@dataclass(frozen=True)
class ToolGrammar:
    """One tool as a grammar offers it: its name, and the schema its arguments follow."""

    name: str
    schema: Mapping[str, Any] = field(default_factory=lambda: dict(ANY_OBJECT))


def reply_grammar(
    action_format: ActionFormat,
    tools: Sequence[ToolGrammar],
    *,
    choice: ToolChoice,
    parallel: bool = True,
    answer: Mapping[str, Any] | None = None,
    lark: Lark | None = None,
) -> str:
    """The grammar of a reply (see the module docstring), its rule ``start``.

    Args:
        action_format: Writes the calls.
        tools: The tools a call may name (a named choice keeps its own).
        choice: The checked ``tool_choice``.
        parallel: False: one call at most.
        answer: The schema of a JSON answer (``response_format``), when there is one.
        lark: The tokenizer's special tokens (None: every marker as text).

    Raises:
        GrammarUnsupportedError: The format cannot write the grammar (its message says why).
        InvalidArgumentError: More than :data:`MAX_GRAMMAR_TOOLS` tools; nothing to constrain
            (no calls allowed and no answer schema).
    """
    lark = lark or Lark()
    if choice.name is not None:  # a named choice: one call of that tool
        tools = [t for t in tools if t.name == choice.name]
        parallel = False
    calls = choice.mode != "none" and bool(tools)
    if len(tools) > MAX_GRAMMAR_TOOLS and calls:
        raise InvalidArgumentError(
            f"{len(tools)} tools cannot be offered by one grammar; at most {MAX_GRAMMAR_TOOLS}."
        )
    rules: list[str] = []
    if answer is not None:
        rules.append(f"answer: {lark.json(answer)}")
    if not calls:
        if answer is None:
            raise InvalidArgumentError("Expected tool calls or an answer schema to constrain.")
        return "\n".join(["start: answer", *rules])
    guard = action_format.GUARDS_MARKUP
    alternatives = []
    for i, tool in enumerate(tools):
        schema = closed_objects(guard_markup(tool.schema) if guard else tool.schema)
        rules.extend(action_format.call_grammar(tool.name, schema, f"call_{i}", lark))
        alternatives.append(f"call_{i}")
    rules.append(f"call: {' | '.join(alternatives)}")
    rules.append(f"calls: {action_format.calls_grammar('call', parallel, lark)}")
    if choice.forced:
        return "\n".join(["start: calls", *rules])
    if answer is not None:
        return "\n".join(["start: answer | calls", *rules])
    text = action_format.text_grammar()
    if text is None:
        raise GrammarUnsupportedError(
            f"the {action_format.name!r} action format cannot constrain strict tools' arguments "
            "while the model may also answer in text; send tool_choice 'required' (or a named "
            "tool), or declare the tools without strict."
        )
    rules.append(f"TEXT: {text}")
    if action_format.TEXT_BEFORE_CALLS:
        return "\n".join(["start: TEXT | TEXT calls", *rules])
    return "\n".join(["start: TEXT | calls", *rules])
