"""A chat template's render, bounded in time: a model file's template is untrusted code.

A chat template is Jinja run in transformers' ``ImmutableSandboxedEnvironment``: the sandbox
keeps it from Python's internals, not from running for ever. ``range`` is capped at 100,000
items, but nested loops (over ranges, strings, ``messages * n``) multiply, and a loop body with
no call in it never reaches a hook the sandbox offers (``SandboxedEnvironment.call``,
``getattr``): a template's loop can hold the thread that renders it for hours, behind a trigger
word in one request.

:func:`apply_template` renders with ``tokenizer.apply_chat_template`` in the calling thread and
a watchdog thread stops it at a deadline: it raises :class:`TemplateTimeoutError` in the
rendering thread (CPython's ``PyThreadState_SetAsyncExc``, the documented C API for an exception
in another thread, checked between bytecodes, so every Jinja loop, which compiles to Python,
is stopped; a single C call, a huge string repetition say, ends first). The error names the
template. Why not a subprocess: every turn of every episode renders (thousands a second on a
GPU rollout), and a process per render, or the messages sent to a render worker and back,
costs more than the render; the watchdog costs a heap push and pop. Where the C API is missing
(an interpreter other than CPython) renders run unbounded.

:func:`template_errors` names the errors that are the template's own: Jinja's
``TemplateError`` (transformers' ``raise_exception`` raises it; ``UndefinedError``,
``SecurityError`` and ``TemplateSyntaxError`` are subclasses).
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import heapq
import itertools
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from llm_gym.errors import LlmGymError

__all__ = [
    "DEFAULT_RENDER_DEADLINE_S",
    "TemplateTimeoutError",
    "apply_template",
    "render_deadline",
    "template_errors",
    "template_name",
    "within_deadline",
]

T = TypeVar("T")

DEFAULT_RENDER_DEADLINE_S = 10.0
"""Seconds one render of a chat template may take. A real template renders a conversation of
the longest context in well under a second, so the deadline only stops a template that loops
or recurses."""


_DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "llm_gym_render_deadline", default=None
)


@contextlib.contextmanager
def render_deadline(seconds: float) -> Iterator[None]:
    """Within the block (this thread or task), renders that name no deadline of their own take
    ``seconds`` as theirs: a server's deadline reaches the template probes its renders run."""
    token = _DEADLINE.set(float(seconds))
    try:
        yield
    finally:
        _DEADLINE.reset(token)


class TemplateTimeoutError(LlmGymError, TimeoutError):
    """A chat template's render ran past its deadline (a template that loops)."""


class _Stop(BaseException):
    """Raised in the rendering thread at its deadline; a BaseException, so no ``except
    Exception`` in Jinja or transformers swallows it."""


def template_errors() -> tuple[type[BaseException], ...]:
    """The errors a chat template raises itself: ``jinja2.TemplateError`` (and its subclasses:
    ``raise_exception`` in the template, an undefined value used, a sandbox refusal, a syntax
    error); empty when jinja2 is not installed."""
    try:
        from jinja2 import TemplateError
    except ImportError:
        return ()
    return (TemplateError,)


def template_name(tokenizer: Any) -> str:
    """How an error names ``tokenizer``'s template: its model's path or the tokenizer's class."""
    return str(getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__)


try:
    _SET_ASYNC_EXC: Any = ctypes.pythonapi.PyThreadState_SetAsyncExc
    _SET_ASYNC_EXC.argtypes = [ctypes.c_ulong, ctypes.py_object]
    _SET_ASYNC_EXC.restype = ctypes.c_int
except (AttributeError, ValueError):  # not CPython
    _SET_ASYNC_EXC = None


class _Watch:
    """One render being watched: its thread, and whether the watchdog stopped it."""

    def __init__(self, thread_id: int) -> None:
        self.thread_id = thread_id
        self.active = True
        self.fired = False
        self.lock = threading.Lock()

    def fire(self) -> None:
        with self.lock:
            if self.active and not self.fired:
                self.fired = True
                _SET_ASYNC_EXC(self.thread_id, _Stop)

    def end(self) -> None:
        """Stop watching; a stop fired but not yet raised in this thread is withdrawn."""
        with self.lock:
            self.active = False
            if self.fired:
                _SET_ASYNC_EXC(self.thread_id, ctypes.py_object())  # NULL: clears a pending one


class _Watchdog:
    """One daemon thread that fires each watch at its deadline (a heap of deadlines)."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, _Watch]] = []
        self._order = itertools.count()
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None

    def watch(self, watch: _Watch, seconds: float) -> None:
        """Fire ``watch`` after ``seconds``. It may fire before this returns: the caller
        registers it inside the region that catches the stop (see :func:`within_deadline`)."""
        with self._wake:
            heapq.heappush(self._heap, (time.monotonic() + seconds, next(self._order), watch))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="llm_gym-template-deadline", daemon=True
                )
                self._thread.start()
            self._wake.notify()

    def _run(self) -> None:
        while True:
            with self._wake:
                while self._heap and not self._heap[0][2].active:
                    heapq.heappop(self._heap)  # ended in time
                if not self._heap:
                    self._wake.wait()
                    continue
                deadline, _, watch = self._heap[0]
                left = deadline - time.monotonic()
                if left > 0:
                    self._wake.wait(left)
                    continue
                heapq.heappop(self._heap)
            watch.fire()


_WATCHDOG = _Watchdog()


def within_deadline(function: Callable[[], T], seconds: float | None, what: str) -> T:
    """``function()`` in this thread, stopped after ``seconds`` (None: unbounded) with a
    :class:`TemplateTimeoutError` that names ``what``."""
    if seconds is None or _SET_ASYNC_EXC is None:
        return function()
    watch = _Watch(threading.get_ident())
    try:
        try:  # registered inside: a stop that fires before watch() returns is caught here
            _WATCHDOG.watch(watch, seconds)
            return function()
        finally:
            watch.end()
    except _Stop:
        raise TemplateTimeoutError(
            f"{what} did not finish within {seconds:g} s (a template that loops); it was "
            "stopped. Fix the model's chat template (tokenizer.chat_template) or pass a "
            "trusted one."
        ) from None


def _deadline(seconds: float | None) -> float:
    if seconds is not None:
        return seconds
    chosen = _DEADLINE.get()
    return DEFAULT_RENDER_DEADLINE_S if chosen is None else chosen


def apply_template(
    tokenizer: Any,
    chat: Any,
    *,
    tools: Any = None,
    add_generation_prompt: bool,
    template_kwargs: dict[str, Any] | None = None,
    deadline_s: float | None = None,
    **options: Any,
) -> str:
    """``tokenizer.apply_chat_template(chat, tools=tools, tokenize=False, ...)`` stopped after
    ``deadline_s`` (None: the enclosing :func:`render_deadline`'s, else
    :data:`DEFAULT_RENDER_DEADLINE_S`) with a
    :class:`TemplateTimeoutError`; ``template_kwargs`` reach the template, ``options`` the call
    (``chat_template=``, ...)."""
    return within_deadline(
        lambda: tokenizer.apply_chat_template(
            chat,
            tools=tools,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            **options,
            **(template_kwargs or {}),
        ),
        _deadline(deadline_s),
        f"the chat template of {template_name(tokenizer)}",
    )
