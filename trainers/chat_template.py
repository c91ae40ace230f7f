"""The chat template SFT trains with: TRL's Qwen2.5 template, assistant mask = the RL env_mask.

TRL's own training copy of the Qwen2.5 template (swapped in for ``assistant_only_loss=True``) puts
``{% generation %}`` around ``"\\n" + content + "<|im_end|>\\n"``: per assistant turn it trains
two tokens more than RL does (the ``"\\n"`` after ``<|im_start|>assistant``, which at RL time is
part of the generation prompt, and the ``"\\n"`` after ``<|im_end|>``, which RL never samples: it
is the start of the environment's reply). :data:`RL_ALIGNED_QWEN2_5_TEMPLATE` renders the same
text, byte for byte, with the markers around ``content + "<|im_end|>"`` only, i.e. exactly the
tokens whose ``env_mask`` is 1 in :func:`llm_gym.rollout.episode_to_samples`.
:func:`rl_aligned_chat_template` hands it out only when it renders exactly what the tokenizer's
own template renders.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

from llm_gym.policies.chat_templates import (
    apply_chat_template,
    missing_tokens,
    require_chat_template,
)
from llm_gym.policies.template_render import apply_template, template_errors

__all__ = [
    "RL_ALIGNED_QWEN2_5_TEMPLATE",
    "grpo_start",
    "rl_aligned_chat_template",
    "with_chat_template",
]

RL_ALIGNED_QWEN2_5_TEMPLATE = """\
{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n\
You are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and \
arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \
\\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful \
assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>assistant\\n' }}
        {%- generation %}
        {%- if not message.tool_calls %}
            {{- message.content + '<|im_end|>' }}
        {%- else %}
            {%- if message.content %}
                {{- message.content }}
            {%- endif %}
            {%- for tool_call in message.tool_calls %}
                {%- if tool_call.function is defined %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {%- if message.content or not loop.first %}
                    {{- '\\n' }}
                {%- endif %}
                {{- '<tool_call>\\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {{- tool_call.arguments | tojson }}
                {{- '}\\n</tool_call>' }}
            {%- endfor %}
            {{- '<|im_end|>' }}
        {%- endif %}
        {%- endgeneration %}
        {{- '\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""
"""TRL's Qwen2.5 template (``qwen2_5.jinja``) with ``{% generation %}`` markers around each
assistant turn's ``content + "<|im_end|>"`` only: it renders the same text as the original, and
its assistant mask is exactly the RL side's ``env_mask`` (TRL's ``qwen2_5_training.jinja`` also
marks the ``"\\n"`` before the content and the one after ``<|im_end|>``)."""

_PROBE_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look up a fact.",
            "parameters": {
                "type": "object",
                "properties": {"key": {"type": "string", "description": "The key."}},
                "required": ["key"],
            },
        },
    }
]
_PROBE_MESSAGES: list[dict[str, Any]] = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is x?"},
    {"role": "assistant", "content": '<tool_call>\n{"name": "lookup"}\n</tool_call>'},
    {"role": "tool", "name": "lookup", "content": "7"},
    {"role": "tool", "name": "lookup", "content": "8"},
    {
        "role": "assistant",
        "content": "thinking",
        "tool_calls": [
            {"type": "function", "function": {"name": "lookup", "arguments": {"key": "a"}}},
            {"type": "function", "function": {"name": "lookup", "arguments": {"key": "b"}}},
        ],
    },
    {"role": "tool", "name": "lookup", "content": "9"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"type": "function", "function": {"name": "lookup", "arguments": {"key": "c"}}},
        ],
    },
    {"role": "user", "content": "And?"},
    {"role": "assistant", "content": "15"},
]


def _render(tokenizer: Any, messages: Any, tools: Any, template: str | None, gen: bool) -> str:
    """One render, stopped at the render deadline (a model file's template is untrusted code:
    :mod:`llm_gym.policies.template_render`)."""
    return apply_template(
        tokenizer, messages, tools=tools, chat_template=template, add_generation_prompt=gen
    )


