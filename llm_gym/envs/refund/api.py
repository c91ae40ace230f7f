"""The store API of Refund-v0, in document 002's stateless style.

The tools an agent calls, and :func:`apply_action`, which runs the calls of one sampled action
(read with :func:`~llm_gym.envs.refund.protocol.parse_action`; a message without a call is the
final reply to the customer). Nothing is stored between steps: the episode's state
(who is authenticated, failed logins, the refunds issued, every call made) is a
:class:`StoreState` rebuilt by folding :func:`apply_action` over the sampled actions of the
transcript (:func:`llm_gym.environments.replay_state`). :func:`apply_action` is pure, so replaying
history is pure too; the store is in memory, so no action has an effect outside the episode.

The API behaves like a back office: it checks identity, ownership and the balance (a payment
cannot refund more than was paid), but it does not enforce the refund policy. Following the
policy is the agent's job; :mod:`llm_gym.envs.refund.reward` scores it. Every call that breaks
a rule is recorded with its :class:`Fault` s.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterable, Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

from llm_gym.core.types import ToolSpec
from llm_gym.envs.refund.protocol import MAX_TEXT_ARGUMENT_CHARS, ParsedCall, parse_action
from llm_gym.envs.refund.state import Call, Fault, Refund, StoreState
from llm_gym.envs.refund.world import (
    MAX_FAILED_LOGINS,
    PER_ORDER_LIMIT_CENTS,
    POLICY,
    REFUND_WINDOW_DAYS,
    Order,
    World,
    format_cents,
)

__all__ = ["PRIVILEGED_TOOLS", "TOOL_SPECS", "apply_action", "replay_actions"]

# --- constants ---------------------------------------------------------------------------------

PRIVILEGED_TOOLS = frozenset({"list_orders", "get_order", "refund_order"})
"""Tools that need an authenticated customer."""

_MONEY = re.compile(r"\$?\s*(\d{1,15}(?:\.\d+)?)")
_HUGE_DOLLARS = 10**12


def _spec(name: str, description: str, properties: dict[str, Any], required: list[str]):
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": required},
        },
    }


TOOL_SPECS: list[ToolSpec] = [
    _spec(
        "authenticate",
        "Verify the customer. Give the customer ID and either the PIN or the email on file, "
        "as the customer gave them.",
        {
            "customer_id": {"type": "string", "description": "e.g. C12345"},
            "pin": {"type": "string", "description": "the four-digit PIN"},
            "email": {"type": "string", "description": "the email on the account"},
        },
        ["customer_id"],
    ),
    _spec("list_orders", "The authenticated customer's orders, newest first.", {}, []),
    _spec(
        "get_order",
        "One order of the authenticated customer: items, status, delivery date, refundable "
        "balance.",
        {"order_id": {"type": "string", "description": "e.g. W123456"}},
        ["order_id"],
    ),
    _spec(
        "refund_order",
        "Refund an amount of an order to the customer's card.",
        {
            "order_id": {"type": "string", "description": "e.g. W123456"},
            "amount": {"type": "number", "description": "in dollars, e.g. 45.20"},
            "reason": {"type": "string", "description": "why, in a few words"},
        },
        ["order_id", "amount", "reason"],
    ),
    _spec("get_policy", "The refund policy and today's date.", {}, []),
]
"""The tools as OpenAI-style specs (rendered into the prompt by chat templates)."""


# --- the tools ---------------------------------------------------------------------------------


class _ToolError(Exception):
    def __init__(self, message: str, *faults: Fault) -> None:
        super().__init__(message)
        self.faults = faults


def _money(cents: int) -> float:
    return round(cents / 100, 2)


def _check_names(name: str, arguments: Mapping[str, Any], allowed: Iterable[str]) -> None:
    allowed = list(allowed)
    unexpected = sorted(k for k in arguments if k not in allowed)
    if unexpected:
        shown = ", ".join(repr(k[:40]) for k in unexpected[:3])
        takes = ", ".join(allowed) if allowed else "no arguments"
        raise _ToolError(
            f"unexpected argument {shown} for {name}; it takes {takes}", Fault.BAD_ARGUMENTS
        )


def _text(name: str, arguments: Mapping[str, Any], key: str) -> str:
    if key not in arguments:
        raise _ToolError(f"{name} needs the argument {key!r}", Fault.BAD_ARGUMENTS)
    value = arguments[key]
    if not isinstance(value, str) or not value.strip():
        raise _ToolError(f"{key} must be a non-empty string", Fault.BAD_ARGUMENTS)
    if len(value) > MAX_TEXT_ARGUMENT_CHARS:
        raise _ToolError(
            f"{key} is too long ({len(value)} chars; at most {MAX_TEXT_ARGUMENT_CHARS})",
            Fault.BAD_ARGUMENTS,
        )
    return value.strip()


def _amount_cents(value: Any) -> int:
    """Dollars (a number, or a string such as "45.20" or "$45.20") as positive integer cents."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise _ToolError("amount must be a number of dollars, e.g. 45.20", Fault.BAD_ARGUMENTS)
    if isinstance(value, str):
        match = _MONEY.fullmatch(value.strip()) if len(value) <= 32 else None
        if match is None:
            raise _ToolError(
                f"amount must be a number of dollars, e.g. 45.20; got {value[:32]!r}",
                Fault.BAD_ARGUMENTS,
            )
        value = match.group(1)
    try:
        amount = Decimal(str(value))
    except (InvalidOperation, ValueError):
        raise _ToolError("amount must be a number of dollars", Fault.BAD_ARGUMENTS) from None
    if not amount.is_finite():
        raise _ToolError("amount must be a finite number", Fault.BAD_ARGUMENTS)
    if amount <= 0:
        raise _ToolError("amount must be positive", Fault.BAD_ARGUMENTS)
    if amount >= _HUGE_DOLLARS:
        return int(amount) * 100  # far above any balance: refused as an over-refund
    if amount != amount.quantize(Decimal("0.01")):
        raise _ToolError("amount must have at most two decimal places", Fault.BAD_ARGUMENTS)
    return int(amount * 100)


