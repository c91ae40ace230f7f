"""Valid text: every string that crosses between an environment and a policy encodes to UTF-8.

A Python ``str`` may hold *surrogates* (the code points U+D800 to U+DFFF, which UTF-8 cannot
encode): an exception message that quotes bytes decoded with ``surrogateescape``, a JSON string
with a ``"\\ud800"`` escape, a file name. Such a string does not encode to UTF-8, so a chat
template, a tokenizer or an HTTP client given it fails, and the failure belongs to no one
episode. The episode driver (:mod:`llm_gym.rollout.driver`) passes every message an environment
adds, the tool specs, and the model's own text through :func:`clean_message` /
:func:`clean_text`, so what reaches a policy (or an environment) is always valid.

The rule: every surrogate code point becomes U+FFFD (the replacement character), one for one.
(A ``str`` never needs a surrogate: JSON's escaped pairs and UTF-16 decoders give the astral
character itself, and the pair as two code points does not encode to UTF-8 either.) Everything
else is kept, NUL characters and other control characters included: they are valid UTF-8 and
valid JSON (``\\u0000``), and an environment may mean them (a program's output).

Checking is cheap: an ASCII string is accepted by ``str.isascii`` (one pass in C, no copy), any
other string by one regular-expression scan for a surrogate (a character class, linear); only a
string that holds one is copied.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from llm_gym.core.types import FrozenMessage, Message, rebuild_nested

__all__ = ["REPLACEMENT_CHARACTER", "clean_json", "clean_message", "clean_messages", "clean_text"]

REPLACEMENT_CHARACTER = "\ufffd"
"""What a surrogate becomes."""

_SURROGATE = re.compile("[\ud800-\udfff]")


def _valid(text: str) -> bool:
    return text.isascii() or _SURROGATE.search(text) is None


_SCALARS = frozenset({int, float, bool, type(None)})


def _valid_value(value: Any) -> bool:
    """Whether every string in ``value`` (dict keys included) is valid; no copies.

    A loop over an explicit stack, not recursion: a JSON value nested as deeply as ``json.loads``
    allows (close to the recursion limit) is walked as easily as a flat one. A container met
    twice (shared, or holding itself) counts as invalid, so that :func:`_clean_value` copies
    the shared one and refuses the cycle.
    """
    kind = type(value)
    if kind is str:
        return value.isascii() or _SURROGATE.search(value) is None
    if kind in _SCALARS:
        return True
    stack = [value]
    seen: set[int] = set()
    while stack:
        item = stack.pop()
        if id(item) in seen:  # shared or a cycle: _clean_value copies the one, refuses the other
            return False
        seen.add(id(item))
        if type(item) is dict or isinstance(item, Mapping):
            for key, child in item.items():  # strings checked here: no push and pop for them
                if type(key) is str:
                    if not (key.isascii() or _SURROGATE.search(key) is None):
                        return False
                elif type(key) not in _SCALARS:
                    stack.append(key)
                if type(child) is str:
                    if not (child.isascii() or _SURROGATE.search(child) is None):
                        return False
                elif type(child) not in _SCALARS:
                    stack.append(child)
        elif isinstance(item, list | tuple):
            for child in item:
                if type(child) is str:
                    if not (child.isascii() or _SURROGATE.search(child) is None):
                        return False
                elif type(child) not in _SCALARS:
                    stack.append(child)
        elif isinstance(item, str) and not _valid(item):
            return False
    return True


def clean_text(text: str) -> str:
    """``text`` itself when it encodes to UTF-8, else a copy with each surrogate replaced by
    U+FFFD (one substitution by a character class: linear; a scan in C between surrogates).

    Example:
        >>> clean_text("ok")
        'ok'
        >>> clean_text("bad \\ud800 byte")
        'bad \\ufffd byte'
    """
    if _valid(text):
        return text
    return _SURROGATE.sub(REPLACEMENT_CHARACTER, text)


def _clean_leaf(value: Any) -> Any:
    return clean_text(str(value)) if isinstance(value, str) else value


def _clean_build(container: Any, cleaned: list[Any]) -> Any:
    if isinstance(container, Mapping):
        pairs = zip(cleaned[::2], cleaned[1::2], strict=True)
        return FrozenMessage(pairs) if isinstance(container, FrozenMessage) else dict(pairs)
    return cleaned if isinstance(container, list) else tuple(cleaned)


def _clean_value(value: Any) -> Any:
    """A copy of ``value`` with every string cleaned (dicts, lists and tuples are walked and
    copied, at any depth; other values are kept as they are).

    Raises:
        InvalidArgumentError: ``value`` contains itself.
    """
    return rebuild_nested(value, _clean_leaf, _clean_build)


def clean_json(value: Any) -> Any:
    """``value`` (a JSON-like structure: tool specs, arguments) itself when every string in it,
    keys included, encodes to UTF-8; else a copy with the strings cleaned by :func:`clean_text`.

    Example:
        >>> clean_json({"name": "f", "description": "x\\udc80"})
        {'name': 'f', 'description': 'x\\ufffd'}
    """
    return value if _valid_value(value) else _clean_value(value)


def clean_message(message: Message) -> Message:
    """``message`` itself when every string in it (content, tool calls, names, ids) encodes to
    UTF-8; else a cleaned copy (a :class:`~llm_gym.core.types.FrozenMessage` stays frozen).

    Example:
        >>> clean_message({"role": "tool", "content": "tool_error: \\udcff"})
        {'role': 'tool', 'content': 'tool_error: \\ufffd'}
    """
    for value in message.values():  # the common case: every value is a valid string
        if type(value) is str:
            if not (value.isascii() or _SURROGATE.search(value) is None):
                break
        elif not _valid_value(value):
            break
    else:
        return message
    return _clean_value(message)  # type: ignore[no-any-return]


def clean_messages(messages: Sequence[Message], start: int = 0) -> list[Message] | None:
    """None when the messages from ``start`` on are all valid (nothing to do), else a new list:
    the messages before ``start`` as they are, the rest through :func:`clean_message`.

    Example:
        >>> clean_messages([{"role": "user", "content": "hi"}]) is None
        True
        >>> clean_messages([{"role": "user", "content": "\\ud800"}])
        [{'role': 'user', 'content': '\\ufffd'}]
    """
    index, end = start, len(messages)
    while index < end:  # runs on every step: a plain loop, no slice, no call per message
        message = messages[index]
        index += 1
        for value in message.values():
            if type(value) is not str or not value.isascii():
                break
        else:
            continue  # all ASCII strings: valid
        if clean_message(message) is not message:
            index -= 1
            return [*messages[:index], *(clean_message(m) for m in messages[index:])]
    return None
