"""The databases of SQL-v0: three seeded schemas (``shop``, ``company``, ``library``).

A database is a pure function of its schema and a database seed (:func:`build_tables`), so the
same task always gives the same rows. The module reads top to bottom: the word tables the rows
are drawn from, the column types, one builder per schema, the schema registry.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable
from typing import Any

from llm_gym.envs.sql.database import Table
from llm_gym.errors import InvalidArgumentError

__all__ = [
    "SCHEMAS",
    "SCHEMA_DESCRIPTIONS",
    "build_tables",
    "check_database_spec",
]

# --- word tables ----------------------------------------------------------------------------------

FIRST_NAMES = (
    "Ada", "Bruno", "Carmen", "Dmitri", "Elena", "Farid", "Greta", "Hugo", "Ines", "Jonas",
    "Keiko", "Lars", "Maya", "Nikolai", "Olga", "Pablo", "Quinn", "Rosa", "Samir", "Tove",
    "Umar", "Vera", "Wanda", "Xavier", "Yara", "Zoltan", "Amira", "Bram", "Chloe", "Diego",
    "Esther", "Felix", "Hana", "Ivan", "Julia", "Kofi", "Lena", "Marco", "Nadia", "Oscar",
)  # fmt: skip
LAST_NAMES = (
    "Almeida", "Berg", "Castillo", "Dahl", "Eriksen", "Fischer", "Garcia", "Haas", "Ito", "Jensen",
    "Kowalski", "Lindqvist", "Moreau", "Novak", "Okafor", "Petrov", "Quiroga", "Rossi", "Sato",
    "Tanaka", "Usman", "Varga", "Weber", "Xu", "Yilmaz", "Zamora", "Abbott", "Brandt", "Costa",
    "Duval", "Engel", "Ferrara", "Gray", "Horvat", "Ibarra", "Janssen", "Keller", "Lopez",
    "Meyer", "Nilsen",
)  # fmt: skip
CITIES = (
    "Lisbon", "Oslo", "Porto", "Tallinn", "Ghent", "Bergen", "Leiden", "Malmo", "Turin",
    "Seville", "Dresden", "Cork",
)  # fmt: skip
COUNTRIES = ("Chile", "Norway", "Japan", "Kenya", "Canada", "Italy", "India", "Poland")
YEARS = (2021, 2022, 2023, 2024)
STATUSES = ("shipped", "pending", "cancelled")

PRODUCT_NOUNS = {
    "books": ("Atlas", "Novel", "Cookbook", "Journal", "Almanac"),
    "garden": ("Trowel", "Planter", "Hose", "Rake", "Birdhouse"),
    "kitchen": ("Kettle", "Skillet", "Whisk", "Teapot", "Grater"),
    "toys": ("Puzzle", "Kite", "Robot", "Yo-yo", "Marble Set"),
    "sports": ("Racket", "Helmet", "Jump Rope", "Yoga Mat", "Bottle"),
    "electronics": ("Speaker", "Charger", "Headset", "Lamp", "Keyboard"),
    "music": ("Ukulele", "Metronome", "Harmonica", "Drum Pad", "Tuner"),
    "office": ("Stapler", "Notebook", "Desk Tray", "Pen Set", "Binder"),
}
ADJECTIVES = (
    "Amber", "Bold", "Classic", "Compact", "Deluxe", "Golden", "Handy", "Nordic", "Quiet",
    "Rapid", "Silver", "Sturdy", "Tiny", "Urban", "Vivid", "Wild", "Cosy", "Bright", "Misty",
    "Crimson",
)  # fmt: skip
TITLE_NOUNS = (
    "River", "Lantern", "Orchard", "Harbour", "Winter", "Mirror", "Garden", "Voyage", "Archive",
    "Compass", "Island", "Tower", "Forest", "Letter", "Storm", "Bridge", "Meadow", "Signal",
    "Cellar", "Horizon",
)  # fmt: skip
DEPARTMENTS = (
    "Engineering", "Sales", "Marketing", "Finance", "Support", "Research", "Legal",
    "Operations", "Design", "Logistics",
)  # fmt: skip
TITLES = ("Analyst", "Engineer", "Associate", "Specialist", "Manager")
PROJECT_NAMES = (
    "Aurora", "Beacon", "Cobalt", "Delta", "Ember", "Falcon", "Granite", "Harbor", "Iris",
    "Juniper", "Kite", "Lumen", "Mosaic", "Nimbus", "Orion", "Pioneer",
)  # fmt: skip
GENRES = ("mystery", "fantasy", "history", "poetry", "science", "romance", "travel")


# --- the databases --------------------------------------------------------------------------------

PK = "INTEGER PRIMARY KEY"
TEXT = "TEXT NOT NULL"
INT = "INTEGER NOT NULL"
REAL = "REAL NOT NULL"


def _people(rng: random.Random, n: int) -> list[str]:
    """``n`` distinct "First Last" names."""
    names: list[str] = []
    seen: set[str] = set()
    while len(names) < n:
        name = f"{rng.choice(FIRST_NAMES)} {rng.choice(LAST_NAMES)}"
        if name not in seen:
            seen.add(name)
            names.append(name)
    return names


def _date(rng: random.Random) -> str:
    return f"{rng.choice(YEARS)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"


def _shop_tables(rng: random.Random) -> tuple[Table, ...]:
    cities = rng.sample(CITIES, rng.randint(4, 6))
    n_customers = rng.randint(15, 30)
    customers = tuple(
        (i + 1, name, rng.choice(cities), rng.randint(2015, 2024))
        for i, name in enumerate(_people(rng, n_customers))
    )
    categories = rng.sample(sorted(PRODUCT_NOUNS), rng.randint(4, 6))
    products: list[tuple[Any, ...]] = []
    product_names: set[str] = set()
    n_products = rng.randint(12, 24)
    while len(products) < n_products:
        category = rng.choice(categories)
        name = f"{rng.choice(ADJECTIVES)} {rng.choice(PRODUCT_NOUNS[category])}"
        if name in product_names:
            continue
        product_names.add(name)
        products.append((len(products) + 1, name, category, rng.randint(199, 29_999) / 100))
    orders: list[tuple[Any, ...]] = []
    items: list[tuple[Any, ...]] = []
    for order_id in range(1, rng.randint(40, 90) + 1):
        status = rng.choices(STATUSES, weights=(7, 2, 1))[0]
        orders.append((order_id, rng.randint(1, n_customers), _date(rng), status))
        count = rng.choices((1, 2, 3, 4), weights=(4, 3, 2, 1))[0]
        for product in rng.sample(products, count):
            items.append((order_id, product[0], rng.randint(1, 5)))
    return (
        Table(
            "customers",
            (("customer_id", PK), ("name", TEXT), ("city", TEXT), ("signup_year", INT)),
            customers,
        ),
        Table(
            "products",
            (("product_id", PK), ("name", TEXT), ("category", TEXT), ("price", REAL)),
            tuple(products),
        ),
        Table(
            "orders",
            (
                ("order_id", PK),
                ("customer_id", "INTEGER NOT NULL REFERENCES customers(customer_id)"),
                ("order_date", "TEXT NOT NULL  -- YYYY-MM-DD"),
                ("status", "TEXT NOT NULL  -- shipped, pending or cancelled"),
            ),
            tuple(orders),
        ),
        Table(
            "order_items",
            (
                ("order_id", "INTEGER NOT NULL REFERENCES orders(order_id)"),
                ("product_id", "INTEGER NOT NULL REFERENCES products(product_id)"),
                ("quantity", INT),
            ),
            tuple(items),
        ),
    )


def _company_tables(rng: random.Random) -> tuple[Table, ...]:
    names = rng.sample(DEPARTMENTS, rng.randint(4, 6))
    cities = rng.sample(CITIES, 3)
    departments = tuple(
        (i + 1, name, rng.choice(cities), rng.randint(200, 2000) * 1000)
        for i, name in enumerate(names)
    )
    people = _people(rng, rng.randint(25, 50))
    employees: list[tuple[Any, ...]] = []
    bosses: dict[int, list[int]] = {d[0]: [] for d in departments}
    for i, name in enumerate(people):
        employee_id = i + 1
        if i < len(departments):  # one director heads each department
            department_id, title, manager = departments[i][0], "Director", None
            salary = rng.randint(220, 360) * 500
        else:
            department_id = rng.choice(departments)[0]
            title = rng.choice(TITLES)
            manager = rng.choice(bosses[department_id])
            salary = rng.randint(80, 240) * 500
        if title in ("Director", "Manager"):
            bosses[department_id].append(employee_id)
        employees.append(
            (employee_id, name, department_id, title, salary, rng.randint(2005, 2024), manager)
        )
    projects = tuple(
        (i + 1, name, rng.choice(departments)[0], rng.randint(2018, 2024))
        for i, name in enumerate(rng.sample(PROJECT_NAMES, rng.randint(6, 12)))
    )
    assignments = tuple(
        (employee[0], project[0], rng.randint(5, 160))
        for employee in employees
        for project in rng.sample(projects, rng.choice((0, 1, 1, 2, 2, 3)))
    )
    return (
        Table(
            "departments",
            (("department_id", PK), ("name", TEXT), ("city", TEXT), ("budget", INT)),
            departments,
        ),
        Table(
            "employees",
            (
                ("employee_id", PK),
                ("name", TEXT),
                ("department_id", "INTEGER NOT NULL REFERENCES departments(department_id)"),
                ("title", TEXT),
                ("salary", INT),
                ("hire_year", INT),
                ("manager_id", "INTEGER REFERENCES employees(employee_id)  -- NULL: no manager"),
            ),
            tuple(employees),
        ),
        Table(
            "projects",
            (
                ("project_id", PK),
                ("name", TEXT),
                ("department_id", "INTEGER NOT NULL REFERENCES departments(department_id)"),
                ("start_year", INT),
            ),
            projects,
        ),
        Table(
            "assignments",
            (
                ("employee_id", "INTEGER NOT NULL REFERENCES employees(employee_id)"),
                ("project_id", "INTEGER NOT NULL REFERENCES projects(project_id)"),
                ("hours", INT),
            ),
            assignments,
        ),
    )


def _library_tables(rng: random.Random) -> tuple[Table, ...]:
    countries = rng.sample(COUNTRIES, rng.randint(4, 6))
    n_authors, n_members = rng.randint(8, 14), rng.randint(15, 30)
    people = _people(rng, n_authors + n_members)
    authors = tuple(
        (i + 1, name, rng.choice(countries), rng.randint(1900, 1990))
        for i, name in enumerate(people[:n_authors])
    )
    genres = rng.sample(GENRES, rng.randint(4, 6))
    titles = [f"The {a} {n}" for a in ADJECTIVES for n in TITLE_NOUNS]
    books = []
    for i, title in enumerate(rng.sample(titles, rng.randint(25, 45))):
        author = rng.choice(authors)
        year = rng.randint(max(1950, author[3] + 20), 2023)
        books.append((i + 1, title, author[0], rng.choice(genres), year, rng.randint(90, 900)))
    cities = rng.sample(CITIES, rng.randint(4, 6))
    members = tuple(
        (i + 1, name, rng.choice(cities), rng.randint(2010, 2024))
        for i, name in enumerate(people[n_authors:])
    )
    loans = tuple(
        (
            i + 1,
            rng.randint(1, len(books)),
            rng.randint(1, n_members),
            _date(rng),
            rng.randint(1, 60),
        )
        for i in range(rng.randint(50, 110))
    )
    return (
        Table(
            "authors",
            (("author_id", PK), ("name", TEXT), ("country", TEXT), ("birth_year", INT)),
            authors,
        ),
        Table(
            "books",
            (
                ("book_id", PK),
                ("title", TEXT),
                ("author_id", "INTEGER NOT NULL REFERENCES authors(author_id)"),
                ("genre", TEXT),
                ("published_year", INT),
                ("pages", INT),
            ),
            tuple(books),
        ),
        Table(
            "members",
            (("member_id", PK), ("name", TEXT), ("city", TEXT), ("joined_year", INT)),
            members,
        ),
        Table(
            "loans",
            (
                ("loan_id", PK),
                ("book_id", "INTEGER NOT NULL REFERENCES books(book_id)"),
                ("member_id", "INTEGER NOT NULL REFERENCES members(member_id)"),
                ("loan_date", "TEXT NOT NULL  -- YYYY-MM-DD"),
                ("days_kept", INT),
            ),
            loans,
        ),
    )


_BUILDERS: dict[str, Callable[[random.Random], tuple[Table, ...]]] = {
    "shop": _shop_tables,
    "company": _company_tables,
    "library": _library_tables,
}
SCHEMAS: tuple[str, ...] = tuple(_BUILDERS)
"""The database schemas, by name."""
SCHEMA_DESCRIPTIONS = {
    "shop": "an online shop (customers, products, orders, order_items)",
    "company": "a company (departments, employees, projects, assignments)",
    "library": "a lending library (authors, books, members, loans)",
}


def check_database_spec(schema: Any, db_seed: Any) -> None:
    """Raise :class:`InvalidArgumentError` unless ``(schema, db_seed)`` names a database."""
    if schema not in _BUILDERS:
        raise InvalidArgumentError(
            f"An SQL-v0 task needs metadata['schema'] in {list(SCHEMAS)}, actual value: {schema!r}."
        )
    if not isinstance(db_seed, int) or isinstance(db_seed, bool) or db_seed < 0:
        raise InvalidArgumentError(
            f"An SQL-v0 task needs metadata['db_seed'] as an int >= 0, actual value: {db_seed!r}."
        )


@functools.lru_cache(maxsize=64)
def build_tables(schema: str, db_seed: int) -> tuple[Table, ...]:
    """The tables (with rows) of database ``db_seed`` of ``schema``; a pure function."""
    check_database_spec(schema, db_seed)
    return _BUILDERS[schema](random.Random(f"sql-v0/{schema}/{db_seed}"))
