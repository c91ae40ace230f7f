"""Maze: reach the goal of a text grid under partial observation with ``look`` and ``move``.

Each task is a maze carved by a seeded generator (a randomized depth-first search, so every open
cell is reachable, with a few walls knocked out in the larger mazes to add loops). The agent
knows its own position and the goal's, but sees the walls only through ``look`` (its 3x3
neighbourhood); ``move`` walks one cell. The module reads top to bottom: constants, the maze
generator and solver, the seeded task generator and its splits, the tools, the environment, the
oracle.
"""

from __future__ import annotations

import functools
import hashlib
import json
import random
import re
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

from llm_gym.core.env import StepResult
from llm_gym.core.task import Task, pick_split
from llm_gym.core.tool import ToolResult, decode_arguments
from llm_gym.core.tool_env import ToolEnv
from llm_gym.core.types import JsonSchema, Message, ToolCall
from llm_gym.errors import InvalidArgumentError, ToolArgumentError

__all__ = [
    "DIRECTIONS",
    "DIRECTION_ALIASES",
    "MAX_CALLS_PER_TURN",
    "SIZES",
    "SPLIT_SIZES",
    "SYSTEM_PROMPT",
    "TURN_BUDGET",
    "VERSION",
    "MazeEnv",
    "generate_maze",
    "generate_tasks",
    "get_tasks",
    "oracle_action",
    "render_maze",
    "shortest_path",
]

# --- constants ------------------------------------------------------------------------------------

VERSION = "0"
"""Bumped whenever tasks, tools or rewards change (records carry it)."""

TURN_BUDGET = 30
"""Assistant turns per episode: the episode ends with reward 0.0 after this many turns without
reaching the goal. The oracle needs at most 9 (one look, then four moves a turn along a shortest
path of at most 30 moves); the rollout loop's own limit for Maze-v0 is 40."""
MAX_CALLS_PER_TURN = 4
"""Tool calls run per assistant message; further calls in the same message are skipped with a
tool error, so a blind list of moves cannot replace looking."""
ORACLE_MOVES_PER_TURN = 4
"""Moves the oracle sends in one message."""

DIRECTIONS: dict[str, tuple[int, int]] = {
    "up": (-1, 0),
    "down": (1, 0),
    "left": (0, -1),
    "right": (0, 1),
}
"""The four moves as (row, column) offsets; rows grow downwards."""
DIRECTION_ALIASES: dict[str, str] = {
    **{d: d for d in DIRECTIONS},
    "north": "up",
    "south": "down",
    "west": "left",
    "east": "right",
    "n": "up",
    "s": "down",
    "w": "left",
    "e": "right",
}
"""Every accepted spelling of a direction (matched case-insensitively) and the move it means."""

WALL, OPEN, AGENT, GOAL = "#", ".", "@", "G"

SIZES = (5, 7, 9)
"""Grid heights and widths (border walls included); the two are drawn independently."""
SIZE_WEIGHTS = (1, 3, 6)
SPLIT_SIZES = {"train": 1000, "val": 200, "test": 200}
"""Tasks per split; no maze layout appears twice in all of them (so the splits share no prompt
and no maze)."""
TASK_SEED = 20261214
"""Seed of the task universe: the same seed always gives the same tasks in the same splits."""

SYSTEM_PROMPT = (
    "You are in a maze drawn on a grid of cells. Rows are numbered from 0 at the top, columns "
    "from 0 at the left; the outer border is wall. You know where you are and where the goal "
    "is, but not where the walls are: call look to see the 3x3 cells around you ('#' wall, "
    "'.' open, '@' you, 'G' the goal) and the open directions. Call move with a direction "
    "(up, down, left or right; north, south, west, east and n, s, w, e also work) to walk one "
    "cell; moving into a wall leaves you where you are. You may send several tool calls in one "
    f"message (at most {MAX_CALLS_PER_TURN}); they run in order. The episode ends with reward 1 "
    f"when you reach the goal, and with reward 0 after {TURN_BUDGET} messages or when you reply "
    "without a tool call."
)

# --- the maze generator and solver ----------------------------------------------------------------

Cell = tuple[int, int]


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


