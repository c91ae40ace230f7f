"""SQL-v0: answer questions about a per-task SQLite database through a read-only query tool."""

from llm_gym.envs.sql.database import (
    MAX_OUTPUT_CHARS,
    MAX_ROWS,
    MAX_SQL_CHARS,
    QUERY_TIMEOUT_S,
    ReadOnlyDatabase,
    Table,
)
from llm_gym.envs.sql.env import SYSTEM_PROMPT, VERSION, SQLEnv, oracle_action, strip_answer
from llm_gym.envs.sql.schemas import SCHEMAS, build_tables
from llm_gym.envs.sql.tasks import SPLIT_SIZES, generate_tasks, get_tasks

__all__ = [
    # the environment
    "SQLEnv",
    "SYSTEM_PROMPT",
    "VERSION",
    "strip_answer",
    # tasks
    "SCHEMAS",
    "SPLIT_SIZES",
    "build_tables",
    "generate_tasks",
    "get_tasks",
    "oracle_action",
    # the database
    "MAX_OUTPUT_CHARS",
    "MAX_ROWS",
    "MAX_SQL_CHARS",
    "QUERY_TIMEOUT_S",
    "ReadOnlyDatabase",
    "Table",
]
