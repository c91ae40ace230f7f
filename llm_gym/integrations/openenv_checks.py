"""The client's checks of what an llm_gym server says (:mod:`openenv_client` reads every frame
with them): strict models of an observation (messages, tool specs, ``start``, reward fields)
and of the task listing; a hostile server's answer becomes an
:class:`~llm_gym.errors.InvalidArgumentError` naming the field."""

from __future__ import annotations

from typing import Any, Literal

from llm_gym.errors import InvalidArgumentError
from llm_gym.integrations.openenv_protocol import (
    MAX_MESSAGES,
    MAX_TOOL_CALLS,
    ToolCallModel,
)

try:
    from pydantic import BaseModel, ConfigDict, Field, ValidationError
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "llm_gym's OpenEnv integration needs openenv-core: pip install -e '.[interop]'"
    ) from exc

__all__ = ["ServedObservation", "TaskListing", "check_listing", "check_observation"]


class ServedMessage(BaseModel):
    """A message of an llm_gym server's observation (OpenAI's format, nothing else)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    role: Literal["system", "user", "assistant", "tool"]
    content: str
    tool_calls: list[ToolCallModel] = Field(default_factory=list, max_length=MAX_TOOL_CALLS)
    tool_call_id: str = Field(default="", max_length=256)
    name: str = Field(default="", max_length=256)


class FunctionSpecModel(BaseModel):
    """The function half of a served tool spec (other keys are kept as they came)."""

    model_config = ConfigDict(extra="allow", strict=True)
    name: str = Field(min_length=1, max_length=256)
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=dict)


class ToolSpecModel(BaseModel):
    """A served tool spec: ``{"type": "function", "function": {...}}``."""

    model_config = ConfigDict(extra="forbid", strict=True)
    type: Literal["function"]
    function: FunctionSpecModel


class ServedObservation(BaseModel):
    """An llm_gym server's observation, as :class:`EnvObservation` sends it."""

    model_config = ConfigDict(extra="ignore", strict=True)
    messages: list[ServedMessage] = Field(max_length=MAX_MESSAGES)
    start: int = Field(ge=0)
    tool_specs: list[ToolSpecModel] = Field(default_factory=list, max_length=256)
    truncated: bool = False
    task_id: str | None = None
    metrics: dict[str, Any] = Field(default_factory=dict)
    raw_text_actions: bool = False
    max_turns: int | None = Field(default=None, ge=1)
    concludes: bool = False


class ListedTask(BaseModel):
    """One task of ``GET /llm_gym/tasks``."""

    model_config = ConfigDict(extra="ignore", strict=True)
    id: str = Field(min_length=1, max_length=1024)
    prompt: str


class TaskListing(BaseModel):
    """``GET /llm_gym/tasks``: the split's tasks and the env's settings."""

    model_config = ConfigDict(extra="ignore", strict=True)
    tasks: list[ListedTask]
    max_turns: int | None = Field(default=None, ge=1)
    action_format: str | None = Field(default=None, min_length=1, max_length=64)


def _problems(exc: ValidationError) -> str:
    """``messages[0].role='root': Input should be ...`` for the first three errors."""
    found = []
    for error in exc.errors()[:3]:
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error["loc"])
        where = where.lstrip(".") or "the value"
        if error["type"] != "missing":
            where = f"{where}={error['input']!r:.40}"
        found.append(f"{where}: {error['msg']}"[:300])
    return "; ".join(found)


def check_observation(observation: Any) -> dict[str, Any]:
    """An llm_gym server's observation as plain dicts (messages with only the keys they came
    with), checked: messages in OpenAI's format, ``start`` an int >= 0, tool specs, a bool
    ``truncated`` and a dict of ``metrics``.

    Raises:
        InvalidArgumentError: naming the field (``messages[2].content: ...``).
    """
    try:
        checked = ServedObservation.model_validate(observation)
    except ValidationError as exc:
        raise InvalidArgumentError(_problems(exc)) from None
    result = checked.model_dump(exclude_unset=True)
    result["messages"] = [m.model_dump(exclude_unset=True) for m in checked.messages]
    result["tool_specs"] = [s.model_dump(exclude_unset=True) for s in checked.tool_specs]
    return result


def check_listing(listing: Any) -> dict[str, Any]:
    """``GET /llm_gym/tasks``'s answer, checked (task ids unique); raises InvalidArgumentError."""
    if not isinstance(listing, dict) or not isinstance(listing.get("tasks"), list):
        raise InvalidArgumentError("the task listing is not llm_gym's (no list of tasks).")
    try:
        checked = TaskListing.model_validate(listing).model_dump()
    except ValidationError as exc:
        raise InvalidArgumentError(f"the task listing is malformed: {_problems(exc)}") from None
    seen: set[str] = set()
    for task in checked["tasks"]:
        if task["id"] in seen:
            raise InvalidArgumentError(f"the task listing has a duplicate task id {task['id']!r}")
        seen.add(task["id"])
    return checked