def _neighbours(grid: Sequence[str], cell: Cell) -> list[tuple[str, Cell]]:
    r, c = cell
    return [
        (d, (r + dr, c + dc)) for d, (dr, dc) in DIRECTIONS.items() if grid[r + dr][c + dc] != WALL
    ]


def _distances(grid: Sequence[str], start: Cell) -> dict[Cell, int]:
    distances = {start: 0}
    queue = deque([start])
    while queue:
        cell = queue.popleft()
        for _, nxt in _neighbours(grid, cell):
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
        for direction, nxt in _neighbours(grid, cell):
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


# --- the seeded task generator --------------------------------------------------------------------


def _maze_id(grid: Sequence[str], start: Cell, goal: Cell) -> str:
    text = "\n".join(grid) + f"\n{start}\n{goal}"
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def _one_task(rng: random.Random) -> Task:
    height, width = rng.choices(SIZES, weights=SIZE_WEIGHTS, k=2)
    extra = rng.randint(0, 2) if height * width >= 63 else 0
    grid = generate_maze(rng, height, width, extra_openings=extra)
    rooms = [(r, c) for r in range(1, height, 2) for c in range(1, width, 2)]
    start = rng.choice(rooms)
    distances = _distances(grid, start)
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
    splits: dict[str, tuple[Task, ...]] = {}
    start = 0
    for split, size in SPLIT_SIZES.items():
        chunk = universe[start : start + size]
        splits[split] = tuple(
            Task(t.prompt, t.target, t.metadata, id=f"maze/{split}/{i:04d}")
            for i, t in enumerate(chunk)
        )
        start += size
    return splits


def get_tasks(split: str = "train") -> tuple[Task, ...]:
    """The tasks of ``split`` (``"train"``, ``"val"`` or ``"test"``)."""
    return pick_split(_splits(), split)


# --- tools ----------------------------------------------------------------------------------------


def _where(cell: Cell) -> str:
    return f"row {cell[0]}, column {cell[1]}"


class _LookTool:
    """``look``: the 3x3 cells around the agent, its position and the open directions."""

    name = "look"
    description = (
        "See the 3x3 cells around you ('#' wall, '.' open, '@' you, 'G' the goal), your "
        "position, the goal's position and the directions you can move in."
    )
    synchronous = True
    """``execute`` never awaits anything: callers may run it without an event loop."""

    def __init__(self, env: MazeEnv) -> None:
        self.env = env
        self.parameters_schema: JsonSchema = {"type": "object", "properties": {}, "required": []}

    async def execute(self, arguments: str) -> ToolResult:
        unknown = sorted(decode_arguments(arguments))
        if unknown:
            raise ToolArgumentError(
                f"look takes no arguments, got {unknown[:5]}; call it with {{}}."
            )
        return ToolResult(content=self.env.look())


class _MoveTool:
    """``move``: walk one cell up, down, left or right."""

    name = "move"
    description = (
        "Walk one cell in a direction. Moving into a wall leaves you where you are. Reaching "
        "the goal ends the episode."
    )
    synchronous = True
    """``execute`` never awaits anything: callers may run it without an event loop."""

    def __init__(self, env: MazeEnv) -> None:
        self.env = env
        self.parameters_schema: JsonSchema = {
            "type": "object",
            "properties": {
                "direction": {
                    "type": "string",
                    "enum": list(DIRECTIONS),
                    "description": "up, down, left or right (north, south, west, east and n, "
                    "s, w, e are accepted too). Rows grow downwards.",
                }
            },
            "required": ["direction"],
        }

    async def execute(self, arguments: str) -> ToolResult:
        values = decode_arguments(arguments)
        unknown = sorted(set(values) - {"direction"})
        if unknown:
            raise ToolArgumentError(
                f"unknown argument(s) {unknown[:5]} for move; allowed: ['direction']."
            )
        if "direction" not in values:
            raise ToolArgumentError(
                'move needs a direction, e.g. {"direction": "up"}; allowed: up, down, left, right.'
            )
        raw = values["direction"]
        direction = DIRECTION_ALIASES.get(raw.strip().lower()) if isinstance(raw, str) else None
        if direction is None:
            raise ToolArgumentError(
                f"direction must be one of up, down, left, right (or north, south, west, east; "
                f"n, s, w, e), got {json.dumps(raw)[:40]}."
            )
        content, reached = self.env.move(direction)
        return ToolResult(content=content, should_stop=reached)


