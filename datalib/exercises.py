"""General Python exercises (source ``exercises:v1``): short, varied tasks that keep SFT from over-specialising.

Why they exist (issue 23, item 3): 94% of the generated data-cleaning answers open with the same "treat a missing X
as empty" guard and every one has 2-6 steps, so SFT learned to apply that template to anything — HumanEval/53
``add(x, y)`` came back as "Step 1: treat 0 as the empty number", and HumanEval greedy pass@1 fell 7 → 1 of 164.
These exercises are the field's remedy, data diversity: arithmetic, strings, lists and dicts, each answered in one to
three steps, with a guard only where the docstring asks for one. They are put to the model exactly as an external
problem is (the generic instruction plus the whole HumanEval-style prompt, :func:`models.prompts.user_message`), so
the adapter also sees "a problem a user brings" and its short answer, not only the bundled family's format.

They go to the ``train`` split only (a training aid, never a measured figure): what they are for is measured by the
external guard (HumanEval) and the held-out families. None is a HumanEval task: no entry point is shared, and
:func:`humaneval_overlap` (run by ``prepare``, asserted by the tests) finds no 10-word run of a HumanEval prompt or
solution in any exercise.

Each kind is a function of the variant index ``v`` (0..5) that picks the function name, argument names and constants
from short tuples, so the six variants of a kind differ in signature and data, not only in name. Expected outputs are
computed by running the reference (:func:`datalib.generate.render_spec`), so they are right by construction.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from datalib.generate import render_spec
from datalib.problem_families import Spec, _step

VERSION = "v1"
SOURCE = f"exercises:{VERSION}"
TASK_PREFIX = "Exercise"
FAMILY = "exercises"
INSTRUCTION = "Complete the following Python function so that it does what its docstring says."
N_VARIANTS = 6


def _pick(options: Sequence, v: int):
    return options[v % len(options)]


def _spec(name, params, returns, summary, steps, cases, patterns, modules=()) -> Spec:
    return Spec(
        entry_point=name,
        params=tuple(params),
        returns=returns,
        summary=summary,
        rules=(),
        steps=tuple(_step(text, code) for text, code in steps),
        cases=tuple(cases),
        key_patterns=tuple(patterns),
        input_desc="",
        modules=tuple(modules),
    )


# ------------------------------------------------------------------------------------------------- numbers


def _count_multiples(v: int) -> Spec:
    name = _pick(("count_multiples", "how_many_divisible"), v)
    arg = _pick(("numbers", "values", "nums"), v)
    k = _pick((3, 5, 2, 7, 4, 10), v)
    return _spec(
        f"{name}_of_{k}",
        [(arg, "List[int]")],
        "int",
        f"Return how many of the integers in `{arg}` are divisible by {k}.",
        [(f"count the elements divisible by {k}", f"return sum(1 for n in {arg} if n % {k} == 0)")],
        [([k, 1, 2 * k, 11, -k],), ([],), ([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 21, 35],), ([0, k * k],), ([k + 1],)],
        (f"% {k}",),
    )


def _scale(v: int) -> Spec:
    name = _pick(("scale_values", "multiply_all"), v)
    arg = _pick(("values", "numbers", "items"), v)
    factor = _pick(("factor", "by", "k"), v + 1)
    return _spec(
        name,
        [(arg, "List[int]"), (factor, "int")],
        "List[int]",
        f"Return a new list with every element of `{arg}` multiplied by `{factor}`.",
        [("multiply each element", f"return [x * {factor} for x in {arg}]")],
        [([1, 2, 3], 2), ([], 5), ([-4, 0, 7], 3), ([10], 0), ([2, 2], -1)],
        (f"* {factor}",),
    )


def _running_total(v: int) -> Spec:
    name = _pick(("running_total", "cumulative_sums", "prefix_sums"), v)
    arg = _pick(("amounts", "numbers"), v)
    return _spec(
        name,
        [(arg, "List[int]")],
        "List[int]",
        f"Return the running totals of `{arg}`: element i is the sum of the first i + 1 elements.",
        [
            ("start from zero", "total = 0\nresult = []"),
            (
                "add each element and record the total",
                f"for x in {arg}:\n    total += x\n    result.append(total)\nreturn result",
            ),
        ],
        [([1, 2, 3],), ([],), ([5, -5, 5],), ([0, 0, 1],), ([10, 20, 30, 40],)],
        ("total += x",),
    )


def _product(v: int) -> Spec:
    name = _pick(("product_of", "multiply_together"), v)
    arg = _pick(("factors", "numbers", "values"), v)
    return _spec(
        name,
        [(arg, "List[int]")],
        "int",
        f"Return the product of the integers in `{arg}` (1 for an empty list).",
        [
            ("start from the multiplicative identity", "result = 1"),
            ("multiply every element in", f"for x in {arg}:\n    result *= x\nreturn result"),
        ],
        [([2, 3, 4],), ([],), ([5],), ([-1, 2, -3],), ([7, 0, 9],)],
        ("result *= x",),
    )


def _mean(v: int) -> Spec:
    name = _pick(("average", "arithmetic_mean"), v)
    arg = _pick(("readings", "numbers", "samples"), v)
    return _spec(
        name,
        [(arg, "List[float]")],
        "float",
        f"Return the average of `{arg}`, or 0.0 when the list is empty.",
        [
            ("an empty list has average 0.0", f"if not {arg}:\n    return 0.0"),
            ("divide the sum by the count", f"return sum({arg}) / len({arg})"),
        ],
        [([1.0, 2.0, 3.0],), ([],), ([4.5],), ([-2.0, 2.0],), ([1.0, 2.0],)],
        ("/ len(",),
    )


def _spread(v: int) -> Spec:
    name = _pick(("value_range", "spread"), v)
    arg = _pick(("numbers", "heights", "prices"), v)
    return _spec(
        name,
        [(arg, "List[int]")],
        "int",
        f"Return the difference between the largest and the smallest number in `{arg}` (a non-empty list).",
        [("subtract the minimum from the maximum", f"return max({arg}) - min({arg})")],
        [([3, 9, 1],), ([5],), ([-4, 4],), ([2, 2, 2],), ([10, -10, 0, 7],)],
        ("max(", "min("),
    )


def _count_above(v: int) -> Spec:
    name = _pick(("count_above", "count_greater"), v)
    arg = _pick(("numbers", "scores", "temperatures"), v)
    limit = _pick(("limit", "threshold", "cutoff"), v + 1)
    return _spec(
        name,
        [(arg, "List[int]"), (limit, "int")],
        "int",
        f"Return how many numbers in `{arg}` are strictly greater than `{limit}`.",
        [(f"count the numbers above {limit}", f"return sum(1 for x in {arg} if x > {limit})")],
        [([1, 5, 10], 4), ([], 0), ([3, 3, 3], 3), ([-1, -2, 0], -2), ([100, 200], 50)],
        (f"> {limit}",),
    )


def _convert(v: int) -> Spec:
    kinds = (
        (
            "celsius_to_fahrenheit",
            "celsius",
            "Convert a temperature from Celsius to Fahrenheit.",
            "celsius * 9 / 5 + 32",
        ),
        (
            "fahrenheit_to_celsius",
            "fahrenheit",
            "Convert a temperature from Fahrenheit to Celsius.",
            "(fahrenheit - 32) * 5 / 9",
        ),
        ("km_to_meters", "km", "Convert a distance in kilometres to metres.", "km * 1000"),
        ("hours_to_minutes", "hours", "Convert a duration in hours to minutes.", "hours * 60"),
        ("minutes_to_seconds", "minutes", "Convert a duration in minutes to seconds.", "minutes * 60"),
        ("kg_to_grams", "kg", "Convert a mass in kilograms to grams.", "kg * 1000"),
    )
    name, arg, summary, expr = kinds[v % len(kinds)]
    return _spec(
        name,
        [(arg, "float")],
        "float",
        summary + " Round the result to 2 decimal places.",
        [("apply the conversion formula and round", f"return round({expr}, 2)")],
        [(0.0,), (100.0,), (-40.0,), (37.5,), (1.25,)],
        ("round(",),
    )


def _is_leap(v: int) -> Spec:
    name = _pick(("is_leap_year", "leap_year"), v)
    arg = _pick(("year", "y", "n"), v)
    return _spec(
        name,
        [(arg, "int")],
        "bool",
        f"Return True when `{arg}` is a leap year in the Gregorian calendar: divisible by 4, except centuries, "
        "which must be divisible by 400.",
        [("apply the Gregorian rule", f"return {arg} % 4 == 0 and ({arg} % 100 != 0 or {arg} % 400 == 0)")],
        [(2024,), (1900,), (2000,), (2023,), (2100,), (1600,)],
        ("% 400",),
    )


def _digit_count(v: int) -> Spec:
    name = _pick(("count_digits", "number_of_digits"), v)
    arg = _pick(("n", "number", "value"), v)
    return _spec(
        name,
        [(arg, "int")],
        "int",
        f"Return how many decimal digits the integer `{arg}` has (the sign does not count; 0 has one digit).",
        [("count the digits of the absolute value", f"return len(str(abs({arg})))")],
        [(0,), (7,), (-12345,), (1000,), (99,)],
        ("abs(",),
    )


def _digit_sum(v: int) -> Spec:
    name = _pick(("sum_of_digits", "digit_total"), v)
    arg = _pick(("n", "number", "value"), v)
    return _spec(
        name,
        [(arg, "int")],
        "int",
        f"Return the sum of the decimal digits of `{arg}` (ignore the sign).",
        [("add up the digits of the absolute value", f"return sum(int(d) for d in str(abs({arg})))")],
        [(123,), (0,), (-405,), (9999,), (10,)],
        ("int(d)",),
    )


def _factorial(v: int) -> Spec:
    name = _pick(("factorial", "fact"), v)
    arg = _pick(("n", "k", "count"), v)
    return _spec(
        name,
        [(arg, "int")],
        "int",
        f"Return `{arg}`! (the product 1 * 2 * ... * {arg}); 0! is 1.",
        [
            ("start from 1", "result = 1"),
            ("multiply by every number up to n", f"for i in range(2, {arg} + 1):\n    result *= i\nreturn result"),
        ],
        [(0,), (1,), (5,), (10,), (3,)],
        ("range(2,",),
    )


def _is_power_of_two(v: int) -> Spec:
    name = _pick(("is_power_of_two", "power_of_two"), v)
    arg = _pick(("n", "x", "value"), v)
    return _spec(
        name,
        [(arg, "int")],
        "bool",
        f"Return True when `{arg}` is a positive power of two (1, 2, 4, 8, ...).",
        [("a power of two has exactly one bit set", f"return {arg} > 0 and {arg} & ({arg} - 1) == 0")],
        [(1,), (16,), (18,), (0,), (-8,), (1024,)],
        ("& (",),
    )


def _count_positive(v: int) -> Spec:
    name = _pick(("count_positive", "num_positive"), v)
    arg = _pick(("numbers", "deltas", "balances"), v)
    return _spec(
        name,
        [(arg, "List[float]")],
        "int",
        f"Return how many numbers in `{arg}` are strictly positive.",
        [("count the positive numbers", f"return len([x for x in {arg} if x > 0])")],
        [([1.5, -2.0, 0.0, 3.0],), ([],), ([-1.0],), ([0.1, 0.2],), ([0.0, 0.0],)],
        ("x > 0",),
    )


def _argmax(v: int) -> Spec:
    name = _pick(("index_of_max", "position_of_largest"), v)
    arg = _pick(("numbers", "scores", "votes"), v)
    return _spec(
        name,
        [(arg, "List[int]")],
        "int",
        f"Return the index of the largest number in `{arg}` (the first one on ties; the list is not empty).",
        [("find the first index of the maximum", f"return {arg}.index(max({arg}))")],
        [([3, 9, 1],), ([5],), ([2, 7, 7],), ([-3, -1, -2],), ([0, 0, 0, 1],)],
        (".index(",),
    )


def _squares(v: int) -> Spec:
    name = _pick(("square_each", "squared"), v)
    arg = _pick(("numbers", "sides", "values"), v)
    return _spec(
        name,
        [(arg, "List[int]")],
        "List[int]",
        f"Return the squares of the numbers in `{arg}`, in the same order.",
        [("square each number", f"return [x * x for x in {arg}]")],
        [([1, 2, 3],), ([],), ([-4],), ([0, 10],), ([5, -5, 2],)],
        ("x * x",),
    )


def _absolute(v: int) -> Spec:
    name = _pick(("absolute_values", "magnitudes"), v)
    arg = _pick(("numbers", "errors", "offsets"), v)
    return _spec(
        name,
        [(arg, "List[int]")],
        "List[int]",
        f"Return the absolute value of every number in `{arg}`.",
        [("take abs() of each number", f"return [abs(x) for x in {arg}]")],
        [([-1, 2, -3],), ([],), ([0],), ([-100, 100],), ([7, -7, 0],)],
        ("abs(x)",),
    )


def _clamp_one(v: int) -> Spec:
    name = _pick(("clamp", "bound"), v)
    arg = _pick(("x", "value", "n"), v)
    return _spec(
        name,
        [(arg, "int"), ("low", "int"), ("high", "int")],
        "int",
        f"Return `{arg}` limited to the closed interval [low, high] (low <= high).",
        [("limit it from below, then from above", f"return min(max({arg}, low), high)")],
        [(5, 0, 10), (-3, 0, 10), (42, 0, 10), (7, 7, 7), (-1, -5, -2)],
        ("min(max(",),
    )


def _gcd(v: int) -> Spec:
    name = _pick(("highest_common_factor", "hcf"), v)
    a, b = _pick((("a", "b"), ("x", "y"), ("m", "n")), v)
    return _spec(
        name,
        [(a, "int"), (b, "int")],
        "int",
        f"Return the highest common factor of the positive integers `{a}` and `{b}` using Euclid's algorithm.",
        [
            (
                "replace the pair by (b, a mod b) until b is 0",
                f"while {b}:\n    {a}, {b} = {b}, {a} % {b}\nreturn {a}",
            )
        ],
        [(12, 18), (7, 13), (100, 10), (1, 1), (84, 36)],
        ("while ",),
    )


# ------------------------------------------------------------------------------------------------- strings


def _reverse_words(v: int) -> Spec:
    name = _pick(("reverse_words", "words_backwards"), v)
    arg = _pick(("sentence", "text", "line"), v)
    return _spec(
        name,
        [(arg, "str")],
        "str",
        f"Return `{arg}` with the order of its words reversed; words are separated by whitespace and the result "
        "joins them with single spaces.",
        [("split into words, reverse and join", f"return ' '.join(reversed({arg}.split()))")],
        [("hello big world",), ("",), ("one",), ("  a   b ",), ("the quick brown fox",)],
        ("reversed(",),
    )


def _count_char(v: int) -> Spec:
    name = _pick(("count_char", "occurrences_of"), v)
    arg = _pick(("text", "word", "s"), v)
    ch = _pick(("ch", "letter", "c"), v + 1)
    return _spec(
        name,
        [(arg, "str"), (ch, "str")],
        "int",
        f"Return how many times the single character `{ch}` occurs in `{arg}` (case-sensitive).",
        [("count the occurrences", f"return {arg}.count({ch})")],
        [("banana", "a"), ("", "x"), ("Mississippi", "s"), ("AaAa", "a"), ("zzz", "z")],
        (".count(",),
    )


def _is_anagram(v: int) -> Spec:
    name = _pick(("is_anagram", "are_anagrams"), v)
    a, b = _pick((("first", "second"), ("a", "b"), ("word1", "word2")), v)
    return _spec(
        name,
        [(a, "str"), (b, "str")],
        "bool",
        f"Return True when `{a}` and `{b}` contain the same letters the same number of times, ignoring case and "
        "spaces.",
        [
            ("normalise both", f"x = sorted({a}.replace(' ', '').lower())\ny = sorted({b}.replace(' ', '').lower())"),
            ("compare the sorted letters", "return x == y"),
        ],
        [("listen", "silent"), ("Dormitory", "dirty room"), ("abc", "abd"), ("", ""), ("aab", "abb")],
        ("sorted(",),
    )


def _repeat(v: int) -> Spec:
    name = _pick(("repeat_text", "echo"), v)
    arg = _pick(("text", "word", "s"), v)
    times = _pick(("times", "n", "count"), v + 1)
    sep = _pick(("-", " ", ","), v + 2)
    return _spec(
        name,
        [(arg, "str"), (times, "int")],
        "str",
        f"Return `{arg}` repeated `{times}` times, joined by {sep!r} (an empty string when `{times}` is 0).",
        [("join the copies", f"return {sep!r}.join([{arg}] * {times})")],
        [("ab", 3), ("x", 0), ("hi", 1), ("", 2), ("ok", 4)],
        (".join(",),
    )


def _first_word(v: int) -> Spec:
    name = _pick(("first_word", "leading_word"), v)
    arg = _pick(("sentence", "text", "line"), v)
    return _spec(
        name,
        [(arg, "str")],
        "str",
        f"Return the first whitespace-separated word of `{arg}`, or the empty string when there is none.",
        [("split and take the first word", f"words = {arg}.split()\nreturn words[0] if words else ''")],
        [("hello world",), ("",), ("   padded  words",), ("single",), ("\ttab first",)],
        (".split()",),
    )


def _initials(v: int) -> Spec:
    name = _pick(("initials", "monogram"), v)
    arg = _pick(("full_name", "name", "person"), v)
    return _spec(
        name,
        [(arg, "str")],
        "str",
        f"Return the uppercase initials of the words in `{arg}`, each followed by a dot, e.g. 'A.B.'.",
        [("take each word's first letter", f"return ''.join(word[0].upper() + '.' for word in {arg}.split())")],
        [("ada lovelace",), ("Grace Brewster Hopper",), ("",), ("alan",), ("  guido  van rossum ",)],
        ("[0].upper()",),
    )


def _remove_char(v: int) -> Spec:
    name = _pick(("remove_char", "strip_all"), v)
    arg = _pick(("text", "s", "line"), v)
    ch = _pick(("ch", "unwanted", "c"), v + 1)
    return _spec(
        name,
        [(arg, "str"), (ch, "str")],
        "str",
        f"Return `{arg}` with every occurrence of the character `{ch}` removed.",
        [("replace it with nothing", f"return {arg}.replace({ch}, '')")],
        [("banana", "a"), ("", "x"), ("a-b-c", "-"), ("zzz", "z"), ("keep", "q")],
        (".replace(",),
    )


def _char_frequency(v: int) -> Spec:
    name = _pick(("char_frequency", "letter_counts"), v)
    arg = _pick(("text", "word", "s"), v)
    return _spec(
        name,
        [(arg, "str")],
        "Dict[str, int]",
        f"Return a dict mapping each character of `{arg}` to how many times it occurs, in order of first appearance.",
        [
            ("start with an empty dict", "counts = {}"),
            (
                "count each character",
                f"for ch in {arg}:\n    counts[ch] = counts.get(ch, 0) + 1\nreturn counts",
            ),
        ],
        [("hello",), ("",), ("aaa",), ("abcab",), ("a b",)],
        ("counts.get(",),
    )


def _longest_word(v: int) -> Spec:
    name = _pick(("longest_word", "biggest_word"), v)
    arg = _pick(("sentence", "text", "line"), v)
    return _spec(
        name,
        [(arg, "str")],
        "str",
        f"Return the longest word of `{arg}` (the first one on ties), or '' when it has no words.",
        [("pick the longest word", f"return max({arg}.split(), key=len, default='')")],
        [("a bb ccc dd",), ("",), ("same size",), ("one",), ("tiny enormous big",)],
        ("key=len",),
    )


def _starts_with_vowel(v: int) -> Spec:
    name = _pick(("starts_with_vowel", "begins_with_vowel"), v)
    arg = _pick(("word", "text", "s"), v)
    return _spec(
        name,
        [(arg, "str")],
        "bool",
        f"Return True when `{arg}` starts with a vowel (a, e, i, o or u, either case).",
        [("check the first letter", f"return {arg}[:1].lower() in ('a', 'e', 'i', 'o', 'u')")],
        [("apple",), ("Orange",), ("banana",), ("",), ("yes",)],
        ("[:1]",),
    )


def _pad(v: int) -> Spec:
    name = _pick(("pad_left", "right_align"), v)
    arg = _pick(("text", "label", "s"), v)
    fill = _pick(("0", "*", "."), v)
    return _spec(
        name,
        [(arg, "str"), ("width", "int")],
        "str",
        f"Return `{arg}` padded on the left with {fill!r} to at least `width` characters.",
        [("right-justify with the fill character", f"return {arg}.rjust(width, {fill!r})")],
        [("7", 3), ("abc", 2), ("", 4), ("xy", 2), ("42", 5)],
        (".rjust(",),
    )


def _count_words(v: int) -> Spec:
    name = _pick(("count_words", "word_count"), v)
    arg = _pick(("text", "sentence", "paragraph"), v)
    return _spec(
        name,
        [(arg, "str")],
        "int",
        f"Return the number of whitespace-separated words in `{arg}`.",
        [("split on whitespace and count", f"return len({arg}.split())")],
        [("hello world",), ("",), ("  spaced   out  ",), ("one",), ("a\nb\tc",)],
        ("len(",),
    )


def _is_digits(v: int) -> Spec:
    name = _pick(("is_all_digits", "only_digits"), v)
    arg = _pick(("text", "code", "s"), v)
    return _spec(
        name,
        [(arg, "str")],
        "bool",
        f"Return True when `{arg}` is non-empty and every character is a digit 0-9.",
        [("check each character", f"return bool({arg}) and all('0' <= ch <= '9' for ch in {arg})")],
        [("12345",), ("",), ("12a",), ("007",), (" 1",)],
        ("all(",),
    )


def _acronym(v: int) -> Spec:
    name = _pick(("acronym", "abbreviate"), v)
    arg = _pick(("phrase", "title", "words"), v)
    return _spec(
        name,
        [(arg, "str")],
        "str",
        f"Return the acronym of `{arg}`: the first letter of each word, uppercased.",
        [("join the first letters", f"return ''.join(w[0] for w in {arg}.split()).upper()")],
        [("portable network graphics",), ("",), ("As Soon As Possible",), ("x",), ("hyper text markup language",)],
        ("w[0]",),
    )


def _caesar(v: int) -> Spec:
    name = _pick(("caesar_shift", "rotate_letters"), v)
    arg = _pick(("text", "message", "s"), v)
    shift = _pick((1, 3, 13), v)
    return _spec(
        name,
        [(arg, "str")],
        "str",
        f"Shift every lowercase letter of `{arg}` {shift} places forward in the alphabet, wrapping from z to a; "
        "other characters stay as they are.",
        [
            (
                "shift the lowercase letters",
                "return ''.join(\n"
                f"    chr((ord(c) - 97 + {shift}) % 26 + 97) if 'a' <= c <= 'z' else c for c in {arg}\n)",
            )
        ],
        [("abc",), ("xyz",), ("Hello, world!",), ("",), ("zebra 9",)],
        ("% 26",),
    )


# --------------------------------------------------------------------------------------------------- lists


def _chunk(v: int) -> Spec:
    name = _pick(("chunk", "batches"), v)
    arg = _pick(("items", "values", "rows"), v)
    size = _pick(("size", "n", "batch_size"), v + 1)
    return _spec(
        name,
        [(arg, "List[int]"), (size, "int")],
        "List[List[int]]",
        f"Split `{arg}` into consecutive lists of `{size}` elements (the last one may be shorter).",
        [("slice every size elements", f"return [{arg}[i : i + {size}] for i in range(0, len({arg}), {size})]")],
        [([1, 2, 3, 4, 5], 2), ([], 3), ([1, 2, 3], 3), ([9], 5), ([1, 2, 3, 4], 1)],
        ("range(0, len(",),
    )


def _interleave(v: int) -> Spec:
    name = _pick(("interleave", "alternate"), v)
    a, b = _pick((("first", "second"), ("left", "right"), ("xs", "ys")), v)
    return _spec(
        name,
        [(a, "List[int]"), (b, "List[int]")],
        "List[int]",
        f"Return the elements of `{a}` and `{b}` alternately, starting with `{a}`; when one list runs out, the "
        "rest of the other follows.",
        [
            (
                "take pairs while both have elements",
                f"result = []\nfor x, y in zip({a}, {b}):\n    result.extend([x, y])",
            ),
            (
                "append what is left of the longer one",
                f"n = min(len({a}), len({b}))\nreturn result + {a}[n:] + {b}[n:]",
            ),
        ],
        [([1, 3], [2, 4]), ([], [1]), ([1, 2, 3], [9]), ([], []), ([5], [6, 7, 8])],
        ("zip(",),
    )


def _last_n(v: int) -> Spec:
    name = _pick(("last_n", "tail"), v)
    arg = _pick(("items", "events", "values"), v)
    return _spec(
        name,
        [(arg, "List[int]"), ("n", "int")],
        "List[int]",
        f"Return the last `n` elements of `{arg}` (all of them when it is shorter; none when n is 0).",
        [("slice from the end", f"return {arg}[len({arg}) - n :] if n > 0 else []")],
        [([1, 2, 3, 4], 2), ([1], 3), ([1, 2], 0), ([], 1), ([5, 6, 7], 3)],
        ("len(",),
    )


def _rotate(v: int) -> Spec:
    name = _pick(("rotate_left", "shift_left"), v)
    arg = _pick(("items", "ring", "values"), v)
    return _spec(
        name,
        [(arg, "List[int]"), ("k", "int")],
        "List[int]",
        f"Return `{arg}` rotated left by `k` positions (k >= 0; an empty list stays empty).",
        [
            ("an empty list has nothing to rotate", f"if not {arg}:\n    return []"),
            ("cut at k modulo the length and swap the halves", f"k %= len({arg})\nreturn {arg}[k:] + {arg}[:k]"),
        ],
        [([1, 2, 3, 4], 1), ([1, 2, 3], 3), ([], 2), ([1, 2, 3], 5), ([7], 0)],
        ("k %= len(",),
    )


def _pairwise_sums(v: int) -> Spec:
    name = _pick(("adjacent_sums", "neighbour_sums"), v)
    arg = _pick(("numbers", "values", "steps"), v)
    return _spec(
        name,
        [(arg, "List[int]")],
        "List[int]",
        f"Return the sums of each pair of neighbouring elements of `{arg}` (one fewer element than `{arg}`).",
        [("add each element to the next one", f"return [a + b for a, b in zip({arg}, {arg}[1:])]")],
        [([1, 2, 3],), ([],), ([5],), ([1, -1, 1, -1],), ([10, 20],)],
        ("zip(",),
    )


def _index_of(v: int) -> Spec:
    name = _pick(("find_index", "position_of"), v)
    arg = _pick(("items", "names", "words"), v)
    target = _pick(("target", "wanted", "key"), v + 1)
    return _spec(
        name,
        [(arg, "List[str]"), (target, "str")],
        "int",
        f"Return the index of the first element of `{arg}` equal to `{target}`, or -1 when there is none.",
        [
            (
                "scan for the target",
                f"for i, item in enumerate({arg}):\n    if item == {target}:\n        return i\nreturn -1",
            )
        ],
        [(["a", "b", "c"], "b"), ([], "x"), (["x", "x"], "x"), (["a"], "z"), (["p", "q", "r", "q"], "q")],
        ("enumerate(",),
    )


def _merge_sorted(v: int) -> Spec:
    name = _pick(("merge_sorted", "combine_sorted"), v)
    a, b = _pick((("first", "second"), ("left", "right"), ("xs", "ys")), v)
    return _spec(
        name,
        [(a, "List[int]"), (b, "List[int]")],
        "List[int]",
        f"`{a}` and `{b}` are sorted ascending; return one ascending list with all their elements.",
        [
            ("walk both lists with two indices", "result = []\ni = j = 0"),
            (
                "take the smaller head each time",
                f"while i < len({a}) and j < len({b}):\n"
                f"    if {a}[i] <= {b}[j]:\n        result.append({a}[i])\n        i += 1\n"
                f"    else:\n        result.append({b}[j])\n        j += 1",
            ),
            ("append the remainder", f"return result + {a}[i:] + {b}[j:]"),
        ],
        [([1, 4, 9], [2, 3, 10]), ([], [1, 2]), ([5], []), ([1, 1], [1]), ([-3, 0], [-5, 7])],
        ("<=",),
    )


def _zip_dict(v: int) -> Spec:
    name = _pick(("pair_up", "make_lookup"), v)
    keys, values = _pick((("keys", "values"), ("names", "ages"), ("codes", "counts")), v)
    return _spec(
        name,
        [(keys, "List[str]"), (values, "List[int]")],
        "Dict[str, int]",
        f"Return a dict mapping each element of `{keys}` to the element of `{values}` at the same position "
        "(extra elements of the longer list are ignored).",
        [("zip them into a dict", f"return dict(zip({keys}, {values}))")],
        [(["a", "b"], [1, 2]), ([], []), (["x"], [1, 2, 3]), (["p", "q", "r"], [7]), (["k", "k"], [1, 2])],
        ("dict(zip(",),
    )


def _invert(v: int) -> Spec:
    name = _pick(("invert_mapping", "swap_keys_values"), v)
    arg = _pick(("mapping", "codes", "table"), v)
    return _spec(
        name,
        [(arg, "Dict[str, int]")],
        "Dict[int, str]",
        f"Return a dict with the keys and values of `{arg}` swapped (the values are distinct).",
        [("swap each pair", f"return {{value: key for key, value in {arg}.items()}}")],
        [({"a": 1, "b": 2},), ({},), ({"x": 10},), ({"one": 1, "two": 2, "three": 3},), ({"z": 0},)],
        (".items()",),
    )


def _best_key(v: int) -> Spec:
    name = _pick(("top_scorer", "key_of_largest"), v)
    arg = _pick(("scores", "totals", "points"), v)
    return _spec(
        name,
        [(arg, "Dict[str, int]")],
        "str",
        f"Return the key of `{arg}` with the largest value (the first such key in insertion order; the dict is not "
        "empty).",
        [("pick the key by its value", f"return max({arg}, key={arg}.get)")],
        [({"ann": 3, "bob": 5},), ({"x": 1},), ({"a": 2, "b": 2},), ({"p": -1, "q": -5},), ({"k": 0, "m": 9, "n": 9},)],
        ("key=",),
    )


def _count_true(v: int) -> Spec:
    name = _pick(("count_true", "num_set"), v)
    arg = _pick(("flags", "answers", "checks"), v)
    return _spec(
        name,
        [(arg, "List[bool]")],
        "int",
        f"Return how many elements of `{arg}` are True.",
        [("sum the booleans", f"return sum(1 for flag in {arg} if flag)")],
        [([True, False, True],), ([],), ([False],), ([True] * 4,), ([False, True],)],
        ("if flag",),
    )


def _has_duplicates(v: int) -> Spec:
    name = _pick(("has_duplicates", "contains_repeat"), v)
    arg = _pick(("items", "ids", "values"), v)
    return _spec(
        name,
        [(arg, "List[int]")],
        "bool",
        f"Return True when some value occurs more than once in `{arg}`.",
        [("compare the count of distinct values", f"return len(set({arg})) < len({arg})")],
        [([1, 2, 3],), ([1, 2, 1],), ([],), ([5, 5],), ([0, 1, 2, 3, 4, 0],)],
        ("set(",),
    )


def _every_other(v: int) -> Spec:
    name = _pick(("every_other", "even_positions"), v)
    arg = _pick(("items", "frames", "values"), v)
    return _spec(
        name,
        [(arg, "List[int]")],
        "List[int]",
        f"Return the elements of `{arg}` at positions 0, 2, 4, ...",
        [("take every second element", f"return {arg}[::2]")],
        [([1, 2, 3, 4, 5],), ([],), ([9],), ([1, 2],), ([0, 0, 1, 1, 2, 2],)],
        ("[::2]",),
    )


def _sort_by_length(v: int) -> Spec:
    name = _pick(("sort_by_length", "shortest_first"), v)
    arg = _pick(("words", "names", "items"), v)
    return _spec(
        name,
        [(arg, "List[str]")],
        "List[str]",
        f"Return `{arg}` sorted from shortest to longest; words of equal length keep their order.",
        [("sort by length (sorted() is stable)", f"return sorted({arg}, key=len)")],
        [(["ccc", "a", "bb"],), ([],), (["xy", "ab"],), (["one"],), (["four", "to", "six", "a"],)],
        ("key=len",),
    )


def _total_length(v: int) -> Spec:
    name = _pick(("total_length", "characters_in"), v)
    arg = _pick(("words", "lines", "parts"), v)
    return _spec(
        name,
        [(arg, "List[str]")],
        "int",
        f"Return the total number of characters in the strings of `{arg}`.",
        [("add up the lengths", f"return sum(len(s) for s in {arg})")],
        [(["ab", "c"],), ([],), ([""],), (["hello", "world", "!"],), (["  "],)],
        ("len(s)",),
    )


def _swap_ends(v: int) -> Spec:
    name = _pick(("swap_ends", "swap_first_last"), v)
    arg = _pick(("items", "values", "queue"), v)
    return _spec(
        name,
        [(arg, "List[int]")],
        "List[int]",
        f"Return a copy of `{arg}` with its first and last elements exchanged (lists shorter than 2 are returned "
        "as they are).",
        [
            ("copy the list", f"result = list({arg})"),
            (
                "swap the ends when there are two",
                "if len(result) >= 2:\n    result[0], result[-1] = result[-1], result[0]\nreturn result",
            ),
        ],
        [([1, 2, 3],), ([],), ([7],), ([1, 2],), ([4, 5, 6, 7],)],
        ("result[-1]",),
    )


def _group_by_parity(v: int) -> Spec:
    name = _pick(("split_even_odd", "partition_parity"), v)
    arg = _pick(("numbers", "values", "ids"), v)
    return _spec(
        name,
        [(arg, "List[int]")],
        "Tuple[List[int], List[int]]",
        f"Return two lists: the even numbers of `{arg}` and the odd ones, each in their original order.",
        [
            ("collect the even numbers", f"evens = [n for n in {arg} if n % 2 == 0]"),
            ("collect the odd numbers", f"odds = [n for n in {arg} if n % 2 != 0]\nreturn evens, odds"),
        ],
        [([1, 2, 3, 4],), ([],), ([7],), ([-2, -3, 0],), ([2, 4, 6],)],
        ("% 2 == 0",),
    )


def _word_lengths(v: int) -> Spec:
    name = _pick(("word_lengths", "lengths_of_words"), v)
    arg = _pick(("sentence", "text", "line"), v)
    return _spec(
        name,
        [(arg, "str")],
        "List[int]",
        f"Return the length of every whitespace-separated word of `{arg}`, in order.",
        [("measure each word", f"return [len(word) for word in {arg}.split()]")],
        [("the cat sat",), ("",), ("  x  ",), ("supercalifragilistic",), ("a bb ccc",)],
        ("len(word)",),
    )


KINDS: tuple[Callable[[int], Spec], ...] = (
    _count_multiples, _scale, _running_total, _product, _mean, _spread, _count_above, _convert, _is_leap,
    _digit_count, _digit_sum, _factorial, _is_power_of_two, _count_positive, _argmax, _squares, _absolute,
    _clamp_one, _gcd, _reverse_words, _count_char, _is_anagram, _repeat, _first_word, _initials, _remove_char,
    _char_frequency, _longest_word, _starts_with_vowel, _pad, _count_words, _is_digits, _acronym, _caesar, _chunk,
    _interleave, _last_n, _rotate, _pairwise_sums, _index_of, _merge_sorted, _zip_dict, _invert, _best_key,
    _count_true, _has_duplicates, _every_other, _sort_by_length, _total_length, _swap_ends, _group_by_parity,
    _word_lengths,
)  # fmt: skip


def exercise_problems() -> list[dict]:
    """Every exercise as a problem dict (data/README.md's schema), split ``train``, in a fixed order.

    Deterministic (no randomness at all); no two variants render the same prompt (tested).

    Raises:
        RuntimeError: a kind is broken (see :func:`datalib.generate.render_spec`).
    """
    return [
        {
            "task_id": f"{TASK_PREFIX}/{kind.__name__.lstrip('_')}/{v}",
            **render_spec(kind(v)),
            "instruction": INSTRUCTION,
            "family": FAMILY,
            "split": "train",
            "source": SOURCE,
        }
        for kind in KINDS
        for v in range(N_VARIANTS)
    ]


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9_]+", text.lower())


def humaneval_overlap(exercises: Sequence[dict], humaneval: Sequence[dict], n: int = 10) -> dict:
    """Decontamination: shared entry points and shared ``n``-word runs between exercises and HumanEval.

    Words are lowercase runs of ``[a-z0-9_]`` of the prompt plus the canonical solution (punctuation dropped), the
    usual n-gram decontamination of code benchmarks (e.g. the StarCoder / OctoPack decontamination against HumanEval
    used 10-grams at most as strict). Returns ``{"n": n, "entry_points": [...], "ngram_hits": [(task_id,
    humaneval task_id, run)], "n_entry_points", "n_ngram_hits", "checked": len(exercises)}``; both lists are empty
    (both counts 0) for clean data.
    """
    grams: dict[tuple[str, ...], str] = {}
    for p in humaneval:
        words = _words(p["prompt"] + "\n" + p["canonical_solution"])
        for i in range(len(words) - n + 1):
            grams.setdefault(tuple(words[i : i + n]), p["task_id"])
    names = {p["entry_point"] for p in humaneval}
    hits = []
    for p in exercises:
        words = _words(p["prompt"] + "\n" + p["canonical_solution"])
        for i in range(len(words) - n + 1):
            run = tuple(words[i : i + n])
            if run in grams:
                hits.append((p["task_id"], grams[run], " ".join(run)))
                break
    shared = sorted(p["entry_point"] for p in exercises if p["entry_point"] in names)
    return {
        "n": n,
        "checked": len(exercises),
        "n_entry_points": len(shared),
        "n_ngram_hits": len(hits),
        "entry_points": shared,
        "ngram_hits": hits,
    }
