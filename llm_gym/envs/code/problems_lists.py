"""Problem templates about lists and matrices."""

from __future__ import annotations

import random

from llm_gym.envs.code.problem import Problem, int_list, make_problem

__all__ = ["TEMPLATES"]


def rotate(rng: random.Random) -> Problem:
    direction = rng.choice(["right", "left"])
    shift = "-k % n" if direction == "right" else "k % n"
    example = "[4, 1, 2, 3]" if direction == "right" else "[2, 3, 4, 1]"
    return make_problem(
        rng,
        template="rotate",
        signature=f"rotate_{direction}(xs: list[int], k: int) -> list[int]",
        description=(
            f"returns xs rotated {direction} by k positions (rotating [1, 2, 3, 4] by 1 gives "
            f"{example}); k >= 0 may exceed len(xs); an empty list stays empty"
        ),
        reference=f"""
        def rotate_{direction}(xs, k):
            n = len(xs)
            if n == 0:
                return []
            k = {shift}
            return xs[k:] + xs[:k]
        """,
        draw=lambda r: (int_list(r, -9, 9, 1, 8), r.randint(0, 12)),
        edges=[([], 3), ([1, 2, 3], 0), ([1, 2, 3], 3)],
        params={"direction": direction},
    )


def second_extreme(rng: random.Random) -> Problem:
    which = rng.choice(["largest", "smallest"])
    fallback = rng.choice([None, -1, 0])
    pick = "values[-2]" if which == "largest" else "values[1]"
    return make_problem(
        rng,
        template="second_extreme",
        signature=f"second_{which}(xs: list[int]) -> int | None",
        description=(
            f"returns the second {which} distinct value in xs, or {fallback!r} when xs has "
            "fewer than two distinct values"
        ),
        reference=f"""
        def second_{which}(xs):
            values = sorted(set(xs))
            if len(values) < 2:
                return {fallback!r}
            return {pick}
        """,
        draw=lambda r: (int_list(r, -20, 20, 1, 9),),
        edges=[([],), ([5, 5, 5],), ([1, 2],)],
        params={"which": which, "fallback": fallback},
    )


def _nested(rng: random.Random, depth: int) -> list:
    out: list = []
    for _ in range(rng.randint(0, 4)):
        if depth > 0 and rng.random() < 0.4:
            out.append(_nested(rng, depth - 1))
        else:
            out.append(rng.randint(0, 9))
    return out


def flatten(rng: random.Random) -> Problem:
    levels = rng.choice([None, 1, 2])
    if levels is None:
        description = "returns the integers of the nested list xs in order, at any depth"
        reference = """
        def flatten(xs):
            out = []
            for x in xs:
                if isinstance(x, list):
                    out.extend(flatten(x))
                else:
                    out.append(x)
            return out
        """
        signature = "flatten(xs: list) -> list[int]"
    else:
        description = (
            f"returns xs with {levels} level{'s' if levels > 1 else ''} of list nesting "
            "removed: each element that is a list is replaced by its elements, "
            f"{'repeating this once more on the result' if levels == 2 else 'once'}"
        )
        reference = f"""
        def flatten_levels(xs):
            for _ in range({levels}):
                out = []
                for x in xs:
                    if isinstance(x, list):
                        out.extend(x)
                    else:
                        out.append(x)
                xs = out
            return xs
        """
        signature = "flatten_levels(xs: list) -> list"
    return make_problem(
        rng,
        template="flatten",
        signature=signature,
        description=description,
        reference=reference,
        draw=lambda r: (_nested(r, 3),),
        edges=[([],), ([[[]]],), ([1, [2, [3, [4]]]],)],
        params={"levels": levels},
    )


def chunk(rng: random.Random) -> Problem:
    keep_short = rng.random() < 0.5
    rule = "the last chunk may be shorter" if keep_short else "a shorter last chunk is dropped"
    limit = "len(xs)" if keep_short else "len(xs) - k + 1"
    return make_problem(
        rng,
        template="chunk",
        signature="chunk(xs: list[int], k: int) -> list[list[int]]",
        description=f"returns xs split into consecutive chunks of k elements (k >= 1); {rule}",
        reference=f"""
        def chunk(xs, k):
            return [xs[i:i + k] for i in range(0, {limit}, k)]
        """,
        draw=lambda r: (int_list(r, 0, 9, 0, 10), r.randint(1, 4)),
        edges=[([], 2), ([1, 2, 3], 5), ([1, 2, 3, 4], 2)],
        params={"keep_short": keep_short},
    )


def windows(rng: random.Random) -> Problem:
    width = rng.randint(2, 5)
    kind = rng.choice(["sum", "max", "min"])
    return make_problem(
        rng,
        template="windows",
        signature=f"window_{kind}(xs: list[int]) -> list[int]",
        description=(
            f"returns the {kind} of every window of {width} consecutive elements of xs, in "
            f"order (an empty list when xs has fewer than {width} elements)"
        ),
        reference=f"""
        def window_{kind}(xs):
            return [{kind}(xs[i:i + {width}]) for i in range(len(xs) - {width} + 1)]
        """,
        draw=lambda r: (int_list(r, -9, 9, 0, 10),),
        edges=[([],), (list(range(width - 1)),), (list(range(width)),)],
        params={"width": width, "kind": kind},
    )