# --- the environment ------------------------------------------------------------------------------


def _cell(value: Any, what: str) -> Cell:
    if (
        not isinstance(value, Sequence)
        or isinstance(value, str)
        or len(value) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    ):
        raise InvalidArgumentError(
            f"Maze task metadata {what!r} must be [row, column] ints, actual value: {value!r}."
        )
    return int(value[0]), int(value[1])


def _parse_maze(metadata: Mapping[str, Any]) -> tuple[list[str], Cell, Cell]:
    """Validate a task's maze (``grid``, ``start``, ``goal``) and return it."""
    missing = [key for key in ("grid", "start", "goal") if key not in metadata]
    if missing:
        raise InvalidArgumentError(
            f"A Maze task needs metadata 'grid', 'start' and 'goal' (see generate_tasks); "
            f"missing: {missing}."
        )
    grid = metadata["grid"]
    if (
        isinstance(grid, str)
        or not isinstance(grid, Sequence)
        or len(grid) < 3
        or not all(isinstance(row, str) and len(row) == len(grid[0]) >= 3 for row in grid)
        or any(set(row) - {WALL, OPEN} for row in grid)
    ):
        raise InvalidArgumentError(
            "Maze task metadata 'grid' must be a list of at least 3 equally long rows of '#' "
            "and '.' (at least 3 wide)."
        )
    height, width = len(grid), len(grid[0])
    if any(row[0] != WALL or row[-1] != WALL for row in grid) or set(grid[0] + grid[-1]) != {WALL}:
        raise InvalidArgumentError("Maze task metadata 'grid' must have a border of '#' walls.")
    start, goal = _cell(metadata["start"], "start"), _cell(metadata["goal"], "goal")
    for what, (r, c) in (("start", start), ("goal", goal)):
        if not (0 <= r < height and 0 <= c < width) or grid[r][c] != OPEN:
            raise InvalidArgumentError(
                f"Maze task metadata {what!r} {[r, c]} must be an open cell of the grid."
            )
    if start == goal:
        raise InvalidArgumentError(
            f"Maze task metadata 'start' and 'goal' must differ: {[*start]}."
        )
    shortest_path(grid, start, goal)  # raises when the maze cannot be solved
    return list(grid), start, goal


