"""A safe arithmetic evaluator: :func:`safe_eval` and :func:`format_number`.

:func:`safe_eval` parses an expression with :func:`ast.parse` and walks the tree itself; model text
is never turned into code. Only int and float literals, binary ``+ - * / // % **``, unary ``+`` and
``-`` and parentheses are accepted. Everything else, and every result that would be too large, too
slow to compute, complex or not finite, is refused with a :class:`~llm_gym.errors.CalculatorError`
whose message tells a language model what went wrong and what is allowed.

Cost is bounded before any work is done: the length of the text is checked first, the depth of
brackets is checked by a linear scan before parsing, the tree is walked with an explicit stack (no
Python recursion), and every product and power is sized from its operands before it is computed.
The ``calculator`` tool on top of it is :class:`~llm_gym.tools.calculator.CalculatorTool`.
"""

from __future__ import annotations

import ast
import math
from typing import TypeAlias

from llm_gym.errors import CalculatorError

__all__ = [
    "MAX_EXPONENT",
    "MAX_EXPRESSION_LENGTH",
    "MAX_NESTING_DEPTH",
    "MAX_RESULT_ABS",
    "MAX_TREE_DEPTH",
    "SNIPPET_CHARS",
    "Number",
    "format_number",
    "safe_eval",
    "snippet",
]

Number: TypeAlias = int | float
"""What :func:`safe_eval` returns: a Python ``int`` or a finite ``float`` (never ``bool``)."""

MAX_EXPRESSION_LENGTH = 1000
"""Longest expression accepted, in characters (surrounding whitespace included).

Checked before anything else, so an oversized input is refused in microseconds. It also keeps int
literals far below Python's 4300-digit conversion limit.
"""

MAX_NESTING_DEPTH = 32
"""Deepest nesting of brackets accepted: ``(``, ``[`` and ``{`` all count.

Checked by a linear scan of the text before it reaches the parser.
"""

MAX_TREE_DEPTH = 500
"""Deepest expression tree walked. A sum of ``n`` terms nests ``n`` levels deep, so this admits any
chain of binary operators that fits in :data:`MAX_EXPRESSION_LENGTH`; it refuses only absurd runs
of unary signs such as ``- - - ... 1``. The walk uses an explicit stack, so depth never risks
Python's recursion limit; this bound keeps the walk bounded should the length limit be raised.
"""

MAX_EXPONENT = 1000
"""Largest absolute value of the right operand of ``**``."""

MAX_RESULT_ABS = 1e100
"""Largest magnitude of any literal, intermediate value and final result."""

SNIPPET_CHARS = 40
"""Longest piece of the model's text quoted in an error message."""

_MAX_RESULT_LOG10 = math.log10(MAX_RESULT_ABS)
# |a| >= 2 ** (a.bit_length() - 1), so a product whose operands' bit lengths sum past this is
# certainly larger than MAX_RESULT_ABS and is refused without being computed.
_MAX_PRODUCT_BITS = math.floor(math.log2(MAX_RESULT_ABS)) + 2

_ALLOWED = "Only numbers, + - * / // % ** and parentheses are allowed."
_SPLIT = "Split the calculation into smaller steps."

_BINARY_SYMBOLS: dict[type[ast.operator], str] = {
    ast.Add: "+",
    ast.Sub: "-",
    ast.Mult: "*",
    ast.Div: "/",
    ast.FloorDiv: "//",
    ast.Mod: "%",
    ast.Pow: "**",
}
_REFUSED_BINARY_SYMBOLS: dict[type[ast.operator], str] = {
    ast.BitAnd: "&",
    ast.BitOr: "|",
    ast.BitXor: "^",
    ast.LShift: "<<",
    ast.RShift: ">>",
    ast.MatMult: "@",
}
_UNARY_SYMBOLS: dict[type[ast.unaryop], str] = {ast.UAdd: "+", ast.USub: "-"}
_REFUSED_UNARY_SYMBOLS: dict[type[ast.unaryop], str] = {ast.Not: "not", ast.Invert: "~"}

