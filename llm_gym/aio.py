"""Running llm_gym's async code from synchronous code."""

from __future__ import annotations

import asyncio
import threading
import types
import weakref
from collections.abc import Awaitable, Callable, Coroutine, Generator
from typing import Any, TypeVar

__all__ = ["LoopRunner", "resume", "run_sync", "within"]

T = TypeVar("T")


def _in_thread(coro: Coroutine[Any, Any, T]) -> T:
    result: list[Any] = []
    error: list[BaseException] = []

    def target() -> None:
        try:
            result.append(asyncio.run(coro))
        except BaseException as exc:
            error.append(exc)

    thread = threading.Thread(target=target, name="llm_gym-run_sync")
    thread.start()
    thread.join()
    if error:
        raise error[0]
    return result[0]


def _loop_running() -> bool:
    """Whether this thread runs an event loop now."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(coro)``, also from inside a running event loop (a notebook, say)."""
    if _loop_running():
        return _in_thread(coro)
    return asyncio.run(coro)


_ABANDONED: set[asyncio.Future[Any]] = set()
"""Calls :func:`within` gave up on that ignored their cancellation, kept until they finish."""
UNWIND_S = 1.0
"""The longest :func:`within` waits, past the deadline, for a cancelled call to unwind (its
``finally`` blocks) before it gives up on it."""


async def within(
    call: Awaitable[T], timeout_s: float | None, error: Callable[[], BaseException]
) -> T:
    """``await call``; when ``timeout_s`` (None: no limit) passes first, ``call`` is cancelled
    and ``error()`` is raised instead of the ``TimeoutError``.

    The deadline holds even when ``call`` ignores its cancellation (code that catches
    ``CancelledError`` and goes on): the call runs as a task of its own; at the deadline it is
    cancelled, given up to ``min(timeout_s, UNWIND_S)`` to unwind, then left to finish in the
    background (its result or error dropped) while ``error()`` is raised. (A loop that is
    closed still waits for it: ``asyncio.run`` finishes every task it started.)
    """
    if timeout_s is None:
        return await call
    task = asyncio.ensure_future(call)
    try:
        done, _ = await asyncio.wait((task,), timeout=timeout_s)
        if not done:
            task.cancel()
            await asyncio.wait((task,), timeout=min(timeout_s, UNWIND_S))
    except BaseException:  # the caller is cancelled: so is the call
        _abandon(task)
        raise
    if not done:
        _abandon(task)
        raise error()
    return task.result()


def _abandon(task: asyncio.Future[Any]) -> None:
    """Cancel ``task`` without waiting for it; its outcome is retrieved (and dropped) when it
    finishes, so nothing is logged as never retrieved."""
    if task.done():
        _dropped(task)
        return
    task.cancel()
    _ABANDONED.add(task)
    task.add_done_callback(_dropped)


def _dropped(task: asyncio.Future[Any]) -> None:
    _ABANDONED.discard(task)
    if not task.cancelled():
        task.exception()


@types.coroutine
def _resume(coro: Coroutine[Any, Any, T], yielded: Any) -> Generator[Any, Any, T]:
    """Hand a coroutine that was started by hand over to the running task."""
    while True:
        try:
            value = yield yielded
        except BaseException as exc:  # a cancellation or error thrown in by the task
            try:
                yielded = coro.throw(exc)
            except StopIteration as stop:
                return stop.value
        else:
            try:
                yielded = coro.send(value)
            except StopIteration as stop:
                return stop.value


async def resume(coro: Coroutine[Any, Any, T], yielded: Any) -> T:
    """Finish, as a coroutine a loop can run, ``coro`` after it was started by hand
    (``yielded = coro.send(None)`` suspended it)."""
    return await _resume(coro, yielded)


class LoopRunner:
    """Runs coroutines on one private, reused event loop (no new loop per call)."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None

    def run(self, coro: Coroutine[Any, Any, T], eager: bool = False) -> T:
        """Run ``coro`` to completion and return its result.

        With ``eager=True`` the coroutine is first driven directly, without an event loop
        (``coro.send(None)``): one that completes without suspending costs no loop round trip;
        one that suspends is finished on the loop, so the result is the same either way. Until
        it first suspends, such a coroutine runs with no running loop: it must not ask for one
        (``asyncio.get_running_loop``, ``create_task``, ``to_thread``) before its first
        ``await`` that suspends (``await asyncio.sleep(0)`` is one; see
        :attr:`llm_gym.core.env.Env.synchronous`).
        """
        if eager:
            try:
                yielded = coro.send(None)
            except StopIteration as stop:
                return stop.value
            coro = resume(coro, yielded)
        if _loop_running():  # called from inside a running loop
            return _in_thread(coro)
        loop = self._loop
        if loop is None or loop.is_closed():
            self._loop = loop = asyncio.new_event_loop()
            # Close the loop when the runner is dropped without close() (no ResourceWarning).
            weakref.finalize(self, loop.close)
        return loop.run_until_complete(coro)

    @property
    def has_loop(self) -> bool:
        """Whether a call needed the loop (made at the first call that suspends)."""
        return self._loop is not None and not self._loop.is_closed()

    def close(self) -> None:
        if self._loop is not None and not self._loop.is_closed():
            self._loop.close()
        self._loop = None