def max_subarray(rng: random.Random) -> Problem:
    allow_empty = rng.random() < 0.5
    rule = (
        "the empty subarray (sum 0) is allowed, so the answer is at least 0; xs may be empty"
        if allow_empty
        else "the subarray must be non-empty; xs is non-empty"
    )
    start = "0" if allow_empty else "xs[0]"
    return make_problem(
        rng,
        template="max_subarray",
        signature="max_subarray(xs: list[int]) -> int",
        description=f"returns the largest sum of a contiguous subarray of xs; {rule}",
        reference=f"""
        def max_subarray(xs):
            best = {start}
            current = 0
            for x in xs:
                current = max(x, current + x)
                best = max(best, current)
            return best
        """,
        draw=lambda r: (int_list(r, -10, 10, 1, 10),),
        edges=([([],)] if allow_empty else []) + [([-3],), ([-2, -1, -5],)],
        params={"allow_empty": allow_empty},
    )


def dedupe(rng: random.Random) -> Problem:
    keep = rng.choice(["first", "last"])
    reference = (
        """
        def dedupe(xs):
            seen = set()
            out = []
            for x in xs:
                if x not in seen:
                    seen.add(x)
                    out.append(x)
            return out
        """
        if keep == "first"
        else """
        def dedupe(xs):
            seen = set()
            out = []
            for x in reversed(xs):
                if x not in seen:
                    seen.add(x)
                    out.append(x)
            return out[::-1]
        """
    )
    return make_problem(
        rng,
        template="dedupe",
        signature="dedupe(xs: list[int]) -> list[int]",
        description=f"returns xs without duplicates, keeping the {keep} occurrence of each value "
        "and the relative order of the kept elements",
        reference=reference,
        draw=lambda r: (int_list(r, 0, 5, 0, 10),),
        edges=[([],), ([1, 2, 1],)],
        params={"keep": keep},
    )


def count_pairs(rng: random.Random) -> Problem:
    kind = rng.choice(["sum", "difference"])
    test = "xs[i] + xs[j] == target" if kind == "sum" else "abs(xs[i] - xs[j]) == target"
    return make_problem(
        rng,
        template="count_pairs",
        signature=f"count_{kind}_pairs(xs: list[int], target: int) -> int",
        description=f"returns the number of index pairs i < j with {test}",
        reference=f"""
        def count_{kind}_pairs(xs, target):
            return sum(
                1
                for i in range(len(xs))
                for j in range(i + 1, len(xs))
                if {test}
            )
        """,
        draw=lambda r: (int_list(r, -5, 5, 0, 10), r.randint(0, 6)),
        edges=[([], 0), ([1, 1, 1], 0)],
        params={"kind": kind},
    )


def matrix(rng: random.Random) -> Problem:
    kind = rng.choice(["transpose", "rotate_clockwise", "rotate_counterclockwise", "spiral"])
    descriptions = {
        "transpose": "returns the transpose of the matrix m (a list of equal-length rows)",
        "rotate_clockwise": "returns the matrix m (a list of equal-length rows) rotated 90 "
        "degrees clockwise",
        "rotate_counterclockwise": "returns the matrix m (a list of equal-length rows) rotated "
        "90 degrees counterclockwise",
        "spiral": "returns the elements of the matrix m (a list of equal-length rows) in "
        "clockwise spiral order, starting at the top-left corner",
    }
    bodies = {
        "transpose": "return [list(col) for col in zip(*m)]",
        "rotate_clockwise": "return [list(row) for row in zip(*m[::-1])]",
        "rotate_counterclockwise": "return [list(row) for row in zip(*m)][::-1]",
        "spiral": (
            "out = []\n"
            "            m = [list(row) for row in m]\n"
            "            while m:\n"
            "                out += m.pop(0)\n"
            "                m = [list(row) for row in zip(*m)][::-1]\n"
            "            return out"
        ),
    }
    returns = "list[int]" if kind == "spiral" else "list[list[int]]"

    def draw(r: random.Random) -> tuple[list[list[int]]]:
        rows, cols = r.randint(1, 4), r.randint(1, 4)
        return ([[r.randint(0, 9) for _ in range(cols)] for _ in range(rows)],)

    return make_problem(
        rng,
        template="matrix",
        signature=f"{kind}(m: list[list[int]]) -> {returns}",
        description=descriptions[kind],
        reference=f"""
        def {kind}(m):
            {bodies[kind]}
        """,
        draw=draw,
        edges=[([[1]],), ([[1, 2, 3]],)],
        params={"kind": kind},
    )


