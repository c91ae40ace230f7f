"""reasoning-gym's generators, run where they can be stopped: a child process, a deadline.

Some configs make reasoning-gym's own code run for minutes or without end: ``basic_arithmetic``
with ``max_digits=2000`` lists the divisors of numbers of thousands of digits by trial division
up to their square root. No Python code can interrupt that from the same process, so every
dataset is built and its entries generated in a child process (:func:`generate_entries`): the
``fork`` start method where the platform has it (the child starts at once, reasoning-gym
already imported; ``spawn`` elsewhere). The entries come back through a pipe in batches that
double in size (a caller that needs a few entries has them at once; thousands of entries cost
a dozen messages), and the child is killed when the caller has what it needs, or when building
the dataset or generating one entry takes longer than ``timeout_s``
(:data:`GENERATION_TIMEOUT_S` by default). Past that deadline the options are refused with an
:class:`~llm_gym.errors.InvalidArgumentError` that names the dataset, the config and the limit.

The task source calls this once per split (the tasks are cached) and once per new config (a
check that it builds), so a process pays one fork per split, not one per reset.
"""

from __future__ import annotations

import json
import math
import multiprocessing
import time
from collections.abc import Iterator
from functools import cache
from types import ModuleType
from typing import Any

from llm_gym.errors import InvalidArgumentError

__all__ = [
    "GENERATION_TIMEOUT_S",
    "INSTALL_HINT",
    "MAX_GENERATION_TIMEOUT_S",
    "SEND_INTERVAL_S",
    "START_TIMEOUT_S",
    "check_timeout",
    "generate_entries",
    "load_reasoning_gym",
    "make_dataset",
]

INSTALL_HINT = "pip install -e '.[interop]'"
"""How to install the optional dependency (reasoning-gym)."""
GENERATION_TIMEOUT_S = 5.0
"""The most seconds reasoning-gym may take to build a dataset from its config or to generate
one entry of it (the offered datasets take well under 0.1 s with their default configs); past
it the generation is stopped and the options refused. The ``generation_timeout_s`` task option
overrides it."""
MAX_GENERATION_TIMEOUT_S = 600.0
"""The largest ``generation_timeout_s``."""
SEND_INTERVAL_S = 0.05
"""The child sends the entries it has generated at least this often (a batch per message), so
the deadline of each entry is kept to within this much."""
START_TIMEOUT_S = 60.0
"""Seconds the child may take to start (``spawn`` imports llm_gym and reasoning-gym first)."""


@cache
def load_reasoning_gym() -> ModuleType:
    """The ``reasoning_gym`` module, imported once; a clear error when it is not installed."""
    try:
        import reasoning_gym
    except ImportError as exc:
        raise ImportError(
            f"llm_gym's reasoning-gym environments need reasoning-gym: {INSTALL_HINT}"
        ) from exc
    return reasoning_gym


def make_dataset(dataset: str, config: str, *, seed: int, size: int) -> Any:
    """reasoning-gym's dataset ``dataset`` with the JSON ``config``, ``seed`` and ``size``, built
    in this process; a config it refuses becomes an error that lists the config's fields.
    Building is cheap for a config :func:`generate_entries` has built once within its limit."""
    rg = load_reasoning_gym()
    try:
        return rg.create_dataset(dataset, seed=seed, size=size, **json.loads(config))
    except Exception as exc:  # the config class's TypeError, validate()'s AssertionError, ...
        config_cls = rg.factory.DATASETS[dataset][1]
        fields = sorted(getattr(config_cls, "__dataclass_fields__", {}))
        raise InvalidArgumentError(
            f"reasoning-gym refused config {config} for {dataset!r}: {type(exc).__name__}: "
            f"{exc}. Its config fields: {fields}."
        ) from exc


