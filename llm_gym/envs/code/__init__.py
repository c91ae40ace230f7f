"""Code-v0: write a Python function that passes hidden tests; code runs in a sandbox."""

from llm_gym.envs.code.env import (
    MAX_TEST_RUNS,
    SYSTEM_PROMPT,
    VERSION,
    CodeEnv,
    RunTestsTool,
    oracle_action,
)
from llm_gym.envs.code.grading import (
    MAX_CODE_CHARS,
    Verdict,
    check_source,
    extract_code,
    grade,
    values_equal,
)
from llm_gym.envs.code.sandbox import (
    CallResult,
    SandboxLimits,
    SandboxResult,
    require_sandbox,
    run_function,
    sandbox_layers,
)
from llm_gym.envs.code.tasks import SPLIT_SIZES, TEMPLATES, generate_tasks, get_tasks

__all__ = [
    # the environment
    "VERSION",
    "CodeEnv",
    "RunTestsTool",
    "SYSTEM_PROMPT",
    "MAX_TEST_RUNS",
    "oracle_action",
    # tasks
    "SPLIT_SIZES",
    "TEMPLATES",
    "generate_tasks",
    "get_tasks",
    # grading
    "MAX_CODE_CHARS",
    "Verdict",
    "check_source",
    "extract_code",
    "grade",
    "values_equal",
    # the sandbox
    "CallResult",
    "SandboxLimits",
    "SandboxResult",
    "require_sandbox",
    "run_function",
    "sandbox_layers",
]
