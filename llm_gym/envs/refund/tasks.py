"""The seeded task generator of Refund-v0 and its splits.

A task is one customer's request ("refund order W123456", "the kettle in my last order arrived
broken"). Its ``metadata`` holds the whole store of that episode (the customers and their
orders, as plain JSON values, see :mod:`llm_gym.envs.refund.world`), the credentials the customer
gave, today's date, and the expected resolution: refund one order by an exact amount, or refuse
for a named policy reason. The module reads top to bottom: the cases and word tables, the
generator, the splits.
"""

from __future__ import annotations

import datetime as dt
import functools
import random
from collections.abc import Sequence
from typing import Any

from llm_gym.core.task import Task, cut_splits, distinct_tasks, pick_split
from llm_gym.envs.refund.world import Customer, Item, Order, format_cents

__all__ = ["CASES", "SPLIT_SIZES", "TASK_SEED", "generate_tasks", "get_tasks"]

# --- the cases and word tables -----------------------------------------------------------------

CASES: dict[str, int] = {
    # case: weight. "ok" tasks expect a refund; every other case expects a refusal.
    "ok": 45,
    "too_old": 12,
    "already_refunded": 7,
    "over_limit": 10,
    "not_delivered": 10,
    "not_owner": 8,
    "auth_failed": 8,
}
"""The request cases and how often the generator draws each."""

SPLIT_SIZES = {"train": 1000, "val": 200, "test": 200}
"""Tasks per split; the splits are disjoint (no prompt appears in two)."""
TASK_SEED = 20261205
"""Seed of the task universe: the same seed always gives the same tasks in the same splits."""

_BASE_DATE = dt.date(2025, 1, 1)
_ITEMS: tuple[tuple[str, int, int], ...] = (
    # name, lowest and highest price in dollars
    ("wireless mouse", 15, 45),
    ("mechanical keyboard", 59, 169),
    ("USB-C cable", 8, 19),
    ("desk lamp", 22, 69),
    ("coffee grinder", 35, 129),
    ("blender", 45, 199),
    ("running shoes", 59, 159),
    ("backpack", 35, 110),
    ("water bottle", 12, 35),
    ("yoga mat", 19, 60),
    ("headphones", 49, 299),
    ("air fryer", 69, 189),
    ("electric kettle", 25, 79),
    ("rain jacket", 49, 180),
    ("bluetooth speaker", 29, 199),
    ("phone case", 9, 39),
    ("cast iron pan", 29, 89),
    ("board game", 19, 65),
    ("wall clock", 18, 75),
    ("throw blanket", 25, 95),
    ("sunglasses", 19, 180),
    ("gaming controller", 39, 79),
)
_EXPENSIVE_ITEMS: tuple[tuple[str, int, int], ...] = (
    ("laptop", 650, 1400),
    ("4K monitor", 420, 899),
    ("espresso machine", 420, 950),
    ("office chair", 410, 690),
    ("road bike", 700, 1600),
    ("smartphone", 450, 1100),
    ("robot vacuum", 420, 850),
)
_FIRST_NAMES = (
    "Ava", "Ben", "Chloe", "Dev", "Elena", "Farid", "Grace", "Hiro", "Ines", "Jonas", "Kira",
    "Liam", "Maya", "Nikhil", "Olga", "Pablo", "Quinn", "Rosa", "Sami", "Tara", "Umar", "Vera",
    "Wen", "Ximena", "Yusuf", "Zoe",
)  # fmt: skip
_LAST_NAMES = (
    "Adler", "Brooks", "Castillo", "Dubois", "Eriksen", "Fischer", "Garcia", "Haddad", "Ito",
    "Jensen", "Kowalski", "Lopez", "Moreau", "Novak", "Okafor", "Patel", "Rossi", "Silva",
    "Tanaka", "Usman", "Varga", "Weber", "Yilmaz", "Zhang",
)  # fmt: skip
_DOMAINS = ("example.com", "example.net", "example.org", "mail.example")


# --- the seeded task generator -----------------------------------------------------------------


