"""The program the sandbox runs: call one function of the candidate's code on every input.

Run as ``python -I -S -B harness.py RESULTS_FD MAX_VALUE_CHARS`` (standard library only: neither
``llm_gym`` nor any site-packages exists in the sandbox). It reads the payload (``marshal`` of
``{"code", "entry", "inputs"}``; never an expected output) from stdin, then writes one JSON line
to ``RESULTS_FD`` for the definition (``{"kind":"defined"}``, with an ``"error"`` when it failed)
and one per input (``{"kind":"call","i":I,"value":V}`` or ``"error"``).

Contract: the harness reports values, never verdicts. Its encoder and writer are bound before the
candidate's code runs, so monkeypatching ``builtins``, ``json``, ``os`` or ``sys`` changes nothing
it writes; values other than ``None``, ``bool``, ``int``, ``float``, ``str``, and lists, tuples
and str-keyed dicts of them (exactly these types: no subclass) are reported as errors. The
candidate may write lines of its own to the same descriptor; none can carry an expected output.
"""

import marshal
import os
import sys
from _json import encode_basestring_ascii as _quote

__all__ = ["describe", "make_encoder", "run"]


def _emit(fd, line, write=os.write):
    """Write one record line to the results pipe (whole, retrying on short writes)."""
    data = line.encode("utf-8", "replace")
    while data:
        data = data[write(fd, data) :]


def describe(exc, type=type, str=str, isinstance=isinstance, getattr=getattr,
             name_of=type.__dict__["__name__"].__get__):  # fmt: skip
    """``"ValueError: message (line 3)"``; the builtins it uses are bound here, so a candidate
    that patches them still gets its errors described."""
    try:
        name, message = name_of(type(exc)), str(exc.msg if isinstance(exc, SyntaxError) else exc)
    except BaseException:
        name, message = "Exception", "<unprintable>"
    line = getattr(exc, "lineno", None) if isinstance(exc, SyntaxError) else None
    tb = getattr(exc, "__traceback__", None)
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<solution>":
            line = tb.tb_lineno
        tb = tb.tb_next
    text = f"{name}: {message}"[:300] if message else name
    return f"{text} (line {line})" if line else text


class _Unsupported(Exception):
    pass


def make_encoder(max_chars):
    """A JSON encoder for plain values that holds its own references (monkeypatching is moot);
    it raises past ``max_chars`` characters or 100 levels of nesting."""
    quote = _quote
    int_repr, float_repr, join = int.__repr__, float.__repr__, ",".join
    type_name = type.__dict__["__name__"].__get__
    type_, len_, dict_items, unsupported = type, len, dict.items, _Unsupported
    special_floats = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}

    def encode(value, depth=0, budget=None):
        budget = budget if budget is not None else [max_chars]
        if depth > 100:
            raise unsupported("the return value is nested more than 100 levels deep")
        kind = type_(value)
        if value is None:
            text = "null"
        elif kind is bool:
            text = "true" if value else "false"
        elif kind is int:
            try:
                text = int_repr(value)
            except ValueError:
                raise unsupported("the returned int has too many digits") from None
        elif kind is float:
            text = float_repr(value)
            text = special_floats.get(text, text)
        elif kind is str:
            text = quote(value)
        elif kind is list or kind is tuple:
            text = "[" + join([encode(item, depth + 1, budget) for item in value]) + "]"
        elif kind is dict:
            parts = []
            for key, item in dict_items(value):
                if type_(key) is not str:
                    raise unsupported("dict keys must be str")
                parts.append(quote(key) + ":" + encode(item, depth + 1, budget))
            text = "{" + join(parts) + "}"
        else:
            raise unsupported(f"unsupported return type {type_name(kind)}")
        budget[0] -= len_(text)
        if budget[0] < 0:
            raise unsupported("the return value is too large")
        return text

    return encode


def run(fd, max_value_chars):
    """Read the payload from stdin, run it, report to ``fd``; ends the process."""
    import builtins

    quote = _quote
    payload = marshal.loads(sys.stdin.buffer.read())
    os.close(0)
    for stream in (sys.stdout, sys.stderr):
        stream.reconfigure(write_through=True, line_buffering=True)
    code, entry, inputs = payload["code"], payload["entry"], payload["inputs"]
    encode = make_encoder(max_value_chars)
    emit, exit_now, describe_ = _emit, os._exit, describe
    base_exception, callable_, enumerate_ = BaseException, callable, enumerate
    namespace = {"__name__": "__solution__", "__builtins__": builtins}
    try:
        exec(compile(code, "<solution>", "exec"), namespace)
        function = namespace.get(entry)
        if not callable_(function):
            emit(fd, f'{{"kind":"defined","error":{quote(f"no function named {entry}")}}}\n')
            exit_now(0)
    except base_exception as exc:
        emit(fd, f'{{"kind":"defined","error":{quote(describe_(exc))}}}\n')
        exit_now(0)
    emit(fd, '{"kind":"defined"}\n')
    for index, args in enumerate_(inputs):
        try:
            value = function(*args)
            line = f'{{"kind":"call","i":{index},"value":{encode(value)}}}\n'
        except base_exception as exc:
            line = f'{{"kind":"call","i":{index},"error":{quote(describe_(exc))}}}\n'
        try:
            emit(fd, line)
        except base_exception:
            exit_now(1)
    exit_now(0)


if __name__ == "__main__":
    run(int(sys.argv[1]), int(sys.argv[2]))
