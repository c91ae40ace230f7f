"""``RefundEnv``: document 002's customer-service example made real, and its oracle.

An :class:`~llm_gym.environments.EnvironmentMultiTurn` in document 002's stateless style: no
attribute changes during an episode. ``step_episode`` rebuilds the store's state by replaying
the transcript's sampled actions (:func:`llm_gym.environments.replay_state`, which checks that
``messages[-1]`` is the current action and skips anything that is not a sampled action), then
applies the current action once. ``score_episode`` replays the whole transcript and scores it
with the pure :func:`~llm_gym.envs.refund.reward.score_transcript`.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from llm_gym.core.task import Task
from llm_gym.core.types import Message, ToolSpec
from llm_gym.environments import (
    ChatMessage,
    EnvironmentEpisode,
    EnvironmentMultiTurn,
    EnvironmentStepResult,
    RewardResult,
    TaskExample,
    replay_state,
    sampled_actions,
)
from llm_gym.envs.refund.api import TOOL_SPECS, apply_action
from llm_gym.envs.refund.protocol import read_tool_results, render_tool_call, render_tool_results
from llm_gym.envs.refund.reward import (
    REPLY_QUALITY_WEIGHT,
    REPLY_RUBRIC,
    score_transcript,
)
from llm_gym.envs.refund.state import StoreState
from llm_gym.envs.refund.tasks import SPLIT_SIZES, get_tasks
from llm_gym.envs.refund.world import (
    PER_ORDER_LIMIT_CENTS,
    POLICY,
    REFUND_WINDOW_DAYS,
    World,
    format_cents,
)
from llm_gym.errors import InvalidArgumentError
from llm_gym.judge import JudgeSettings, shared_judge

__all__ = [
    "MAX_EPISODE_TURNS",
    "SYSTEM_PROMPT",
    "VERSION",
    "RefundEnv",
    "load_environment",
    "oracle_action",
]

VERSION = "0"
"""Bumped whenever tasks, tools, policy or reward change (records carry it)."""
MAX_EPISODE_TURNS = 10
"""Assistant actions per episode (the oracle needs at most 5)."""

SYSTEM_PROMPT = """\
You are a customer-service agent of an online store. Today is {today}. Help the customer with \
their refund request, following the policy below.

{policy}

