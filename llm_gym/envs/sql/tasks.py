"""SQL-v0 tasks: three seeded database schemas and questions answered by reference SQL.

A task names a schema (``shop``, ``company`` or ``library``) and a database seed; the database is a
pure function of the two (:func:`build_tables`), so the same task always gives the same rows.
Each question comes from a template that picks its parameters from the rows (a city that exists, a
department with employees, ...), writes a reference query, and runs it on the task's database: the
result is the target. Questions whose answer would be ambiguous (a tie for "which ... the most")
or empty are drawn again.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from llm_gym.core.task import Task, pick_split
from llm_gym.envs.sql.database import ReadOnlyDatabase, Table
from llm_gym.errors import InvalidArgumentError

__all__ = [
    "EXACT_TOLERANCE",
    "QUESTION_ATTEMPTS",
    "ROUNDED_TOLERANCE",
    "SCHEMAS",
    "SCHEMA_DESCRIPTIONS",
    "SPLIT_SIZES",
    "TASK_SEED",
    "Question",
    "build_tables",
    "check_database_spec",
    "generate_tasks",
    "get_tasks",
    "prompt_of",
]

# --- constants -----------------------------------------------------------------------------------

SPLIT_SIZES = {"train": 1000, "val": 200, "test": 200}
"""Tasks per split. Every task has its own database seed, so no database (and no prompt) is in two
splits."""
TASK_SEED = 20260505
"""Seed of the task universe: the same seed always gives the same tasks in the same splits."""
MAX_DB_SEED = 10**6
"""Database seeds are drawn from ``range(MAX_DB_SEED)``."""
ROUNDED_TOLERANCE = 0.01 * (1 + 1e-9)
"""Absolute tolerance of answers asked "rounded to 2 decimal places": one unit in the last place,
so either rounding of a half-way value (and the unrounded value) counts."""
QUESTION_ATTEMPTS = 20
"""Questions drawn per database before its seed is skipped (ties and empty answers are redrawn)."""
EXACT_TOLERANCE = 1e-6
"""Absolute tolerance of every other numeric answer (counts and integer sums must be exact)."""

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


# --- the question templates -----------------------------------------------------------------------

Rows = Mapping[str, list[dict[str, Any]]]
"""A database's rows by table, each row a ``{column: value}`` dict (for picking parameters)."""


@dataclass(frozen=True)
class Question:
    """A question with the reference SQL that answers it."""

    text: str
    """The question as the model reads it."""
    sql: str
    """The reference query; its first cell is the answer."""
    type: str
    """The question's type (``count``, ``sum``, ``average``, ``top``, ``group_by``, ...)."""
    rounded: bool = False
    """Whether the question asks for 2 decimal places (and the SQL rounds with ``ROUND(x, 2)``)."""
    ranked: bool = False
    """Whether the SQL ranks ``(name, value)`` rows best first (``LIMIT 1`` is added after the
    tie check)."""


def _q(value: str) -> str:
    """An SQL string literal."""
    return "'" + value.replace("'", "''") + "'"


def _pick(rng: random.Random, values: Sequence[Any]) -> Any:
    return rng.choice(sorted(set(values)))


