"""Problem templates about strings: counting, encoding, words, brackets."""

from __future__ import annotations

import random
import string

from llm_gym.envs.code.problem import Problem, make_problem, text, word

__all__ = ["TEMPLATES"]

_BRACKETS = ("()", "[]", "{}", "<>")


def count_letters(rng: random.Random) -> Problem:
    letters = "aeiou" if rng.random() < 0.4 else "".join(sorted(rng.sample("bcdfghklmnprst", 3)))
    ignore_case = rng.random() < 0.5
    rule = "ignoring case ('A' counts as 'a')" if ignore_case else "case-sensitively"
    lower = ".lower()" if ignore_case else ""
    alphabet = letters + letters.upper() + "xyzXYZ "
    return make_problem(
        rng,
        template="count_letters",
        signature="count_letters(s: str) -> int",
        description=f"returns how many characters of s are one of the letters '{letters}', "
        f"compared {rule}",
        reference=f"""
        def count_letters(s):
            return sum(1 for ch in s{lower} if ch in "{letters}")
        """,
        draw=lambda r: (word(r, alphabet, 0, 14),),
        edges=[("",), (letters.upper(),)],
        params={"letters": letters, "ignore_case": ignore_case},
    )


def _runs(rng: random.Random, alphabet: str, max_run: int) -> list[tuple[str, int]]:
    runs: list[tuple[str, int]] = []
    for _ in range(rng.randint(1, 5)):
        ch = rng.choice([c for c in alphabet if not runs or c != runs[-1][0]])
        runs.append((ch, rng.randint(1, max_run)))
    return runs


def rle_encode(rng: random.Random) -> Problem:
    count_first = rng.random() < 0.5
    piece = "str(count) + ch" if count_first else "ch + str(count)"
    example = "'3a1b'" if count_first else "'a3b1'"
    return make_problem(
        rng,
        template="rle_encode",
        signature="rle_encode(s: str) -> str",
        description=(
            "returns the run-length encoding of s: each maximal run of one character becomes "
            f"{'the run length followed by the character' if count_first else 'the character followed by the run length'}"  # noqa: E501
            f" (so 'aaab' becomes {example}); the empty string encodes to ''"
        ),
        reference=f"""
        def rle_encode(s):
            out = []
            i = 0
            while i < len(s):
                j = i
                while j < len(s) and s[j] == s[i]:
                    j += 1
                ch, count = s[i], j - i
                out.append({piece})
                i = j
            return "".join(out)
        """,
        draw=lambda r: ("".join(c * n for c, n in _runs(r, "abcxyz", 12)),),
        edges=[("",), ("a",)],
        params={"count_first": count_first},
    )


def rle_decode(rng: random.Random) -> Problem:
    count_first = rng.random() < 0.5
    if count_first:
        pattern, example = r"(\d+)([a-z])", "'3a1b'"
        order = "int(m.group(1)) * m.group(2)"
    else:
        pattern, example = r"([a-z])(\d+)", "'a3b1'"
        order = "m.group(1) * int(m.group(2))"

    def draw(r: random.Random) -> tuple[str]:
        runs = _runs(r, "abcxyz", 15)
        return ("".join(f"{n}{c}" if count_first else f"{c}{n}" for c, n in runs),)

    return make_problem(
        rng,
        template="rle_decode",
        signature="rle_decode(s: str) -> str",
        description=(
            "returns the string encoded by s, a run-length encoding where each run is written "
            f"{'as its length then its lowercase letter' if count_first else 'as its lowercase letter then its length'}"  # noqa: E501
            f" (so {example} decodes to 'aaab'; lengths may have several digits)"
        ),
        reference=f"""
        import re

        def rle_decode(s):
            return "".join({order} for m in re.finditer(r"{pattern}", s))
        """,
        draw=draw,
        edges=[("",)],
        params={"count_first": count_first},
    )


