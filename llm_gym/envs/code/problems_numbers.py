"""Problem templates about integers: digits, bases, primes, divisors, sequences."""

from __future__ import annotations

import random
import textwrap

from llm_gym.envs.code.problem import Problem, make_problem

__all__ = ["TEMPLATES"]

_PRIMES = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47)
_FIZZ_WORDS = ("Fizz", "Buzz", "Bang", "Pop", "Zip", "Zap", "Ping", "Pong", "Tick", "Tock")


def digit_sum(rng: random.Random) -> Problem:
    base = rng.randint(2, 16)
    return make_problem(
        rng,
        template="digit_sum",
        signature="digit_sum(n: int) -> int",
        description=f"returns the sum of the digits of n written in base {base} (n >= 0)",
        reference=f"""
        def digit_sum(n):
            total = 0
            while n:
                n, digit = divmod(n, {base})
                total += digit
            return total
        """,
        draw=lambda r: (r.randint(0, 10**6),),
        edges=[(0,), (base - 1,), (base,)],
        params={"base": base},
    )


def digital_root(rng: random.Random) -> Problem:
    base = rng.randint(3, 16)
    return make_problem(
        rng,
        template="digital_root",
        signature="digital_root(n: int) -> int",
        description=(
            f"returns the digital root of n in base {base}: replace n by the sum of its "
            f"base-{base} digits until it is less than {base} (n >= 0)"
        ),
        reference=f"""
        def digital_root(n):
            while n >= {base}:
                total = 0
                while n:
                    n, digit = divmod(n, {base})
                    total += digit
                n = total
            return n
        """,
        draw=lambda r: (r.randint(0, 10**9),),
        edges=[(0,), (base,), (base * base - 1,)],
        params={"base": base},
    )


def fib_mod(rng: random.Random) -> Problem:
    modulus = rng.randint(2, 10**9)
    first, second = rng.choice([(0, 1), (0, 1), (1, 1), (2, 1)])
    return make_problem(
        rng,
        template="fib_mod",
        signature="fib_mod(n: int) -> int",
        description=(
            f"returns F(n) modulo {modulus}, where F(0) = {first}, F(1) = {second} and "
            f"F(k) = F(k - 1) + F(k - 2) (n >= 0)"
        ),
        reference=f"""
        def fib_mod(n):
            a, b = {first}, {second}
            for _ in range(n):
                a, b = b, (a + b) % {modulus}
            return a % {modulus}
        """,
        draw=lambda r: (r.randint(0, 3000),),
        edges=[(0,), (1,), (2,)],
        params={"modulus": modulus, "first": first, "second": second},
    )


def primes(rng: random.Random) -> Problem:
    variant = rng.choice(["count_below", "count_upto", "sum_below"])
    text = {
        "count_below": "returns how many primes are less than n",
        "count_upto": "returns how many primes are less than or equal to n",
        "sum_below": "returns the sum of all primes less than n",
    }[variant]
    limit = "n" if variant != "count_upto" else "n + 1"
    result = "sum(i for i in range(limit) if sieve[i])" if variant == "sum_below" else "sum(sieve)"
    return make_problem(
        rng,
        template="primes",
        signature=f"primes_{variant}(n: int) -> int",
        description=f"{text} (n >= 0)",
        reference=f"""
        def primes_{variant}(n):
            limit = {limit}
            if limit < 3:
                return 0
            sieve = [False, False] + [True] * (limit - 2)
            for i in range(2, int(limit ** 0.5) + 1):
                if sieve[i]:
                    for j in range(i * i, limit, i):
                        sieve[j] = False
            return {result}
        """,
        draw=lambda r: (r.randint(0, 5000),),
        edges=[(0,), (2,), (3,)],
        params={"variant": variant},
    )


