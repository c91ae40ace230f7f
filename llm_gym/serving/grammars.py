"""The grammar of a chat request's reply, and the field to blame when it cannot be built.

``tool_choice`` ``"required"`` or a named tool, ``strict`` tools under ``auto``, and a
``response_format`` of ``json_object`` / ``json_schema`` make the engine decode under a grammar
(:func:`llm_gym.policies.constraint.reply_constraint`, written in the server's action format).
A schema or choice that cannot be enforced is a 400 naming its field: a schema too large or too
deep (:func:`~llm_gym.actions.grammar.check_schema`), one the library cannot compile or that
admits no value, a tool name the action format cannot write, or a forced choice in a format
without a call grammar.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from llm_gym.actions import ActionFormat
from llm_gym.actions.grammar import GrammarUnsupportedError, Lark
from llm_gym.errors import InvalidArgumentError
from llm_gym.serving.chat_protocol import ChatRequest
from llm_gym.serving.protocol import bad_request

if TYPE_CHECKING:
    from llm_gym.policies.constraint import GrammarCompiler

__all__ = ["chat_grammar"]

_ANSWER = "response_format.json_schema.schema"


def _culprit(compiler: GrammarCompiler, request: ChatRequest, message: str) -> str:
    """The field a grammar error comes from: the one its message names, else the first schema
    that does not compile alone."""
    for prefix in ("tools[", "response_format"):
        if message.startswith(prefix):
            return message.split(" ", 1)[0]
    answer = request.answer_schema
    if answer is not None and compiler.check(f"start: {Lark.json(answer)}") is not None:
        return _ANSWER
    for i, tool in enumerate(request.tools or ()):
        schema = tool["function"].get("parameters")
        if schema is not None and compiler.check(f"start: {Lark.json(schema)}") is not None:
            return f"tools[{i}].function.parameters"
    return "tools"


def chat_grammar(
    compiler: GrammarCompiler, action_format: ActionFormat, request: ChatRequest
) -> str | None:
    """The grammar ``request``'s reply follows, or None when nothing constrains it.

    Raises:
        APIError: 400 naming the field at fault (see the module docstring).
    """
    from llm_gym.policies.constraint import reply_constraint

    try:
        return reply_constraint(
            compiler,
            action_format,
            request.tools or [],
            request.tool_choice,
            parallel=request.parallel_tool_calls,
            answer=request.answer_schema,
        )
    except GrammarUnsupportedError as exc:
        field = "tool_choice" if request.tool_choice.forced else "response_format"
        raise bad_request(str(exc), field) from None
    except InvalidArgumentError as exc:
        raise bad_request(str(exc)[:2000], _culprit(compiler, request, str(exc))) from None