def palindrome(rng: random.Random) -> Problem:
    ignore_case = rng.random() < 0.5
    letters_only = rng.random() < 0.5
    rules = []
    if ignore_case:
        rules.append("ignoring case")
    if letters_only:
        rules.append("considering only letters and digits (ch.isalnum())")
    rule = " and ".join(rules) if rules else "comparing every character exactly"
    keep = "ch.isalnum()" if letters_only else "True"
    lower = ".lower()" if ignore_case else ""

    def draw(r: random.Random) -> tuple[str]:
        half = word(r, "abAB ,!", 0, 5)
        if r.random() < 0.6:
            mirror = half[::-1]
            mirror = "".join(c.swapcase() if r.random() < 0.3 else c for c in mirror)
            return (half + r.choice(["", "x", " "]) + mirror,)
        return (word(r, "abAB ,!", 1, 8),)

    return make_problem(
        rng,
        template="palindrome",
        signature="is_palindrome(s: str) -> bool",
        description=f"returns True if s reads the same forwards and backwards, {rule}; else False",
        reference=f"""
        def is_palindrome(s):
            kept = [ch{lower} for ch in s if {keep}]
            return kept == kept[::-1]
        """,
        draw=draw,
        edges=[("",), ("Aa",), ("a,a!",)],
        params={"ignore_case": ignore_case, "letters_only": letters_only},
    )


def caesar(rng: random.Random) -> Problem:
    shift = rng.randint(1, 25)
    direction = rng.choice(["forward", "backward"])
    signed = shift if direction == "forward" else -shift
    return make_problem(
        rng,
        template="caesar",
        signature="caesar(s: str) -> str",
        description=(
            f"returns s with every letter shifted {shift} places {direction} in the alphabet, "
            "wrapping around (z -> a) and keeping its case; other characters stay as they are"
        ),
        reference=f"""
        def caesar(s):
            out = []
            for ch in s:
                if "a" <= ch <= "z":
                    out.append(chr((ord(ch) - 97 + {signed}) % 26 + 97))
                elif "A" <= ch <= "Z":
                    out.append(chr((ord(ch) - 65 + {signed}) % 26 + 65))
                else:
                    out.append(ch)
            return "".join(out)
        """,
        draw=lambda r: (text(r, 4, string.ascii_letters + "!?"),),
        edges=[("",), ("xyz XYZ!",)],
        params={"shift": shift, "direction": direction},
    )


def longest_word(rng: random.Random) -> Problem:
    tie = rng.choice(["first", "last"])
    compare = ">" if tie == "first" else ">="
    return make_problem(
        rng,
        template="longest_word",
        signature="longest_word(s: str) -> str",
        description=(
            "returns the longest word of s (words are separated by one or more spaces); on a "
            f"tie return the {tie} of the longest words; return '' when s has no word"
        ),
        reference=f"""
        def longest_word(s):
            best = ""
            for w in s.split():
                if len(w) {compare} len(best):
                    best = w
            return best
        """,
        draw=lambda r: (text(r, 6, "abcdef"),),
        edges=[("",), ("   ",), ("ab cd",)],
        params={"tie": tie},
    )


def reverse_words(rng: random.Random) -> Problem:
    kind = rng.choice(["order", "letters"])
    if kind == "order":
        description = (
            "returns the words of s in reverse order, joined by single spaces (s may contain "
            "several spaces between words and leading or trailing spaces)"
        )
        body = 'return " ".join(reversed(s.split()))'
    else:
        description = (
            "returns s with the letters of each word reversed, keeping the word order, joined by "
            "single spaces (s may contain several spaces between words and leading or trailing "
            "spaces)"
        )
        body = 'return " ".join(w[::-1] for w in s.split())'

    def draw(r: random.Random) -> tuple[str]:
        words = [word(r) for _ in range(r.randint(1, 5))]
        spaced = "".join(w + " " * r.randint(1, 2) for w in words).strip(" ")
        return (spaced + " " * r.randint(0, 1),)

    return make_problem(
        rng,
        template="reverse_words",
        signature=f"reverse_{kind}(s: str) -> str",
        description=description,
        reference=f"""
        def reverse_{kind}(s):
            {body}
        """,
        draw=draw,
        edges=[("",), ("  ",), ("one",)],
        params={"kind": kind},
    )


