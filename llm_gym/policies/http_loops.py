"""One HTTP client per event loop, closed when its loop shuts down.

An ``httpx.AsyncClient`` (its connection pool, its sockets) belongs to the event loop that
opened its connections, and a policy may be used from several: successive ``asyncio.run``
calls, the async trainer's worker thread, :func:`~llm_gym.aio.run_sync`'s thread.
:class:`LoopClients` keeps one client (and one concurrency semaphore) per running loop.

Closing. Each loop's client is tied to a small async generator started on that loop: a loop
shut down the standard way (``asyncio.run``, or ``loop.shutdown_asyncgens()`` before
``loop.close()``, as the async trainer's worker does) closes its generators, and the generator's
``finally`` closes the client and forgets it. :meth:`LoopClients.close` closes every loop's
client from any thread (on the loop itself, or through ``run_coroutine_threadsafe``). A loop
closed without shutting its generators down cannot close anything any more: its client is
dropped at the next :meth:`LoopClients.get`, and its sockets go with the garbage collector.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import weakref
from collections.abc import AsyncGenerator, Callable
from typing import Any

__all__ = ["LoopClients"]


class _State:
    """What one event loop holds: its client, its semaphore, the generator that closes them."""

    __slots__ = ("client", "keeper", "semaphore")

    def __init__(self, client: Any, semaphore: asyncio.Semaphore) -> None:
        self.client = client
        self.semaphore = semaphore
        self.keeper: AsyncGenerator[None, None] | None = None


async def _close(state: _State) -> None:
    if state.keeper is not None:
        with contextlib.suppress(RuntimeError):  # already closing on its own loop
            await state.keeper.aclose()
    await state.client.aclose()


class LoopClients:
    """One client and one semaphore per running event loop (see the module docstring).

    Args:
        factory: Makes a client (an object with ``async aclose()``); called on the loop that
            will use it.
        max_concurrency: The value of each loop's semaphore.
    """

    def __init__(self, factory: Callable[[], Any], max_concurrency: int) -> None:
        self._factory = factory
        self._max_concurrency = max_concurrency
        self._lock = threading.Lock()
        self._states: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _State] = (
            weakref.WeakKeyDictionary()
        )
        self._closing: set[asyncio.Future[Any]] = set()

    def __len__(self) -> int:
        """Loops that hold a client now."""
        with self._lock:
            return len(self._states)

    async def get(self) -> tuple[Any, asyncio.Semaphore]:
        """The running loop's client and semaphore, made on first use."""
        loop = asyncio.get_running_loop()
        with self._lock:
            state = self._states.get(loop)
            if state is not None:
                return state.client, state.semaphore
            for other in [other for other in self._states if other.is_closed()]:
                del self._states[other]  # closed without shutdown: nothing can close these
            state = self._states[loop] = _State(
                self._factory(), asyncio.Semaphore(self._max_concurrency)
            )
            state.keeper = self._keeper(loop, state)
            step = state.keeper.__anext__()  # the loop registers it (closes it on shutdown)
        await step  # no suspension: the generator runs straight to its ``yield``
        return state.client, state.semaphore

    async def _keeper(
        self, loop: asyncio.AbstractEventLoop, state: _State
    ) -> AsyncGenerator[None, None]:
        try:
            yield
        finally:
            with self._lock:
                if self._states.get(loop) is state:
                    del self._states[loop]
            await state.client.aclose()

    def close(self) -> None:
        """Close every loop's client: on the calling thread's running loop as a task, on a
        loop running elsewhere through ``run_coroutine_threadsafe`` (not waited for), on an idle
        loop by running it (when this thread runs no loop). A later :meth:`get` makes a new
        client."""
        with self._lock:
            states = list(self._states.items())
            self._states.clear()
        try:
            current: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            current = None
        for loop, state in states:
            if loop.is_closed():
                continue
            closing = _close(state)
            try:
                if loop is current:
                    task = loop.create_task(closing)
                    self._closing.add(task)
                    task.add_done_callback(self._closing.discard)
                elif loop.is_running():
                    asyncio.run_coroutine_threadsafe(closing, loop)
                elif current is None:
                    loop.run_until_complete(closing)
                else:  # an idle loop, and this thread runs another: it cannot be run here
                    closing.close()
            except RuntimeError:  # the loop closed, or started elsewhere, meanwhile
                closing.close()

    async def aclose(self) -> None:
        """:meth:`close`, waiting until the running loop's client is closed."""
        loop = asyncio.get_running_loop()
        with self._lock:
            state = self._states.pop(loop, None)
        self.close()
        if state is not None:
            await _close(state)
