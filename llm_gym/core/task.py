"""``Task``: the spec of one episode."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from llm_gym.errors import InvalidArgumentError

__all__ = ["Task", "cut_splits", "distinct_tasks", "pick_split", "task_key"]


@dataclass(frozen=True)
class Task:
    """The spec of one episode: what the model is asked and what the reward checks against.

    Example:
        >>> Task(prompt="What is 2 + 3?", target=5).target
        5
    """

    prompt: str
    """The user's request, shown to the model as the first user message."""
    target: Any = None
    """What the reward checks against (a number, a name, a list of hidden tests...)."""
    metadata: Mapping[str, Any] = field(default_factory=dict)
    """Anything else the environment or its oracle needs (task type, fact keys, a seed...)."""
    id: str | None = None
    """A stable identifier, unique within a task set; used for grouping and reports."""

    def __post_init__(self) -> None:
        if not isinstance(self.prompt, str):
            raise InvalidArgumentError(
                f"Task.prompt must be a str, actual type: {type(self.prompt).__name__}."
            )
        if not isinstance(self.metadata, Mapping):
            raise InvalidArgumentError(
                f"Task.metadata must be a mapping, actual type: {type(self.metadata).__name__}."
            )
        if self.id is not None and (
            isinstance(self.id, bool) or not isinstance(self.id, str | int)
        ):
            raise InvalidArgumentError(  # reports group episodes by it
                f"Task.id must be None, a str or an int, actual value: {self.id!r:.80}."
            )

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: ``{"prompt", "target", "metadata", "id"}``."""
        return {
            "prompt": self.prompt,
            "target": self.target,
            "metadata": dict(self.metadata),
            "id": self.id,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Task:
        """Build a task from a dict such as one JSONL line.

        Accepts the keys of :meth:`to_dict`; ``input``/``output`` (the keys of document 002's
        datasets) are read as ``prompt``/``target`` when ``prompt`` is absent.
        """
        if not isinstance(data, Mapping):
            raise InvalidArgumentError(
                f"Expected a mapping with a 'prompt' key, actual type: {type(data).__name__}."
            )
        allowed = {"prompt", "target", "metadata", "id", "input", "output"}
        unknown = sorted(set(data) - allowed)
        if unknown:
            raise InvalidArgumentError(
                f"Unknown task keys {unknown}; allowed keys: {sorted(allowed)}."
            )
        if "prompt" in data:
            prompt, target = data["prompt"], data.get("target")
        elif "input" in data:
            prompt, target = data["input"], data.get("output")
        else:
            raise InvalidArgumentError(
                f"A task needs a 'prompt' (or 'input') key, actual keys: {sorted(data)}."
            )
        metadata = data.get("metadata") or {}
        if isinstance(metadata, Mapping):  # a copy; anything else is refused, by name
            metadata = dict(metadata)
        return cls(prompt=prompt, target=target, metadata=metadata, id=data.get("id"))


def distinct_tasks(draw: Callable[[], Task | None], n: int) -> list[Task]:
    """``n`` tasks from ``draw()`` with no two sharing a prompt (``None`` draws are skipped), in
    draw order; gives up after ``50 * n`` draws with a clear error.

    Example:
        >>> prompts = iter(["a", "b", "a", "c"])
        >>> [t.prompt for t in distinct_tasks(lambda: Task(next(prompts)), 3)]
        ['a', 'b', 'c']
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise InvalidArgumentError(f"n must be an int >= 0, actual value: {n!r}.")
    seen: set[str] = set()
    tasks: list[Task] = []
    attempts = 0
    while len(tasks) < n:
        attempts += 1
        if attempts > 50 * n:
            raise InvalidArgumentError(f"Could not draw {n} distinct tasks; asked for too many.")
        task = draw()
        if task is not None and task.prompt not in seen:
            seen.add(task.prompt)
            tasks.append(task)
    return tasks


def cut_splits(
    universe: Sequence[Task], sizes: Mapping[str, int], name: str
) -> dict[str, tuple[Task, ...]]:
    """Cut distinct tasks into consecutive splits; ids become ``f"{name}/{split}/{i:04d}"``.

    Example:
        >>> splits = cut_splits([Task("a"), Task("b"), Task("c")], {"train": 2, "val": 1}, "demo")
        >>> [t.id for t in splits["train"]], splits["val"][0].prompt
        (['demo/train/0000', 'demo/train/0001'], 'c')
    """
    splits: dict[str, tuple[Task, ...]] = {}
    start = 0
    for split, size in sizes.items():
        splits[split] = tuple(
            Task(t.prompt, t.target, t.metadata, id=f"{name}/{split}/{i:04d}")
            for i, t in enumerate(universe[start : start + size])
        )
        start += size
    return splits


def pick_split(splits: Mapping[str, tuple[Task, ...]], split: str) -> tuple[Task, ...]:
    """``splits[split]``, or a clear error naming the splits there are."""
    if split not in splits:
        raise InvalidArgumentError(
            f"split must be one of {sorted(splits)}, actual value: {split!r}."
        )
    return splits[split]


def task_key(task: Task, index: int) -> str:
    """A task's name among its split's tasks: its ``id``, else ``task-{index}`` (its place in
    the split), so every task can be named in a dataset row or over the wire.

    Example:
        >>> task_key(Task("q", id="a/0"), 3), task_key(Task("q"), 3)
        ('a/0', 'task-3')
    """
    return str(task.id) if task.id is not None else f"task-{index}"