def most_common(rng: random.Random) -> Problem:
    unit = rng.choice(["char", "word"])
    tie = rng.choice(["smallest", "first"])
    items = "s.split()" if unit == "word" else 'list(s.replace(" ", ""))'
    what = "word (words are separated by spaces)" if unit == "word" else "non-space character"
    tie_text = (
        "the alphabetically smallest of them"
        if tie == "smallest"
        else "the one whose first appearance in s comes first"
    )
    key = "(-counts[x], x)" if tie == "smallest" else "(-counts[x], items.index(x))"
    draw_alphabet = "abcd"
    return make_problem(
        rng,
        template="most_common",
        signature=f"most_common_{unit}(s: str) -> str",
        description=f"returns the most frequent {what} in s; on a tie return {tie_text}; "
        "return '' when there is none",
        reference=f"""
        def most_common_{unit}(s):
            items = {items}
            counts = {{}}
            for x in items:
                counts[x] = counts.get(x, 0) + 1
            if not counts:
                return ""
            return min(counts, key=lambda x: {key})
        """,
        draw=lambda r: (" ".join(word(r, draw_alphabet, 1, 2) for _ in range(r.randint(1, 8))),),
        edges=[("",), ("b a",)],
        params={"unit": unit, "tie": tie},
    )


def anagrams(rng: random.Random) -> Problem:
    loose = rng.random() < 0.5
    rule = "ignoring case and spaces" if loose else "exactly (case and spaces count)"
    clean = '.replace(" ", "").lower()' if loose else ""

    def draw(r: random.Random) -> tuple[str, str]:
        a = word(r, "abcAB ", 1, 8)
        letters = list(a.replace(" ", "").lower() if loose and r.random() < 0.5 else a)
        r.shuffle(letters)
        b = "".join(letters)
        if r.random() < 0.35:
            b = b + r.choice("abc")
        return (a, b)

    return make_problem(
        rng,
        template="anagrams",
        signature="are_anagrams(a: str, b: str) -> bool",
        description=f"returns True if a and b are anagrams of each other, compared {rule}; "
        "else False",
        reference=f"""
        def are_anagrams(a, b):
            return sorted(a{clean}) == sorted(b{clean})
        """,
        draw=draw,
        edges=[("", ""), ("Ab", "b a")],
        params={"loose": loose},
    )


def balanced(rng: random.Random) -> Problem:
    pairs = rng.sample(_BRACKETS, rng.randint(1, 4))
    pairs.sort(key=_BRACKETS.index)
    shown = " ".join(pairs)
    openers = "".join(p[0] for p in pairs)
    closers = "".join(p[1] for p in pairs)
    alphabet = openers + closers + "x"

    def draw(r: random.Random) -> tuple[str]:
        if r.random() < 0.5:  # build a balanced string, maybe break it
            out, stack = [], []
            for _ in range(r.randint(1, 8)):
                if stack and r.random() < 0.5:
                    out.append(stack.pop())
                else:
                    p = r.choice(pairs)
                    out.append(p[0])
                    stack.append(p[1])
            out += reversed(stack)
            if r.random() < 0.4:
                out.insert(r.randrange(len(out) + 1), r.choice(alphabet))
            return ("".join(out),)
        return (word(r, alphabet, 0, 8),)

    return make_problem(
        rng,
        template="balanced",
        signature="is_balanced(s: str) -> bool",
        description=(
            f"returns True if the brackets {shown} in s are balanced and properly nested; every "
            "other character is ignored; else False"
        ),
        reference=f"""
        def is_balanced(s):
            closing = dict(zip("{closers}", "{openers}"))
            stack = []
            for ch in s:
                if ch in "{openers}":
                    stack.append(ch)
                elif ch in closing:
                    if not stack or stack.pop() != closing[ch]:
                        return False
            return not stack
        """,
        draw=draw,
        edges=[("",), (closers[0],), (openers[0],)],
        params={"pairs": pairs},
    )


TEMPLATES = (
    count_letters,
    rle_encode,
    rle_decode,
    palindrome,
    caesar,
    longest_word,
    reverse_words,
    most_common,
    anagrams,
    balanced,
)
"""The string templates, in a fixed order (the generator draws from them by index)."""