def _shop_questions(rng: random.Random, d: Rows) -> Question:
    city = _pick(rng, [c["city"] for c in d["customers"]])
    category = _pick(rng, [p["category"] for p in d["products"]])
    year = _pick(rng, [o["order_date"][:4] for o in d["orders"]])
    status = _pick(rng, [o["status"] for o in d["orders"]])
    sales = (
        "FROM orders o JOIN order_items oi ON oi.order_id = o.order_id "
        "JOIN products p ON p.product_id = oi.product_id"
    )
    options = [
        Question(
            f"How many customers live in {city}?",
            f"SELECT COUNT(*) FROM customers WHERE city = {_q(city)}",
            "count",
        ),
        Question(
            f"How many {status} orders were placed in {year}?",
            f"SELECT COUNT(*) FROM orders WHERE status = {_q(status)} "
            f"AND substr(order_date, 1, 4) = {_q(year)}",
            "count",
        ),
        Question(
            f"How many orders were placed by customers who live in {city}?",
            "SELECT COUNT(*) FROM orders o JOIN customers c ON c.customer_id = o.customer_id "
            f"WHERE c.city = {_q(city)}",
            "join_count",
        ),
        Question(
            f"How many units of {category} products were ordered in total (the sum of the "
            "quantities over all order items, whatever the order's status)?",
            "SELECT SUM(oi.quantity) FROM order_items oi JOIN products p "
            f"ON p.product_id = oi.product_id WHERE p.category = {_q(category)}",
            "sum",
        ),
        Question(
            f"What is the total revenue (price times quantity) of the shipped orders placed in "
            f"{year}, rounded to 2 decimal places?",
            f"SELECT ROUND(SUM(p.price * oi.quantity), 2) {sales} "
            f"WHERE o.status = 'shipped' AND substr(o.order_date, 1, 4) = {_q(year)}",
            "sum",
            rounded=True,
        ),
        Question(
            f"What is the average price of the {category} products, rounded to 2 decimal places?",
            f"SELECT ROUND(AVG(price), 2) FROM products WHERE category = {_q(category)}",
            "average",
            rounded=True,
        ),
        Question(
            "Which customer placed the most orders? Reply with the customer's name.",
            "SELECT c.name, COUNT(*) AS orders FROM customers c JOIN orders o "
            "ON o.customer_id = c.customer_id GROUP BY c.customer_id ORDER BY orders DESC",
            "top",
            ranked=True,
        ),
        Question(
            "Which product sold the most units in orders that were not cancelled? Reply with "
            "the product's name.",
            f"SELECT p.name, SUM(oi.quantity) AS units {sales} WHERE o.status != 'cancelled' "
            "GROUP BY p.product_id ORDER BY units DESC",
            "top",
            ranked=True,
        ),
        Question(
            "The customers of which city spent the most in total (price times quantity, over "
            "all orders)? Reply with the city.",
            f"SELECT c.city, SUM(p.price * oi.quantity) AS spent {sales} "
            "JOIN customers c ON c.customer_id = o.customer_id GROUP BY c.city "
            "ORDER BY spent DESC",
            "group_by",
            ranked=True,
        ),
        Question(
            f"How many different customers have ordered at least one {category} product?",
            f"SELECT COUNT(DISTINCT o.customer_id) {sales} WHERE p.category = {_q(category)}",
            "count_distinct",
        ),
        Question(
            f"What is the price of the most expensive {category} product?",
            f"SELECT MAX(price) FROM products WHERE category = {_q(category)}",
            "max",
        ),
        Question(
            "How many customers have never placed an order?",
            "SELECT COUNT(*) FROM customers WHERE customer_id NOT IN "
            "(SELECT customer_id FROM orders)",
            "anti_join",
        ),
        Question(
            "On average, how many units does an order contain (the sum of its quantities, "
            "averaged over all orders), rounded to 2 decimal places?",
            "SELECT ROUND(AVG(units), 2) FROM "
            "(SELECT SUM(quantity) AS units FROM order_items GROUP BY order_id)",
            "average",
            rounded=True,
        ),
    ]
    return rng.choice(options)


def _company_questions(rng: random.Random, d: Rows) -> Question:
    department = rng.choice(d["departments"])
    dept = department["name"]
    in_dept = (
        "FROM employees e JOIN departments d ON d.department_id = e.department_id "
        f"WHERE d.name = {_q(dept)}"
    )
    year = rng.randint(2010, 2020)
    project = rng.choice(d["projects"])["name"]
    city = _pick(rng, [x["city"] for x in d["departments"]])
    title = _pick(rng, [e["title"] for e in d["employees"]])
    managers = sorted({e["manager_id"] for e in d["employees"] if e["manager_id"] is not None})
    manager = d["employees"][rng.choice(managers) - 1]["name"]
    options = [
        Question(
            f"How many employees work in the {dept} department?",
            f"SELECT COUNT(*) {in_dept}",
            "join_count",
        ),
        Question(
            f"What is the average salary in the {dept} department, rounded to 2 decimal places?",
            f"SELECT ROUND(AVG(e.salary), 2) {in_dept}",
            "average",
            rounded=True,
        ),
        Question(
            f"How many employees were hired after {year} (not counting {year} itself)?",
            f"SELECT COUNT(*) FROM employees WHERE hire_year > {year}",
            "count",
        ),
        Question(
            "Which department has the largest total salary of its employees? Reply with the "
            "department's name.",
            "SELECT d.name, SUM(e.salary) AS payroll FROM employees e JOIN departments d "
            "ON d.department_id = e.department_id GROUP BY d.department_id ORDER BY payroll DESC",
            "group_by",
            ranked=True,
        ),
        Question(
            f"How many hours in total are assigned to the project {project}?",
            "SELECT SUM(a.hours) FROM assignments a JOIN projects p "
            f"ON p.project_id = a.project_id WHERE p.name = {_q(project)}",
            "sum",
        ),
        Question(
            "Which employee has the most assigned hours over all projects? Reply with the "
            "employee's name.",
            "SELECT e.name, SUM(a.hours) AS total FROM employees e JOIN assignments a "
            "ON a.employee_id = e.employee_id GROUP BY e.employee_id ORDER BY total DESC",
            "top",
            ranked=True,
        ),
        Question(
            f"Who is the highest-paid employee of the {dept} department? Reply with the "
            "employee's name.",
            f"SELECT e.name, e.salary {in_dept} ORDER BY e.salary DESC",
            "top",
            ranked=True,
        ),
        Question(
            "How many employees earn more than the average salary of all employees?",
            "SELECT COUNT(*) FROM employees WHERE salary > (SELECT AVG(salary) FROM employees)",
            "subquery",
        ),
        Question(
            "How many employees are not assigned to any project?",
            "SELECT COUNT(*) FROM employees WHERE employee_id NOT IN "
            "(SELECT employee_id FROM assignments)",
            "anti_join",
        ),
        Question(
            f"How many employees report directly to {manager}?",
            "SELECT COUNT(*) FROM employees e JOIN employees m ON e.manager_id = m.employee_id "
            f"WHERE m.name = {_q(manager)}",
            "self_join",
        ),
        Question(
            f"How many projects belong to departments located in {city}?",
            "SELECT COUNT(*) FROM projects p JOIN departments d "
            f"ON d.department_id = p.department_id WHERE d.city = {_q(city)}",
            "join_count",
        ),
        Question(
            f"What is the total salary of the employees whose title is {title}?",
            f"SELECT SUM(salary) FROM employees WHERE title = {_q(title)}",
            "sum",
        ),
    ]
    return rng.choice(options)


