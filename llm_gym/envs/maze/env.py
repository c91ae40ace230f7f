"""Maze: reach the goal of a text grid under partial observation with ``look`` and ``move``.

Each task is a maze (:mod:`llm_gym.envs.maze.grid`, drawn by :mod:`llm_gym.envs.maze.tasks`).
The agent knows its own position and the goal's, but sees the walls only through ``look`` (its
3x3 neighbourhood); ``move`` walks one cell. The module reads top to bottom: constants, the
tools, the environment, the oracle.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from llm_gym.core.env import StepResult
from llm_gym.core.task import Task
from llm_gym.core.tool import ToolResult, decode_arguments
from llm_gym.core.tool_env import ToolEnv
from llm_gym.core.types import JsonSchema, Message, ToolCall
from llm_gym.envs.maze.grid import (
    AGENT,
    DIRECTIONS,
    GOAL,
    OPEN,
    WALL,
    Cell,
    open_neighbours,
    shortest_path,
)
from llm_gym.errors import InvalidArgumentError, ToolArgumentError

__all__ = [
    "DIRECTION_ALIASES",
    "MAX_CALLS_PER_TURN",
    "SYSTEM_PROMPT",
    "TURN_BUDGET",
    "VERSION",
    "MazeEnv",
    "oracle_action",
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
    max_tokens_per_turn = 128
    """A turn is up to ``MAX_CALLS_PER_TURN`` look or move calls (about 28 tokens each)."""

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
        open_directions = ", ".join(d for d, _ in open_neighbours(self._grid, self._position))
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
