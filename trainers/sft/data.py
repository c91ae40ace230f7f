"""Multi-turn SFT data: conversations in TRL's conversational format, as the RL side renders them.

Rows are ``{"messages": [...], "tools": ...}``, built so that the SFT token sequence is exactly
the one the RL side trains on:

* assistant messages are the raw text the rollout produced (``Turn.text``: for hermes, the
  ``<tool_call>...</tool_call>`` text the oracle's action was rendered to) as plain ``content``,
  without structured ``tool_calls``, exactly as :func:`llm_gym.policies.render_chat` renders
  them at RL time; the model learns to *write* its tool calls;
* environment replies keep their roles (``tool`` messages with their ``name``);
* ``tools`` holds the environment's tool specs (as a JSON string), so the template renders them
  into the system prompt as at RL time.

Sources: the oracle's transcripts (:func:`oracle_sft_dataset`), document 002's SFT targets
(:func:`sft_dataset_from_multi_turn`); :func:`short_context_dataset` and
:func:`disjoint_tasks` shape a curriculum and its tasks.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from llm_gym.core.task import Task
from llm_gym.errors import InvalidArgumentError

if TYPE_CHECKING:
    from datasets import Dataset

    from llm_gym.environments import EnvironmentMultiTurn
    from llm_gym.rollout import Episode

__all__ = [
    "disjoint_tasks",
    "rl_token_dataset",
    "rl_token_rows",
    "episode_to_messages",
    "oracle_sft_dataset",
    "sft_dataset_from_multi_turn",
    "short_context_dataset",
    "text_layout_dataset",
]


def _sft_message(message: dict[str, Any]) -> dict[str, Any]:
    """A message as the RL side renders it: role and content (+ name for tool results).

    Not :func:`llm_gym.policies.plain_message`: the same text to the chat template (so the same
    tokens), but that one keeps ``tool_call_id`` on tool messages, which would add a
    ``tool_call_id`` field (null on every other message) to the dataset's Arrow ``messages``
    column; and this one makes role and content strings, as one Arrow column needs them.
    """
    role = str(message.get("role", "user"))
    out: dict[str, Any] = {"role": role, "content": str(message.get("content") or "")}
    if role == "tool" and message.get("name") is not None:
        out["name"] = str(message["name"])
    return out


def episode_to_messages(episode: Episode) -> list[dict[str, Any]]:
    """The conversation of a finished episode as the RL side renders it.

    The opening messages, then for each turn the assistant's raw text (``Turn.text``, plain
    ``content``, no structured ``tool_calls``) and the environment's reply (``Turn.env_messages``,
    ``tool`` messages keep their ``name``). The same messages :func:`~llm_gym.rollout.
    episode_to_samples` renders, so the chat template gives the same token sequence.
    """
    return [_sft_message(m) for m in episode.transcript()]


def rl_token_rows(
    tokenizer: Any,
    messages: Sequence[dict[str, Any]],
    tool_specs: Sequence[dict[str, Any]] | None,
    *,
    action_format: str = "hermes",
    template_tools: str = "fallback",
) -> list[dict[str, list[int]]]:
    """A conversation as the token rows RL trains on, for any chat template.

    The conversation is replayed through the rollout's :class:`~llm_gym.rollout.TokenTracker`:
    the messages before the first assistant turn are the prompt, each assistant turn is its
    text's tokens and the tokenizer's end-of-turn (eos) token (mask 1, as the model samples
    them), and each environment reply the template's delta (mask 0). So the rows are exactly
    the ids and ``env_mask`` of an RL sample of the same conversation, whatever the template
    (one without tools gets them as text, :mod:`llm_gym.policies.template_tools`; one that
    rewrites history gives a row per sample).

    Returns:
        ``[{"input_ids": [...], "assistant_masks": [...]}]`` (TRL's ``SFTTrainer`` builds its
        labels from ``assistant_masks``).
    """
    from llm_gym.rollout import TokenTracker

    first = next((i for i, m in enumerate(messages) if m.get("role") == "assistant"), None)
    if first is None:
        raise InvalidArgumentError("An SFT conversation needs an assistant message to train on.")
    tracker = TokenTracker(
        tokenizer, tool_specs, action_format=action_format, template_tools=template_tools
    )
    tracker.start(list(messages[:first]))
    eos = tokenizer.eos_token_id
    end = [int(eos)] if eos is not None else []
    turn, index = 0, first
    while index < len(messages):
        message = messages[index]
        if message.get("role") == "assistant":
            text = str(message.get("content") or "")
            ids = list(tokenizer.encode(text, add_special_tokens=False)) + end
            tracker.add_generation(ids, None, text, turn)
            turn, index = turn + 1, index + 1
            continue
        reply = []
        while index < len(messages) and messages[index].get("role") != "assistant":
            reply.append(dict(messages[index]))
            index += 1
        tracker.add_environment(reply)
    return [
        {
            "input_ids": sample.prompt_ids + sample.completion_ids,
            "assistant_masks": [0] * len(sample.prompt_ids) + sample.env_mask,
        }
        for sample in tracker.finish()
    ]


def rl_token_dataset(
    tokenizer: Any,
    dataset: Dataset,
    *,
    action_format: str = "hermes",
    template_tools: str = "fallback",
) -> Dataset:
    """:func:`rl_token_rows` of every row of a conversational dataset (``messages`` and
    ``tools``, a JSON string or a list), as a tokenized dataset."""
    from datasets import Dataset

    rows: list[dict[str, list[int]]] = []
    for row in dataset:
        tools = row.get("tools")
        specs = json.loads(tools) if isinstance(tools, str) else tools
        rows.extend(
            rl_token_rows(
                tokenizer,
                row["messages"],
                specs,
                action_format=action_format,
                template_tools=template_tools,
            )
        )
    return Dataset.from_list(rows)


def text_layout_dataset(
    tokenizer: Any,
    dataset: Dataset,
    *,
    action_format: str = "hermes",
    template_tools: str = "fallback",
) -> Dataset:
    """The rows as the chat template gets them, for TRL's own tokenization of the rows: each
    row's ``messages`` and ``tools`` through :func:`llm_gym.policies.chat.template_input`, which
    decides the layout from both (a row with tool results in its history but no ``tools`` gets
    the text layout too, as at RL time). A template that renders tools gets the conversation as
    it is, else the text layout with no ``tools`` (:mod:`llm_gym.policies.template_tools`);
    either way the control tokens of every non-assistant message and tool spec are neutralised
    (:func:`~llm_gym.policies.chat.neutralize_control_tokens`), as in every other layout."""
    from llm_gym.policies.chat import template_input
    from llm_gym.policies.template_tools import layout_for

    def convert(row: dict[str, Any]) -> dict[str, Any]:
        tools = row.get("tools")
        specs = json.loads(tools) if isinstance(tools, str) else list(tools or [])
        options = {"action_format": action_format, "template_tools": template_tools}
        text = layout_for(tokenizer, specs, messages=row["messages"], **options)
        messages, rendered = template_input(
            tokenizer, row["messages"], specs, raw_assistant=False, **options
        )
        return {
            **row,  # the native layout keeps each message's fields; the text layout's are text
            "messages": [_sft_message(m) for m in messages] if text else messages,
            "tools": json.dumps(rendered or [], ensure_ascii=False),
        }

    return dataset.map(convert)


def _rows_to_dataset(rows: list[dict[str, Any]]) -> Dataset:
    from datasets import Dataset

    if not rows:
        raise InvalidArgumentError("No SFT rows: every transcript was filtered out.")
    return Dataset.from_list(rows)


def oracle_sft_dataset(
    env_id_or_factory: str | Callable[..., Any],
    tasks: Sequence[Task] | None = None,
    *,
    oracle: Callable[..., Any] | None = None,
    episodes: int | None = None,
    action_format: str | None = None,
    split: str = "train",
    max_turns: int | None = None,
    only_successful: bool = True,
    success_threshold: float = 1.0,
    tokenizer: Any = None,
) -> Dataset:
    """The oracle's transcripts as a conversational SFT dataset.

    Runs the oracle through :func:`llm_gym.rollout.collect_groups` (an
    :class:`~llm_gym.policies.OraclePolicy`; the action format renders its messages to text) and
    converts each episode with :func:`episode_to_messages`.

    Args:
        env_id_or_factory: A registered id (``"ToolUseGame-v0"``: its tasks, oracle, turn limit
            and action format come from the registry), its ``EnvEntry``, or an env factory /
            ``Env`` class.
        tasks: The tasks (default: the registered environment's ``split``).
        oracle: The scripted expert (default: the registered one).
        episodes: Transcripts to make (default: one per task). Tasks are taken in order and
            cycled when ``episodes`` exceeds their number (the oracles are deterministic, so a
            repeat is a duplicate row: it weighs the task more, it adds no information).
        action_format: The format the oracle's tool calls are written in: a registered name
            (pinned), or ``"auto"``: the one ``tokenizer``'s chat template teaches, else the
            environment's (:func:`~llm_gym.policies.template_format.episode_format`). Default:
            the environment's when it pins one, else ``"auto"``.
        split: The split of a registered environment, when ``tasks`` is None.
        max_turns: Assistant turns per episode (default: the registered value, else 8).
        only_successful: Drop episodes the environment judged failed
            (:func:`llm_gym.eval.metrics.episode_succeeded`: its ``success`` flag, else its
            reward against ``success_threshold``), so the model never imitates a failed
            transcript (False: keep them, as an imperfect demonstrator's data would). Episodes
            that raised are always dropped.
        success_threshold: See ``only_successful``.
        tokenizer: The tokenizer of the model the rows will train: its chat template chooses
            the format under ``"auto"`` (None: the environment's format).

    Returns:
        A ``datasets.Dataset`` with ``messages`` (list of ``{"role", "content"[, "name"]}``),
        ``tools`` (the tool specs as a JSON string: TRL ``json.loads`` it; as a list, Arrow would
        merge the specs' schemas and fill missing keys with nulls that ``tojson`` would render
        into the system prompt), ``task_id``, ``reward``.
    """
    from llm_gym.core.registry import as_env_entry
    from llm_gym.eval.metrics import episode_succeeded
    from llm_gym.policies import OraclePolicy
    from llm_gym.policies.template_format import episode_format
    from llm_gym.rollout import collect_groups

    entry = as_env_entry(env_id_or_factory)
    task_list = list(tasks) if tasks is not None else entry.tasks(split)
    expert = oracle or entry.oracle()
    if expert is None:
        raise InvalidArgumentError(
            "oracle_sft_dataset needs an oracle: pass oracle=..., or use an environment "
            "registered with one."
        )
    if not task_list:
        raise InvalidArgumentError("oracle_sft_dataset needs at least one task.")
    if episodes is not None:
        if episodes < 1:
            raise InvalidArgumentError(f"episodes must be >= 1, actual value: {episodes}.")
        task_list = [task_list[i % len(task_list)] for i in range(episodes)]
    groups = collect_groups(
        entry.env_factory(),
        task_list,
        OraclePolicy(expert),
        max_turns=max_turns or entry.max_turns,
        action_format=episode_format(
            action_format or entry.requested_action_format,
            tokenizer,
            env_format=entry.action_format,
        ),
        oracle=expert,
    )
    rows = []
    for group in groups:
        for episode in group:
            if episode.error:
                continue  # an episode that raised is never a demonstration
            if only_successful and not episode_succeeded(
                episode.reward, episode.metrics, success_threshold
            ):
                continue
            rows.append(
                {
                    "messages": episode_to_messages(episode),
                    "tools": json.dumps(episode.tool_specs, ensure_ascii=False),
                    "task_id": str(episode.task.id or ""),
                    "reward": float(episode.reward),
                }
            )
    return _rows_to_dataset(rows)


def sft_dataset_from_multi_turn(
    env: EnvironmentMultiTurn, examples: Iterable[Any], prompt_text: str = ""
) -> Dataset:
    """Document 002's SFT rows: ``env.start_episode(example, prompt_text) +
    env.sft_completion(example)`` per example (see :func:`llm_gym.environments.sft_messages`).

    SFT never runs ``step_episode``: the target transcript comes from ``example.output`` (or an
    ``sft_completion`` override). Non-assistant target messages (tool results, user turns) stay
    in the conversation and are masked; assistant messages are trained.

    Args:
        env: The environment.
        examples: ``TaskExample``\\ s, ``Task``\\ s or dicts with ``input``/``output``.
        prompt_text: The system prompt text passed to ``start_episode``.

    Returns:
        A dataset with ``messages`` and ``tools`` (the environment's ``tool_specs`` as a JSON
        string: ``"[]"`` for document 002's plain-text protocol).
    """
    from llm_gym.environments import sft_messages

    specs = getattr(env, "tool_specs", None)
    if callable(specs):
        specs = specs()
    tools = json.dumps(list(specs or []), ensure_ascii=False)
    rows = []
    for index, example in enumerate(examples):
        prompt, target = sft_messages(env, example, prompt_text)
        if not any(m.get("role") == "assistant" for m in target):
            raise InvalidArgumentError(
                f"Example {index}: the SFT target has no assistant message to train on."
            )
        rows.append({"messages": [_sft_message(m) for m in prompt + target], "tools": tools})
    return _rows_to_dataset(rows)


def disjoint_tasks(
    generate: Callable[[int, int], Sequence[Task]],
    n: int,
    seed: int,
    exclude: Iterable[Task | str],
) -> list[Task]:
    """Up to ``n`` extra tasks from ``generate(seed, m)`` whose prompts are not in ``exclude``.

    For more training tasks than a split holds (``exclude`` = the val and test tasks, and the
    train tasks to avoid duplicates); draws ``2 n`` and keeps the first ``n`` disjoint ones
    (fewer when the task space runs out). A prompt ``generate`` repeats (one question asked in
    several worlds) is kept each time: distinct tasks are ``generate``'s contract.
    """
    banned = {t.prompt if isinstance(t, Task) else str(t) for t in exclude}
    return [task for task in generate(seed, 2 * n) if task.prompt not in banned][:n]


def short_context_dataset(dataset: Dataset) -> Dataset:
    """The rows without their system message and tool specs: the conversation from the user's
    question on (the chat template then renders its short default system line).

    A curriculum for small models trained from scratch: the system prompt and tool specs are
    the same ~400 tokens in every ToolUseGame transcript, and behind them a 1.8M-parameter model
    learns to copy a name or a number from the question or a tool result into its tool call very
    slowly (attention at initialisation spreads over every earlier token). Trained first on these
    ~100-token conversations it learns the copying in a few hundred steps; a shorter phase on the
    full transcripts then carries it over to the long context the model sees at RL time.
    """
    from datasets import Dataset

    rows = []
    for row in dataset:
        messages = [m for m in row["messages"] if m.get("role") != "system"]
        rows.append({**row, "messages": messages, "tools": "[]"})
    return Dataset.from_list(rows)