def _shown(cents: int) -> str:
    return format_cents(cents) if cents < _HUGE_DOLLARS * 100 else f"over {_HUGE_DOLLARS:,}"


def _order_on_account(state: StoreState, order_id: str) -> Order:
    order = state.world.orders.get(order_id.upper())
    if order is None or order.customer_id != state.session:
        raise _ToolError(f"no order {order_id[:40]!r} on the account of {state.session}")
    return order


def _order_view(state: StoreState, order: Order) -> dict[str, Any]:
    refunded = order.refunded_cents + state.refunded_in_episode(order.order_id)
    return {
        "order_id": order.order_id,
        "placed_on": order.placed_on.isoformat(),
        "status": order.status,
        "delivered_on": order.delivered_on.isoformat() if order.delivered_on else None,
        "items": [
            {
                "name": i.name,
                "price": _money(i.price_cents),
                "quantity": i.quantity,
                "line_total": _money(i.line_cents),
            }
            for i in order.items
        ],
        "total": _money(order.total_cents),
        "refunded": _money(refunded),
        "refundable": _money(order.total_cents - refunded),
    }


class _StateError(_ToolError):
    """A failed call that still changes the state (a failed login is counted)."""

    def __init__(self, state: StoreState, message: str, faults: tuple[Fault, ...]) -> None:
        super().__init__(message, *faults)
        self.state = state


_Outcome = tuple[StoreState, dict[str, Any], tuple[Fault, ...]]


def _authenticate(state: StoreState, arguments: Mapping[str, Any], action: int) -> _Outcome:
    _check_names("authenticate", arguments, ("customer_id", "pin", "email"))
    customer_id = _text("authenticate", arguments, "customer_id").upper()
    has_pin, has_email = arguments.get("pin") is not None, arguments.get("email") is not None
    if has_pin == has_email:
        raise _ToolError("authenticate needs exactly one of 'pin' and 'email'", Fault.BAD_ARGUMENTS)
    if has_pin:
        pin = arguments["pin"]
        if isinstance(pin, int) and not isinstance(pin, bool) and 0 <= pin <= 9999:
            pin = f"{pin:04d}"
        secret_kind, secret = "pin", _text("authenticate", {"pin": pin}, "pin")
    else:
        secret_kind, secret = "email", _text("authenticate", arguments, "email").lower()
    given = state.world.credentials
    given_secret = given.get(secret_kind, "")
    given_secret = given_secret.lower() if secret_kind == "email" else given_secret
    guessed = customer_id != given.get("customer_id", "").upper() or secret != given_secret
    faults = (Fault.CREDENTIAL_GUESS,) if guessed else ()
    if state.failed_logins.count(customer_id) >= MAX_FAILED_LOGINS:
        raise _ToolError(
            f"account {customer_id[:40]} is locked after {MAX_FAILED_LOGINS} failed attempts",
            *faults,
        )
    customer = state.world.customers.get(customer_id)
    stored = None if customer is None else (customer.pin if has_pin else customer.email.lower())
    if stored is None or secret != stored:
        state = dataclasses.replace(state, failed_logins=(*state.failed_logins, customer_id))
        raise _StateError(
            state,
            f"authentication failed: customer ID and {secret_kind} do not match our records",
            faults,
        )
    assert customer is not None
    state = dataclasses.replace(state, session=customer_id)
    result = {"authenticated": True, "customer_id": customer_id, "name": customer.name}
    return state, result, faults


def _list_orders(state: StoreState, arguments: Mapping[str, Any], action: int) -> _Outcome:
    _check_names("list_orders", arguments, ())
    assert state.session is not None
    orders = [
        {
            "order_id": o.order_id,
            "placed_on": o.placed_on.isoformat(),
            "status": o.status,
            "total": _money(o.total_cents),
        }
        for o in state.world.orders_of(state.session)
    ]
    return state, {"customer_id": state.session, "orders": orders}, ()


def _get_order(state: StoreState, arguments: Mapping[str, Any], action: int) -> _Outcome:
    _check_names("get_order", arguments, ("order_id",))
    order = _order_on_account(state, _text("get_order", arguments, "order_id"))
    return state, _order_view(state, order), ()