class _Ids:
    """Distinct customer and order IDs within one task."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.used: set[str] = set()

    def draw(self, prefix: str, digits: int) -> str:
        while True:
            value = f"{prefix}{self.rng.randrange(10 ** (digits - 1), 10**digits)}"
            if value not in self.used:
                self.used.add(value)
                return value


def _price(rng: random.Random, low: int, high: int) -> int:
    return rng.randint(low, high) * 100 + rng.choice((0, 49, 95, 99, 50, 25))


def _items(
    rng: random.Random, n: int, *, catalogue: Sequence[tuple[str, int, int]] = _ITEMS
) -> list[Item]:
    chosen = rng.sample(list(catalogue), n)
    return [
        Item(name, _price(rng, low, high), 1 if rng.random() < 0.8 or high > 100 else 2)
        for name, low, high in chosen
    ]


def _customer(rng: random.Random, ids: _Ids) -> Customer:
    first, last = rng.choice(_FIRST_NAMES), rng.choice(_LAST_NAMES)
    email = f"{first}.{last}{rng.randint(1, 99)}@{rng.choice(_DOMAINS)}".lower()
    return Customer(ids.draw("C", 5), f"{first} {last}", email, f"{rng.randrange(10_000):04d}")


def _status_for(rng: random.Random, today: dt.date, placed: dt.date) -> tuple[str, dt.date | None]:
    age = (today - placed).days
    if age <= 1:
        return "processing", None
    if age <= 4:
        return "shipped", None
    return "delivered", placed + dt.timedelta(days=rng.randint(2, min(5, age)))


def _background_order(
    rng: random.Random, ids: _Ids, customer_id: str, today: dt.date, placed: dt.date
) -> Order:
    items = tuple(_items(rng, rng.randint(1, 3)))
    total = sum(i.line_cents for i in items)
    status, delivered = _status_for(rng, today, placed)
    refunded = 0
    roll = rng.random()
    if status == "delivered" and roll < 0.08:
        status, delivered, refunded = "cancelled", None, total
    elif status == "delivered" and roll < 0.18:
        refunded = total
    elif status == "delivered" and roll < 0.28 and len(items) > 1:
        refunded = items[0].line_cents
    return Order(ids.draw("W", 6), customer_id, placed, status, delivered, items, refunded)


def _target_order(
    rng: random.Random, ids: _Ids, case: str, kind: str, owner: str, today: dt.date
) -> tuple[Order, Item | None]:
    """The order the request is about, shaped for ``case``; plus the item for item requests."""
    if case == "not_delivered":
        age = rng.randint(0, 4)
        placed = today - dt.timedelta(days=age)
        status, delivered = ("processing", None) if age <= 1 else ("shipped", None)
        items = _items(rng, rng.randint(1, 3))
        return Order(ids.draw("W", 6), owner, placed, status, delivered, tuple(items)), (
            rng.choice(items) if kind == "item" else None
        )
    days_since_delivery = rng.randint(34, 150) if case == "too_old" else rng.randint(1, 27)
    delivered = today - dt.timedelta(days=days_since_delivery)
    placed = delivered - dt.timedelta(days=rng.randint(2, 5))
    refunded = 0
    target: Item | None = None
    if case == "over_limit":
        expensive = _items(rng, 1, catalogue=_EXPENSIVE_ITEMS)
        items = expensive + _items(rng, rng.randint(0, 2))
        rng.shuffle(items)
        target = expensive[0] if kind == "item" else None
    else:
        while True:
            items = _items(rng, rng.randint(1 if kind == "full" else 2, 3))
            if sum(i.line_cents for i in items) <= 38_000:
                break
        if kind == "item":
            candidates = [i for i in items if i.quantity == 1] or [items[0]]
            target = rng.choice(candidates)
        if case == "already_refunded":
            refunded = sum(i.line_cents for i in items)
        elif case in ("ok", "not_owner", "auth_failed", "too_old") and rng.random() < 0.25:
            others = [i for i in items if i is not target]
            if len(others) >= 1 and len(items) > 1:
                refunded = rng.choice(others).line_cents
    order = Order(ids.draw("W", 6), owner, placed, "delivered", delivered, tuple(items), refunded)
    return order, target


_GREETINGS = ("Hi.", "Hello!", "Hi there!", "Good morning.", "Hey!", "")
_FULL_BY_ID = (
    "Please refund order {order}, I no longer need it.",
    "I'd like a full refund for order {order}.",
    "I changed my mind about order {order}. Can I get my money back?",
    "Could you refund order {order} in full, please?",
)
_FULL_LAST = (
    "Please refund my most recent order.",
    "Can you refund the last order I placed?",
    "I want a full refund for my latest order.",
)
_ITEM_BY_ID = (
    "The {item} in order {order} arrived damaged. Please refund it.",
    "My {item} from order {order} was broken on arrival; I want a refund for it.",
    "Order {order}: the {item} came damaged. Can you refund that item?",
)
_ITEM_LAST = (
    "The {item} from my latest order arrived broken. Please refund just that item.",
    "The {item} in my most recent order was damaged in shipping. Can I get a refund for it?",
)


def _credentials(rng: random.Random, customer: Customer, wrong: bool) -> tuple[dict[str, str], str]:
    """What the customer says to identify themselves (wrong on purpose for ``auth_failed``)."""
    if rng.random() < 0.5:
        pin = customer.pin
        if wrong:
            while pin == customer.pin:
                pin = f"{rng.randrange(10_000):04d}"
        text = rng.choice(
            (
                "My customer ID is {cid} and my PIN is {secret}.",
                "Customer ID {cid}, PIN {secret}.",
                "I'm {name} (customer {cid}); my PIN is {secret}.",
            )
        )
        return {"customer_id": customer.customer_id, "pin": pin}, text.format(
            cid=customer.customer_id, secret=pin, name=customer.name
        )
    email = customer.email
    if wrong:
        local, domain = email.split("@")
        email = rng.choice(
            (f"{local}@{rng.choice([d for d in _DOMAINS if d != domain])}", f"x{local}@{domain}")
        )
    text = rng.choice(
        (
            "My customer ID is {cid} and the email on my account is {secret}.",
            "Customer ID {cid}, email {secret}.",
            "This is {name}, customer {cid}, email {secret}.",
        )
    )
    return {"customer_id": customer.customer_id, "email": email}, text.format(
        cid=customer.customer_id, secret=email, name=customer.name
    )


def _draw_task(rng: random.Random) -> Task:
    today = _BASE_DATE + dt.timedelta(days=rng.randrange(365))
    case = rng.choices(list(CASES), weights=list(CASES.values()))[0]
    kind = "full" if case == "already_refunded" or rng.random() < 0.55 else "item"
    by_last = case != "not_owner" and rng.random() < 0.35
    ids = _Ids(rng)
    requester = _customer(rng, ids)
    others = [_customer(rng, ids) for _ in range(rng.randint(1, 2))]
    owner = others[0].customer_id if case == "not_owner" else requester.customer_id
    target, item = _target_order(rng, ids, case, kind, owner, today)

    orders = [target]
    taken = {target.placed_on}
    for customer in [requester, *others]:
        for _ in range(rng.randint(2, 5) if customer is requester else rng.randint(1, 3)):
            for _attempt in range(20):
                if customer is requester and by_last:
                    age = (today - target.placed_on).days + rng.randint(1, 300)
                else:
                    age = rng.randint(0, 360)
                placed = today - dt.timedelta(days=age)
                if placed not in taken:
                    break
            taken.add(placed)
            orders.append(_background_order(rng, ids, customer.customer_id, today, placed))

    credentials, who = _credentials(rng, requester, wrong=case == "auth_failed")
    template = {
        ("full", False): _FULL_BY_ID,
        ("full", True): _FULL_LAST,
        ("item", False): _ITEM_BY_ID,
        ("item", True): _ITEM_LAST,
    }[kind, by_last]
    ask = rng.choice(template).format(order=target.order_id, item=item.name if item else "")
    prompt = " ".join(p for p in (rng.choice(_GREETINGS), who, ask) if p)

    if case == "ok":
        amount = item.line_cents if item else target.total_cents - target.refunded_cents
        expected: dict[str, Any] = {
            "action": "refund",
            "order_id": target.order_id,
            "amount_cents": amount,
        }
        label = f"refund {target.order_id} {format_cents(amount)}"
    else:
        expected = {"action": "refuse", "reason": case, "order_id": target.order_id}
        label = f"refuse ({case})"
    rng.shuffle(orders)
    metadata = {
        "case": case,
        "request": {
            "kind": kind,
            "order_id": None if by_last else target.order_id,
            "item": item.name if item else None,
        },
        "target_order": target.order_id,
        "expected": expected,
        "today": today.isoformat(),
        "customer_id": requester.customer_id,
        "credentials": credentials,
        "customers": [c.to_dict() for c in (requester, *others)],
        "orders": [o.to_dict() for o in orders],
    }
    return Task(prompt=prompt, target=label, metadata=metadata)


def generate_tasks(seed: int, n: int) -> list[Task]:
    """``n`` distinct tasks (no two share a prompt) drawn from a ``random.Random(seed)``.

    A pure function of its arguments: the same seed always gives the same list.

    Example:
        >>> generate_tasks(1, 2) == generate_tasks(1, 2)
        True
    """
    rng = random.Random(seed)
    return distinct_tasks(lambda: _draw_task(rng), n)


# --- the splits --------------------------------------------------------------------------------


@functools.cache
def _splits() -> dict[str, tuple[Task, ...]]:
    universe = generate_tasks(TASK_SEED, sum(SPLIT_SIZES.values()))
    return cut_splits(universe, SPLIT_SIZES, "refund")


def get_tasks(split: str = "train") -> tuple[Task, ...]:
    """The tasks of ``split`` (``"train"``, ``"val"`` or ``"test"``)."""
    return pick_split(_splits(), split)