def _library_questions(rng: random.Random, d: Rows) -> Question:
    genre = _pick(rng, [b["genre"] for b in d["books"]])
    country = _pick(rng, [a["country"] for a in d["authors"]])
    year = _pick(rng, [x["loan_date"][:4] for x in d["loans"]])
    author = _pick(rng, [d["authors"][b["author_id"] - 1]["name"] for b in d["books"]])
    city = _pick(rng, [m["city"] for m in d["members"]])
    loaned_books = "FROM loans l JOIN books b ON b.book_id = l.book_id"
    options = [
        Question(
            f"How many {genre} books does the library have?",
            f"SELECT COUNT(*) FROM books WHERE genre = {_q(genre)}",
            "count",
        ),
        Question(
            f"What is the average number of pages of the books written by authors from "
            f"{country}, rounded to 2 decimal places?",
            "SELECT ROUND(AVG(b.pages), 2) FROM books b JOIN authors a "
            f"ON a.author_id = b.author_id WHERE a.country = {_q(country)}",
            "average",
            rounded=True,
        ),
        Question(
            "Which author has written the most books in the library? Reply with the author's name.",
            "SELECT a.name, COUNT(*) AS books FROM authors a JOIN books b "
            "ON b.author_id = a.author_id GROUP BY a.author_id ORDER BY books DESC",
            "top",
            ranked=True,
        ),
        Question(
            "Which book has been borrowed the most times? Reply with its title.",
            f"SELECT b.title, COUNT(*) AS times {loaned_books} GROUP BY b.book_id "
            "ORDER BY times DESC",
            "top",
            ranked=True,
        ),
        Question(
            f"Which member borrowed the most books in {year}? Reply with the member's name.",
            "SELECT m.name, COUNT(*) AS borrowed FROM loans l JOIN members m "
            f"ON m.member_id = l.member_id WHERE substr(l.loan_date, 1, 4) = {_q(year)} "
            "GROUP BY m.member_id ORDER BY borrowed DESC",
            "top",
            ranked=True,
        ),
        Question(
            f"Summed over all loans, for how many days in total were {genre} books kept?",
            f"SELECT SUM(l.days_kept) {loaned_books} WHERE b.genre = {_q(genre)}",
            "sum",
        ),
        Question(
            f"How many loans were made in {year}?",
            f"SELECT COUNT(*) FROM loans WHERE substr(loan_date, 1, 4) = {_q(year)}",
            "count",
        ),
        Question(
            "How many books have never been borrowed?",
            "SELECT COUNT(*) FROM books WHERE book_id NOT IN (SELECT book_id FROM loans)",
            "anti_join",
        ),
        Question(
            "Which genre has the most loans? Reply with the genre.",
            f"SELECT b.genre, COUNT(*) AS n {loaned_books} GROUP BY b.genre ORDER BY n DESC",
            "group_by",
            ranked=True,
        ),
        Question(
            f"How many different members have borrowed at least one book by {author}?",
            f"SELECT COUNT(DISTINCT l.member_id) {loaned_books} JOIN authors a "
            f"ON a.author_id = b.author_id WHERE a.name = {_q(author)}",
            "count_distinct",
        ),
        Question(
            f"On average, for how many days did members living in {city} keep a borrowed book? "
            "Round to 2 decimal places.",
            "SELECT ROUND(AVG(l.days_kept), 2) FROM loans l JOIN members m "
            f"ON m.member_id = l.member_id WHERE m.city = {_q(city)}",
            "average",
            rounded=True,
        ),
        Question(
            f"In which year was the oldest book by an author from {country} published?",
            "SELECT MIN(b.published_year) FROM books b JOIN authors a "
            f"ON a.author_id = b.author_id WHERE a.country = {_q(country)}",
            "min",
        ),
    ]
    return rng.choice(options)


