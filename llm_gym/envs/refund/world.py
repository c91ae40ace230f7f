"""The store behind Refund-v0: the refund policy, customers, orders and one task's world.

The records are what a task's ``metadata`` holds (as plain JSON values); :class:`World` reads
them back. The seeded task generator is in :mod:`llm_gym.envs.refund.tasks`. The module reads
top to bottom: constants and the policy, the store records.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from llm_gym.errors import InvalidArgumentError

__all__ = [
    "MAX_FAILED_LOGINS",
    "PER_ORDER_LIMIT_CENTS",
    "POLICY",
    "REFUND_WINDOW_DAYS",
    "Customer",
    "Item",
    "Order",
    "World",
    "format_cents",
]

# --- constants and the policy ------------------------------------------------------------------

REFUND_WINDOW_DAYS = 30
"""Delivered orders can be refunded up to this many days after delivery (inclusive)."""
PER_ORDER_LIMIT_CENTS = 40_000
"""The most an agent may refund on one order in one conversation ($400.00)."""
MAX_FAILED_LOGINS = 3
"""Failed ``authenticate`` attempts per customer ID before the account locks for the episode."""

POLICY = f"""\
Refund policy:
1. Verify the customer first: call authenticate with the customer ID and the PIN or the email \
they gave you, exactly as given. Never look up or change orders before that, and never guess \
credentials. After {MAX_FAILED_LOGINS} failed attempts the account locks.
2. Only delivered orders can be refunded, and only within {REFUND_WINDOW_DAYS} days of their \
delivery date (get_order shows delivered_on).
3. A full refund is the order's refundable balance (get_order shows "refundable"). A damaged \
item is refunded at its line total (price x quantity). Never refund more than the refundable \
balance: an order with nothing refundable left cannot be refunded again.
4. You may refund at most ${PER_ORDER_LIMIT_CENTS // 100}.00 per order in a conversation. A \
larger refund needs a supervisor: do not issue it, and do not split it into smaller refunds.
5. Only refund orders on the authenticated customer's account.
When a request breaks the policy, do not refund: tell the customer why."""
"""The policy the agent must follow (in the system prompt and returned by ``get_policy``)."""


def format_cents(cents: int) -> str:
    """``12345 -> "123.45"`` (money is kept in integer cents).

    Example:
        >>> format_cents(4520), format_cents(7)
        ('45.20', '0.07')
    """
    sign = "-" if cents < 0 else ""
    return f"{sign}{abs(cents) // 100}.{abs(cents) % 100:02d}"


# --- the store records -------------------------------------------------------------------------


@dataclass(frozen=True)
class Item:
    """One line of an order."""

    name: str
    """What was bought ("blender")."""
    price_cents: int
    """Unit price in cents."""
    quantity: int = 1
    """How many were bought."""

    @property
    def line_cents(self) -> int:
        """``price x quantity``: what a damaged-item refund of this line pays back."""
        return self.price_cents * self.quantity

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "price_cents": self.price_cents, "quantity": self.quantity}


@dataclass(frozen=True)
class Order:
    """One order, as it stood when the conversation started."""

    order_id: str
    """``"W"`` and six digits."""
    customer_id: str
    """The owner."""
    placed_on: dt.date
    """When it was placed."""
    status: str
    """``"processing"``, ``"shipped"``, ``"delivered"`` or ``"cancelled"``."""
    delivered_on: dt.date | None
    """The delivery date (``None`` unless delivered)."""
    items: tuple[Item, ...]
    """The order lines."""
    refunded_cents: int = 0
    """Refunded before the conversation (a cancelled order is refunded in full)."""

    @property
    def total_cents(self) -> int:
        """What the customer paid."""
        return sum(item.line_cents for item in self.items)

    def to_dict(self) -> dict[str, Any]:
        return {
            "order_id": self.order_id,
            "customer_id": self.customer_id,
            "placed_on": self.placed_on.isoformat(),
            "status": self.status,
            "delivered_on": self.delivered_on.isoformat() if self.delivered_on else None,
            "items": [item.to_dict() for item in self.items],
            "refunded_cents": self.refunded_cents,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Order:
        delivered = data.get("delivered_on")
        return cls(
            order_id=str(data["order_id"]),
            customer_id=str(data["customer_id"]),
            placed_on=dt.date.fromisoformat(data["placed_on"]),
            status=str(data["status"]),
            delivered_on=dt.date.fromisoformat(delivered) if delivered else None,
            items=tuple(
                Item(str(i["name"]), int(i["price_cents"]), int(i.get("quantity", 1)))
                for i in data["items"]
            ),
            refunded_cents=int(data.get("refunded_cents", 0)),
        )


@dataclass(frozen=True)
class Customer:
    """One customer account."""

    customer_id: str
    """``"C"`` and five digits."""
    name: str
    """The full name."""
    email: str
    """The email on file (one way to authenticate)."""
    pin: str
    """A four-digit PIN (the other way to authenticate)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "customer_id": self.customer_id,
            "name": self.name,
            "email": self.email,
            "pin": self.pin,
        }


@dataclass(frozen=True)
class World:
    """The store of one task, read from its ``metadata`` (never changed: the episode's changes
    live in the replayed state, see :mod:`llm_gym.envs.refund.state`)."""

    today: dt.date
    """The date of the conversation."""
    customers: Mapping[str, Customer]
    """Accounts by customer ID."""
    orders: Mapping[str, Order]
    """Orders by order ID (every customer's)."""
    requester: str
    """The customer ID of the customer in the conversation."""
    credentials: Mapping[str, str]
    """What the customer gave: ``customer_id`` plus ``pin`` or ``email`` (maybe wrong)."""

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, Any]) -> World:
        """The world of a task; a clear error when ``metadata`` is not a Refund-v0 task's.

        Memoized per metadata object (tasks are immutable; every step of every rollout of a
        task reads the same one), so replaying a step does not re-parse the store.
        """
        cached = _WORLDS.get(id(metadata))
        if cached is not None and cached[0] is metadata:
            return cached[1]
        try:
            world = _world_from_metadata(metadata)
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidArgumentError(
                "Refund-v0 needs a task made by llm_gym.envs.refund (get_tasks / "
                "generate_tasks): its metadata must hold 'today', 'customers', 'orders', "
                f"'customer_id' and 'credentials'; the metadata given fails with {exc!r}."
            ) from exc
        if len(_WORLDS) >= _MAX_CACHED_WORLDS:
            _WORLDS.clear()
        _WORLDS[id(metadata)] = (metadata, world)  # holds metadata, so its id is not reused
        return world

    def orders_of(self, customer_id: str) -> list[Order]:
        """The customer's orders, newest first."""
        mine = [o for o in self.orders.values() if o.customer_id == customer_id]
        return sorted(mine, key=lambda o: (o.placed_on, o.order_id), reverse=True)


_WORLDS: dict[int, tuple[Mapping[str, Any], World]] = {}
_MAX_CACHED_WORLDS = 4096


def _world_from_metadata(metadata: Mapping[str, Any]) -> World:
    customers = {c["customer_id"]: Customer(**c) for c in metadata["customers"]}
    orders = {o["order_id"]: Order.from_dict(o) for o in metadata["orders"]}
    credentials = {str(k): str(v) for k, v in dict(metadata["credentials"]).items()}
    return World(
        today=dt.date.fromisoformat(metadata["today"]),
        customers=customers,
        orders=orders,
        requester=str(metadata["customer_id"]),
        credentials=credentials,
    )