def gcd_lcm(rng: random.Random) -> Problem:
    kind = rng.choice(["gcd", "lcm"])
    start, combine = ("0", "a") if kind == "gcd" else ("1", "result * x // a")
    body = f"""
        result = {start}
        for x in xs:
            a, b = result, x
            while b:
                a, b = b, a % b
            result = {combine}
        return result
    """
    word = "greatest common divisor" if kind == "gcd" else "least common multiple"
    factor = rng.randint(1, 12)
    return make_problem(
        rng,
        template="gcd_lcm",
        signature=f"{kind}_all(xs: list[int]) -> int",
        description=f"returns the {word} of all the numbers in xs (a non-empty list of ints >= 1)",
        reference=f"def {kind}_all(xs):\n" + textwrap.indent(textwrap.dedent(body).strip(), "    "),
        draw=lambda r: ([factor * r.randint(1, 30) for _ in range(r.randint(1, 6))],),
        edges=[([1],), ([factor],)],
        params={"kind": kind, "factor": factor},
    )


def collatz(rng: random.Random) -> Problem:
    kind = rng.choice(["steps", "peak"])
    text = (
        "returns the number of steps to reach 1"
        if kind == "steps"
        else "returns the largest value reached before arriving at 1 (n itself included)"
    )
    result = "steps" if kind == "steps" else "peak"
    return make_problem(
        rng,
        template="collatz",
        signature=f"collatz_{kind}(n: int) -> int",
        description=(
            f"{text}, starting from n (n >= 1), where a step maps an even number m to m // 2 "
            "and an odd number m to 3 * m + 1"
        ),
        reference=f"""
        def collatz_{kind}(n):
            steps, peak = 0, n
            while n != 1:
                n = n // 2 if n % 2 == 0 else 3 * n + 1
                steps += 1
                peak = max(peak, n)
            return {result}
        """,
        draw=lambda r: (r.randint(1, 10**5),),
        edges=[(1,), (2,), (27,)],
        params={"kind": kind},
    )


def to_base(rng: random.Random) -> Problem:
    base = rng.choice([b for b in range(2, 37) if b != 10])
    return make_problem(
        rng,
        template="to_base",
        signature="to_base(n: int) -> str",
        description=(
            f"returns n (n >= 0) written in base {base}, with digits 0-9 then lowercase letters "
            "a-z and no prefix; 0 is written '0'"
        ),
        reference=f"""
        def to_base(n):
            digits = "0123456789abcdefghijklmnopqrstuvwxyz"
            if n == 0:
                return "0"
            out = []
            while n:
                n, d = divmod(n, {base})
                out.append(digits[d])
            return "".join(reversed(out))
        """,
        draw=lambda r: (r.randint(0, 10**7),),
        edges=[(0,), (base,), (base - 1,)],
        params={"base": base},
    )


def from_base(rng: random.Random) -> Problem:
    base = rng.choice([b for b in range(2, 37) if b != 10])
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"[:base]

    def draw(r: random.Random) -> tuple[str]:
        return (r.choice(digits[1:]) + "".join(r.choice(digits) for _ in range(r.randint(0, 6))),)

    return make_problem(
        rng,
        template="from_base",
        signature="from_base(s: str) -> int",
        description=(
            f"returns the value of s, a number written in base {base} with digits 0-9 then "
            "lowercase letters (no sign, no prefix)"
        ),
        reference=f"""
        def from_base(s):
            value = 0
            for ch in s:
                value = value * {base} + "0123456789abcdefghijklmnopqrstuvwxyz".index(ch)
            return value
        """,
        draw=draw,
        edges=[("0",), ("10",)],
        params={"base": base},
    )


def sum_multiples(rng: random.Random) -> Problem:
    a, b = rng.sample(range(2, 13), 2)
    return make_problem(
        rng,
        template="sum_multiples",
        signature="sum_multiples(n: int) -> int",
        description=f"returns the sum of all positive integers below n that are divisible by {a} "
        f"or by {b} (n >= 0)",
        reference=f"""
        def sum_multiples(n):
            return sum(i for i in range(1, n) if i % {a} == 0 or i % {b} == 0)
        """,
        draw=lambda r: (r.randint(0, 5000),),
        edges=[(0,), (1,), (a * b,)],
        params={"a": a, "b": b},
    )


