"""The ``input`` of a ``POST /v1/responses`` request (and its ``instructions``) as chat messages.

:func:`input_messages` reads them into the messages of :mod:`llm_gym.serving.chat_protocol`:

* ``instructions``: a system message first.
* ``input``: a string is one user message. A list holds items: ``message`` items (also without
  ``type``, OpenAI's "easy" form) with role ``user``, ``system``, ``developer`` or ``assistant``
  and content that is a string or ``input_text`` / ``output_text`` / ``refusal`` parts;
  ``function_call`` items (``call_id``, ``name``, ``arguments`` as a JSON string), joined to the
  assistant message before them as its ``tool_calls``; ``function_call_output`` items
  (``call_id``, ``output`` as a string or text parts), each a ``tool`` message (with the call's
  ``name``) for the call of that ``call_id``.
* Every ``function_call_output`` answers exactly one ``function_call`` earlier in ``input``, and
  every ``function_call`` is answered (OpenAI's rule); ``call_id`` values are unique.
* ``reasoning`` items are skipped (a reasoning model's; nothing of them reaches this model);
  ``item_reference`` items are refused (this server keeps no items), as is any other type.

Every refusal is a 400 naming the item's field (``input[3].call_id``). The work is linear in
the number of items.
"""

from __future__ import annotations

from typing import Any

from llm_gym.serving.protocol import bad_request

__all__ = ["NOT_KEPT", "input_messages", "required_string"]

NOT_KEPT = (
    "this server keeps no responses, conversations or prompts; send the whole conversation in "
    "'input' (earlier output items included) and omit it"
)
"""Why a reference to an earlier response, conversation, prompt or item is refused."""


def _text_parts(value: Any, field: str, kinds: tuple[str, ...]) -> str:
    """A string, or the text of a list of text parts of ``kinds``."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise bad_request(
            f"{field} must be a string or a list of content parts; got {type(value).__name__}",
            field,
        )
    texts = []
    for j, part in enumerate(value):
        where = f"{field}[{j}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in kinds:
            shown = kind if isinstance(kind, str) else type(part).__name__
            raise bad_request(
                f"{where} must be a text part ({', '.join(kinds)}); got {shown[:40]!r} (this "
                "server reads text only)",
                f"{where}.type" if isinstance(part, dict) else where,
            )
        key = "refusal" if kind == "refusal" else "text"
        if not isinstance(part.get(key), str):
            raise bad_request(f"{where}.{key} must be a string", f"{where}.{key}")
        texts.append(part[key])
    return "".join(texts)


def required_string(item: dict[str, Any], key: str, field: str, what: str) -> str:
    """``item[key]``, a non-empty string (``field``: the item's path; ``what``: what it names).

    Raises:
        APIError: 400 naming ``field.key``.
    """
    value = item.get(key)
    if not isinstance(value, str) or not value:
        raise bad_request(
            f"{field}.{key} is required: {what}; got {type(value).__name__}", f"{field}.{key}"
        )
    return value


class _Conversation:
    """Chat messages built item by item, with the calls still waiting for their outputs."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self.calls: dict[str, tuple[str, int]] = {}  # call_id: (name, item index)
        self.answered: set[str] = set()

    def message(self, item: dict[str, Any], field: str) -> None:
        role = item.get("role")
        if role not in ("user", "system", "developer", "assistant"):
            raise bad_request(
                f"{field}.role must be one of user, system, developer, assistant; got "
                f"{str(role)[:40]!r}",
                f"{field}.role",
            )
        kinds = ("input_text", "output_text", "refusal")
        content = _text_parts(item.get("content"), f"{field}.content", kinds)
        self.messages.append({"role": role, "content": content})

    def function_call(self, item: dict[str, Any], index: int) -> None:
        field = f"input[{index}]"
        call_id = required_string(item, "call_id", field, "the id its function_call_output answers")
        name = required_string(item, "name", field, "the function's name")
        arguments = item.get("arguments")
        if not isinstance(arguments, str):
            raise bad_request(
                f"{field}.arguments must be the arguments as a JSON string; got "
                f"{type(arguments).__name__}",
                f"{field}.arguments",
            )
        if call_id in self.calls:
            raise bad_request(
                f"{field}.call_id {call_id[:80]!r} is used by an earlier function_call "
                f"(input[{self.calls[call_id][1]}]); each call needs its own call_id",
                f"{field}.call_id",
            )
        self.calls[call_id] = (name, index)
        call = {
            "id": call_id,
            "type": "function",
            "function": {"name": name, "arguments": arguments},
        }
        last = self.messages[-1] if self.messages else None
        if last is not None and last["role"] == "assistant":
            last.setdefault("tool_calls", []).append(call)
        else:
            self.messages.append({"role": "assistant", "content": "", "tool_calls": [call]})

    def function_call_output(self, item: dict[str, Any], field: str) -> None:
        call_id = required_string(
            item, "call_id", field, "the call_id of the function_call it answers"
        )
        if call_id not in self.calls:
            raise bad_request(
                f"{field}.call_id {call_id[:80]!r} answers no function_call earlier in 'input'; "
                "send the function_call item (from the response's output) before its output",
                f"{field}.call_id",
            )
        if call_id in self.answered:
            raise bad_request(
                f"{field}.call_id {call_id[:80]!r} is answered by an earlier "
                "function_call_output; each call takes one output",
                f"{field}.call_id",
            )
        self.answered.add(call_id)
        output = _text_parts(item.get("output"), f"{field}.output", ("input_text", "output_text"))
        name = self.calls[call_id][0]
        self.messages.append(
            {"role": "tool", "tool_call_id": call_id, "name": name, "content": output}
        )

    def check_answered(self) -> None:
        for call_id, (name, index) in self.calls.items():
            if call_id not in self.answered:
                raise bad_request(
                    f"input[{index}] (function_call {name[:60]!r}, call_id {call_id[:80]!r}) has "
                    "no function_call_output; add one with this call_id after it",
                    f"input[{index}].call_id",
                )


def input_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    conversation = _Conversation()
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise bad_request(
                f"'instructions' must be a string; got {type(instructions).__name__}",
                "instructions",
            )
        conversation.messages.append({"role": "system", "content": instructions})
    value = body.get("input")
    if isinstance(value, str):
        conversation.messages.append({"role": "user", "content": value})
    elif isinstance(value, list):
        for i, item in enumerate(value):
            field = f"input[{i}]"
            if not isinstance(item, dict):
                raise bad_request(f"{field} must be an object (an input item)", field)
            kind = item.get("type", "message" if "role" in item else None)
            if kind == "message":
                conversation.message(item, field)
            elif kind == "function_call":
                conversation.function_call(item, i)
            elif kind == "function_call_output":
                conversation.function_call_output(item, field)
            elif kind == "item_reference":
                raise bad_request(f"{field} is an item_reference: {NOT_KEPT}", f"{field}.type")
            elif kind != "reasoning":
                raise bad_request(
                    f"{field}.type must be message, function_call, function_call_output or "
                    f"reasoning on this server; got {str(kind)[:40]!r}",
                    f"{field}.type",
                )
        conversation.check_answered()
    elif value is not None:
        raise bad_request(
            f"'input' must be a string or a list of input items; got {type(value).__name__}",
            "input",
        )
    if not any(m["role"] != "system" for m in conversation.messages):
        raise bad_request(
            "'input' must hold a message or a function call (a string, or a list of input items)",
            "input",
        )
    return conversation.messages
