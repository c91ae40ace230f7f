"""Code-v0: write a Python function that passes hidden tests; the code runs in a sandbox.

The module reads top to bottom: constants, the ``run_tests`` tool, the environment, the oracle.
Tasks come from :mod:`llm_gym.envs.code.tasks`, grading from :mod:`llm_gym.envs.code.grading`,
the sandbox from :mod:`llm_gym.envs.code.sandbox`.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any

from llm_gym.core.env import StepResult
from llm_gym.core.task import Task
from llm_gym.core.tool import ToolResult, decode_arguments
from llm_gym.core.tool_env import ToolEnv
from llm_gym.core.types import JsonSchema, Message, ToolCall
from llm_gym.envs.code.grading import (
    MAX_CODE_CHARS,
    Verdict,
    extract_code,
    feedback,
    grade,
)
from llm_gym.envs.code.sandbox import SandboxLimits, require_sandbox
from llm_gym.errors import InvalidArgumentError, ToolArgumentError

__all__ = [
    "MAX_TEST_RUNS",
    "SYSTEM_PROMPT",
    "VERSION",
    "CodeEnv",
    "RunTestsTool",
    "oracle_action",
]

# --- constants -----------------------------------------------------------------------------------

VERSION = "0"
"""Bumped whenever tasks, tools, sandbox limits or rewards change (records carry it)."""

MAX_TEST_RUNS = 4
"""``run_tests`` calls allowed per episode; later calls are tool errors."""

SYSTEM_PROMPT = (
    "You write Python functions. Each task gives a function's signature, what it must return "
    "and a few examples. Use only the Python standard library: your code runs in a sandbox "
    "without files, network or subprocesses, for about 2 seconds. You may call run_tests with "
    f"your complete code to run it on the examples (at most {MAX_TEST_RUNS} times). When you "
    "are done, reply with your complete code in a ```python fenced block and no tool call. That "
    "reply is final: it is graded on hidden tests, and only code that passes all of them scores."
)


# --- the run_tests tool --------------------------------------------------------------------------


class RunTestsTool:
    """``run_tests(code)``: run the code on the current task's visible examples in the sandbox.

    Reports each example as PASS/FAIL with what the call returned or raised, and the program's
    output. Hidden tests are never run here, so nothing about them leaks.
    """

    name = "run_tests"
    description = (
        "Run your complete code on the task's examples in the sandbox and report, for each "
        "example, what your function returned or raised."
    )
    parameters_schema: JsonSchema = {
        "type": "object",
        "properties": {
            "code": {
                "type": "string",
                "description": "Complete Python source that defines the requested function.",
            }
        },
        "required": ["code"],
    }
    synchronous = False
    """Runs a subprocess: awaited in a worker thread."""

    def __init__(self, env: CodeEnv) -> None:
        self.env = env

    async def execute(self, arguments: str) -> ToolResult:
        """Validate the call, run the examples, return the report."""
        values = decode_arguments(arguments)
        unknown = sorted(set(values) - {"code"})
        if unknown:
            raise ToolArgumentError(
                f"unknown argument(s) {unknown} for tool 'run_tests'; allowed: ['code']."
            )
        code = values.get("code")
        if not isinstance(code, str):
            raise ToolArgumentError(
                f"'code' must be a string of Python source, got {type(code).__name__}."
            )
        if len(code) > MAX_CODE_CHARS:
            raise ToolArgumentError(
                f"'code' has {len(code):,} characters; the limit is {MAX_CODE_CHARS:,}."
            )
        return ToolResult(content=await self.env.run_examples(code))


# --- the environment -----------------------------------------------------------------------------


class CodeEnv(ToolEnv):
    """Write a Python function that passes hidden tests.

    ## Description
    The user message gives a signature, a statement and three examples. ``run_tests(code)`` runs
    code on the examples (at most ``max_test_runs`` times); a reply without tool calls is the
    final answer: its last ```python block (else its last fenced block, else the whole reply) is
    run on the task's hidden tests in the sandbox (:mod:`llm_gym.envs.code.sandbox`).

    ## Reward
    1.0 when every hidden test returns the expected value, else 0.0 (all or nothing, like
    pass@1). With ``partial_credit=True``: the fraction of hidden tests passed. Metrics always
    carry ``hidden_passed``, ``hidden_total`` and ``hidden_pass_fraction``.

    ## Episode End
    Terminated by the final reply. The registered loop limit is 6 assistant turns.

    ## Arguments
    ``limits`` (:class:`~llm_gym.envs.code.sandbox.SandboxLimits` of each run),
    ``partial_credit`` (bool), ``max_test_runs`` (int >= 0), ``unsafe_no_sandbox`` (bool: run
    the code without any isolation; only for code you trust). Without it the env refuses to be
    built where the sandbox cannot run (:class:`~llm_gym.errors.SandboxUnavailableError`, naming
    what to install); ``gym.make("Code-v0", env_kwargs={"unsafe_no_sandbox": True})`` opts in.

    ## Version History
    - v0: first release.
    """

    system_prompt = SYSTEM_PROMPT
    max_tokens_per_turn = 512
    """A turn is a complete function: in a run_tests call or the final fenced block."""

    def __init__(
        self,
        *,
        limits: SandboxLimits | None = None,
        partial_credit: bool = False,
        max_test_runs: int = MAX_TEST_RUNS,
        unsafe_no_sandbox: bool = False,
    ) -> None:
        if not isinstance(max_test_runs, int) or max_test_runs < 0:
            raise InvalidArgumentError(
                f"max_test_runs must be an int >= 0, actual value: {max_test_runs!r}."
            )
        if limits is not None and not isinstance(limits, SandboxLimits):
            raise InvalidArgumentError(
                f"limits must be a SandboxLimits, actual type: {type(limits).__name__}."
            )
        if not isinstance(unsafe_no_sandbox, bool):
            raise InvalidArgumentError(
                f"unsafe_no_sandbox must be a bool, actual value: {unsafe_no_sandbox!r}."
            )
        if not unsafe_no_sandbox:
            require_sandbox()
        super().__init__(tools=[RunTestsTool(self)])
        self.unsafe_no_sandbox = unsafe_no_sandbox
        self.limits = limits or SandboxLimits()
        self.partial_credit = bool(partial_credit)
        self.max_test_runs = max_test_runs
        self._test_runs = 0
        self._verdict: Verdict | None = None

    @property
    def _run_options(self) -> dict[str, Any]:
        return {"limits": self.limits, "unsafe_no_sandbox": self.unsafe_no_sandbox}

    async def reset(self, task: Task) -> list[Message]:
        target = task.target
        if not isinstance(target, dict) or "entry" not in target or "tests" not in target:
            raise InvalidArgumentError(
                "A Code-v0 task needs target={'entry': name, 'tests': [{'args', 'expected'}, "
                f"...]}}, actual value: {target!r:.200}."
            )
        self._test_runs = 0
        self._verdict = None
        return await super().reset(task)

    async def run_examples(self, code: str) -> str:
        """Run ``code`` on the current task's visible examples; the feedback text."""
        task = self.task
        if self._test_runs >= self.max_test_runs:
            raise ToolArgumentError(
                f"run_tests was already used {self._test_runs} times, the limit; reply with "
                "your final code in a ```python block."
            )
        self._test_runs += 1
        entry = task.target["entry"]
        examples = task.metadata.get("examples", [])
        verdict = await asyncio.to_thread(grade, code, entry, examples, **self._run_options)
        return feedback(verdict, entry, examples)

    async def step(self, message: Message) -> StepResult:
        if message.get("tool_calls"):
            return await super().step(message)
        task = self.task
        self._messages.append(message)
        code = extract_code(message.get("content") or "")
        verdict = await asyncio.to_thread(
            grade, code, task.target["entry"], task.target["tests"], **self._run_options
        )
        self._verdict = verdict
        if self.partial_credit:
            reward = verdict.passed / verdict.total if verdict.total else 0.0
        else:
            reward = 1.0 if verdict.all_passed else 0.0
        return self._finish(code, reward)

    def metrics(self, answer: str | None, task: Task) -> dict[str, Any]:
        verdict = self._verdict
        if verdict is None:
            return {"test_runs": self._test_runs}
        sandbox = verdict.sandbox
        return {
            "test_runs": self._test_runs,
            "hidden_passed": verdict.passed,
            "hidden_total": verdict.total,
            "hidden_pass_fraction": verdict.passed / verdict.total if verdict.total else 0.0,
            "refused": int(sandbox is None),
            "timed_out": int(sandbox is not None and sandbox.timed_out),
            "sandbox_error": int(sandbox is not None and not sandbox.started),
        }


# --- the oracle ----------------------------------------------------------------------------------


def oracle_action(task: Task, messages: Sequence[Message]) -> Message:
    """The expert's next assistant message: test the reference solution, then submit it.

    First a ``run_tests`` call with the task's reference solution (correct by construction: it
    computed the expected outputs); once a ``run_tests`` report is in the conversation, the same
    code as the final reply.
    """
    code = task.metadata["reference"]
    tested = any(m.get("role") == "tool" and m.get("name") == "run_tests" for m in messages)
    if not tested:
        call: ToolCall = {
            "id": "oracle_0",
            "type": "function",
            "function": {"name": "run_tests", "arguments": json.dumps({"code": code})},
        }
        return Message(role="assistant", content="", tool_calls=[call])
    return Message(role="assistant", content=f"```python\n{code}```")