def check_timeout(value: Any) -> float:
    """``value`` as the seconds of ``generation_timeout_s``: a number in (0,
    :data:`MAX_GENERATION_TIMEOUT_S`]; else a named error."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or not 0 < value <= MAX_GENERATION_TIMEOUT_S
    ):
        raise InvalidArgumentError(
            f"generation_timeout_s must be a number of seconds in (0, "
            f"{MAX_GENERATION_TIMEOUT_S:g}], actual value: {value!r:.80}."
        )
    return float(value)


def _context() -> Any:
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("fork" if "fork" in methods else "spawn")


def _child(pipe: Any, dataset: str, config: str, seed: int, size: int, chunks: int) -> None:
    """The child's work: build the dataset, then send ``(seed, index, entry)`` of its entries
    ``0..size-1``, then of the next chunk's (seeded ``seed + size``), ``chunks`` chunks in all.

    Messages: ``("started", None)``, ``("built", None)``, ``("entries", [...])`` any number of
    times, then ``("done", None)``; or ``("refused", text)`` when reasoning-gym refuses the
    config, ``("failed", text)`` when it raises on an entry (or an entry cannot be sent)."""
    try:
        pipe.send(("started", None))
        try:
            data = make_dataset(dataset, config, seed=seed, size=max(size, 1))
        except InvalidArgumentError as exc:
            pipe.send(("refused", str(exc)))
            return
        pipe.send(("built", None))
        batch: list[Any] = []
        sent, total = time.monotonic(), 0
        for count in range(size * chunks):
            chunk, index = divmod(count, size)
            if index == 0 and chunk:
                data = make_dataset(dataset, config, seed=seed + chunk * size, size=size)
            batch.append((seed + chunk * size, index, data[index]))
            # Batches double (1, 1, 2, 4, ...: a caller that needs a few entries has them at
            # once) up to one per SEND_INTERVAL_S (a slow entry is sent as soon as it is made).
            if len(batch) > total or time.monotonic() - sent >= SEND_INTERVAL_S:
                pipe.send(("entries", batch))
                total += len(batch)
                batch, sent = [], time.monotonic()
        pipe.send(("entries", batch))
        pipe.send(("done", None))
    except Exception as exc:  # reported to the parent, which raises it by name
        pipe.send(("failed", f"{type(exc).__name__}: {str(exc)[:500]}"))
    finally:
        pipe.close()


def generate_entries(
    dataset: str,
    config: str,
    *,
    seed: int,
    size: int,
    chunks: int = 1,
    timeout_s: float = GENERATION_TIMEOUT_S,
) -> Iterator[tuple[int, int, dict[str, Any]]]:
    """``(chunk seed, index, entry)`` of reasoning-gym's entries ``0..size-1`` of ``dataset``
    (JSON ``config``, ``seed``, ``size``), then of the same dataset seeded ``seed + size``, and
    so on for ``chunks`` chunks, generated in a child process and yielded as they come.
    ``size=0`` only builds the dataset (a check of the config).

    The entries are those of ``create_dataset(dataset, seed=chunk_seed, size=size,
    **config)[index]`` in this process (they cross a pipe, so they are pickled). Raises
    :class:`~llm_gym.errors.InvalidArgumentError` when reasoning-gym refuses the config, raises
    on an entry, or takes longer than ``timeout_s`` to build the dataset or to generate one
    entry; the child is then killed. Closing the iterator early (``contextlib.closing``) kills
    the child too.
    """
    context = _context()
    receiver, sender = context.Pipe(duplex=False)
    child = context.Process(
        target=_child,
        args=(sender, dataset, config, seed, size, chunks),
        name=f"reasoning-gym {dataset}",
        daemon=True,
    )
    child.start()
    sender.close()
    try:
        wait_s, stage = START_TIMEOUT_S, "start"
        while True:
            if not receiver.poll(wait_s):
                raise _too_slow(dataset, config, timeout_s, stage)
            try:
                kind, value = receiver.recv()
            except EOFError:
                child.join(1.0)
                raise InvalidArgumentError(
                    f"reasoning-gym's {dataset!r} generator process ended without its entries "
                    f"(exit code {child.exitcode}) with config {config:.200}; use a config that "
                    "generates smaller entries."
                ) from None
            wait_s = timeout_s
            if kind == "entries":
                yield from value
                stage = "entry"
            elif kind == "built":
                stage = "entry"
            elif kind == "started":
                stage = "build"
            elif kind == "done":
                return
            elif kind == "refused":
                raise InvalidArgumentError(value)
            else:
                raise InvalidArgumentError(
                    f"reasoning-gym's {dataset!r} raised generating an entry with config "
                    f"{config:.200}: {value}. Use another config."
                )
    finally:
        child.kill()
        child.join()
        receiver.close()


def _too_slow(dataset: str, config: str, timeout_s: float, stage: str) -> InvalidArgumentError:
    if stage == "start":
        return InvalidArgumentError(
            f"reasoning-gym's generator process for {dataset!r} did not start within "
            f"{START_TIMEOUT_S:g} s."
        )
    what = "to build the dataset" if stage == "build" else "to generate one entry"
    return InvalidArgumentError(
        f"reasoning-gym's {dataset!r} took over {timeout_s:g} s {what} with config "
        f"{config:.200} (generation_timeout_s={timeout_s:g}); use a config that generates "
        "faster (fewer digits, terms or cells), or raise generation_timeout_s."
    )