def power_sum(rng: random.Random) -> Problem:
    power = rng.randint(1, 5)
    modulus = rng.randint(10, 10**6)
    return make_problem(
        rng,
        template="power_sum",
        signature="power_sum(n: int) -> int",
        description=f"returns (1**{power} + 2**{power} + ... + n**{power}) modulo {modulus} "
        "(n >= 0; the empty sum is 0)",
        reference=f"""
        def power_sum(n):
            return sum(i ** {power} for i in range(1, n + 1)) % {modulus}
        """,
        draw=lambda r: (r.randint(0, 3000),),
        edges=[(0,), (1,)],
        params={"power": power, "modulus": modulus},
    )


def divisors(rng: random.Random) -> Problem:
    kind = rng.choice(["count", "sum", "proper_sum"])
    text = {
        "count": "returns how many positive divisors n has",
        "sum": "returns the sum of all positive divisors of n",
        "proper_sum": "returns the sum of the positive divisors of n that are less than n",
    }[kind]
    result = {"count": "len(found)", "sum": "sum(found)", "proper_sum": "sum(found) - n"}[kind]
    return make_problem(
        rng,
        template="divisors",
        signature=f"divisor_{kind}(n: int) -> int",
        description=f"{text} (n >= 1)",
        reference=f"""
        def divisor_{kind}(n):
            found = set()
            i = 1
            while i * i <= n:
                if n % i == 0:
                    found.add(i)
                    found.add(n // i)
                i += 1
            return {result}
        """,
        draw=lambda r: (r.randint(1, 10**6),),
        edges=[(1,), (2,), (36,)],
        params={"kind": kind},
    )


def factorial_prime_power(rng: random.Random) -> Problem:
    p = rng.choice(_PRIMES)
    return make_problem(
        rng,
        template="factorial_prime_power",
        signature="prime_power_in_factorial(n: int) -> int",
        description=f"returns the largest k such that {p}**k divides n! (n >= 0; 0! = 1)",
        reference=f"""
        def prime_power_in_factorial(n):
            k, q = 0, {p}
            while q <= n:
                k += n // q
                q *= {p}
            return k
        """,
        draw=lambda r: (r.randint(0, 10**6),),
        edges=[(0,), (p - 1,), (p,)],
        params={"p": p},
    )


def roman(rng: random.Random) -> Problem:
    direction = rng.choice(["to", "from"])
    table = (
        "[(1000, 'M'), (900, 'CM'), (500, 'D'), (400, 'CD'), (100, 'C'), (90, 'XC'), "
        "(50, 'L'), (40, 'XL'), (10, 'X'), (9, 'IX'), (5, 'V'), (4, 'IV'), (1, 'I')]"
    )
    encode = f"""
        def to_roman(n):
            out = []
            for value, symbol in {table}:
                while n >= value:
                    out.append(symbol)
                    n -= value
            return "".join(out)
    """
    if direction == "to":
        return make_problem(
            rng,
            template="roman",
            signature="to_roman(n: int) -> str",
            description="returns n (1 <= n <= 3999) in standard Roman numerals (uppercase, "
            "subtractive forms such as IV, IX, XL, XC, CD, CM)",
            reference=encode,
            draw=lambda r: (r.randint(1, 3999),),
            edges=[(1,), (4,), (3999,)],
            params={"direction": direction},
        )
    namespace: dict = {}
    exec(compile(textwrap.dedent(encode), "<roman>", "exec"), namespace)  # our own code
    as_roman = namespace["to_roman"]
    return make_problem(
        rng,
        template="roman",
        signature="from_roman(s: str) -> int",
        description="returns the value of s, a number from 1 to 3999 in standard uppercase "
        "Roman numerals (subtractive forms such as IV and CM included)",
        reference="""
        def from_roman(s):
            values = {"I": 1, "V": 5, "X": 10, "L": 50, "C": 100, "D": 500, "M": 1000}
            total = 0
            for i, ch in enumerate(s):
                if i + 1 < len(s) and values[ch] < values[s[i + 1]]:
                    total -= values[ch]
                else:
                    total += values[ch]
            return total
        """,
        draw=lambda r: (as_roman(r.randint(1, 3999)),),
        edges=[("I",), ("IV",), ("MMMCMXCIX",)],
        params={"direction": direction},
    )


