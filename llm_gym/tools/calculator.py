"""The ``calculator`` tool: arithmetic for a language model, through :func:`safe_eval`.

The tool decodes its JSON arguments and hands the expression to the safe evaluator
(:mod:`llm_gym.tools.arithmetic`); model text is never turned into code. A malformed call or a
refused expression raises, and the environment reports it to the model as a tool error.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from llm_gym.actions.codec import json_error_reason, json_type_name
from llm_gym.core.types import JsonSchema
from llm_gym.errors import ToolArgumentError
from llm_gym.tools.arithmetic import SNIPPET_CHARS, format_number, safe_eval, snippet

if TYPE_CHECKING:
    from llm_gym.core.tool import ToolResult

__all__ = ["CalculatorTool"]

_LISTED_FIELDS = 10
"""At most this many unexpected fields are named in an error message."""


class CalculatorTool:
    """The ``calculator`` tool: evaluates ``{"expression": ...}`` with :func:`safe_eval`.

    Refusals are raised as exceptions (:class:`~llm_gym.errors.ToolArgumentError` for malformed
    arguments, :class:`~llm_gym.errors.CalculatorError` for a refused expression); the environment
    reports a raising tool to the model as a tool error.
    """

    name: str = "calculator"
    description: str = "Evaluate an arithmetic expression with + - * / // % ** and parentheses."
    parameters_schema: JsonSchema
    """JSON schema of the arguments: an object with one required string, ``expression``."""
    synchronous: bool = True
    """``execute`` never awaits anything: callers may run it without an event loop."""

    def __init__(self) -> None:
        """Create the tool; each instance owns its own copy of the schema."""
        self.parameters_schema = {
            "type": "object",
            "properties": {
                "expression": {
                    "type": "string",
                    "description": (
                        "Arithmetic using numbers, + - * / // % ** and parentheses, "
                        "such as '2 * (3 + 4) ** 2'. No variables or functions."
                    ),
                }
            },
            "required": ["expression"],
        }

    async def execute(self, arguments: str) -> ToolResult:
        """Evaluate the expression in ``arguments``.

        Args:
            arguments: The call's arguments as a JSON-encoded object with a string field
                ``"expression"``, exactly as a chat tool call carries them. Other fields are
                ignored.

        Returns:
            A tool result whose content is the value formatted by :func:`format_number`.

        Raises:
            ToolArgumentError: ``arguments`` is not a JSON object with a string ``"expression"``.
            CalculatorError: :func:`safe_eval` refused the expression.
        """
        from llm_gym.core.tool import ToolResult

        expression = _expression_argument(arguments)
        return ToolResult(content=format_number(safe_eval(expression)))


def _expression_argument(arguments: str) -> str:
    """Extract the ``"expression"`` string from a tool call's JSON arguments."""
    example = 'Call it with a JSON object such as {"expression": "2 * (3 + 4)"}.'
    if not isinstance(arguments, str):
        raise ToolArgumentError(
            f"calculator arguments must be a JSON-encoded string, got "
            f"{type(arguments).__name__}. {example}"
        )
    try:
        decoded = json.loads(arguments)
    except (ValueError, RecursionError) as exc:  # RecursionError: nested too deeply
        raise ToolArgumentError(
            f"calculator arguments are not valid JSON ({json_error_reason(exc)}): "
            f"{snippet(arguments)!r}. {example}"
        ) from None
    if not isinstance(decoded, dict):
        raise ToolArgumentError(
            f"calculator arguments must be a JSON object, got {_json_type(decoded)}. {example}"
        )
    if "expression" not in decoded:
        fields = [snippet(name) for name in list(decoded)[:_LISTED_FIELDS]]
        more = len(decoded) - len(fields)
        raise ToolArgumentError(
            f"calculator arguments are missing the required field 'expression' "
            f"(got fields: {fields}{f' and {more} more' if more else ''}). {example}"
        )
    expression = decoded["expression"]
    if not isinstance(expression, str):
        got = "null" if expression is None else f"{_json_type(expression)} {_preview(expression)}"
        raise ToolArgumentError(
            f"the calculator field 'expression' must be a string, got {got}. {example}"
        )
    return expression


def _preview(value: object) -> str:
    """The start of ``value`` as JSON (a container nested too deeply to encode as ``...``)."""
    try:
        return json.dumps(value)[:SNIPPET_CHARS]
    except (ValueError, RecursionError):
        return "..."


def _json_type(value: object) -> str:
    """Name a decoded JSON value's type the way JSON does."""
    return json_type_name(value, article=True)
