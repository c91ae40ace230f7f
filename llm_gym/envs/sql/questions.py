"""The question templates of SQL-v0: per schema, questions with the reference SQL that answers them.

Each template picks its parameters from the database's rows (a city that exists, a department
with employees, ...) and writes the reference query; the task generator
(:mod:`llm_gym.envs.sql.tasks`) runs it to get the target.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["QUESTION_TEMPLATES", "Question", "Rows"]

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


QUESTION_TEMPLATES: dict[str, Callable[[random.Random, Rows], Question]] = {
    "shop": _shop_questions,
    "company": _company_questions,
    "library": _library_questions,
}
"""The question template of each schema: ``(rng, rows) -> Question``."""