Tools: authenticate(customer_id, pin | email), list_orders(), get_order(order_id), \
refund_order(order_id, amount, reason), get_policy(). Call tools with \
<tool_call>{{"name": ..., "arguments": {{...}}}}</tool_call> blocks (several per message \
allowed); their results come back in <tool_result>. Reply in plain text, without a tool call, \
when you are done: that reply ends the conversation."""
"""The system prompt (``{today}`` and ``{policy}`` are filled in per task)."""

_OPENING_LENGTH = 2  # the system prompt and the customer's message


class RefundEnv(EnvironmentMultiTurn):
    """Customer service on a stateful store API, with a written refund policy.

    ## Description
    A customer asks for a refund (an order, their latest order, or one damaged item). The agent
    authenticates them, looks the order up, and either refunds the right amount or declines
    because the policy forbids it (not delivered, past the 30-day window, over the $400 limit,
    already refunded, not their order, failed login).

    ## Action
    Document 002's text protocol: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``
    blocks run tools (results come back as a user message ``<tool_result>[...]</tool_result>``);
    a message without a block is the final reply and ends the episode.

    ## Reward
    :func:`~llm_gym.envs.refund.reward.score_transcript`: resolved 0.5, authenticated first 0.2,
    no over-refund 0.15, within policy 0.15; success at 1.0; per-turn rewards in the result's
    metadata. With ``reply_judge``, a judge endpoint also rates the reply's quality (default
    rubric :data:`~llm_gym.envs.refund.reward.REPLY_RUBRIC`) and the score blends it in with its
    ``weight`` (default 0.2; :func:`~llm_gym.envs.refund.reward.score_transcript`); success
    still means every behaviour. A failed judgement gives ``fallback`` as the quality (None:
    the behaviours' score alone) and ``judge_failed`` 1 in the metadata.

    ## Episode End
    The final reply, or :data:`MAX_EPISODE_TURNS` actions (then scored as it stands).

    Args:
        split: The split ``dataset`` reads (``"train"``, ``"val"`` or ``"test"``).
        max_turns: Assistant actions per episode.
        reply_judge: None (no judge), or the judge of the reply's quality:
            :class:`~llm_gym.judge.JudgeSettings` or their mapping, where ``rubric`` and
            ``weight`` (in (0, 1]) may be left out (``{"base_url": URL, "model": NAME}``).
    """

    version: ClassVar[str] = VERSION
    tool_specs: ClassVar[list[ToolSpec]] = TOOL_SPECS
    """The tools as specs, so chat templates and the random policy see them."""
    max_tokens_per_turn: ClassVar[int] = 192
    """A turn is a few tool calls (a refund is about 57 tokens) or a short reply to the
    customer."""

    def __init__(
        self,
        *,
        split: str = "train",
        max_turns: int = MAX_EPISODE_TURNS,
        reply_judge: JudgeSettings | Mapping[str, Any] | None = None,
    ) -> None:
        if isinstance(max_turns, bool) or not isinstance(max_turns, int) or max_turns < 1:
            raise InvalidArgumentError(
                f"max_turns must be an int >= 1, actual value: {max_turns!r}."
            )
        if split not in SPLIT_SIZES:
            raise InvalidArgumentError(
                f"split must be one of {sorted(SPLIT_SIZES)}, actual value: {split!r}."
            )
        self.split = split
        self.max_turns = max_turns
        self.reply_judge = None
        if reply_judge is not None:
            if isinstance(reply_judge, Mapping):
                defaults = {"rubric": REPLY_RUBRIC, "weight": REPLY_QUALITY_WEIGHT}
                reply_judge = {**defaults, **reply_judge}
            self.reply_judge = JudgeSettings.of(reply_judge)
            if not 0 < self.reply_judge.weight <= 1:
                raise InvalidArgumentError(
                    "reply_judge weight (the judged quality's share of the score) must be in "
                    f"(0, 1], actual value: {self.reply_judge.weight!r}."
                )

    @property
    def dataset(self) -> tuple[Task, ...]:
        """The tasks of :attr:`split` (document 002's ``dataset``)."""
        return get_tasks(self.split)

    # --- document 002's hooks -----------------------------------------------------------------
    def start_episode(self, example: TaskExample, prompt_text: str) -> list[ChatMessage]:
        world = World.from_metadata(example.metadata)
        rules = SYSTEM_PROMPT.format(today=world.today.isoformat(), policy=POLICY)
        return [
            {"role": "system", "content": f"{prompt_text}\n\n{rules}".strip()},
            {"role": "user", "content": example.input},
        ]

    def max_episode_turns(self, example: TaskExample) -> int:
        return self.max_turns

    def step_episode(
        self, example: TaskExample, messages: list[ChatMessage], assistant_response: str
    ) -> EnvironmentStepResult:
        initial = StoreState(World.from_metadata(example.metadata))
        state = replay_state(
            initial, apply_action, messages, assistant_response, prompt_length=_OPENING_LENGTH
        )
        if state.replied:
            return EnvironmentStepResult(done=True, final_response_text=assistant_response)
        results = state.last_results
        return EnvironmentStepResult(
            done=False,
            messages=({"role": "user", "content": render_tool_results(results)},),
            metadata={
                "calls": [r.get("name") for r in results],
                "errors": sum("error" in r for r in results),
            },
        )

    def score_episode(self, example: TaskExample, episode: EnvironmentEpisode) -> RewardResult:
        actions = sampled_actions(episode.messages, prompt_length=_OPENING_LENGTH)
        if self.reply_judge is None:
            return score_transcript(example.metadata, actions)
        opening, rest = episode.messages[:_OPENING_LENGTH], episode.messages[_OPENING_LENGTH:]
        [judged] = shared_judge(self.reply_judge).judge([(opening, rest)])
        quality = judged.score if judged.score is not None else self.reply_judge.fallback
        result = score_transcript(example.metadata, actions, quality, self.reply_judge.weight)
        result.metadata["judge_failed"] = float(judged.score is None)
        return result

    def sft_completion(self, example: TaskExample) -> list[ChatMessage]:
        """The oracle's transcript after the opening (SFT does not run ``step_episode``, so the
        target is rolled out here, with this environment's own hooks)."""
        task = example.to_task()
        messages = self.start_episode(example, "")
        target: list[ChatMessage] = []
        for _ in range(self.max_episode_turns(example)):
            action = oracle_action(task, messages)["content"]
            messages.append({"role": "assistant", "content": action})
            target.append({"role": "assistant", "content": action})
            result = self.step_episode(example, messages, action)
            messages.extend(result.messages)
            target.extend(result.messages)
            if result.done:
                break
        return target


def load_environment(split: str = "train", **kwargs: Any) -> RefundEnv:
    """Document 002's entry point: ``RefundEnv(split=split, **kwargs)``."""
    return RefundEnv(split=split, **kwargs)


# --- the oracle --------------------------------------------------------------------------------


def _results(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Every tool-result entry in ``messages``, oldest first."""
    entries: list[dict[str, Any]] = []
    for message in messages:
        if message.get("role") == "user":
            entries.extend(read_tool_results(message.get("content") or "") or [])
    return entries


def _last(entries: Sequence[dict[str, Any]], name: str) -> dict[str, Any] | None:
    """The latest result entry of tool ``name`` (``None``: never called)."""
    return next((e for e in reversed(entries) if e.get("name") == name), None)


def _reply(text: str) -> Message:
    return Message(role="assistant", content=text)


def _call(name: str, arguments: Mapping[str, Any] | None = None) -> Message:
    return Message(role="assistant", content=render_tool_call(name, arguments))


def _cents(dollars: Any) -> int:
    return round(float(dollars) * 100)


def oracle_action(task: Task, messages: Sequence[Message]) -> Message:
    """The expert's next message: authenticate, look the order up, then refund or decline.

    It reads the request (which order, the whole order or one item) and the credentials from
    ``task.metadata``, and decides from what the tools returned: the order's status, delivery
    date, refundable balance and item prices (never from the expected answer). Its tool calls
    are already text in the environment's protocol.
    """
    metadata = task.metadata
    credentials = dict(metadata["credentials"])
    request = metadata["request"]
    today = dt.date.fromisoformat(metadata["today"])
    entries = _results(messages)

    login = _last(entries, "authenticate")
    if login is None:
        return _call("authenticate", credentials)
    if "error" in login:
        return _reply(
            "I'm sorry, I could not verify your identity with the details you gave, so I can't "
            "access your orders. Please check your customer ID and PIN or email and try again."
        )

    order_id = request.get("order_id")
    if order_id is None:
        listing = _last(entries, "list_orders")
        if listing is None or "error" in listing:
            return _call("list_orders")
        orders = listing["result"]["orders"]
        if not orders:
            return _reply("I can't find any orders on your account, so there is nothing to refund.")
        order_id = max(orders, key=lambda o: o["placed_on"])["order_id"]

    refund = _last(entries, "refund_order")
    if refund is not None and "result" in refund:
        amount = refund["result"]["refunded"]
        return _reply(
            f"Done: I refunded ${amount:.2f} for order {order_id} to your original payment "
            "method. It should appear within 5-10 business days."
        )

    looked_up = _last(entries, "get_order")
    if looked_up is None:
        return _call("get_order", {"order_id": order_id})
    if "error" in looked_up:
        return _reply(
            f"I'm sorry, I can't find order {order_id} on your account, so I can't refund it. "
            "Please check the order number."
        )
    order = looked_up["result"]
    if order["status"] != "delivered" or not order["delivered_on"]:
        return _reply(
            f"Order {order_id} is {order['status']} and has not been delivered yet; we can only "
            "refund delivered orders. Once it arrives, you can ask again."
        )
    delivered = dt.date.fromisoformat(order["delivered_on"])
    if (today - delivered).days > REFUND_WINDOW_DAYS:
        return _reply(
            f"I'm sorry, order {order_id} was delivered on {order['delivered_on']}, more than "
            f"{REFUND_WINDOW_DAYS} days ago, so it is past our refund window."
        )
    refundable = _cents(order["refundable"])
    if request.get("item"):
        line = next((i for i in order["items"] if i["name"] == request["item"]), None)
        if line is None:
            return _reply(f"I can't find a {request['item']} in order {order_id}.")
        amount, what = _cents(line["line_total"]), f"the {request['item']}"
    else:
        amount, what = refundable, f"order {order_id}"
    if refundable <= 0 or amount > refundable:
        return _reply(
            f"Order {order_id} has already been refunded, so there is nothing left to refund."
        )
    if amount > PER_ORDER_LIMIT_CENTS:
        return _reply(
            f"A refund of ${format_cents(amount)} for {what} is above the "
            f"${format_cents(PER_ORDER_LIMIT_CENTS)} I can approve. I've noted your request; a "
            "supervisor will follow up with you."
        )
    reason = "damaged item" if request.get("item") else "customer request"
    return _call(
        "refund_order",
        {"order_id": order_id, "amount": float(format_cents(amount)), "reason": reason},
    )