# What to call each refused kind of expression node in an error message.
_CONSTRUCT_NAMES: dict[type[ast.expr], str] = {
    ast.Name: "names",
    ast.Attribute: "attribute access",
    ast.Call: "function calls",
    ast.Lambda: "lambda functions",
    ast.Subscript: "subscripts and indexing",
    ast.Slice: "slices",
    ast.Compare: "comparisons",
    ast.BoolOp: "boolean operators (and, or)",
    ast.IfExp: "conditional expressions (x if c else y)",
    ast.NamedExpr: "assignment expressions (:=)",
    ast.JoinedStr: "f-strings",
    ast.FormattedValue: "f-strings",
    ast.List: "lists",
    ast.Tuple: "tuples",
    ast.Set: "sets",
    ast.Dict: "dicts",
    ast.ListComp: "comprehensions",
    ast.SetComp: "comprehensions",
    ast.DictComp: "comprehensions",
    ast.GeneratorExp: "generator expressions",
    ast.Starred: "starred expressions",
    ast.Await: "await expressions",
    ast.Yield: "yield expressions",
    ast.YieldFrom: "yield expressions",
}


def safe_eval(expression: str) -> Number:
    """Evaluate an arithmetic expression without executing it as code.

    Args:
        expression: Text such as ``"2 * (3 + 4) ** 2"``. Int and float literals, binary
            ``+ - * / // % **``, unary ``+ -`` and parentheses are allowed; surrounding whitespace
            is ignored. Operators have Python's precedence and semantics (``**`` is
            right-associative, ``//`` floors, ``%`` takes the sign of the divisor).

    Returns:
        The value, an ``int`` when every step stays integral and a ``float`` otherwise.

    Raises:
        CalculatorError: The text is not a string, is empty, longer than
            :data:`MAX_EXPRESSION_LENGTH`, nested deeper than :data:`MAX_NESTING_DEPTH`, does not
            parse, uses anything but the allowed constructs, divides by zero, uses an exponent
            beyond :data:`MAX_EXPONENT`, or produces a value that is complex, not finite or of
            magnitude above :data:`MAX_RESULT_ABS`.
    """
    if not isinstance(expression, str):
        raise CalculatorError(
            f"the expression must be a string, got {type(expression).__name__}. "
            "Pass the arithmetic as text, such as '2 * (3 + 4)'."
        )
    if len(expression) > MAX_EXPRESSION_LENGTH:
        raise CalculatorError(
            f"the expression is too long: {len(expression)} characters, the limit is "
            f"{MAX_EXPRESSION_LENGTH}. {_SPLIT}"
        )
    text = expression.strip()
    if not text:
        raise CalculatorError(
            "the expression is empty. Pass an arithmetic expression such as '2 * (3 + 4)'."
        )
    _check_bracket_depth(text)
    try:
        tree = _parse(text)
        _validate(tree.body, text)
        return _evaluate(tree.body)
    except CalculatorError:
        raise
    except ZeroDivisionError as exc:
        raise CalculatorError(f"division by zero ({exc}).") from None
    except OverflowError as exc:
        raise CalculatorError(
            f"a value is too large to compute ({exc}); the limit is {MAX_RESULT_ABS:g} in "
            "magnitude."
        ) from None
    except (RecursionError, MemoryError) as exc:
        raise CalculatorError(
            f"the expression is too complex to evaluate ({type(exc).__name__}). {_SPLIT}"
        ) from None
    except (ValueError, TypeError, ArithmeticError) as exc:
        raise CalculatorError(f"could not evaluate the expression: {exc}. {_ALLOWED}") from None


def format_number(value: Number) -> str:
    """Render a result the way a person would write it.

    Ints print in full. Floats with an integral value and magnitude below ``1e15`` print without a
    fractional part (``4.0`` gives ``"4"``, ``-0.0`` gives ``"0"``). Other floats print with 12
    significant digits in ``"g"`` format, which hides binary rounding noise (``0.1 + 0.2`` gives
    ``"0.3"``) and switches to exponent notation for very large or small values (``"1e+20"``).

    Args:
        value: An ``int`` or ``float``, typically from :func:`safe_eval`.

    Returns:
        The text form of ``value``.
    """
    if isinstance(value, int):
        return str(int(value))
    if math.isfinite(value) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return format(value, ".12g")


def snippet(text: str) -> str:
    """Shorten ``text`` for quoting in an error message (at most :data:`SNIPPET_CHARS`)."""
    text = " ".join(text.split())
    if len(text) > SNIPPET_CHARS:
        return text[: SNIPPET_CHARS - 3] + "..."
    return text


