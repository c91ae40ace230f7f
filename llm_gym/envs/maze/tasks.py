"""The seeded tasks of Maze-v0 and their splits.

Each task is a maze carved by :func:`~llm_gym.envs.maze.grid.generate_maze` (a randomized
depth-first search, so every open cell is reachable, with a few walls knocked out in the larger
mazes to add loops), a start room and a goal room far from it.
"""

from __future__ import annotations

import functools
import hashlib
import random
from collections.abc import Sequence

from llm_gym.core.task import Task, cut_splits, pick_split
from llm_gym.envs.maze.grid import Cell, distances_from, generate_maze
from llm_gym.errors import InvalidArgumentError

__all__ = ["SIZES", "SPLIT_SIZES", "TASK_SEED", "generate_tasks", "get_tasks"]

SIZES = (5, 7, 9)
"""Grid heights and widths (border walls included); the two are drawn independently."""
SIZE_WEIGHTS = (1, 3, 6)
SPLIT_SIZES = {"train": 1000, "val": 200, "test": 200}
"""Tasks per split; no maze layout appears twice in all of them (so the splits share no prompt
and no maze)."""
TASK_SEED = 20261214
"""Seed of the task universe: the same seed always gives the same tasks in the same splits."""


def _maze_id(grid: Sequence[str], start: Cell, goal: Cell) -> str:
    text = "\n".join(grid) + f"\n{start}\n{goal}"
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def _one_task(rng: random.Random) -> Task:
    height, width = rng.choices(SIZES, weights=SIZE_WEIGHTS, k=2)
    extra = rng.randint(0, 2) if height * width >= 63 else 0
    grid = generate_maze(rng, height, width, extra_openings=extra)
    rooms = [(r, c) for r in range(1, height, 2) for c in range(1, width, 2)]
    start = rng.choice(rooms)
    distances = distances_from(grid, start)
    farthest = max(distances[room] for room in rooms)
    # The goal is a room at least 60% of the way to the farthest one: never a trivial walk.
    far_rooms = [room for room in rooms if distances[room] >= max(2, 0.6 * farthest)]
    goal = rng.choice(far_rooms)
    maze_id = _maze_id(grid, start, goal)
    prompt = (
        f"Maze {maze_id}: {height} rows x {width} columns. You are at row {start[0]}, column "
        f"{start[1]}. The goal is at row {goal[0]}, column {goal[1]}. Reach the goal."
    )
    metadata = {
        "grid": list(grid),
        "start": list(start),
        "goal": list(goal),
        "shortest_path_length": distances[goal],
    }
    return Task(prompt=prompt, target=list(goal), metadata=metadata)


def generate_tasks(seed: int, n: int) -> list[Task]:
    """``n`` distinct mazes (no two share a layout, nor so a prompt) from ``random.Random(seed)``.

    A pure function of its arguments: the same seed always gives the same list. Each task's
    ``metadata`` holds the ``grid`` (rows of ``'#'`` and ``'.'``), the ``start`` and ``goal``
    cells as ``[row, column]`` and the ``shortest_path_length``; the prompt names the maze by a
    hash of all three, the grid's size, the start and the goal. ``target`` is the goal cell.
    """
    if not isinstance(n, int) or n < 0:
        raise InvalidArgumentError(f"n must be an int >= 0, actual value: {n!r}.")
    rng = random.Random(seed)
    seen_layouts: set[tuple[str, ...]] = set()
    seen_prompts: set[str] = set()
    tasks: list[Task] = []
    attempts = 0
    while len(tasks) < n:
        attempts += 1
        if attempts > 50 * n:
            raise InvalidArgumentError(f"Could not draw {n} distinct mazes; asked for too many.")
        task = _one_task(rng)
        layout = tuple(task.metadata["grid"])
        if layout not in seen_layouts and task.prompt not in seen_prompts:
            seen_layouts.add(layout)
            seen_prompts.add(task.prompt)
            tasks.append(task)
    return tasks


@functools.cache
def _splits() -> dict[str, tuple[Task, ...]]:
    universe = generate_tasks(TASK_SEED, sum(SPLIT_SIZES.values()))
    # The few small layouts are drawn early and then run out: shuffle so that every split gets
    # its share of them.
    random.Random(TASK_SEED).shuffle(universe)
    return cut_splits(universe, SPLIT_SIZES, "maze")


def get_tasks(split: str = "train") -> tuple[Task, ...]:
    """The tasks of ``split`` (``"train"``, ``"val"`` or ``"test"``)."""
    return pick_split(_splits(), split)
