"""Running llm_gym's async code from synchronous code."""

from __future__ import annotations

import asyncio
import threading
import types
import weakref
from asyncio.events import _get_running_loop, _set_running_loop
from collections.abc import Awaitable, Callable, Coroutine, Generator
from typing import Any, TypeVar

__all__ = ["LoopRunner", "run_sync", "within"]

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


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(coro)``, also from inside a running event loop (a notebook, say)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    return _in_thread(coro)


async def within(
    call: Awaitable[T], timeout_s: float | None, error: Callable[[], BaseException]
) -> T:
    """``await call``; when ``timeout_s`` (None: no limit) passes first, ``call`` is cancelled
    and ``error()`` is raised instead of the ``TimeoutError``."""
    if timeout_s is None:
        return await call
    try:
        return await asyncio.wait_for(call, timeout_s)
    except TimeoutError:
        raise error() from None


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


async def _finish(coro: Coroutine[Any, Any, T], yielded: Any) -> T:
    return await _resume(coro, yielded)


class LoopRunner:
    """Runs coroutines on one private, reused event loop (no new loop per call)."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None

    def run(self, coro: Coroutine[Any, Any, T], eager: bool = False) -> T:
        """Run ``coro`` to completion and return its result.

        With ``eager=True`` the coroutine is first driven directly (no event loop round trip);
        if it suspends on a real awaitable it is finished on the loop, so the result is the same
        either way. Use it for coroutines that usually complete without suspending.
        """
        if _get_running_loop() is not None:  # called from inside a running loop
            return _in_thread(coro)
        loop = self._loop
        if loop is None or loop.is_closed():
            self._loop = loop = asyncio.new_event_loop()
            # Close the loop when the runner is dropped without close() (no ResourceWarning).
            weakref.finalize(self, loop.close)
        if not eager:
            return loop.run_until_complete(coro)
        _set_running_loop(loop)
        try:
            yielded = coro.send(None)
        except StopIteration as stop:
            return stop.value
        finally:
            _set_running_loop(None)
        return loop.run_until_complete(_finish(coro, yielded))

    def close(self) -> None:
        if self._loop is not None and not self._loop.is_closed():
            self._loop.close()
        self._loop = None