def _check_bracket_depth(text: str) -> None:
    """Refuse brackets nested deeper than :data:`MAX_NESTING_DEPTH`, in one linear scan."""
    depth = 0
    for char in text:
        if char in "([{":
            depth += 1
            if depth > MAX_NESTING_DEPTH:
                raise CalculatorError(
                    f"the expression is nested too deeply: more than {MAX_NESTING_DEPTH} levels "
                    f"of parentheses. {_SPLIT}"
                )
        elif char in ")]}":
            depth -= 1


def _parse(text: str) -> ast.Expression:
    """Parse ``text`` as a single Python expression (parsing only; nothing is run)."""
    try:
        return ast.parse(text, mode="eval")
    except SyntaxError as exc:
        reason = exc.msg or "invalid syntax"
        raise CalculatorError(
            f"could not parse the expression {snippet(text)!r}: {reason}. {_ALLOWED}"
        ) from None
    except ValueError as exc:  # e.g. null bytes or over-long int literals on some versions
        raise CalculatorError(
            f"could not parse the expression {snippet(text)!r}: {exc}. {_ALLOWED}"
        ) from None


def _validate(root: ast.expr, text: str) -> None:
    """Refuse any construct other than number literals, allowed operators and parentheses."""
    stack: list[tuple[ast.expr, int]] = [(root, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_TREE_DEPTH:
            raise CalculatorError(
                f"the expression is nested too deeply: more than {MAX_TREE_DEPTH} levels of "
                f"operators. {_SPLIT}"
            )
        if isinstance(node, ast.Constant):
            _literal_value(node)
        elif isinstance(node, ast.BinOp):
            if type(node.op) not in _BINARY_SYMBOLS:
                symbol = _REFUSED_BINARY_SYMBOLS.get(type(node.op), type(node.op).__name__)
                raise CalculatorError(f"the operator {symbol!r} is not allowed. {_ALLOWED}")
            stack.append((node.right, depth + 1))
            stack.append((node.left, depth + 1))
        elif isinstance(node, ast.UnaryOp):
            if type(node.op) not in _UNARY_SYMBOLS:
                symbol = _REFUSED_UNARY_SYMBOLS.get(type(node.op), type(node.op).__name__)
                raise CalculatorError(f"the operator {symbol!r} is not allowed. {_ALLOWED}")
            stack.append((node.operand, depth + 1))
        else:
            raise _refused_construct(node, text)


def _refused_construct(node: ast.expr, text: str) -> CalculatorError:
    """Build the error for a node kind that is never allowed, quoting what the model wrote."""
    what = _CONSTRUCT_NAMES.get(type(node), f"{type(node).__name__} expressions")
    if isinstance(node, ast.Name):
        quoted = node.id
    elif isinstance(node, ast.Attribute):
        quoted = "." + node.attr
    else:
        quoted = snippet(ast.get_source_segment(text, node) or type(node).__name__)
    return CalculatorError(f"{what} are not allowed: {quoted!r}. {_ALLOWED}")


def _literal_value(node: ast.Constant) -> Number:
    """Return a literal's value, refusing anything but a finite int or float in range."""
    value = node.value
    if isinstance(value, bool):
        raise CalculatorError(f"booleans are not allowed: {value!r}. {_ALLOWED}")
    if isinstance(value, int | float):
        return _checked(value)
    if isinstance(value, complex):
        raise CalculatorError(
            f"complex numbers are not allowed: {value!r}. Only real numbers are supported."
        )
    if isinstance(value, str | bytes):
        raise CalculatorError(f"strings are not allowed: {snippet(repr(value))}. {_ALLOWED}")
    raise CalculatorError(f"the constant {value!r} is not allowed. {_ALLOWED}")


def _evaluate(root: ast.expr) -> Number:
    """Compute a validated tree bottom-up with an explicit stack, left operand first."""
    values: list[Number] = []
    stack: list[tuple[ast.expr, bool]] = [(root, False)]
    while stack:
        node, operands_ready = stack.pop()
        if isinstance(node, ast.Constant):
            values.append(_literal_value(node))
        elif isinstance(node, ast.UnaryOp):
            if operands_ready:
                operand = values.pop()
                values.append(-operand if isinstance(node.op, ast.USub) else operand)
            else:
                stack.append((node, True))
                stack.append((node.operand, False))
        elif isinstance(node, ast.BinOp):
            if operands_ready:
                right = values.pop()
                left = values.pop()
                values.append(_apply_binary(node.op, left, right))
            else:
                stack.append((node, True))
                stack.append((node.right, False))
                stack.append((node.left, False))
        else:  # pragma: no cover - _validate refuses every other node first
            raise CalculatorError(f"{type(node).__name__} expressions are not allowed. {_ALLOWED}")
    return values.pop()


def _apply_binary(op: ast.operator, left: Number, right: Number) -> Number:
    """Apply one allowed binary operator, refusing results out of range."""
    symbol = _BINARY_SYMBOLS[type(op)]
    try:
        if isinstance(op, ast.Add):
            result = left + right
        elif isinstance(op, ast.Sub):
            result = left - right
        elif isinstance(op, ast.Mult):
            _check_product_size(left, right)
            result = left * right
        elif isinstance(op, ast.Div):
            result = left / right
        elif isinstance(op, ast.FloorDiv):
            result = left // right
        elif isinstance(op, ast.Mod):
            result = left % right
        else:
            result = _power(left, right)
    except ZeroDivisionError:
        raise CalculatorError(f"division by zero in {_describe(left, symbol, right)}.") from None
    except OverflowError:
        raise _too_large(_describe(left, symbol, right)) from None
    return _checked(result)


def _check_product_size(left: Number, right: Number) -> None:
    """Refuse an int product that is certainly too large, judged from bit lengths alone."""
    if (
        isinstance(left, int)
        and isinstance(right, int)
        and left.bit_length() + right.bit_length() > _MAX_PRODUCT_BITS
    ):
        raise _too_large(_describe(left, "*", right))


def _power(base: Number, exponent: Number) -> Number:
    """Compute ``base ** exponent`` after sizing the result from logarithms."""
    described = _describe(base, "**", exponent)
    if abs(exponent) > MAX_EXPONENT:
        raise CalculatorError(
            f"the exponent in {described} is too large: the limit is {MAX_EXPONENT} "
            "in absolute value."
        )
    if base < 0 and isinstance(exponent, float) and not exponent.is_integer():
        raise CalculatorError(
            f"{described} would be a complex number (a negative base with a fractional "
            "exponent). Only real results are supported."
        )
    if base == 0 and exponent < 0:
        raise CalculatorError(f"division by zero in {described} (0 to a negative power).")
    magnitude = abs(base)
    if magnitude not in (0, 1) and exponent * math.log10(magnitude) > _MAX_RESULT_LOG10 + 1:
        raise _too_large(described)
    result = base**exponent
    if isinstance(result, complex):  # pragma: no cover - refused above; kept as a guard
        raise CalculatorError(f"{described} is a complex number. Only real results are supported.")
    return result


def _checked(value: Number) -> Number:
    """Return ``value`` if it is a finite real number within :data:`MAX_RESULT_ABS`."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise CalculatorError(
            f"the result {value!r} is not a real number. Only real results are supported."
        )
    if isinstance(value, float) and math.isinf(value):
        raise CalculatorError(
            f"a value is too large: it overflowed to infinity, the limit is {MAX_RESULT_ABS:g} in "
            "magnitude."
        )
    if isinstance(value, float) and math.isnan(value):
        raise CalculatorError(f"a value is undefined (nan). {_SPLIT}")
    if abs(value) > MAX_RESULT_ABS:
        if isinstance(value, float):
            shown = f"{value:.3g}"
        else:  # sized from the bit length: never converts a huge int to text
            shown = f"about {math.floor(value.bit_length() * math.log10(2)) + 1} digits"
        raise CalculatorError(
            f"a value is too large: {shown}, the limit is {MAX_RESULT_ABS:g} in magnitude."
        )
    return value


def _describe(left: Number, symbol: str, right: Number) -> str:
    """Write one operation for an error message, shortening long operands."""
    return f"{snippet(format_number(left))} {symbol} {snippet(format_number(right))}"


def _too_large(described: str) -> CalculatorError:
    """Build the error for an operation whose result would exceed :data:`MAX_RESULT_ABS`."""
    return CalculatorError(
        f"the result of {described} is too large: the limit is {MAX_RESULT_ABS:g} in magnitude."
    )