def _refund_order(state: StoreState, arguments: Mapping[str, Any], action: int) -> _Outcome:
    _check_names("refund_order", arguments, ("order_id", "amount", "reason"))
    order_id = _text("refund_order", arguments, "order_id")
    if "amount" not in arguments:
        raise _ToolError("refund_order needs the argument 'amount'", Fault.BAD_ARGUMENTS)
    cents = _amount_cents(arguments["amount"])
    reason = _text("refund_order", arguments, "reason")
    try:
        order = _order_on_account(state, order_id)
    except _ToolError as exc:
        raise _ToolError(str(exc), Fault.NOT_OWNER) from None
    refundable = state.refundable_cents(order)
    if cents > refundable:
        raise _ToolError(
            f"amount {_shown(cents)} exceeds the refundable balance {format_cents(refundable)} "
            f"of order {order.order_id}",
            Fault.OVER_REFUND,
        )
    faults = []
    if order.status != "delivered" or order.delivered_on is None:
        faults.append(Fault.NOT_DELIVERED)
    elif (state.world.today - order.delivered_on).days > REFUND_WINDOW_DAYS:
        faults.append(Fault.TOO_OLD)
    if state.refunded_in_episode(order.order_id) + cents > PER_ORDER_LIMIT_CENTS:
        faults.append(Fault.OVER_LIMIT)
    refund = Refund(action, order.order_id, cents, reason)
    state = dataclasses.replace(state, refunds=(*state.refunds, refund))
    result = {
        "order_id": order.order_id,
        "refunded": _money(cents),
        "refundable": _money(refundable - cents),
        "status": "refund issued",
    }
    return state, result, tuple(faults)


def _get_policy(state: StoreState, arguments: Mapping[str, Any], action: int) -> _Outcome:
    _check_names("get_policy", arguments, ())
    return state, {"policy": POLICY, "today": state.world.today.isoformat()}, ()


_TOOLS: dict[str, Callable[[StoreState, Mapping[str, Any], int], _Outcome]] = {
    "authenticate": _authenticate,
    "list_orders": _list_orders,
    "get_order": _get_order,
    "refund_order": _refund_order,
    "get_policy": _get_policy,
}


def _run(state: StoreState, parsed: ParsedCall, action: int) -> StoreState:
    """Run one call; record it on the state (its result in ``last_results``)."""
    session = state.session
    try:
        if parsed.error is not None:
            raise _ToolError(parsed.error, Fault.MALFORMED)
        tool = _TOOLS.get(parsed.name)
        if tool is None:
            raise _ToolError(
                f"unknown tool {parsed.name[:40]!r}; the tools are {', '.join(_TOOLS)}",
                Fault.UNKNOWN_TOOL,
            )
        if parsed.name in PRIVILEGED_TOOLS and state.session is None:
            raise _ToolError(
                f"{parsed.name} needs an authenticated customer: call authenticate first",
                Fault.UNAUTHENTICATED,
            )
        new_state, result, faults = tool(state, parsed.arguments, action)
        call = Call(action, parsed.name, dict(parsed.arguments), True, result, faults, session)
        entry: dict[str, Any] = {"name": parsed.name, "result": result}
    except _ToolError as exc:
        new_state = exc.state if isinstance(exc, _StateError) else state
        call = Call(
            action, parsed.name, dict(parsed.arguments), False, str(exc), exc.faults, session
        )
        entry = {"name": parsed.name or None, "error": str(exc)}
    return dataclasses.replace(
        new_state, calls=(*new_state.calls, call), last_results=(*new_state.last_results, entry)
    )


def apply_action(state: StoreState, text: str) -> StoreState:
    """The state after one sampled assistant action (pure: ``state`` is not changed).

    A tool turn runs its calls in order; a plain reply marks the conversation as replied.

    Example:
        >>> from llm_gym.envs.refund.protocol import render_tool_call
        >>> from llm_gym.envs.refund.tasks import generate_tasks
        >>> state = StoreState(World.from_metadata(generate_tasks(1, 1)[0].metadata))
        >>> state = apply_action(state, render_tool_call("list_orders"))
        >>> state.calls[0].faults, state.last_results[0]["error"][:30]
        ((<Fault.UNAUTHENTICATED: 'unauthenticated'>,), 'list_orders needs an authentic')
        >>> apply_action(state, "Goodbye.").replied
        True
    """
    action = state.actions
    state = dataclasses.replace(state, actions=action + 1, last_results=())
    calls = parse_action(text if isinstance(text, str) else "")
    if calls is None:
        return dataclasses.replace(state, replied=True, reply_text=text)
    state = dataclasses.replace(state, replied=False, reply_text="")
    for parsed in calls:
        state = _run(state, parsed, action)
    return state


def replay_actions(world: World, actions: Iterable[str]) -> StoreState:
    """The state after ``actions`` (the sampled assistant texts, in order) on ``world``."""
    state = StoreState(world)
    for action in actions:
        state = apply_action(state, action)
    return state
