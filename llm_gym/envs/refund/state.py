"""The state of a Refund-v0 episode: the calls made, the refunds issued, the faults.

Nothing is stored between steps: a :class:`StoreState` is rebuilt by folding
:func:`~llm_gym.envs.refund.api.apply_action` over the sampled actions of the transcript. Every
call that breaks a rule is recorded with its :class:`Fault` s, which the reward reads.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from llm_gym.envs.refund.world import Order, World

__all__ = ["POLICY_FAULTS", "Call", "Fault", "Refund", "StoreState"]


class Fault(enum.StrEnum):
    """A rule broken by one call (recorded on the :class:`Call`)."""

    MALFORMED = "malformed"
    """Not a parseable tool call (bad JSON, an unclosed block, too long, too many calls)."""
    UNKNOWN_TOOL = "unknown_tool"
    """A tool the store does not have."""
    BAD_ARGUMENTS = "bad_arguments"
    """Missing, unexpected or invalid arguments (a negative amount, a 3-decimal amount...)."""
    UNAUTHENTICATED = "unauthenticated"
    """A privileged call before the customer was authenticated."""
    CREDENTIAL_GUESS = "credential_guess"
    """``authenticate`` with credentials other than the ones the customer gave."""
    NOT_OWNER = "not_owner"
    """A refund of an order that is not on the authenticated customer's account."""
    OVER_REFUND = "over_refund"
    """A refund above the order's refundable balance (the store refuses it)."""
    NOT_DELIVERED = "policy_not_delivered"
    """A refund of an order that was not delivered (policy rule 2)."""
    TOO_OLD = "policy_too_old"
    """A refund more than the refund window after delivery (policy rule 2)."""
    OVER_LIMIT = "policy_over_limit"
    """Refunds on one order above the per-order limit (policy rule 4)."""


POLICY_FAULTS = frozenset({Fault.NOT_OWNER, Fault.NOT_DELIVERED, Fault.TOO_OLD, Fault.OVER_LIMIT})
"""Faults that break the written refund policy."""


# --- records -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Call:
    """One tool call as the store handled it."""

    action: int
    """The 0-based index of the sampled assistant action that made it."""
    name: str
    """The tool called (``""`` when the block was unreadable)."""
    arguments: Mapping[str, Any]
    """Its arguments."""
    ok: bool
    """Whether the store carried it out."""
    output: Any
    """The result (a dict) or the error message."""
    faults: tuple[Fault, ...] = ()
    """The rules it broke."""
    session: str | None = None
    """The authenticated customer when it ran."""


@dataclass(frozen=True)
class Refund:
    """One refund the store carried out during the episode."""

    action: int
    """The sampled action that issued it."""
    order_id: str
    """The refunded order."""
    amount_cents: int
    """The amount, in cents."""
    reason: str
    """The reason given."""


@dataclass(frozen=True)
class StoreState:
    """The episode's state after some actions; rebuilt by replay, never stored."""

    world: World
    """The store as the task defines it (unchanged)."""
    session: str | None = None
    """The authenticated customer ID."""
    failed_logins: tuple[str, ...] = ()
    """The customer ID of every failed ``authenticate``."""
    refunds: tuple[Refund, ...] = ()
    """The refunds issued so far."""
    calls: tuple[Call, ...] = ()
    """Every tool call so far."""
    actions: int = 0
    """Sampled actions applied."""
    replied: bool = False
    """Whether the last action was a plain reply (the end of the conversation)."""
    reply_text: str = ""
    """That reply."""
    last_results: tuple[dict[str, Any], ...] = ()
    """The tool results of the last action (what the model is shown next)."""

    def refunded_in_episode(self, order_id: str) -> int:
        """Cents refunded on ``order_id`` during the episode."""
        return sum(r.amount_cents for r in self.refunds if r.order_id == order_id)

    def refundable_cents(self, order: Order) -> int:
        """What can still be refunded on ``order``."""
        return order.total_cents - order.refunded_cents - self.refunded_in_episode(order.order_id)