_QUESTIONS: dict[str, Callable[[random.Random, Rows], Question]] = {
    "shop": _shop_questions,
    "company": _company_questions,
    "library": _library_questions,
}


# --- the seeded task generator -------------------------------------------------------------------


def _rows(tables: Sequence[Table]) -> Rows:
    return {
        t.name: [dict(zip((c for c, _ in t.columns), row, strict=True)) for row in t.rows]
        for t in tables
    }


def _answer(db: ReadOnlyDatabase, question: Question) -> Any | None:
    """The target of ``question`` on ``db``, or None when it is empty or ambiguous."""
    _columns, rows, _cut = db.execute(question.sql, max_rows=1_000)
    if not rows or rows[0][0] is None:
        return None
    if question.ranked and len(rows) > 1 and rows[0][1] == rows[1][1]:
        return None  # a tie: "which ... the most" would have two answers
    return rows[0][0]


def prompt_of(question: str, schema: str, db_seed: int) -> str:
    """The user message of a task: the question and which database it is about."""
    return f"{question}\n(Database: {SCHEMA_DESCRIPTIONS[schema]}, instance #{db_seed}.)"


def _one_task(rng: random.Random, db_seed: int) -> Task | None:
    schema = rng.choice(SCHEMAS)
    tables = build_tables(schema, db_seed)
    rows = _rows(tables)
    db = ReadOnlyDatabase(tables)
    try:
        for _ in range(QUESTION_ATTEMPTS):
            question = _QUESTIONS[schema](rng, rows)
            target = _answer(db, question)
            if target is not None:
                break
        else:
            return None
    finally:
        db.close()
    sql = f"{question.sql} LIMIT 1" if question.ranked else question.sql
    metadata = {
        "schema": schema,
        "db_seed": db_seed,
        "type": question.type,
        "sql": sql,
        "rounded": question.rounded,
        "tolerance": ROUNDED_TOLERANCE if question.rounded else EXACT_TOLERANCE,
    }
    return Task(prompt_of(question.text, schema, db_seed), target, metadata)


def generate_tasks(seed: int, n: int) -> list[Task]:
    """``n`` tasks drawn from a ``random.Random(seed)``, each with its own database seed.

    A pure function of its arguments: the same seed always gives the same list. No two tasks
    share a database seed (so no two share a prompt).
    """
    if not isinstance(n, int) or n < 0 or n > MAX_DB_SEED // 10:
        raise InvalidArgumentError(
            f"n must be an int in [0, {MAX_DB_SEED // 10}], actual value: {n!r}."
        )
    rng = random.Random(seed)
    used: set[int] = set()
    tasks: list[Task] = []
    while len(tasks) < n:
        db_seed = rng.randrange(MAX_DB_SEED)
        if db_seed in used:
            continue
        used.add(db_seed)
        task = _one_task(rng, db_seed)
        if task is not None:
            tasks.append(task)
    return tasks


@functools.cache
def _splits() -> dict[str, tuple[Task, ...]]:
    universe = generate_tasks(TASK_SEED, sum(SPLIT_SIZES.values()))
    splits: dict[str, tuple[Task, ...]] = {}
    start = 0
    for split, size in SPLIT_SIZES.items():
        chunk = universe[start : start + size]
        splits[split] = tuple(
            Task(t.prompt, t.target, t.metadata, id=f"sql/{split}/{i:04d}")
            for i, t in enumerate(chunk)
        )
        start += size
    return splits


def get_tasks(split: str = "train") -> tuple[Task, ...]:
    """The tasks of ``split`` (``"train"``, ``"val"`` or ``"test"``)."""
    return pick_split(_splits(), split)