class MazeEnv(ToolEnv):
    """Reach the goal of a maze, seeing only the 3x3 cells around you (``look``, ``move``).

    ## Observation
    The prompt names the maze's size, the start and the goal; walls are seen only through
    ``look``. ``move`` reports the new position (or that a wall blocked the move).

    ## Reward
    1.0 when a move reaches the goal, else 0.0.

    ## Episode End
    Terminated when a move reaches the goal (reward 1.0), after :data:`TURN_BUDGET` assistant
    messages without reaching it, or on a message without tool calls (both reward 0.0). At most
    :data:`MAX_CALLS_PER_TURN` tool calls run per message; calls after the goal is reached are
    skipped.
    """

    system_prompt = SYSTEM_PROMPT

    def __init__(self) -> None:
        super().__init__(tools=[_LookTool(self), _MoveTool(self)])
        self._grid: list[str] = []
        self._position: Cell = (0, 0)
        self._goal: Cell = (0, 0)
        self._reset_counters()

    def _reset_counters(self) -> None:
        self._turn = 0
        self._calls_this_turn = 0
        self._moves = 0
        self._bumps = 0
        self._looks = 0
        self._reached = False

    async def reset(self, task: Task) -> list[Message]:
        self._grid, self._position, self._goal = _parse_maze(task.metadata)
        self._reset_counters()
        return await super().reset(task)

    # --- what the tools do ---------------------------------------------------------------------
    def look(self) -> str:
        """The text ``look`` returns: position, goal, the 3x3 view and the open directions."""
        self._looks += 1
        r, c = self._position
        rows = []
        for dr in (-1, 0, 1):
            row = ""
            for dc in (-1, 0, 1):
                cell = (r + dr, c + dc)
                if cell == self._position:
                    row += AGENT
                elif cell == self._goal:
                    row += GOAL
                else:
                    row += self._grid[cell[0]][cell[1]]
            rows.append(row)
        open_directions = ", ".join(d for d, _ in _neighbours(self._grid, self._position))
        return (
            f"You are at {_where(self._position)}. The goal is at {_where(self._goal)}.\n"
            + "\n".join(rows)
            + f"\nOpen directions: {open_directions}. This is message {self._turn} of "
            f"{TURN_BUDGET}."
        )

    def move(self, direction: str) -> tuple[str, bool]:
        """Walk one cell towards ``direction`` (a key of :data:`DIRECTIONS`).

        Returns the tool's text and whether the goal was reached.
        """
        dr, dc = DIRECTIONS[direction]
        r, c = self._position[0] + dr, self._position[1] + dc
        if self._grid[r][c] == WALL:
            self._bumps += 1
            where = (
                "above"
                if direction == "up"
                else "below"
                if direction == "down"
                else (f"to the {direction}")
            )
            return (
                f"Blocked: there is a wall {where}. You are still at {_where(self._position)}.",
                False,
            )
        self._moves += 1
        self._position = (r, c)
        if self._position == self._goal:
            self._reached = True
            return f"Moved {direction}. You are now at {_where(self._position)}: the goal!", True
        return f"Moved {direction}. You are now at {_where(self._position)}.", False

    # --- the episode -------------------------------------------------------------------------
    async def call_tool(self, name: str, arguments: str) -> tuple[str, bool]:
        self._calls_this_turn += 1
        if self._calls_this_turn > MAX_CALLS_PER_TURN:
            self._tool_errors += 1
            return (
                f"tool_error: at most {MAX_CALLS_PER_TURN} tool calls run per message; this "
                f"{str(name)[:40]!r} call was skipped. Send it again in your next message.",
                False,
            )
        if self._reached:
            return "Skipped: the goal is already reached.", False
        return await super().call_tool(name, arguments)

    async def step(self, message: Message) -> StepResult:
        self._turn += 1
        self._calls_this_turn = 0
        result = await super().step(message)
        if result.terminated or self._turn < TURN_BUDGET:
            return result
        return self._finish(None, 0.0)  # out of turns

    def score(self, answer: str, task: Task) -> float:
        """A reply without tool calls ends the episode short of the goal: 0.0."""
        return 0.0

    def stop_reward(self, task: Task) -> float:
        """1.0: only a move that reaches the goal stops the episode early."""
        return 1.0 if self._reached else 0.0

    def metrics(self, answer: str | None, task: Task) -> dict[str, Any]:
        shortest = task.metadata.get("shortest_path_length")
        return {
            "reached_goal": self._reached,
            "out_of_turns": not self._reached and answer is None,
            "stopped_without_tool_call": answer is not None,
            "moves": self._moves,
            "bumps": self._bumps,
            "looks": self._looks,
            "extra_moves": self._moves - shortest if self._reached and shortest else 0,
        }


# --- the oracle -----------------------------------------------------------------------------------

_POSITION = re.compile(r"You are (?:now |still )?at row (\d+), column (\d+)")


def _call(index: int, name: str, arguments: dict[str, Any]) -> ToolCall:
    return {
        "id": f"oracle_{index}",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }


def _last_position(messages: Sequence[Message]) -> Cell | None:
    for message in reversed(messages):
        if message.get("role") == "tool":
            found = _POSITION.findall(message.get("content") or "")
            if found:
                return int(found[-1][0]), int(found[-1][1])
    return None


def oracle_action(task: Task, messages: Sequence[Message]) -> Message:
    """The expert's next assistant message: look once, then walk a shortest path.

    The position comes from the tool results in ``messages``; the walls from the task's
    ``metadata["grid"]`` (the oracle knows the map). It sends :data:`ORACLE_MOVES_PER_TURN` moves a
    message along a breadth-first shortest path from where the last tool result says it is.
    """
    position = _last_position(messages)
    if position is None:
        return Message(role="assistant", content="", tool_calls=[_call(0, "look", {})])
    path = shortest_path(task.metadata["grid"], position, task.metadata["goal"])
    calls = [
        _call(i, "move", {"direction": direction})
        for i, direction in enumerate(path[:ORACLE_MOVES_PER_TURN])
    ]
    return Message(role="assistant", content="", tool_calls=calls)
