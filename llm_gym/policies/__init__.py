"""Policies: what writes the assistant's turns. One batched async interface, many backends.

Create any policy by spec with :func:`policy_from_spec` (``"oracle"``, ``"random:3"``,
``"hf:PATH"``, ``"openai:MODEL@URL"``, ``"vllm"`` inside the trainer); add a backend with
:func:`register_policy`. Importing this package imports no torch or transformers: a model is
loaded on use, and the vLLM backend (:mod:`llm_gym.policies.vllm`, which needs the training
stack) is imported by the registry only when asked for.
"""

from llm_gym.policies.base import (
    Generation,
    Oracle,
    Policy,
    PolicyBatchError,
    PolicyError,
    PolicyRequest,
    PolicyStream,
)
from llm_gym.policies.chat import plain_message, render_chat
from llm_gym.policies.hf import HFPolicy
from llm_gym.policies.openai import (
    EndpointError,
    EndpointTimeoutError,
    MalformedResponseError,
    OpenAIPolicy,
)
from llm_gym.policies.registry import (
    PolicyBackend,
    policy_backend,
    policy_from_spec,
    register_policy,
    registered_policies,
)
from llm_gym.policies.scripted import OraclePolicy, RandomPolicy

__all__ = [
    # the interface
    "Policy",
    "PolicyRequest",
    "Generation",
    "PolicyStream",
    "PolicyError",
    "PolicyBatchError",
    "Oracle",
    # backends
    "RandomPolicy",
    "OraclePolicy",
    "HFPolicy",
    "OpenAIPolicy",
    "EndpointError",
    "EndpointTimeoutError",
    "MalformedResponseError",
    # the registry
    "register_policy",
    "policy_from_spec",
    "policy_backend",
    "registered_policies",
    "PolicyBackend",
    # chat rendering
    "render_chat",
    "plain_message",
]