def interleave(rng: random.Random) -> Problem:
    first = rng.choice(["a", "b"])
    order = "(a, b)" if first == "a" else "(b, a)"
    return make_problem(
        rng,
        template="interleave",
        signature="interleave(a: list[int], b: list[int]) -> list[int]",
        description=(
            f"returns the elements of a and b alternately, starting with {first}[0]; when one "
            "list runs out, the rest of the other follows"
        ),
        reference=f"""
        def interleave(a, b):
            first, second = {order}
            out = []
            for i in range(max(len(first), len(second))):
                if i < len(first):
                    out.append(first[i])
                if i < len(second):
                    out.append(second[i])
            return out
        """,
        draw=lambda r: (int_list(r, 0, 9, 0, 5), int_list(r, 10, 19, 0, 5)),
        edges=[([], []), ([1], []), ([], [2, 3])],
        params={"first": first},
    )


def inversions(rng: random.Random) -> Problem:
    kind = rng.choice(["inversions", "ascending_pairs"])
    test = "xs[i] > xs[j]" if kind == "inversions" else "xs[i] < xs[j]"
    return make_problem(
        rng,
        template="inversions",
        signature=f"count_{kind}(xs: list[int]) -> int",
        description=f"returns the number of index pairs i < j with {test}",
        reference=f"""
        def count_{kind}(xs):
            return sum(1 for i in range(len(xs)) for j in range(i + 1, len(xs)) if {test})
        """,
        draw=lambda r: (int_list(r, 0, 9, 0, 12),),
        edges=[([],), ([2, 2, 2],)],
        params={"kind": kind},
    )


def longest_run(rng: random.Random) -> Problem:
    kind = rng.choice(["equal", "increasing", "decreasing"])
    test = {"equal": "xs[i] == xs[i - 1]", "increasing": "xs[i] > xs[i - 1]"}.get(
        kind, "xs[i] < xs[i - 1]"
    )
    what = {
        "equal": "consecutive equal elements",
        "increasing": "consecutive strictly increasing elements",
        "decreasing": "consecutive strictly decreasing elements",
    }[kind]
    return make_problem(
        rng,
        template="longest_run",
        signature=f"longest_{kind}_run(xs: list[int]) -> int",
        description=f"returns the length of the longest run of {what} in xs (0 for an empty "
        "list, 1 for a single element)",
        reference=f"""
        def longest_{kind}_run(xs):
            if not xs:
                return 0
            best = run = 1
            for i in range(1, len(xs)):
                run = run + 1 if {test} else 1
                best = max(best, run)
            return best
        """,
        draw=lambda r: (int_list(r, 0, 4, 0, 12),),
        edges=[([],), ([7],)],
        params={"kind": kind},
    )


def partition(rng: random.Random) -> Problem:
    modulus = rng.randint(2, 5)
    remainder = rng.randrange(modulus)
    return make_problem(
        rng,
        template="partition",
        signature="partition(xs: list[int]) -> list[int]",
        description=(
            f"returns the elements x of xs with x % {modulus} == {remainder} first, then all "
            "the others, each group keeping its original order"
        ),
        reference=f"""
        def partition(xs):
            return [x for x in xs if x % {modulus} == {remainder}] + [
                x for x in xs if x % {modulus} != {remainder}
            ]
        """,
        draw=lambda r: (int_list(r, -10, 20, 0, 10),),
        edges=[([],)],
        params={"modulus": modulus, "remainder": remainder},
    )


def kth(rng: random.Random) -> Problem:
    which = rng.choice(["smallest", "largest"])
    pick = "sorted(xs)[k - 1]" if which == "smallest" else "sorted(xs, reverse=True)[k - 1]"

    def draw(r: random.Random) -> tuple[list[int], int]:
        xs = int_list(r, -20, 20, 1, 9)
        return (xs, r.randint(1, len(xs)))

    return make_problem(
        rng,
        template="kth",
        signature=f"kth_{which}(xs: list[int], k: int) -> int",
        description=f"returns the k-th {which} element of xs counting duplicates (k = 1 is the "
        f"{which}; 1 <= k <= len(xs))",
        reference=f"""
        def kth_{which}(xs, k):
            return {pick}
        """,
        draw=draw,
        edges=[([3], 1), ([2, 2, 1], 2)],
        params={"which": which},
    )


def running(rng: random.Random) -> Problem:
    kind = rng.choice(["sum", "max", "min", "product"])
    start, combine = {
        "sum": ("0", "acc + x"),
        "max": ("None", "x if acc is None else max(acc, x)"),
        "min": ("None", "x if acc is None else min(acc, x)"),
        "product": ("1", "acc * x"),
    }[kind]
    return make_problem(
        rng,
        template="running",
        signature=f"running_{kind}(xs: list[int]) -> list[int]",
        description=f"returns a list whose i-th element is the {kind} of xs[0], ..., xs[i]",
        reference=f"""
        def running_{kind}(xs):
            out = []
            acc = {start}
            for x in xs:
                acc = {combine}
                out.append(acc)
            return out
        """,
        draw=lambda r: (int_list(r, -9, 9, 0, 9),),
        edges=[([],), ([5],)],
        params={"kind": kind},
    )


TEMPLATES = (
    rotate,
    second_extreme,
    flatten,
    chunk,
    windows,
    max_subarray,
    dedupe,
    count_pairs,
    matrix,
    interleave,
    inversions,
    longest_run,
    partition,
    kth,
    running,
)
"""The list templates, in a fixed order (the generator draws from them by index)."""
