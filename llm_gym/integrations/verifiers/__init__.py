"""verifiers (0.4) environments in llm_gym's loop, evaluator and trainer, and back.

verifiers 0.4 (``import verifiers.v1 as vf``) describes an environment as a
:class:`~verifiers.v1.Taskset` (its ``load()`` yields :class:`~verifiers.v1.Task` s: the data
with ``prompt``/``system_prompt`` and any fields of the task's own ``TaskData``, ``@vf.reward``
and ``@vf.metric`` scoring, ``@vf.stop`` and ``@vf.intercept`` hooks, ``Toolset`` s of
``@vf.tool`` functions) plus, optionally, a :class:`~verifiers.v1.Env` whose ``run(task,
agents)`` owns the episode's control flow (an ``interaction`` answered turn by turn is its
multi-turn environment). :func:`from_verifiers` turns either into an env factory and a task
source, and importing this module lets every place that takes an environment take them as
they are (``collect_groups(vf_env, ...)``, ``run_and_report``, the trainer's ``env_factory``)::

    from llm_gym.integrations.verifiers import from_verifiers, register_verifiers_env

    register_verifiers_env("MyVf-v0", vf_env)            # gym.make("MyVf-v0"), run_and_report
    factory = from_verifiers(vf_env)                      # or collect_groups(factory, ...)
    groups = collect_groups(factory, factory.tasks("train"), policy, max_turns=4)

llm_gym's loop is the model: the adapter drives verifiers' env side in-process (its hooks
through verifiers' own ``RolloutSession``, its message graph, its tool servers registered on an
in-process MCP server, ``Task.score``) and never calls a verifiers model client
(:mod:`.env` says how an episode maps, how it is scored, and how
one cut short by llm_gym is scored). Our action format parses tool calls against the tools'
OpenAI function specs (``<server>_<tool>``, as verifiers' chat harness names them).

What runs without a sandbox only: the task's ``setup``/``finalize`` and rewards get
``runtime=None`` (signals that require a runtime are skipped by verifiers' own ``Task.score``),
and harness-provided tools (``bash``, ``edit``) are not offered; the adapter plays verifiers'
tool-less ``null`` harness plus the task's toolsets.

Lifetime: the env's ``start()`` and the taskset's shared tool servers are held per event loop
and stopped (``vf.Env.stop()``, then the servers' teardown) when that loop shuts down, so each
``collect_groups`` call, evaluation and trainer step releases its own; code that drives episodes
on a long-lived loop of its own awaits ``factory.aclose()`` when it is done
(:class:`~llm_gym.integrations.verifiers.tools.SharedResources`).

The other direction, an llm_gym environment as a verifiers taskset and environment, is
:mod:`~llm_gym.integrations.verifiers.taskset` (:func:`load_environment`).

The package's modules: :mod:`.factory` (verifiers environments as env factories and task
sources), :mod:`.env` (one episode as an ``Env``), :mod:`.rollout` (one seat's rollout with
llm_gym's loop as the model), :mod:`.tools` (a task's tool servers in-process) and
:mod:`.taskset` (ours as verifiers tasksets). Importing the package imports verifiers.
"""

from llm_gym.integrations.verifiers.env import VerifiersEnv
from llm_gym.integrations.verifiers.factory import (
    VerifiersEnvFactory,
    VerifiersTasks,
    from_verifiers,
    register_verifiers_env,
    to_task,
)
from llm_gym.integrations.verifiers.taskset import (
    LlmGymTaskset,
    llm_gym_taskset,
    load_environment,
    trace_from_messages,
)

__all__ = [
    # verifiers environments in llm_gym
    "VerifiersEnv",
    "VerifiersEnvFactory",
    "VerifiersTasks",
    "from_verifiers",
    "register_verifiers_env",
    "to_task",
    # llm_gym environments in verifiers
    "LlmGymTaskset",
    "llm_gym_taskset",
    "load_environment",
    "trace_from_messages",
]
