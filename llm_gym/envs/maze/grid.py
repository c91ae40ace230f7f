"""The mazes of Maze-v0: a seeded maze generator, a breadth-first solver and a text rendering.

A maze is a list of equally long rows of ``'#'`` (wall) and ``'.'`` (open); a cell is
``(row, column)`` with rows growing downwards.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Sequence

from llm_gym.errors import InvalidArgumentError

__all__ = [
    "AGENT",
    "DIRECTIONS",
    "GOAL",
    "OPEN",
    "WALL",
    "Cell",
    "distances_from",
    "generate_maze",
    "open_neighbours",
    "render_maze",
    "shortest_path",
]

DIRECTIONS: dict[str, tuple[int, int]] = {
    "up": (-1, 0),
    "down": (1, 0),
    "left": (0, -1),
    "right": (0, 1),
}
"""The four moves as (row, column) offsets; rows grow downwards."""

WALL, OPEN, AGENT, GOAL = "#", ".", "@", "G"
"""The symbols of a rendered cell: a wall, an open cell, the agent, the goal."""

Cell = tuple[int, int]
"""A cell as ``(row, column)``."""


def generate_maze(
    rng: random.Random, height: int, width: int, extra_openings: int = 0
) -> list[str]:
    """A maze of ``height`` x ``width`` cells (odd sizes >= 5, border walls included).

    Rooms sit at odd (row, column); a randomized depth-first search from a random room opens the
    wall between each room and the one it came from, so every open cell is reachable. Then
    ``extra_openings`` more interior walls between two rooms are opened, which adds loops.
    Returns the rows as strings of ``'#'`` and ``'.'``.
    """
    if height < 5 or width < 5 or height % 2 == 0 or width % 2 == 0:
        raise InvalidArgumentError(
            f"Maze sizes must be odd and >= 5, actual value: {height} x {width}."
        )
    grid = [[WALL] * width for _ in range(height)]
    rooms = [(r, c) for r in range(1, height, 2) for c in range(1, width, 2)]
    first = rng.choice(rooms)
    grid[first[0]][first[1]] = OPEN
    stack = [first]
    while stack:
        r, c = stack[-1]
        unvisited = [
            (r + 2 * dr, c + 2 * dc)
            for dr, dc in DIRECTIONS.values()
            if 0 < r + 2 * dr < height
            and 0 < c + 2 * dc < width
            and grid[r + 2 * dr][c + 2 * dc] == WALL
        ]
        if not unvisited:
            stack.pop()
            continue
        nr, nc = rng.choice(unvisited)
        grid[(r + nr) // 2][(c + nc) // 2] = OPEN
        grid[nr][nc] = OPEN
        stack.append((nr, nc))
    walls_between_rooms = [
        (r, c)
        for r in range(1, height - 1)
        for c in range(1, width - 1)
        if grid[r][c] == WALL and (r % 2) != (c % 2)
    ]
    for r, c in rng.sample(walls_between_rooms, min(extra_openings, len(walls_between_rooms))):
        grid[r][c] = OPEN
    return ["".join(row) for row in grid]


def open_neighbours(grid: Sequence[str], cell: Cell) -> list[tuple[str, Cell]]:
    """The moves out of ``cell`` that do not walk into a wall, with the cells they reach."""
    r, c = cell
    return [
        (d, (r + dr, c + dc)) for d, (dr, dc) in DIRECTIONS.items() if grid[r + dr][c + dc] != WALL
    ]


def distances_from(grid: Sequence[str], start: Cell) -> dict[Cell, int]:
    """The number of moves from ``start`` to every cell it can reach (breadth-first search)."""
    distances = {start: 0}
    queue = deque([start])
    while queue:
        cell = queue.popleft()
        for _, nxt in open_neighbours(grid, cell):
            if nxt not in distances:
                distances[nxt] = distances[cell] + 1
                queue.append(nxt)
    return distances


def shortest_path(grid: Sequence[str], start: Sequence[int], goal: Sequence[int]) -> list[str]:
    """The moves of a shortest path from ``start`` to ``goal`` (breadth-first search).

    Raises:
        InvalidArgumentError: the goal cannot be reached from the start.
    """
    source, target = (int(start[0]), int(start[1])), (int(goal[0]), int(goal[1]))
    came_from: dict[Cell, tuple[Cell, str] | None] = {source: None}
    queue = deque([source])
    while queue and target not in came_from:
        cell = queue.popleft()
        for direction, nxt in open_neighbours(grid, cell):
            if nxt not in came_from:
                came_from[nxt] = (cell, direction)
                queue.append(nxt)
    if target not in came_from:
        raise InvalidArgumentError(
            f"The goal {list(target)} cannot be reached from {list(source)}."
        )
    moves: list[str] = []
    step = came_from[target]
    while step is not None:
        cell, direction = step
        moves.append(direction)
        step = came_from[cell]
    return moves[::-1]


def render_maze(grid: Sequence[str], start: Sequence[int], goal: Sequence[int]) -> str:
    """The whole maze as text, with ``S`` at the start and ``G`` at the goal (for people)."""
    rows = [list(row) for row in grid]
    rows[start[0]][start[1]] = "S"
    rows[goal[0]][goal[1]] = GOAL
    return "\n".join("".join(row) for row in rows)