def bit_runs(rng: random.Random) -> Problem:
    bit = rng.choice("01")
    return make_problem(
        rng,
        template="bit_runs",
        signature=f"longest_{'ones' if bit == '1' else 'zeros'}(n: int) -> int",
        description=f"returns the length of the longest run of consecutive {bit} bits in the "
        "binary representation of n (n >= 1, no leading zeros)",
        reference=f"""
        def longest_{"ones" if bit == "1" else "zeros"}(n):
            best = run = 0
            for ch in bin(n)[2:]:
                run = run + 1 if ch == "{bit}" else 0
                best = max(best, run)
            return best
        """,
        draw=lambda r: (r.randint(1, 2**24),),
        edges=[(1,), (2**10,), (2**10 - 1,)],
        params={"bit": bit},
    )


def fizzbuzz(rng: random.Random) -> Problem:
    a, b = rng.sample(range(2, 10), 2)
    w1, w2 = rng.sample(_FIZZ_WORDS, 2)
    return make_problem(
        rng,
        template="fizzbuzz",
        signature="fizzbuzz(n: int) -> list[str]",
        description=(
            f"returns a list with one string for each i from 1 to n: '{w1}{w2}' if i is "
            f"divisible by both {a} and {b}, '{w1}' if only by {a}, '{w2}' if only by {b}, "
            "else str(i) (n >= 0)"
        ),
        reference=f"""
        def fizzbuzz(n):
            out = []
            for i in range(1, n + 1):
                word = ("{w1}" if i % {a} == 0 else "") + ("{w2}" if i % {b} == 0 else "")
                out.append(word or str(i))
            return out
        """,
        draw=lambda r: (r.randint(0, 40),),
        edges=[(0,), (a * b,)],
        params={"a": a, "b": b, "words": [w1, w2]},
    )


def factorial_digits(rng: random.Random) -> Problem:
    kind = rng.choice(["sum", "count", "trailing_zeros"])
    text = {
        "sum": "returns the sum of the decimal digits of n!",
        "count": "returns the number of decimal digits of n!",
        "trailing_zeros": "returns the number of trailing zeros of n! written in decimal",
    }[kind]
    result = {
        "sum": "sum(int(c) for c in str(f))",
        "count": "len(str(f))",
        "trailing_zeros": "len(str(f)) - len(str(f).rstrip('0'))",
    }[kind]
    return make_problem(
        rng,
        template="factorial_digits",
        signature=f"factorial_digit_{kind}(n: int) -> int",
        description=f"{text} (0 <= n <= 300; 0! = 1)",
        reference=f"""
        def factorial_digit_{kind}(n):
            f = 1
            for i in range(2, n + 1):
                f *= i
            return {result}
        """,
        draw=lambda r: (r.randint(0, 300),),
        edges=[(0,), (1,), (25,)],
        params={"kind": kind},
    )


TEMPLATES = (
    digit_sum,
    digital_root,
    fib_mod,
    primes,
    gcd_lcm,
    collatz,
    to_base,
    from_base,
    sum_multiples,
    power_sum,
    divisors,
    factorial_prime_power,
    roman,
    bit_runs,
    fizzbuzz,
    factorial_digits,
)
"""The integer templates, in a fixed order (the generator draws from them by index)."""