def rl_aligned_chat_template(tokenizer: Any, examples: Iterable[dict[str, Any]] = ()) -> str | None:
    """:data:`RL_ALIGNED_QWEN2_5_TEMPLATE` when it renders exactly what the tokenizer's own
    template renders (on probe conversations and on ``examples``, rows with ``messages`` and
    ``tools``), else ``None``."""
    original = getattr(tokenizer, "chat_template", None)
    if not isinstance(original, str):
        return None
    cases: list[tuple[Any, Any]] = [
        (_PROBE_MESSAGES, _PROBE_TOOLS),
        (_PROBE_MESSAGES, None),
        (_PROBE_MESSAGES[1:], None),
        (_PROBE_MESSAGES[1:], _PROBE_TOOLS),
    ]
    for row in examples:
        tools = row.get("tools")
        cases.append((row["messages"], json.loads(tools) if isinstance(tools, str) else tools))
    try:
        for messages, tools in cases:
            for gen in (False, True):
                mine = _render(tokenizer, messages, tools, RL_ALIGNED_QWEN2_5_TEMPLATE, gen)
                if mine != _render(tokenizer, messages, tools, original, gen):
                    return None
    except template_errors():  # the template's own refusal: not aligned (a timeout raises)
        return None
    return RL_ALIGNED_QWEN2_5_TEMPLATE


def with_chat_template(
    model: Any,
    tokenizer: Any,
    option: str | None,
    load_model: Callable[[str], Any],
    load_tokenizer: Callable[[str], Any],
) -> tuple[Any, Any]:
    """``(model, tokenizer)`` a trainer starts from, the tokenizer holding a chat template.

    ``model`` is a model or a path; ``tokenizer`` None is loaded from the path with
    ``load_tokenizer``. ``option`` (the config's ``chat_template``) is applied
    (:func:`llm_gym.policies.chat_templates.apply_chat_template`); a named template whose turn
    tokens the tokenizer lacks loads the model from its path with ``load_model`` first, so its
    embeddings can grow.

    Raises:
        ChatTemplateError: no chat template, from the tokenizer or ``option``: refused before
            the weights are read (when ``model`` is a path) and before any episode.
    """
    if tokenizer is None and isinstance(model, str):
        tokenizer = load_tokenizer(model)
    if tokenizer is None:
        return model, tokenizer  # the trainer loads it from the model's config (TRL)
    text = getattr(tokenizer, "tokenizer", tokenizer)  # a processor's own tokenizer
    if option is None:
        require_chat_template(text, None if isinstance(model, str) else model)
        return model, tokenizer
    if isinstance(model, str) and missing_tokens(text, option):
        model = load_model(model)
    apply_chat_template(text, option, None if isinstance(model, str) else model)
    return model, tokenizer


def grpo_start(model: Any, processing_class: Any, args: Any) -> tuple[Any, Any]:
    """:func:`with_chat_template` for :class:`~trainers.MultiTurnGRPOTrainer`: the tokenizer
    loaded as TRL's ``GRPOTrainer`` loads it (padded and truncated on the left), a model as
    TRL's ``create_model_from_path`` does from ``args.model_init_kwargs``."""

    def load_tokenizer(path: str) -> Any:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(path, truncation_side="left", padding_side="left")

    def load_model(path: str) -> Any:
        from trl.trainer.utils import create_model_from_path

        kwargs = dict(args.model_init_kwargs or {})
        if args.distributed_state.distributed_type in ("MULTI_GPU", "DEEPSPEED"):
            kwargs["device_map"] = None  # as TRL: distributed training fails with "auto"
        kwargs.setdefault("trust_remote_code", args.trust_remote_code)
        return create_model_from_path(path, **kwargs)

    return with_chat_template(
        model, processing_class, args.chat_template, load_model, load_tokenizer
    )
