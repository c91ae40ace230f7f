"""The reward of Refund-v0: a blend of behaviours, not imitation of a script.

Document 002's "Score behaviours, not a script": any transcript that does the right things earns
the full score, whatever the order of its lookups. :func:`score_transcript` is a pure function of
the task's metadata and the sampled assistant actions; it replays the actions on the store
(:func:`~llm_gym.envs.refund.api.replay_actions`) and checks four behaviours:

===================  ======  ===================================================================
behaviour            weight  earned when
===================  ======  ===================================================================
``resolved``         0.50    the conversation ends with a reply, and: the right order was
                             refunded by exactly the right amount and nothing else was refunded
                             (refund tasks); or nothing was refunded after looking the request
                             up (refusal tasks: the order, or the login when it fails)
``authenticated``    0.20    the customer's own credentials were tried, no privileged call came
                             before a successful login, no credential was guessed
``no_over_refund``   0.15    no refund above an order's balance, no money beyond what is owed,
                             no refund of another order
``within_policy``    0.15    no refund the policy forbids (not delivered, past the window, over
                             the per-order limit, another customer's order)
===================  ======  ===================================================================

The last three count only once the agent has engaged (tried the credentials the customer gave),
so an agent that does nothing scores 0. Success: score 1.0 (every behaviour).

Per-turn rewards: a sampled action that broke a rule (a fault: a malformed or unknown call,
bad arguments, a privileged call before login, a guessed credential, a refund the policy or the
balance forbids, a refund that is not owed) gets 0.0; every other action gets the episode score.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from llm_gym.environments.records import RewardResult
from llm_gym.envs.refund.api import replay_actions
from llm_gym.envs.refund.state import POLICY_FAULTS, Fault, StoreState
from llm_gym.envs.refund.world import World

__all__ = [
    "REPLY_QUALITY_WEIGHT",
    "REPLY_RUBRIC",
    "SUCCESS_THRESHOLD",
    "WEIGHTS",
    "Behaviours",
    "judge",
    "score_transcript",
]

WEIGHTS: dict[str, float] = {
    "resolved": 0.50,
    "authenticated": 0.20,
    "no_over_refund": 0.15,
    "within_policy": 0.15,
}
"""How much each behaviour adds to the score (they sum to 1)."""
SUCCESS_THRESHOLD = 1.0
"""An episode succeeds when it earns every behaviour."""
REPLY_RUBRIC: tuple[dict[str, Any], ...] = (
    {"name": "explains_decision", "weight": 2, "question": "Does the agent's final reply tell "
     "the customer what was decided (the refund made and its amount, or that it was declined) "
     "and why, in line with the store's refund policy?"},
    {"name": "courteous", "weight": 1, "question": "Is the final reply courteous and free of "
     "internal details (tool names, JSON, error codes)?"},
    {"name": "clarity", "weight": 1, "kind": "scale", "question": "How clear and concise is the "
     "final reply for the customer?"},
)  # fmt: skip
"""The judge's rubric of the reply's quality (the ``reply_judge`` option's default)."""
REPLY_QUALITY_WEIGHT = 0.2
"""The judged reply quality's share of the score (the ``reply_judge`` option's default)."""
UNOWED_REFUND = "unowed_refund"
"""The per-turn fault of a refund that is not owed (wrong order, too much, or none was due)."""


@dataclass(frozen=True)
class Behaviours:
    """What an episode did, as the reward sees it."""

    resolved: bool
    """The resolving action was taken (see the module docstring)."""
    authenticated: bool
    """Login came first, with the customer's own credentials."""
    no_over_refund: bool
    """No money beyond what is owed, no refund above a balance."""
    within_policy: bool
    """No refund the policy forbids."""
    engaged: bool
    """The agent tried the credentials the customer gave (the last three count only then)."""
    turn_faults: tuple[tuple[str, ...], ...]
    """The faults of each sampled action, in order."""
    refunded_cents: int
    """Everything refunded during the episode."""
    tool_calls: int
    tool_errors: int
    """Tool calls the store refused."""

    @property
    def score(self) -> float:
        """The weighted blend, rounded to 6 decimals (so a perfect episode is exactly 1.0)."""
        earned = sum(WEIGHTS[name] for name in WEIGHTS if getattr(self, name))
        return round(earned, 6)


def _unowed_refund_actions(state: StoreState, expected: Mapping[str, Any]) -> set[int]:
    """Actions that issued a refund not owed by the expected resolution."""
    unowed: set[int] = set()
    owed = int(expected.get("amount_cents", 0)) if expected.get("action") == "refund" else 0
    target = expected.get("order_id") if expected.get("action") == "refund" else None
    paid = 0
    for refund in state.refunds:
        if refund.order_id != target:
            unowed.add(refund.action)
            continue
        paid += refund.amount_cents
        if paid > owed:
            unowed.add(refund.action)
    return unowed


def judge(metadata: Mapping[str, Any], actions: Sequence[str]) -> Behaviours:
    """The behaviours of the episode whose sampled assistant actions are ``actions``.

    Args:
        metadata: The task's metadata (from :func:`~llm_gym.envs.refund.get_tasks`).
        actions: The sampled assistant texts, in order (tool turns and the final reply).
    """
    world = World.from_metadata(metadata)
    expected = metadata["expected"]
    state = replay_actions(world, actions)
    calls = state.calls
    faults = {fault for call in calls for fault in call.faults}
    unowed = _unowed_refund_actions(state, expected)

    engaged = any(
        call.name == "authenticate" and Fault.CREDENTIAL_GUESS not in call.faults
        and Fault.BAD_ARGUMENTS not in call.faults and Fault.MALFORMED not in call.faults
        for call in calls
    )  # fmt: skip
    authenticated = engaged and not faults & {Fault.UNAUTHENTICATED, Fault.CREDENTIAL_GUESS}
    no_over_refund = engaged and Fault.OVER_REFUND not in faults and not unowed
    within_policy = engaged and not faults & POLICY_FAULTS

    replied = state.replied and bool(state.reply_text.strip())
    target = str(metadata.get("target_order", expected.get("order_id", "")))
    if expected["action"] == "refund":
        on_target = sum(r.amount_cents for r in state.refunds if r.order_id == target)
        elsewhere = any(r.order_id != target for r in state.refunds)
        resolved = replied and on_target == int(expected["amount_cents"]) and not elsewhere
    elif expected.get("reason") == "auth_failed":
        resolved = replied and engaged and not state.refunds
    else:
        looked_up = any(
            call.session == world.requester
            and (
                call.name == "list_orders"
                or (
                    call.name == "get_order"
                    and str(call.arguments.get("order_id", "")).strip().upper() == target
                )
            )
            for call in calls
        )
        resolved = replied and looked_up and not state.refunds

    per_action: list[tuple[str, ...]] = []
    for index in range(len(actions)):
        names = [str(f) for call in calls if call.action == index for f in call.faults]
        if index in unowed:
            names.append(UNOWED_REFUND)
        per_action.append(tuple(dict.fromkeys(names)))
    return Behaviours(
        resolved=resolved,
        authenticated=authenticated,
        no_over_refund=no_over_refund,
        within_policy=within_policy,
        engaged=engaged,
        turn_faults=tuple(per_action),
        refunded_cents=sum(r.amount_cents for r in state.refunds),
        tool_calls=len(calls),
        tool_errors=sum(not call.ok for call in calls),
    )


def score_transcript(
    metadata: Mapping[str, Any],
    actions: Sequence[str],
    reply_quality: float | None = None,
    quality_weight: float = REPLY_QUALITY_WEIGHT,
) -> RewardResult:
    """The :class:`RewardResult` of an episode: the blended score, ``threshold=1.0``, and in
    ``metadata`` the behaviours (0/1), ``per_turn_rewards`` (one per action), ``refunded``
    (dollars), ``tool_calls``, ``tool_errors`` and ``faults`` (how many actions had one).

    With a judged ``reply_quality`` ``q`` in [0, 1] (the ``reply_judge`` option), the score is
    ``(1 - quality_weight) * behaviours + quality_weight * q`` and the threshold moves alike,
    ``(1 - quality_weight) * 1.0 + quality_weight * q``, so success still means every behaviour;
    ``reply_quality`` joins the metadata.

    Example:
        >>> from llm_gym.envs.refund import get_tasks
        >>> score_transcript(get_tasks("val")[0].metadata, ["Sorry, I cannot help."]).score
        0.0
        >>> judged = score_transcript(get_tasks("val")[0].metadata, ["Sorry."], 0.5, 0.2)
        >>> judged.score, judged.threshold  # 0.8 * 0.0 + 0.2 * 0.5, 0.8 * 1.0 + 0.2 * 0.5
        (0.1, 0.9)
    """
    behaviours = judge(metadata, actions)
    score, threshold = behaviours.score, SUCCESS_THRESHOLD
    extra: dict[str, float] = {}
    if reply_quality is not None:
        keep = 1 - quality_weight
        score = round(keep * score + quality_weight * reply_quality, 9)
        threshold = round(keep * SUCCESS_THRESHOLD + quality_weight * reply_quality, 9)
        extra["reply_quality"] = float(reply_quality)
    per_turn = [0.0 if faults else score for faults in behaviours.turn_faults]
    return RewardResult(
        score=score,
        threshold=threshold,
        metadata={
            "per_turn_rewards": per_turn,
            **{name: float(getattr(behaviours, name)) for name in WEIGHTS},
            "refunded": behaviours.refunded_cents / 100,
            "tool_calls": behaviours.tool_calls,
            "tool_errors": behaviours.tool_errors,
            "faults": sum(bool(f) for f in behaviours.turn_faults),
            **extra,
        },
    )
