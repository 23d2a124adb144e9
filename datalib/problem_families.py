"""The families of the bundled data-cleaning problems (generator v1): definitions only, no I/O.

A *family* is one kind of cleaning function (strip-and-drop-empty, dedupe preserving order, parse ``k=v`` pairs,
...). It has behaviour *axes* (keep first or last, case handling, separator, return container, ...) and a list of
*nouns* (``tags``, ``usernames``, ...) that name the function, word the docstring and supply the test data; a noun may
also carry the family's constants (a clamp range, a field name, a length limit). A *variant* is one option per
axis plus one noun; :func:`catalogue` enumerates a family's variants in a fixed order, and :meth:`Variant.spec`
builds the reference solution (one ``# Step k`` per step), the docstring text and the test inputs.
:mod:`datalib.generate` runs the reference on the inputs to get the expected outputs and renders the problem dicts.

Layout: the data types, the helpers and the nouns several families share come first; then one section per family
holding its constants, its builder, the nouns only it uses and its `Family` entry; `FAMILIES` lists the entries in
the catalogue's order at the end.

Everything here is deterministic data: no sets are iterated and no ``hash()`` is used, so the rendering is the same
in every process (``PYTHONHASHSEED`` varies). Source: the project seed's ``clean_string_list`` example
("strip strings and drop empty ones"), generalised to 20 families.
"""

from __future__ import annotations

import itertools
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from typing import Any

# --------------------------------------------------------------------------------------------------- data types


@dataclass(frozen=True)
class Noun:
    """What a variant is about: names the function (``ident``), words the text and carries the test data.

    samples: family-specific sample values (strings for text families, numbers for clamping, ...).
    info: family-specific constants (a range, field names, a length limit, ...).
    """

    plural: str
    singular: str
    samples: tuple = ()
    info: dict = field(default_factory=dict, hash=False)

    @property
    def ident(self) -> str:
        return _ident(self.plural)

    @property
    def singular_ident(self) -> str:
        return _ident(self.singular)


@dataclass(frozen=True)
class Axis:
    """One behaviour axis: its values and the function-name fragment of each ("" = no fragment).

    minor: a surface axis (the returned container type). Variants that differ only on minor axes belong to the
        same split group (see :attr:`Variant.group`), so a test problem is never a train problem in a tuple.
    """

    name: str
    values: tuple[str, ...]
    fragments: tuple[str, ...]
    minor: bool = False


@dataclass(frozen=True)
class Spec:
    """A variant's rendered parts (before its expected outputs are computed).

    params: (argument name, annotation) pairs. returns: the return annotation. summary: imperative sentences saying
    what the function does. rules: edge-case sentences (None, empty, whitespace, wrong types). steps: (step text,
    code indented by 4 spaces) pairs. cases: argument tuples, one per test assert. modules: stdlib modules to import.
    """

    entry_point: str
    params: tuple[tuple[str, str], ...]
    returns: str
    summary: str
    rules: tuple[str, ...]
    steps: tuple[tuple[str, str], ...]
    cases: tuple[tuple[Any, ...], ...]
    key_patterns: tuple[str, ...]
    input_desc: str
    modules: tuple[str, ...] = ()


@dataclass(frozen=True)
class Family:
    """A kind of cleaning function: axes x nouns, and ``build(entry_point, noun, options) -> Spec``."""

    name: str
    axes: tuple[Axis, ...]
    verbs: tuple[str, ...]
    nouns: tuple[Noun, ...]
    build: Callable[[str, Noun, dict[str, str]], Spec]
    singular: bool = False  # name the function after the singular noun (one dict / one string in)


@dataclass(frozen=True)
class Variant:
    """One problem of a family: an option per axis plus a noun (and the verb and phrasing, rotated)."""

    family: Family
    index: int
    options: tuple[tuple[str, str], ...]
    noun: Noun
    verb: str
    phrasing: int

    @property
    def entry_point(self) -> str:
        opts = dict(self.options)
        one = self.family.singular or opts.get("input") == "one"
        parts = [self.verb, self.noun.singular_ident if one else self.noun.ident]
        for axis in self.family.axes:
            fragment = axis.fragments[axis.values.index(opts[axis.name])]
            if fragment:
                parts.append(fragment)
        return "_".join(parts)

    @property
    def group(self) -> str:
        """The split group: family + the non-minor options. Nouns, verbs, phrasings and minor axes stay inside."""
        minor = {a.name for a in self.family.axes if a.minor}
        major = ",".join(f"{k}={v}" for k, v in self.options if k not in minor)
        return f"{self.family.name}[{major}]"

    def spec(self) -> Spec:
        return self.family.build(self.entry_point, self.noun, dict(self.options))


N_PHRASINGS = 4
INSTRUCTION_TEMPLATES = (
    "Write a Python function `{call}`. {summary} {rules}",
    "Implement `{signature}` in Python. {summary} Edge cases: {rules}",
    "I need a small data-cleaning helper named `{name}` that takes {input_desc}. {summary} {rules}",
    "Please write `{call}`, which receives {input_desc}. {summary} Also handle these cases: {rules}",
)


def catalogue(family: Family) -> tuple[Variant, ...]:
    """All variants of a family, in a fixed order: index = option-combination index * n_nouns + noun index."""
    return _catalogue(family.name)


@cache
def _catalogue(name: str) -> tuple[Variant, ...]:
    family = family_by_name(name)
    combos = list(itertools.product(*(axis.values for axis in family.axes)))
    out = []
    for c, values in enumerate(combos):
        options = tuple(zip((a.name for a in family.axes), values, strict=True))
        for k, noun in enumerate(family.nouns):
            out.append(
                Variant(
                    family=family,
                    index=c * len(family.nouns) + k,
                    options=options,
                    noun=noun,
                    verb=family.verbs[(c + 2 * k) % len(family.verbs)],
                    phrasing=(c + k) % N_PHRASINGS,
                )
            )
    return tuple(out)


def family_by_name(name: str) -> Family:
    """The family called ``name``. Raises KeyError (naming the known families) when there is none."""
    for family in FAMILIES:
        if family.name == name:
            return family
    raise KeyError(f"unknown problem family {name!r}; known: {[f.name for f in FAMILIES]}")


# ----------------------------------------------------------------------------------------------- small helpers


def _ident(words: str) -> str:
    return "_".join(words.replace("-", " ").split()).lower()


def _step(text: str, code: str) -> tuple[str, str]:
    """A step: its comment text and its code, dedented then indented as a function body (4 spaces)."""
    return text, textwrap.indent(textwrap.dedent(code).strip("\n"), "    ")


def _out(returns: str, elem: str) -> str:
    return f"List[{elem}]" if returns == "list" else f"Tuple[{elem}, ...]"


def _empty(returns: str) -> str:
    return "[]" if returns == "list" else "()"


def _collect(gen: str, returns: str) -> str:
    return f"[{gen}]" if returns == "list" else f"tuple({gen})"


def _tuple_note(returns: str) -> str:
    return " Return a tuple, not a list." if returns == "tuple" else ""


def _axis(name: str, *pairs: tuple[str, str], minor: bool = False) -> Axis:
    return Axis(name, tuple(v for v, _ in pairs), tuple(f for _, f in pairs), minor)


_RETURNS = _axis("returns", ("list", ""), ("tuple", "as_tuple"), minor=True)


SEQ = "Optional[Sequence[Any]]"

# ------------------------------------------------------------------------------------------------------- nouns

TEXT_NOUNS = (
    Noun("tags", "tag", ("python", "Data Science", "ml", "web dev", "API")),
    Noun("usernames", "username", ("alice", "Bob_Smith", "carol.w", "dave", "EveOnline")),
    Noun("labels", "label", ("urgent", "Bug", "needs review", "wontfix", "UI polish")),
    Noun("keywords", "keyword", ("machine learning", "SQL", "cloud", "Big Data", "etl")),
    Noun("cities", "city", ("Paris", "new york", "Lagos", "Sao Paulo", "oslo")),
    Noun("categories", "category", ("Books", "home garden", "toys", "Electronics", "sports")),
    Noun("hostnames", "hostname", ("api.example.com", "DB-main", "cache-two", "Web.Local", "mail")),
    Noun("filenames", "filename", ("report.pdf", "Notes.TXT", "data final.csv", "image.png", "readme")),
    Noun("colors", "color", ("red", "Dark Blue", "teal", "light green", "Black")),
    Noun("topics", "topic", ("climate", "Open Source", "ai safety", "Startups", "music")),
    Noun("skills", "skill", ("python", "Public Speaking", "excel", "team lead", "Go")),
    Noun("languages", "language", ("English", "french", "Old Norse", "swahili", "Japanese")),
    Noun("countries", "country", ("France", "new zealand", "Peru", "south korea", "Kenya")),
    Noun("ingredients", "ingredient", ("flour", "Brown Sugar", "eggs", "olive oil", "Salt")),
    Noun("departments", "department", ("Sales", "human resources", "IT", "legal", "Customer Care")),
    Noun("genres", "genre", ("jazz", "Hip Hop", "rock", "Classical", "drum and bass")),
)


DICT_NOUNS = (
    Noun(
        "profiles",
        "profile",
        info={
            "record": {"name": "Ada", "email": "ada@example.com", "bio": "  ", "phone": None, "age": 36},
            "keys": (" Full Name", "EMAIL", "home  city", "Zip Code"),
        },
    ),
    Noun(
        "contacts",
        "contact",
        info={
            "record": {"name": "Bob", "phone": "", "email": None, "company": " Acme ", "notes": []},
            "keys": ("First Name", " LAST NAME", "Phone  Number", "e mail"),
        },
    ),
    Noun(
        "orders",
        "order",
        info={
            "record": {"id": 17, "coupon": None, "note": "", "total": 0, "items": ["pen"]},
            "keys": ("Order ID", " Ship  To", "TOTAL", "Gift Note"),
        },
    ),
    Noun(
        "addresses",
        "address",
        info={
            "record": {"street": "1 Main St", "line2": "  ", "city": "Oslo", "state": None, "zip": "0150"},
            "keys": ("Street Name", " CITY", "Postal  Code", "country code"),
        },
    ),
    Noun(
        "products",
        "product",
        info={
            "record": {"sku": "A-1", "name": " Lamp ", "color": None, "tags": [], "price": 19.5},
            "keys": ("Product Name", " SKU", "unit  price", "In Stock"),
        },
    ),
    Noun(
        "events",
        "event",
        info={
            "record": {"title": "Launch", "venue": "", "starts": "09:00", "speakers": {}, "capacity": None},
            "keys": ("Event Title", " VENUE", "start  time", "Max Guests"),
        },
    ),
    Noun(
        "accounts",
        "account",
        info={
            "record": {"user": "dana", "plan": "pro", "referrer": None, "notes": " ", "active": False},
            "keys": ("User Name", " PLAN", "sign up  date", "Is Active"),
        },
    ),
    Noun(
        "survey responses",
        "survey response",
        info={
            "record": {"q1": "yes", "q2": "", "q3": None, "comment": "  great ", "score": 0},
            "keys": ("Question One", " SCORE", "free  text", "Would Recommend"),
        },
    ),
)


PARTICLES = ("van", "von", "de", "der", "da", "di", "du", "del", "la", "le")

PEOPLE_NOUNS = (
    Noun(
        "customers",
        "customer",
        ("ada lovelace", "JEAN-LUC PICARD", "ludwig van beethoven", "grace  hopper"),
        {"domain": "shop.example"},
    ),
    Noun(
        "students",
        "student",
        ("marie curie", "anne-marie DUVAL", "vincent van gogh", "ALAN turing"),
        {"domain": "school.edu"},
    ),
    Noun(
        "authors",
        "author",
        ("mary shelley", "jean-paul sartre", "simone de beauvoir", "LEO TOLSTOY"),
        {"domain": "press.org"},
    ),
    Noun(
        "members",
        "member",
        ("rosa parks", "mary-kate olsen", "ursula von der leyen", "NELSON mandela"),
        {"domain": "club.net"},
    ),
    Noun(
        "speakers",
        "speaker",
        ("ada yonath", "jean-claude van damme", "leonardo da vinci", "KATHERINE JOHNSON"),
        {"domain": "conf.io"},
    ),
    Noun(
        "players",
        "player",
        ("lionel messi", "pierre-emerick aubameyang", "robin van persie", "SERENA WILLIAMS"),
        {"domain": "league.gg"},
    ),
    Noun(
        "patients",
        "patient",
        ("john smith", "mary-jane watson", "charles de gaulle", "ELLA fitzgerald"),
        {"domain": "clinic.org"},
    ),
    Noun(
        "employees",
        "employee",
        ("tim berners-lee", "ANN-SOPHIE MUTTER", "johannes van der waals", "frida kahlo"),
        {"domain": "corp.com"},
    ),
    Noun(
        "guests",
        "guest",
        ("oscar wilde", "jean-luc godard", "leo di caprio", "BILLIE HOLIDAY"),
        {"domain": "hotel.travel"},
    ),
    Noun(
        "reviewers",
        "reviewer",
        ("ada palmer", "marie-claire ALAIN", "ludwig von mises", "carl sagan"),
        {"domain": "journal.org"},
    ),
)


def _records_noun(plural, singular, id_field, ids, group_field, groups, num_field, threshold):
    return Noun(
        plural,
        singular,
        info={
            "id": id_field,
            "ids": ids,
            "group": group_field,
            "groups": groups,
            "num": num_field,
            "threshold": threshold,
        },
    )


RECORD_NOUNS = (
    _records_noun(
        "orders", "order", "id", (101, 102, 103, 104), "status", ("paid", "Pending ", "paid", "PAID"), "total", 100
    ),
    _records_noun(
        "employees",
        "employee",
        "name",
        ("ana", "ben", "chloe", "dev"),
        "department",
        ("Sales", "sales", "IT", " it"),
        "salary",
        50000,
    ),
    _records_noun(
        "books",
        "book",
        "title",
        ("Dune", "Emma", "Ulysses", "Beloved"),
        "genre",
        ("scifi", "Classic", "classic ", "SciFi"),
        "pages",
        300,
    ),
    _records_noun(
        "students", "student", "name", ("Ola", "Max", "Ivy", "Sam"), "class", ("A", "b", "a", "B "), "score", 50
    ),
    _records_noun(
        "products",
        "product",
        "sku",
        ("P-1", "P-2", "P-3", "P-4"),
        "category",
        ("Toys", "toys", "Garden", "garden "),
        "price",
        20,
    ),
    _records_noun(
        "songs",
        "song",
        "title",
        ("Hey Jude", "Yesterday", "Imagine", "Help"),
        "artist",
        ("Beatles", "beatles", "Lennon", " lennon"),
        "plays",
        1000,
    ),
    _records_noun(
        "tickets", "ticket", "id", ("T1", "T2", "T3", "T4"), "priority", ("high", "Low", "HIGH", "low "), "age_days", 7
    ),
    _records_noun(
        "events",
        "event",
        "name",
        ("Expo", "Gala", "Hackathon", "Meetup"),
        "city",
        ("Oslo", "oslo", "Rome", "ROME"),
        "attendees",
        100,
    ),
    _records_noun(
        "users", "user", "username", ("ada", "bob", "cy", "di"), "country", ("NO", "no", "IT", "it "), "age", 18
    ),
    _records_noun(
        "movies",
        "movie",
        "title",
        ("Alien", "Heat", "Up", "Coco"),
        "studio",
        ("Fox", "fox", "Pixar", "PIXAR "),
        "rating",
        7,
    ),
)


def _lo_hi(samples: tuple[str, ...]) -> tuple[str, str]:
    """The largest and smallest sample: [largest, smallest] is out of order for any sort."""
    return max(samples), min(samples)


# ---------------------------------------------------------------------------------------- family: strip + drop


def _build_strip_drop_empty(name: str, noun: Noun, o: dict[str, str]) -> Spec:
    arg, s, ret = noun.ident, noun.samples, o["returns"]
    lower = o["case"] == "lower"
    summary = (
        f"Strip surrounding whitespace from each {noun.singular} in `{arg}` and drop the ones that end up empty"
        + (", lowercasing the rest." if lower else ".")
        + (" Keep the original order." if o["order"] == "input" else " Return them sorted with sorted().")
        + " Duplicates are kept."
        + _tuple_note(ret)
    )
    rules = [f"If `{arg}` is None, return an empty {ret}."]
    steps = [_step("treat a missing sequence as empty", f"if {arg} is None:\n    return {_empty(ret)}")]
    if o["non_str"] == "skip":
        rules.append("Elements that are not strings (None, numbers, ...) are skipped.")
        steps.append(
            _step("keep only the string elements", f"texts = [item for item in {arg} if isinstance(item, str)]")
        )
    else:
        rules.append("None elements are skipped; other non-strings (such as numbers) are converted with str() first.")
        steps.append(
            _step(
                "skip None and convert the other elements to strings",
                f"texts = [item if isinstance(item, str) else str(item) for item in {arg} if item is not None]",
            )
        )
    rules.append("Whitespace-only strings count as empty and are dropped.")
    if lower:
        steps.append(
            _step("strip surrounding whitespace and lowercase", "stripped = [text.strip().lower() for text in texts]")
        )
    else:
        steps.append(_step("strip surrounding whitespace", "stripped = [text.strip() for text in texts]"))
    if o["order"] == "input":
        steps.append(_step("drop the empty strings", "return " + _collect("text for text in stripped if text", ret)))
    else:
        steps.append(_step("drop the empty strings", "kept = [text for text in stripped if text]"))
        steps.append(_step("sort them", "return " + ("sorted(kept)" if ret == "list" else "tuple(sorted(kept))")))
    hi, lo = _lo_hi(s)
    cases = (
        ([f" {s[0]} ", "", s[1].upper(), "   ", f"{s[2]} "],),
        ([f" {hi}", lo, f"{s[3]}  "],),
        ([],),
        (None,),
        (["   ", "\t", " \n "],),
        ([s[0], 42, None, f" {s[1]} ", 3.5, s[0]],),
        ((f"{s[4]} ", "", s[3]),),
    )
    extra = "sorted(" if o["order"] == "sorted" else ".lower()" if lower else "isinstance("
    return Spec(
        name,
        ((arg, SEQ),),
        _out(ret, "str"),
        summary,
        tuple(rules),
        tuple(steps),
        cases,
        (".strip()", "is None", extra),
        f"a list (or tuple) of {noun.plural}",
    )


STRIP_DROP_EMPTY = Family(
    "strip_drop_empty",
    (
        _axis("non_str", ("skip", ""), ("str", "stringified")),
        _axis("case", ("keep", ""), ("lower", "lowercased")),
        _axis("order", ("input", ""), ("sorted", "sorted")),
        _RETURNS,
    ),
    ("clean", "tidy", "sanitize"),
    TEXT_NOUNS[:10],
    _build_strip_drop_empty,
)


# ------------------------------------------------------------------------------------- family: dedupe in order


def _build_dedupe_keep_order(name: str, noun: Noun, o: dict[str, str]) -> Spec:
    arg, s, ret = noun.ident, noun.samples, o["returns"]
    strip, skip_none, last = o["strip"] == "strip", o["none"] == "skip", o["keep"] == "last"
    summary = (
        f"Remove repeated {noun.plural} from `{arg}` while preserving order: "
        + (
            "keep only the last occurrence of each value, in the order those last occurrences appear."
            if last
            else "keep the first occurrence of each value."
        )
        + " Comparison is exact and case-sensitive; non-string values are compared as they are."
        + (
            " String elements are stripped of surrounding whitespace before comparing, and returned stripped."
            if strip
            else ""
        )
        + _tuple_note(ret)
    )
    rules = [f"If `{arg}` is None, return an empty {ret}."]
    rules.append("None elements are dropped." if skip_none else "None is an ordinary value (one None is kept).")
    rules.append(
        "A whitespace-only string becomes '' and counts as a duplicate of other empty strings."
        if strip
        else "Whitespace matters: 'a' and ' a' are different values."
    )
    steps = [_step("treat a missing sequence as empty", f"if {arg} is None:\n    return {_empty(ret)}")]
    src = arg
    if strip:
        cond = " if item is not None" if skip_none else ""
        text = "strip string elements" + (" and drop None" if skip_none else "")
        steps.append(_step(text, f"values = [item.strip() if isinstance(item, str) else item for item in {arg}{cond}]"))
        src = "values"
    elif skip_none:
        steps.append(_step("drop None elements", f"values = [item for item in {arg} if item is not None]"))
        src = "values"
    loop_src = f"reversed({src})" if last else src
    text = (
        "walk from the end so the last occurrence of each value is kept"
        if last
        else "keep each value the first time it is seen"
    )
    steps.append(
        _step(
            text,
            f"""
            seen = set()
            unique = []
            for value in {loop_src}:
                if value not in seen:
                    seen.add(value)
                    unique.append(value)
            """,
        )
    )
    if last:
        steps.append(_step("restore the original order", "unique.reverse()"))
    steps.append(_step("return the unique values", "return unique" if ret == "list" else "return tuple(unique)"))
    cases = (
        ([s[0], s[1], s[0], s[2], s[1]],),
        ([f" {s[3]}", s[3], None, s[4], None, f"{s[3]} "],),
        ([],),
        (None,),
        (["  ", "", "  ", s[0]],),
        ([1, "1", 1, s[1], 2.5, s[1], s[1].swapcase()],),
        ((s[2], s[2], s[0]),),
    )
    return Spec(
        name,
        ((arg, SEQ),),
        _out(ret, "Any"),
        summary,
        tuple(rules),
        tuple(steps),
        cases,
        ("not in seen", "reversed(" if last else ".append(", "is not None" if skip_none else "seen.add("),
        f"a list (or tuple) of {noun.plural}",
    )


DEDUPE_KEEP_ORDER = Family(
    "dedupe_keep_order",
    (
        _axis("keep", ("first", ""), ("last", "keep_last")),
        _axis("none", ("skip", ""), ("keep", "keep_none")),
        _axis("strip", ("exact", ""), ("strip", "stripped")),
        _RETURNS,
    ),
    ("dedupe", "unique", "distinct"),
    TEXT_NOUNS[3:13],
    _build_dedupe_keep_order,
)


# ------------------------------------------------------------------------------------ family: whitespace runs

_JOINERS = {
    "space": (" ", "single space"),
    "underscore": ("_", "single underscore (`_`)"),
    "hyphen": ("-", "single hyphen (`-`)"),
}


def _build_normalise_whitespace(name: str, noun: Noun, o: dict[str, str]) -> Spec:
    joiner, joiner_desc = _JOINERS[o["joiner"]]
    lower = o["case"] == "lower"
    split = "text.lower().split()" if lower else "text.split()"
    s = noun.samples
    how = (
        f"strip leading and trailing whitespace and replace every inner run of whitespace (spaces, tabs, newlines) "
        f"with a {joiner_desc}" + (", and lowercase it" if lower else "")
    )
    if o["input"] == "one":
        arg = noun.singular_ident
        summary = f"Normalise the whitespace of the {noun.singular} `{arg}`: {how}."
        rules = (
            f"If `{arg}` is None, return an empty string.",
            "A value that is not a string (for example a number) is converted with str() first.",
            f"A whitespace-only {noun.singular} becomes an empty string.",
        )
        steps = (
            _step(f"treat None as an empty {noun.singular}", f'if {arg} is None:\n    return ""'),
            _step("convert non-strings with str()", f"text = {arg} if isinstance({arg}, str) else str({arg})"),
            _step("split on runs of whitespace" + (", lowercased" if lower else ""), f"words = {split}"),
            _step(f"join the words with a {joiner_desc}", f'return "{joiner}".join(words)'),
        )
        cases = (
            (f"  {s[0]}   {s[1]} ",),
            (f"{s[2]}\n\n{s[3]}\t",),
            ("",),
            (None,),
            ("  \t\n ",),
            (42,),
            (f" {s[4].upper()}  {s[0]} ",),
        )
        params, returns, desc = ((arg, "Optional[Any]"),), "str", f"a single {noun.singular} (a string)"
    else:
        arg = noun.ident
        summary = (
            f"Normalise the whitespace of every {noun.singular} in `{arg}`: {how}. Keep the order "
            "(one output string per input string)."
        )
        rules = (
            f"If `{arg}` is None, return an empty list.",
            "Elements that are not strings are skipped.",
            f"A whitespace-only {noun.singular} becomes an empty string (it is kept).",
        )
        steps = (
            _step("treat a missing sequence as empty", f"if {arg} is None:\n    return []"),
            _step("keep only the strings", f"texts = [item for item in {arg} if isinstance(item, str)]"),
            _step(
                "split each string on runs of whitespace"
                + (", lowercased," if lower else "")
                + f" and rejoin with a {joiner_desc}",
                f'return ["{joiner}".join({split}) for text in texts]',
            ),
        )
        cases = (
            ([f"  {s[0]}   {s[1]} ", s[2]],),
            ([f"{s[3]}\t\t{s[4]}", "   ", None, 7],),
            ([],),
            (None,),
            (["   ", "\n"],),
            ([12, s[0].upper(), None, 3.5, f" {s[1]} "],),
            ((f" {s[2]}  {s[3]}",),),
        )
        params, returns, desc = ((arg, SEQ),), "List[str]", f"a list (or tuple) of {noun.plural}"
    return Spec(name, params, returns, summary, rules, steps, cases, (".split()", f'"{joiner}".join('), desc)


NORMALISE_WHITESPACE = Family(
    "normalise_whitespace",
    (
        _axis("joiner", ("space", ""), ("underscore", "underscored"), ("hyphen", "hyphenated")),
        _axis("case", ("keep", ""), ("lower", "lowercased")),
        _axis("input", ("one", ""), ("many", "each")),
    ),
    ("squash_spaces_in", "normalize_spacing_of", "collapse_whitespace_in"),
    TEXT_NOUNS[4:16],
    _build_normalise_whitespace,
)


# -------------------------------------------------------------------------------------- family: parse k=v text

_PAIR_SEPS = {"semicolon": ";", "comma": ",", "ampersand": "&", "newline": "\n"}
_KV_SEPS = {"equals": "=", "colon": ":"}


def _build_parse_key_value(name: str, noun: Noun, o: dict[str, str]) -> Spec:
    sep, kv = _PAIR_SEPS[o["pair_sep"]], _KV_SEPS[o["kv_sep"]]
    lower, first = o["key_case"] == "lower", o["dup"] == "first"
    pairs = noun.samples
    example = sep.join(f"{k}{kv}{v}" for k, v in pairs[:2])
    sep_text = (
        "one pair per line (split the text with str.splitlines())" if sep == "\n" else f"pairs are separated by `{sep}`"
    )
    summary = (
        f"Parse a string of {noun.plural} into a dict: {sep_text}, and each pair splits into key and value at the "
        f"first `{kv}`"
        + (f" (for example `{example}`)" if sep != "\n" else "")
        + ". Keys and values are stripped of surrounding whitespace"
        + (", and keys are lowercased" if lower else "")
        + ". If a key appears more than once, the "
        + ("first value wins." if first else "last value wins.")
        + " Values stay strings."
    )
    rules = (
        "If `text` is None or not a string, return an empty dict.",
        f"Pieces without `{kv}` (including empty or whitespace-only pieces) are ignored.",
        "Pairs whose key is empty after stripping are ignored.",
        f"A value may itself contain `{kv}`; only the first `{kv}` splits.",
    )
    split = "text.splitlines()" if sep == "\n" else f'text.split("{sep}")'
    key = "key.strip().lower()" if lower else "key.strip()"
    steps = [
        _step("return an empty dict for None or non-string input", "if not isinstance(text, str):\n    return {}"),
        _step(
            f"split the text into pieces and keep those that contain '{kv}'",
            f'pieces = [piece for piece in {split} if "{kv}" in piece]',
        ),
        _step(
            f"split each piece at the first '{kv}' and strip key and value"
            + (", lowercasing the key" if lower else ""),
            f'pairs = [({key}, value.strip()) for key, value in (piece.split("{kv}", 1) for piece in pieces)]',
        ),
        _step("drop pairs with an empty key", "pairs = [(key, value) for key, value in pairs if key]"),
    ]
    if first:
        steps.append(
            _step(
                "build the dict, keeping the first value of each key",
                """
                result = {}
                for key, value in pairs:
                    result.setdefault(key, value)
                return result
                """,
            )
        )
    else:
        steps.append(_step("build the dict; later pairs overwrite earlier ones", "return dict(pairs)"))
    (k0, v0), (k1, v1), (k2, v2), (k3, v3) = pairs
    cases = (
        (sep.join(f"{k}{kv}{v}" for k, v in pairs[:3]),),
        (sep.join([f" {k0.upper()} {kv} {v0} ", f"{k1}{kv}{v1}{kv}x", f"{k0}{kv}{v3}", f"{k1}{kv}{v2}"]),),
        (sep.join(["novalue", "", f"{kv}orphan", f"{k3}{kv}{v3}", "   "]),),
        ("",),
        (None,),
        ("   ",),
        (42,),
    )
    return Spec(
        name,
        (("text", "Optional[str]"),),
        "Dict[str, str]",
        summary,
        rules,
        tuple(steps),
        cases,
        (f'.split("{kv}", 1)', "isinstance(", ".strip()"),
        f"a string of {noun.plural}",
    )


PAIR_NOUNS = (
    Noun("settings", "setting", (("host", "localhost"), ("port", "8080"), ("debug", "true"), ("mode", "fast"))),
    Noun("query parameters", "query parameter", (("page", "2"), ("sort", "name"), ("q", "shoes"), ("limit", "50"))),
    Noun(
        "headers",
        "header",
        (("Accept", "text/html"), ("Host", "example.org"), ("Connection", "close"), ("Cache-Control", "no-cache")),
    ),
    Noun(
        "environment variables",
        "environment variable",
        (("HOME", "/root"), ("LANG", "en_US"), ("DEBUG", "1"), ("PATH", "/usr/bin")),
    ),
    Noun("cookies", "cookie", (("session", "abc123"), ("theme", "dark"), ("lang", "en"), ("seen", "yes"))),
    Noun("options", "option", (("color", "blue"), ("size", "XL"), ("gift", "no"), ("qty", "3"))),
)


PARSE_KEY_VALUE = Family(
    "parse_key_value",
    (
        _axis(
            "pair_sep",
            ("semicolon", ""),
            ("comma", "comma_separated"),
            ("ampersand", "ampersand_separated"),
            ("newline", "per_line"),
        ),
        _axis("kv_sep", ("equals", ""), ("colon", "colon")),
        _axis("dup", ("last", ""), ("first", "first_wins")),
        _axis("key_case", ("keep", ""), ("lower", "lower_keys")),
    ),
    ("parse", "read", "decode"),
    PAIR_NOUNS,
    _build_parse_key_value,
)


# ---------------------------------------------------------------------------------------- family: clamp ranges


def _build_clamp_numbers(name: str, noun: Noun, o: dict[str, str]) -> Spec:
    arg, ret = noun.ident, o["returns"]
    lo, hi = noun.info["lo"], noun.info["hi"]
    clamp, rounding = o["mode"] == "clamp", o["rounding"] == "round"
    if clamp:
        summary = (
            f"Clamp every {noun.singular} in `{arg}` into the range [{lo}, {hi}]: values below {lo} become {lo} "
            f"and values above {hi} become {hi}."
        )
    else:
        summary = f"Keep only the {noun.plural} in `{arg}` that lie within [{lo}, {hi}] (inclusive) and drop the rest."
    summary += (
        (" Round each resulting value to the nearest integer with round()." if rounding else "")
        + " Keep the original order."
        + _tuple_note(ret)
    )
    rules = [f"If `{arg}` is None, return an empty {ret}."]
    rules.append(
        "None elements are skipped." if o["none"] == "skip" else f"None elements are treated as {lo} (the lower bound)."
    )
    rules.append("Booleans, strings (even numeric or whitespace-only ones) and other non-numbers are skipped.")
    steps = [_step("treat a missing sequence as empty", f"if {arg} is None:\n    return {_empty(ret)}")]
    src = arg
    if o["none"] == "low":
        steps.append(
            _step(
                f"replace None with the lower bound {lo}",
                f"values = [{lo} if value is None else value for value in {arg}]",
            )
        )
        src = "values"
    steps.append(
        _step(
            "keep only real numbers (ints and floats, not bools)",
            f"numbers = [value for value in {src} if isinstance(value, (int, float)) and not isinstance(value, bool)]",
        )
    )
    if clamp:
        text, gen = f"clamp each number into [{lo}, {hi}]", f"min(max(number, {lo}), {hi}) for number in numbers"
    else:
        text, gen = f"keep the numbers within [{lo}, {hi}]", f"number for number in numbers if {lo} <= number <= {hi}"
    if rounding:
        steps.append(_step(text, f"limited = [{gen}]"))
        steps.append(
            _step("round to the nearest integer", "return " + _collect("round(value) for value in limited", ret))
        )
    else:
        steps.append(_step(text, "return " + _collect(gen, ret)))
    s = noun.samples
    cases = (
        (list(s),),
        ([hi + 1.2, lo - 0.7, hi, lo],),
        ([],),
        (None,),
        ([s[0], "  ", str(s[1]), True, None, s[3]],),
        ((s[2], None, s[4]),),
    )
    return Spec(
        name,
        ((arg, SEQ),),
        _out(ret, "float"),
        summary,
        tuple(rules),
        tuple(steps),
        cases,
        ("isinstance(", "min(max(" if clamp else "<=", "round(" if rounding else "not isinstance(value, bool)"),
        f"a list (or tuple) of {noun.plural}",
    )


RANGE_NOUNS = (
    Noun("percentages", "percentage", (12.4, 101, -3, 55.7, 100), {"lo": 0, "hi": 100}),
    Noun("ratings", "rating", (4, 0, 5.6, 3.2, 7), {"lo": 1, "hi": 5}),
    Noun("temperatures", "temperature", (21.6, -45, 55.2, 0, 49.9), {"lo": -30, "hi": 50}),
    Noun("ages", "age", (34, -1, 130, 72.3, 0), {"lo": 0, "hi": 120}),
    Noun("scores", "score", (7.8, 11, -2, 10, 4), {"lo": 0, "hi": 10}),
    Noun("volumes", "volume", (3, 12.2, -0.4, 11, 6.6), {"lo": 0, "hi": 11}),
    Noun("brightness levels", "brightness level", (128, 300, -20, 254.7, 0), {"lo": 0, "hi": 255}),
    Noun("latitudes", "latitude", (45.3, -91, 90, 12.8, 95), {"lo": -90, "hi": 90}),
    Noun("speeds", "speed", (88.8, 320, -5, 120, 299.6), {"lo": 0, "hi": 300}),
    Noun("tire pressures", "tire pressure", (32.4, 18, 51.3, 35, 44), {"lo": 20, "hi": 50}),
)


CLAMP_NUMBERS = Family(
    "clamp_numbers",
    (
        _axis("mode", ("clamp", ""), ("drop", "drop_outliers")),
        _axis("none", ("skip", ""), ("low", "none_as_min")),
        _axis("rounding", ("keep", ""), ("round", "rounded")),
        _RETURNS,
    ),
    ("fit", "bound", "limit"),
    RANGE_NOUNS,
    _build_clamp_numbers,
)


# ------------------------------------------------------------------------------------- family: drop missing values

_MISSING = {
    "none": "A value is missing when it is None.",
    "empty": "A value is missing when it is None or the empty string ''.",
    "blank": "A value is missing when it is None or a string that is empty or whitespace-only.",
    "container": (
        "A value is missing when it is None, a string that is empty or whitespace-only, or an empty list or dict."
    ),
}


def _build_drop_missing_values(name: str, noun: Noun, o: dict[str, str]) -> Spec:
    arg, missing = noun.singular_ident, o["missing"]
    strip, nested = o["strip"] == "strip", o["nested"] == "nested"
    summary = (
        f"Return a copy of the {noun.singular} dict `{arg}` without the entries whose value is missing. "
        + _MISSING[missing]
        + (
            " Values that are dicts are cleaned the same way, recursively, before the check"
            + (" (so a nested dict that ends up empty is dropped too)." if missing == "container" else ".")
            if nested
            else " Nested dicts are not looked into."
        )
        + (" String values that are kept are then stripped of surrounding whitespace." if strip else "")
        + " Keep the key order and do not modify the input."
    )
    rules = [f"If `{arg}` is None, return an empty dict.", "0, False and other falsy non-missing values are kept."]
    if missing in ("none", "empty"):
        rules.append("A whitespace-only string is not missing (it is kept).")
    if missing != "container":
        rules.append("Empty lists and dicts are kept.")
    steps = [_step("treat None as an empty dict", f"if {arg} is None:\n    return {{}}")]
    src = f"{arg}.items()"
    if nested:
        steps.append(
            _step(
                "clean nested dicts recursively",
                f"values = {{key: {name}(value) if isinstance(value, dict) else value"
                f" for key, value in {arg}.items()}}",
            )
        )
        src = "values.items()"
    if missing == "none":
        keep_if, keep_text = "value is not None", "drop the entries whose value is None"
    elif missing == "empty":
        keep_if, keep_text = 'value is not None and value != ""', "drop the entries whose value is None or ''"
    else:
        body = "return isinstance(value, (list, dict)) and not value" if missing == "container" else "return False"
        steps.append(
            _step(
                "decide which values count as missing",
                f"""
                def is_missing(value):
                    if value is None:
                        return True
                    if isinstance(value, str):
                        return not value.strip()
                    {body}
                """,
            )
        )
        keep_if, keep_text = "not is_missing(value)", "keep the entries whose value is not missing"
    if strip:
        steps.append(_step(keep_text, f"kept = {{key: value for key, value in {src} if {keep_if}}}"))
        steps.append(
            _step(
                "strip the kept string values",
                "return {key: value.strip() if isinstance(value, str) else value for key, value in kept.items()}",
            )
        )
    else:
        steps.append(_step(keep_text, f"return {{key: value for key, value in {src} if {keep_if}}}"))
    record = noun.info["record"]
    k = list(record)
    cases = (
        (dict(record),),
        ({k[0]: "  ", k[1]: {"inner": None, "kept": " x "}, k[2]: 0, k[3]: "", k[4]: {"gone": None}},),
        ({},),
        (None,),
        ({k[0]: "   ", k[1]: "\t", k[2]: " ok "},),
        ({1: None, k[2]: False, k[3]: 0.0, k[4]: [None], k[0]: []},),
    )
    if strip or missing in ("blank", "container"):
        patterns = ("is None", ".items()", ".strip()")
    else:
        patterns = ("is None", ".items()", "is not None")
    return Spec(
        name,
        ((arg, "Optional[Dict[Any, Any]]"),),
        "Dict[Any, Any]",
        summary,
        tuple(rules),
        tuple(steps),
        cases,
        patterns,
        f"a {noun.singular} dict",
    )


DROP_MISSING_VALUES = Family(
    "drop_missing_values",
    (
        _axis(
            "missing",
            ("none", ""),
            ("empty", "or_empty"),
            ("blank", "or_blank"),
            ("container", "or_empty_containers"),
        ),
        _axis("strip", ("keep", ""), ("strip", "stripped")),
        _axis("nested", ("flat", ""), ("nested", "deep")),
    ),
    ("drop_missing_in", "prune", "compact"),
    DICT_NOUNS,
    _build_drop_missing_values,
    singular=True,
)


# ---------------------------------------------------------------------------------------- family: merge counts


def _build_merge_counts(name: str, noun: Noun, o: dict[str, str]) -> Spec:
    two, norm = o["inputs"] == "two", o["keys"] == "normalised"
    pairs, drop_zero = o["output"] == "pairs", o["zero"] == "drop"
    empty = "[]" if pairs else "{}"
    if two:
        summary = f"Merge two dicts of {noun.plural} (`first` and `second`) by adding up the values of matching keys."
        params = (("first", "Optional[Dict[Any, Any]]"), ("second", "Optional[Dict[Any, Any]]"))
        rules = ["A None argument counts as an empty dict."]
        steps = [
            _step(
                "collect the dicts that are present",
                "sources = [counts for counts in (first, second) if counts is not None]",
            )
        ]
        desc = f"two dicts of {noun.plural}"
    else:
        arg = noun.ident
        summary = (
            f"Merge the dicts of {noun.plural} in the list `{arg}` into one by adding up the values of matching keys."
        )
        params = ((arg, "Optional[Sequence[Optional[Dict[Any, Any]]]]"),)
        rules = [f"If `{arg}` is None, return an empty result; None entries in the list are skipped."]
        steps = [
            _step("treat a missing list as empty", f"if {arg} is None:\n    return {empty}"),
            _step("skip None entries", f"sources = [counts for counts in {arg} if counts is not None]"),
        ]
        desc = f"a list of dicts of {noun.plural}"
    summary += (
        (
            " Keys are stripped and lowercased before merging, so ' Apples' and 'apples' are the same key."
            if norm
            else ""
        )
        + (" Drop keys whose total is 0." if drop_zero else "")
        + (
            " Return a list of (key, total) tuples sorted by total, highest first, ties broken by key in ascending"
            " order."
            if pairs
            else " Return the totals as a dict, keys in first-seen order."
        )
    )
    rules.append(
        "Entries whose key is not a string, or whose value is not an int or float (bools included), are ignored."
    )
    rules.append("The inputs are not modified.")
    norm_line = "\n                    key = key.strip().lower()" if norm else ""
    steps.append(
        _step(
            "add up the numeric values per string key" + (" (keys stripped and lowercased)" if norm else ""),
            f"""
            totals = {{}}
            for counts in sources:
                for key, value in counts.items():
                    if not isinstance(key, str) or isinstance(value, bool) or not isinstance(value, (int, float)):
                        continue{norm_line}
                    totals[key] = totals.get(key, 0) + value
            """,
        )
    )
    if drop_zero:
        steps.append(
            _step(
                "drop keys whose total is zero", "totals = {key: total for key, total in totals.items() if total != 0}"
            )
        )
    if pairs:
        steps.append(
            _step(
                "sort by total (highest first), then by key",
                "return sorted(totals.items(), key=lambda item: (-item[1], item[0]))",
            )
        )
    else:
        steps.append(_step("return the totals", "return totals"))
    k0, k1, k2, k3 = noun.samples
    a, b = {k0: 2, k1: 1}, {k1: 3, k2: 5, k3: 4}
    c = {k0: 1, f" {k0.upper()} ": 2, k3: 3}
    d = {k3: -3, k1: 0, k2: 6}
    bad = {k0: "3", k1: True, 5: 2, k2: 2.5, "  ": 1}
    if two:
        cases = ((a, b), (c, d), ({}, {}), (None, {k1: 2}), (None, None), (bad, {k2: None, k0: 1}))
    else:
        cases = (([a, b],), ([c, None, d],), ([],), (None,), ([None, None],), ([bad, {k2: None, k0: 1}],))
    return Spec(
        name,
        params,
        "List[Tuple[str, float]]" if pairs else "Dict[str, float]",
        summary,
        tuple(rules),
        tuple(steps),
        cases,
        (".get(key, 0)", "isinstance(value, bool)", "sorted(" if pairs else ".items()"),
        desc,
    )


COUNT_NOUNS = (
    Noun("word counts", "word count", ("the", "data", "code", "model")),
    Noun("inventories", "inventory", ("apples", "pears", "plums", "figs")),
    Noun("vote tallies", "vote tally", ("alice", "bob", "carol", "dan")),
    Noun("page views", "page view count", ("/home", "/about", "/blog", "/shop")),
    Noun("sales", "sales count", ("mugs", "shirts", "hats", "pins")),
    Noun("click counts", "click count", ("buy", "share", "like", "save")),
    Noun("downloads", "download count", ("numpy", "pandas", "flask", "requests")),
    Noun("team points", "team points", ("red team", "blue team", "green team", "gold team")),
    Noun("visits", "visit count", ("france", "japan", "peru", "kenya")),
    Noun("stock levels", "stock level", ("bolts", "nuts", "screws", "washers")),
)


MERGE_COUNTS = Family(
    "merge_counts",
    (
        _axis("inputs", ("two", "pair"), ("many", "all")),
        _axis("keys", ("exact", ""), ("normalised", "normalized_keys")),
        _axis("zero", ("keep", ""), ("drop", "nonzero")),
        _axis("output", ("dict", ""), ("pairs", "ranked")),
    ),
    ("merge", "combine", "sum"),
    COUNT_NOUNS,
    _build_merge_counts,
)


# ------------------------------------------------------------------------------------------- family: flatten


def _build_flatten_nested(name: str, noun: Noun, o: dict[str, str]) -> Spec:
    arg, s, ret = noun.ident, noun.samples, o["returns"]
    deep, tuples, drop_none = o["depth"] == "all", o["tuples"] == "flatten", o["none"] == "drop"
    kinds = "(list, tuple)" if tuples else "list"
    containers = "lists and tuples" if tuples else "lists"
    if deep:
        summary = (
            f"Flatten `{arg}`, arbitrarily nested {containers} of {noun.plural}, into one flat sequence, keeping "
            "left-to-right order."
        )
    else:
        summary = (
            f"Flatten `{arg}`, nested {containers} of {noun.plural}, by exactly one level: every top-level element "
            "that is a "
            + ("list or tuple" if tuples else "list")
            + " is replaced by its elements; deeper nesting stays as it is."
        )
    summary += (
        ("" if tuples else " Tuples are not expanded; they stay single elements.")
        + (
            " None values are dropped" + (" at any depth." if deep else " from the result.")
            if drop_none
            else " None values are kept."
        )
        + _tuple_note(ret)
    )
    rules = (
        f"If `{arg}` is None, return an empty {ret}.",
        "Strings are never split into characters; empty and whitespace-only strings are kept as they are.",
        "Empty inner lists contribute nothing.",
    )
    steps = [_step("treat a missing sequence as empty", f"if {arg} is None:\n    return {_empty(ret)}")]
    if deep:
        keep = "elif value is not None:" if drop_none else "else:"
        steps.append(
            _step(
                "define a depth-first walk that collects every value that is not a "
                + ("list or tuple" if tuples else "list"),
                f"""
                flat = []

                def walk(value):
                    if isinstance(value, {kinds}):
                        for item in value:
                            walk(item)
                    {keep}
                        flat.append(value)
                """,
            )
        )
        steps.append(_step("walk every top-level element", f"for item in {arg}:\n    walk(item)"))
        steps.append(_step("return the flat values", "return flat" if ret == "list" else "return tuple(flat)"))
    else:
        steps.append(
            _step(
                "expand the top-level " + ("lists and tuples" if tuples else "lists") + " by one level",
                f"""
                flat = []
                for item in {arg}:
                    if isinstance(item, {kinds}):
                        flat.extend(item)
                    else:
                        flat.append(item)
                """,
            )
        )
        if drop_none:
            steps.append(
                _step("drop None values", "return " + _collect("value for value in flat if value is not None", ret))
            )
        else:
            steps.append(_step("return the flat values", "return flat" if ret == "list" else "return tuple(flat)"))
    cases = (
        ([[s[0], s[1]], s[2], [[s[3]]]],),
        ([(s[4], s[0]), None, [s[1], None, [s[2], (s[3],)]]],),
        ([],),
        (None,),
        ([["  "], [], "", [[""]]],),
        ([1, [2.5, [s[0]]], (3,), "ab"],),
        (([[[]]], [None]),),
    )
    return Spec(
        name,
        ((arg, SEQ),),
        _out(ret, "Any"),
        summary,
        rules,
        tuple(steps),
        cases,
        ("isinstance(", "walk(" if deep else ".extend(", "is not None" if drop_none else ".append("),
        f"a nested list of {noun.plural}",
    )


FLATTEN_NESTED = Family(
    "flatten_nested",
    (
        _axis("depth", ("all", ""), ("one", "one_level")),
        _axis("tuples", ("flatten", ""), ("atom", "keep_tuples")),
        _axis("none", ("drop", ""), ("keep", "keep_none")),
        _RETURNS,
    ),
    ("flatten", "unnest", "spread"),
    TEXT_NOUNS[6:16],
    _build_flatten_nested,
)


# ------------------------------------------------------------------------------------ family: validate e-mails


def _build_validate_emails(name: str, noun: Noun, o: dict[str, str]) -> Spec:
    domain = noun.info["domain"]
    lower, unique = o["normalise"] == "lower", o["dedupe"] == "unique"
    restricted, valid = o["domain"] == "restricted", o["want"] == "valid"
    summary = (
        f"From `emails`, a list of {noun.singular} e-mail addresses, return the "
        + ("valid" if valid else "invalid")
        + " ones, stripped of surrounding whitespace"
        + (" and lowercased" if lower else "")
        + ", in their original order. An address is valid when, after stripping, it contains exactly one '@', no "
        "whitespace, a non-empty part before the '@', and a domain after it that contains a '.' and does not start "
        "or end with '.'."
        + (
            f" Only addresses whose domain is {domain} (compared case-insensitively) count as valid."
            if restricted
            else ""
        )
        + (
            " Each address is returned once (the first occurrence; compared after stripping"
            + (" and lowercasing)." if lower else ").")
            if unique
            else " Duplicates are kept."
        )
    )
    rules = (
        "If `emails` is None, return an empty list.",
        "Non-string elements are ignored (neither valid nor invalid).",
        "Empty and whitespace-only strings are invalid" + (" (returned as '')." if not valid else "."),
    )
    strip = "item.strip().lower()" if lower else "item.strip()"
    final = f'return domain.lower() == "{domain}"' if restricted else "return True"
    steps = [
        _step("treat a missing list as empty", "if emails is None:\n    return []"),
        _step(
            "keep the strings, stripped" + (" and lowercased" if lower else ""),
            f"addresses = [{strip} for item in emails if isinstance(item, str)]",
        ),
        _step(
            "define the validity rule",
            f"""
            def is_valid(address):
                if address.count("@") != 1 or any(char.isspace() for char in address):
                    return False
                local, domain = address.split("@")
                if not local or "." not in domain or domain.startswith(".") or domain.endswith("."):
                    return False
                {final}
            """,
        ),
    ]
    cond = "is_valid(address)" if valid else "not is_valid(address)"
    text = "keep the " + ("valid" if valid else "invalid") + " addresses"
    if unique:
        steps.append(_step(text, f"matches = [address for address in addresses if {cond}]"))
        steps.append(
            _step(
                "drop repeated addresses, keeping the first",
                """
                seen = set()
                unique = []
                for address in matches:
                    if address not in seen:
                        seen.add(address)
                        unique.append(address)
                return unique
                """,
            )
        )
    else:
        steps.append(_step(text, f"return [address for address in addresses if {cond}]"))
    n0, n1, n2, _ = (full.replace("-", " ").split()[0].lower() for full in noun.samples)
    d = domain
    cases = (
        ([f"{n0}@{d}", f" {n1.title()}@Mail.com ", "Not-An-Email", f"{n2}@@{d}", f"{n1}@{d.upper()}"],),
        ([f"{n0}@{d}", f"{n0.upper()}@{d}", f"{n0}@{d} ", f"@{d}", f"{n2}@{d}."],),
        ([],),
        (None,),
        (["   ", "", f"{n1} @{d}"],),
        ([42, None, f"{n2}@{d}", [f"{n0}@{d}"]],),
        ((f"{n0}@localhost", f"{n1}@.{d}", f"{n2}@{d}"),),
    )
    return Spec(
        name,
        (("emails", SEQ),),
        "List[str]",
        summary,
        rules,
        tuple(steps),
        cases,
        ('.count("@")', '.split("@")', ".strip()"),
        f"a list (or tuple) of {noun.singular} e-mail addresses",
    )


VALIDATE_EMAILS = Family(
    "validate_emails",
    (
        _axis("want", ("valid", ""), ("invalid", "invalid")),
        _axis("normalise", ("keep", ""), ("lower", "lowercased")),
        _axis("dedupe", ("all", ""), ("unique", "unique")),
        _axis("domain", ("any", ""), ("restricted", "own_domain")),
    ),
    ("filter_emails_of", "check_emails_of", "screen_emails_of"),
    PEOPLE_NOUNS,
    _build_validate_emails,
)


# ----------------------------------------------------------------------------------------- family: parse ints


def _build_parse_ints(name: str, noun: Noun, o: dict[str, str]) -> Spec:
    arg = noun.ident
    whole, non_negative, invalid = o["floats"] == "whole", o["negatives"] == "reject", o["invalid"]
    summary = (
        f"Convert the {noun.plural} in `{arg}` to ints. A string is valid when, after stripping surrounding "
        "whitespace, it is an optional '+' or '-' followed by ASCII digits only (so '1_000', '3.0' and '' are "
        "invalid); it becomes int(stripped). An int is valid as it is; booleans are invalid."
        + (
            " A float that is a whole number (like 3.0) is valid and becomes an int; other floats are invalid."
            if whole
            else " Floats are invalid."
        )
        + (" Negative results are invalid." if non_negative else "")
        + {
            "skip": " Invalid values are skipped.",
            "none": " Invalid values become None, so the output has the input's length.",
            "zero": " Invalid values become zero (the int 0), so the output has the input's length.",
        }[invalid]
    )
    rules = (
        f"If `{arg}` is None, return an empty list.",
        "None elements and whitespace-only strings are invalid.",
        "Other types (lists, dicts, ...) are invalid.",
    )
    float_branch = (
        "\n                elif isinstance(value, float) and value.is_integer():"
        "\n                    number = int(value)"
        if whole
        else ""
    )
    final = "return number if number >= 0 else None" if non_negative else "return number"
    steps = [
        _step("treat a missing sequence as empty", f"if {arg} is None:\n    return []"),
        _step(
            "define how one value is parsed (None when invalid)",
            f"""
            def parse(value):
                if isinstance(value, bool):
                    return None
                if isinstance(value, int):
                    number = value{float_branch}
                elif isinstance(value, str) and re.fullmatch(r"[+-]?[0-9]+", value.strip()):
                    number = int(value.strip())
                else:
                    return None
                {final}
            """,
        ),
        _step("parse every value", f"parsed = [parse(value) for value in {arg}]"),
    ]
    if invalid == "skip":
        steps.append(_step("drop the invalid values", "return [number for number in parsed if number is not None]"))
    elif invalid == "zero":
        steps.append(
            _step("replace invalid values with 0", "return [0 if number is None else number for number in parsed]")
        )
    else:
        steps.append(_step("return the parsed values, None marking invalid ones", "return parsed"))
    a, b, c = noun.samples
    cases = (
        ([a, f" {b} ", "abc", c],),
        ([f"-{a}", f"+{b}", "1_000", "3.0", int(c), -int(b)],),
        ([],),
        (None,),
        (["", "   ", "\t"],),
        ([True, None, 4.0, 4.5, [1], a],),
        ((b, "-0", " 12a"),),
    )
    return Spec(
        name,
        ((arg, SEQ),),
        "List[Optional[int]]" if invalid == "none" else "List[int]",
        summary,
        rules,
        tuple(steps),
        cases,
        ("int(", "re.fullmatch(", "isinstance(value, bool)"),
        f"a list (or tuple) of {noun.plural}",
        ("re",),
    )


INT_NOUNS = (
    Noun("quantities", "quantity", ("3", "12", "7")),
    Noun("years", "year", ("1999", "2024", "1969")),
    Noun("page numbers", "page number", ("1", "42", "7")),
    Noun("ports", "port", ("80", "443", "8080")),
    Noun("ranks", "rank", ("1", "2", "10")),
    Noun("floors", "floor", ("3", "0", "12")),
    Noun("seat numbers", "seat number", ("14", "2", "33")),
    Noun("item ids", "item id", ("1001", "42", "7")),
    Noun("retry counts", "retry count", ("5", "0", "19")),
    Noun("durations in minutes", "duration in minutes", ("30", "90", "5")),
)


PARSE_INTS = Family(
    "parse_ints",
    (
        _axis("invalid", ("skip", ""), ("none", "none_for_invalid"), ("zero", "zero_for_invalid")),
        _axis("negatives", ("allow", ""), ("reject", "non_negative")),
        _axis("floats", ("reject", ""), ("whole", "whole_floats")),
    ),
    ("parse", "to_int", "coerce"),
    INT_NOUNS,
    _build_parse_ints,
)


# ------------------------------------------------------------------------------------ family: title-case names


def _build_title_case_names(name: str, noun: Noun, o: dict[str, str]) -> Spec:
    arg, ret = noun.ident, o["returns"]
    particles, each, keep_blank = o["particles"] == "lower", o["hyphen"] == "each", o["blanks"] == "keep"
    summary = (
        f"Format the {noun.singular} names in `{arg}` in title case: collapse runs of whitespace to single spaces, "
        "strip the ends, and write each word with its first letter uppercase and the rest lowercase."
        + (
            " Each hyphen-separated part of a word is capitalised on its own (mary-jane -> Mary-Jane)."
            if each
            else " A hyphenated word is capitalised only at its start (mary-jane -> Mary-jane)."
        )
        + (
            f" The particles {', '.join(PARTICLES)} stay lowercase unless they are the first word."
            if particles
            else " Every word is capitalised, including particles such as van or de."
        )
        + " Keep the order."
        + _tuple_note(ret)
    )
    rules = (
        f"If `{arg}` is None, return an empty {ret}.",
        "Non-string elements are skipped.",
        "Names that are empty or whitespace-only are " + ("kept as ''." if keep_blank else "dropped."),
    )
    cap = (
        'return "-".join(part[:1].upper() + part[1:].lower() for part in word.split("-"))'
        if each
        else "return word[:1].upper() + word[1:].lower()"
    )
    if particles:
        fmt = f"""
            particles = {PARTICLES!r}

            def format_name(name):
                words = name.split()
                return " ".join(
                    word.lower() if index > 0 and word.lower() in particles else capitalise(word)
                    for index, word in enumerate(words)
                )
            """
    else:
        fmt = """
            def format_name(name):
                return " ".join(capitalise(word) for word in name.split())
            """
    steps = [
        _step("treat a missing sequence as empty", f"if {arg} is None:\n    return {_empty(ret)}"),
        _step("keep only the strings", f"texts = [item for item in {arg} if isinstance(item, str)]"),
        _step("define how one word is capitalised", f"def capitalise(word):\n    {cap}"),
        _step("define how a whole name is formatted", fmt),
    ]
    if keep_blank:
        steps.append(_step("format every name", "return " + _collect("format_name(text) for text in texts", ret)))
    else:
        steps.append(_step("format every name", "formatted = [format_name(text) for text in texts]"))
        steps.append(_step("drop the empty names", "return " + _collect("name for name in formatted if name", ret)))
    n = noun.samples
    cases = (
        ([n[0], n[1]],),
        ([f"  {n[2]}  ", n[3].upper()],),
        ([],),
        (None,),
        (["   ", "", n[0].upper()],),
        ([n[1].lower(), 7, None, f"{n[3]}\t"],),
        ((n[2].title(),),),
    )
    return Spec(
        name,
        ((arg, SEQ),),
        _out(ret, "str"),
        summary,
        rules,
        tuple(steps),
        cases,
        (".upper()", ".split()", '" ".join('),
        f"a list (or tuple) of {noun.singular} names",
    )


TITLE_CASE_NAMES = Family(
    "title_case_names",
    (
        _axis("particles", ("all", ""), ("lower", "keep_particles")),
        _axis("hyphen", ("each", ""), ("first", "plain_hyphens")),
        _axis("blanks", ("drop", ""), ("keep", "keep_blank")),
        _RETURNS,
    ),
    ("title_case", "capitalize", "format"),
    PEOPLE_NOUNS,
    _build_title_case_names,
)


# ---------------------------------------------------------------------------------------- family: group records


def _build_group_records(name: str, noun: Noun, o: dict[str, str]) -> Spec:
    arg, info = noun.ident, noun.info
    gf, idf = info["group"], info["id"]
    lower, missing, whole = o["keys"] == "lower", o["missing"], o["value"] == "record"
    summary = (
        f"Group the {noun.singular} records (dicts) in `{arg}` by their `{gf}` field: return a dict mapping each "
        f"`{gf}` value to the list of "
        + ("records" if whole else f"their `{idf}` values")
        + " that have it, in input order (keys in first-seen order)."
        + (
            f" String `{gf}` values are stripped and lowercased before grouping."
            if lower
            else f" `{gf}` values are used as they are."
        )
    )
    rules = [
        f"If `{arg}` is None, return an empty dict.",
        "Elements that are not dicts are skipped.",
        f"Records with no `{gf}` key, or whose `{gf}` is None, are "
        + {"skip": "skipped.", "none": "grouped under the key None.", "other": "grouped under the key 'unknown'."}[
            missing
        ],
    ]
    if not whole:
        rules.append(f"A record without `{idf}` contributes None.")
    lines = [f'key = row.get("{gf}")']
    if missing == "skip":
        lines += ["if key is None:", "    continue"]
    elif missing == "other":
        lines += ["if key is None:", '    key = "unknown"']
    if lower:
        lines += ["if isinstance(key, str):", "    key = key.strip().lower()"]
    value = "row" if whole else f'row.get("{idf}")'
    lines.append(f"groups.setdefault(key, []).append({value})")
    body = "\n".join("    " + line for line in lines)
    steps = (
        _step("treat a missing list as empty", f"if {arg} is None:\n    return {{}}"),
        _step("keep only the dict records", f"rows = [row for row in {arg} if isinstance(row, dict)]"),
        _step(f"add each record to the list of its `{gf}` key", f"groups = {{}}\nfor row in rows:\n{body}"),
        _step("return the groups", "return groups"),
    )
    ids, groups = info["ids"], info["groups"]
    recs = [{idf: i, gf: g} for i, g in zip(ids, groups, strict=True)]
    cases = (
        (recs,),
        (recs[:2] + [{idf: ids[2], gf: None}, {idf: ids[3]}, {gf: groups[0]}],),
        ([],),
        (None,),
        ([recs[0], "not a record", 42, None, recs[1]],),
        ([{idf: ids[0], gf: "  "}, {idf: ids[1], gf: " "}, {idf: ids[2], gf: 7}],),
    )
    return Spec(
        name,
        ((arg, "Optional[Sequence[Any]]"),),
        "Dict[Any, List[Any]]",
        summary,
        tuple(rules),
        steps,
        cases,
        (".setdefault(", f'.get("{gf}")', "isinstance(row, dict)"),
        f"a list of {noun.singular} records (dicts)",
    )


GROUP_RECORDS = Family(
    "group_records",
    (
        _axis("value", ("record", ""), ("field", "ids_only")),
        _axis("missing", ("skip", ""), ("none", "none_key"), ("other", "unknown_key")),
        _axis("keys", ("exact", ""), ("lower", "lower_keys")),
    ),
    ("group", "bucket", "index"),
    RECORD_NOUNS,
    _build_group_records,
)


# ------------------------------------------------------------------------------- family: dedupe ignoring case


def _build_unique_case_insensitive(name: str, noun: Noun, o: dict[str, str]) -> Spec:
    arg, s, ret = noun.ident, noun.samples, o["returns"]
    lower, strip, sort = o["form"] == "lower", o["strip"] == "strip", o["order"] == "sorted"
    summary = (
        f"Remove the {noun.plural} in `{arg}` that repeat an earlier one when case is ignored (compare with .lower()), "
        "keeping the first occurrence"
        + (", returned in lowercase." if lower else " in its original spelling.")
        + (
            " Strings are stripped of surrounding whitespace first (so ' Foo' and 'foo' are duplicates)."
            if strip
            else " Surrounding whitespace is significant (' foo' and 'foo' differ) and is kept."
        )
        + (
            " Return the result sorted case-insensitively (sorted with key=str.lower)."
            if sort
            else " Keep the order of first occurrences."
        )
        + _tuple_note(ret)
    )
    rules = (
        f"If `{arg}` is None, return an empty {ret}.",
        "Non-string elements (None, numbers, ...) are skipped.",
        "Strings that are empty after stripping are dropped."
        if strip
        else "Empty strings are dropped; whitespace-only strings are kept as they are.",
    )
    if strip:
        keep = _step(
            "keep the strings, stripped, and drop empty ones",
            f"texts = [item.strip() for item in {arg} if isinstance(item, str) and item.strip()]",
        )
    else:
        keep = _step(
            "keep the non-empty strings", f"texts = [item for item in {arg} if isinstance(item, str) and item]"
        )
    steps = [
        _step("treat a missing sequence as empty", f"if {arg} is None:\n    return {_empty(ret)}"),
        keep,
        _step(
            "keep the first occurrence of each value, ignoring case",
            f"""
            seen = set()
            unique = []
            for text in texts:
                key = text.lower()
                if key not in seen:
                    seen.add(key)
                    unique.append({"key" if lower else "text"})
            """,
        ),
    ]
    if sort:
        steps.append(_step("sort case-insensitively", "unique.sort(key=str.lower)"))
    steps.append(_step("return the unique values", "return unique" if ret == "list" else "return tuple(unique)"))
    hi, lo = max(s, key=str.lower), min(s, key=str.lower)
    cases = (
        ([s[0], s[0].swapcase(), s[1], s[2], s[1].upper()],),
        ([f" {s[3]}", s[3].upper(), s[4], f"{s[3]} "],),
        ([f"{hi} ", lo.upper(), lo],),
        ([],),
        (None,),
        (["", "  ", s[2], "  "],),
        ([None, 3, s[2], 4.5, s[2].swapcase()],),
        ((s[4], s[4].lower()),),
    )
    return Spec(
        name,
        ((arg, SEQ),),
        _out(ret, "str"),
        summary,
        rules,
        tuple(steps),
        cases,
        (".lower()", "not in seen", "sort(" if sort else "isinstance("),
        f"a list (or tuple) of {noun.plural}",
    )


UNIQUE_CASE_INSENSITIVE = Family(
    "unique_case_insensitive",
    (
        _axis("form", ("first", ""), ("lower", "lowercased")),
        _axis("strip", ("strip", ""), ("raw", "unstripped")),
        _axis("order", ("input", ""), ("sorted", "sorted")),
        _RETURNS,
    ),
    ("dedupe_case_insensitive", "unique_ignoring_case", "distinct_any_case"),
    TEXT_NOUNS[1:11],
    _build_unique_case_insensitive,
)


# ------------------------------------------------------------------------------------------- family: truncate


def _mid_word(cut: int) -> str:
    """A text of words whose position ``cut`` falls inside a word, with a space before it (a word-boundary test)."""
    base = " ".join(("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel") * 3)
    for shift in range(8):
        text = "x" * shift + base
        if text[cut - 1] != " " and text[cut] != " " and " " in text[:cut]:
            return text
    raise AssertionError(f"no mid-word text for cut {cut}")


_MARKERS = {"dots": "...", "ellipsis": "\u2026", "none": ""}


def _build_truncate_text(name: str, noun: Noun, o: dict[str, str]) -> Spec:
    limit, marker = noun.info["limit"], _MARKERS[o["marker"]]
    room, word = limit - len(marker), o["cut"] == "word"
    one = o["input"] == "one"
    how = f"keep its first {room} characters"
    if word:
        how += (
            f", but if that would split a word (the character right after them is not a space), cut back to the "
            f"last space within those {room} characters when there is one"
        )
    how += ", then strip trailing whitespace" + (
        f" and append the marker `{marker}`" if marker else " (no marker is added)"
    )
    subject = f"a {noun.singular}" if one else f"every {noun.singular} in `{noun.ident}`"
    summary = (
        f"Shorten {subject} to at most {limit} characters. Strip surrounding whitespace first; a {noun.singular} "
        f"that then fits is returned as it is. For a longer one, {how}."
    )
    cut_code = (
        f'head = text[:{room}]\nif text[{room}] != " " and " " in head:\n    head = head[: head.rfind(" ")]'
        if word
        else f"head = text[:{room}]"
    )
    tail = f'return head.rstrip() + "{marker}"' if marker else "return head.rstrip()"
    cut_text = f"cut to {room} characters" + (", backing up to the last space so no word is split" if word else "")
    end_text = "strip trailing whitespace" + (" and append the marker" if marker else "")
    s = noun.samples
    if one:
        arg = noun.singular_ident
        rules = (
            f"If `{arg}` is None, return an empty string.",
            "A value that is not a string is converted with str() first.",
            f"A whitespace-only {noun.singular} becomes ''.",
        )
        steps = (
            _step("treat None as an empty string", f'if {arg} is None:\n    return ""'),
            _step("convert to a string and strip surrounding whitespace", f"text = str({arg}).strip()"),
            _step(f"return {noun.plural} that fit unchanged", f"if len(text) <= {limit}:\n    return text"),
            _step(cut_text, cut_code),
            _step(end_text, tail),
        )
        if not marker and not word:  # text[:limit] already leaves a fitting text unchanged
            steps = steps[:2] + (_step(f"keep the first {limit} characters", f"return text[:{limit}].rstrip()"),)
        cases = ((s[0],), (s[1],), (f"  {s[2]}  ",), (_mid_word(room),), (None,), ("",), ("   ",), (10**70 + 12345,))
        params, returns, desc = ((arg, "Optional[Any]"),), "str", f"a single {noun.singular} (a string)"
    else:
        arg = noun.ident
        rules = (
            f"If `{arg}` is None, return an empty list.",
            "Non-string elements are skipped; the order is kept.",
            f"A whitespace-only {noun.singular} becomes ''.",
        )
        body = textwrap.indent(f"{cut_code}\n{tail}", "    ")
        steps = (
            _step("treat a missing sequence as empty", f"if {arg} is None:\n    return []"),
            _step(
                f"define how one {noun.singular} is shortened",
                "def shorten(text):\n    text = text.strip()\n"
                f"    if len(text) <= {limit}:\n        return text\n{body}",
            ),
            _step("shorten every string element", f"return [shorten(item) for item in {arg} if isinstance(item, str)]"),
        )
        cases = (
            ([s[0], s[1]],),
            ([f" {s[2]} ", None, 42, "   "],),
            ([],),
            (None,),
            ([""],),
            ((s[1], _mid_word(room)),),
        )
        params, returns, desc = ((arg, SEQ),), "List[str]", f"a list (or tuple) of {noun.plural}"
    return Spec(
        name,
        params,
        returns,
        summary,
        rules,
        steps,
        cases,
        (".strip()", "text[:", '.rfind(" ")' if word else ".rstrip()"),
        desc,
    )


TRUNCATE_NOUNS = (
    Noun(
        "titles",
        "title",
        ("Short Title", "A Tale of Two Cities in Winter", "Supercalifragilisticexpialidocious"),
        {"limit": 20},
    ),
    Noun(
        "tweets",
        "tweet",
        ("Just shipped!", "Shipping the new release today, thanks to everyone who helped", "x" * 45),
        {"limit": 40},
    ),
    Noun("usernames", "username", ("ana", "john jacob jingleheimer", "the_real_slim_shady"), {"limit": 12}),
    Noun(
        "headlines",
        "headline",
        ("Rain expected", "Local team wins the championship after a dramatic final", "Breaking" * 5),
        {"limit": 30},
    ),
    Noun("captions", "caption", ("Sunset", "Sunset over the harbour with friends", "Panorama" * 4), {"limit": 25}),
    Noun(
        "previews",
        "preview",
        ("Meeting moved", "Hi team, the meeting has been moved to Thursday afternoon, see you there", "z" * 60),
        {"limit": 50},
    ),
    Noun(
        "subjects",
        "subject",
        ("Invoice", "Re: your invoice for March and the updated payment terms", "Reminder" * 6),
        {"limit": 35},
    ),
    Noun("labels", "label", ("todo", "needs design review", "internationalization"), {"limit": 10}),
    Noun("slugs", "slug", ("hello", "how to bake bread at home", "averyveryverylongslug"), {"limit": 16}),
    Noun(
        "descriptions",
        "description",
        ("Red mug", "A sturdy ceramic mug with a red glaze, dishwasher safe and made to last", "Mug" * 25),
        {"limit": 60},
    ),
)


TRUNCATE_TEXT = Family(
    "truncate_text",
    (
        _axis("marker", ("dots", ""), ("ellipsis", "ellipsis_char"), ("none", "no_marker")),
        _axis("cut", ("hard", ""), ("word", "at_word")),
        _axis("input", ("one", ""), ("many", "each")),
    ),
    ("truncate", "shorten", "clip"),
    TRUNCATE_NOUNS,
    _build_truncate_text,
)


# ------------------------------------------------------------------------------------- family: filter records

_OPS = {"ge": (">=", "at least"), "gt": (">", "greater than"), "le": ("<=", "at most"), "lt": ("<", "less than")}


def _build_filter_records(name: str, noun: Noun, o: dict[str, str]) -> Spec:
    arg, info = noun.ident, noun.info
    num, idf, thr = info["num"], info["id"], info["threshold"]
    op, op_text = _OPS[o["op"]]
    keep_unknown, ids = o["missing"] == "keep", o["output"] == "ids"
    summary = (
        f"Return the {noun.singular} records (dicts) from `{arg}` whose `{num}` is {op_text} {thr}"
        + (f", as a list of their `{idf}` values" if ids else "")
        + ", in input order."
    )
    rules = [
        f"If `{arg}` is None, return an empty list.",
        "Elements that are not dicts are skipped.",
        f"Records whose `{num}` is missing, None, a bool or not a number (for example the string '12') are "
        + ("kept." if keep_unknown else "dropped."),
    ]
    if ids:
        rules.append(f"A kept record without `{idf}` contributes None.")
    steps = [
        _step("treat a missing list as empty", f"if {arg} is None:\n    return []"),
        _step("keep only the dict records", f"rows = [row for row in {arg} if isinstance(row, dict)]"),
        _step(
            "define the test for one record",
            f"""
            def matches(row):
                value = row.get("{num}")
                if isinstance(value, bool) or not isinstance(value, (int, float)):
                    return {keep_unknown}
                return value {op} {thr}
            """,
        ),
    ]
    if ids:
        steps.append(
            _step(
                f"return the `{idf}` of each matching record",
                f'return [row.get("{idf}") for row in rows if matches(row)]',
            )
        )
    else:
        steps.append(_step("keep the matching records", "return [row for row in rows if matches(row)]"))
    d = max(1, thr // 10)
    i = info["ids"]
    recs = [{idf: i[0], num: thr + d}, {idf: i[1], num: thr}, {idf: i[2], num: thr - d}, {idf: i[3], num: thr + 2 * d}]
    cases = (
        (recs,),
        (
            [
                {idf: i[0], num: None},
                {idf: i[1]},
                {idf: i[2], num: str(thr)},
                {idf: i[3], num: True},
                {num: thr - 2 * d},
            ],
        ),
        ([],),
        (None,),
        ([recs[0], "row", 3, None, recs[2]],),
        ([{idf: "   ", num: thr + d}, {idf: "", num: float(thr)}],),
    )
    return Spec(
        name,
        ((arg, "Optional[Sequence[Any]]"),),
        "List[Any]",
        summary,
        tuple(rules),
        tuple(steps),
        cases,
        (f'.get("{num}")', "isinstance(value, bool)", f"value {op} {thr}"),
        f"a list of {noun.singular} records (dicts)",
    )


FILTER_RECORDS = Family(
    "filter_records",
    (
        _axis("op", ("ge", ""), ("gt", "strictly_above"), ("le", "at_most"), ("lt", "strictly_below")),
        _axis("missing", ("drop", ""), ("keep", "keep_unknown")),
        _axis("output", ("records", ""), ("ids", "ids")),
    ),
    ("filter", "select", "pick"),
    RECORD_NOUNS,
    _build_filter_records,
)


# -------------------------------------------------------------------------------------- family: normalise keys

_KEY_STYLES = {
    "snake": ("_", "a single underscore"),
    "kebab": ("-", "a single hyphen"),
    "flat": ("", "nothing (remove it)"),
}


def _build_normalise_keys(name: str, noun: Noun, o: dict[str, str]) -> Spec:
    arg = noun.singular_ident
    sep, sep_desc = _KEY_STYLES[o["style"]]
    first, non_str = o["collide"] == "first", o["non_str"]
    summary = (
        f"Return a copy of the {noun.singular} dict `{arg}` with normalised string keys: strip surrounding whitespace, "
        f"lowercase, and replace each run of inner whitespace with {sep_desc}. Values are not changed. "
        + (
            "If two keys normalise to the same key, the first entry wins."
            if first
            else "If two keys normalise to the same key, the later entry's value wins (at the first entry's position)."
        )
        + {
            "keep": " Non-string keys are kept unchanged.",
            "drop": " Entries with non-string keys are dropped.",
            "str": " Non-string keys are converted with str() and then normalised like the others.",
        }[non_str]
    )
    rules = (
        f"If `{arg}` is None, return an empty dict.",
        "Entries whose key is empty after normalising (e.g. a whitespace-only key) are dropped.",
        "The input dict is not modified.",
    )
    if non_str == "keep":
        body = """
            if isinstance(key, str):
                key = normalise(key)
                if not key:
                    continue"""
    elif non_str == "drop":
        body = """
            if not isinstance(key, str):
                continue
            key = normalise(key)
            if not key:
                continue"""
    else:
        body = """
            key = normalise(str(key))
            if not key:
                continue"""
    body = textwrap.indent(textwrap.dedent(body).strip("\n"), "    ")
    collide = "\n    if key in result:\n        continue" if first else ""
    steps = (
        _step("treat None as an empty dict", f"if {arg} is None:\n    return {{}}"),
        _step("define how one key is normalised", f'def normalise(key):\n    return "{sep}".join(key.lower().split())'),
        _step(
            "copy the entries under their normalised keys" + (", keeping the first of colliding keys" if first else ""),
            f"result = {{}}\nfor key, value in {arg}.items():\n{body}{collide}\n    result[key] = value",
        ),
        _step("return the new dict", "return result"),
    )
    keys = noun.info["keys"]
    cases = (
        ({keys[0]: 1, keys[1]: 2, keys[2]: 3},),
        ({keys[3]: "a", keys[3].upper(): "b", f" {keys[3].lower()} ": "c", keys[0]: "d"},),
        ({},),
        (None,),
        ({"   ": 1, "\t": 2, keys[1]: 3},),
        ({1: "one", None: "none", keys[2]: None, (1, 2): "pair", "1": "text one"},),
    )
    return Spec(
        name,
        ((arg, "Optional[Dict[Any, Any]]"),),
        "Dict[Any, Any]",
        summary,
        rules,
        steps,
        cases,
        (".split()", ".lower()", ".items()"),
        f"a {noun.singular} dict",
    )


NORMALISE_KEYS = Family(
    "normalise_keys",
    (
        _axis("style", ("snake", ""), ("kebab", "kebab"), ("flat", "joined")),
        _axis("collide", ("last", ""), ("first", "first_wins")),
        _axis("non_str", ("keep", ""), ("drop", "str_keys_only"), ("str", "stringified_keys")),
    ),
    ("normalize_keys_of", "clean_keys_of", "fix_keys_of"),
    DICT_NOUNS,
    _build_normalise_keys,
    singular=True,
)


# ------------------------------------------------------------------------------------ family: split delimited

_SPLIT_SEPS = {"comma": ",", "semicolon": ";", "pipe": "|", "slash": "/"}


def _build_split_delimited(name: str, noun: Noun, o: dict[str, str]) -> Spec:
    sep, s = _SPLIT_SEPS[o["sep"]], noun.samples
    lower, keep_empty = o["case"] == "lower", o["empty"] == "keep"
    summary = (
        f"Split `text`, a string of {noun.plural} separated by `{sep}`, into a list of {noun.plural}, stripping "
        "whitespace around each one"
        + (" and lowercasing it" if lower else "")
        + ". "
        + (
            "Empty pieces (for example between two separators) are kept as ''."
            if keep_empty
            else "Empty pieces are dropped."
        )
        + " Keep the order."
    )
    rules = (
        "If `text` is None, not a string, or empty/whitespace-only, return an empty list.",
        f"Only `{sep}` separates; other punctuation stays inside the pieces.",
    )
    piece = "part.strip().lower()" if lower else "part.strip()"
    steps = [
        _step(
            "return [] for None, non-strings and blank text",
            "if not isinstance(text, str) or not text.strip():\n    return []",
        ),
        _step(f"split on '{sep}'", f'parts = text.split("{sep}")'),
    ]
    strip_text = "strip each piece" + (" and lowercase it" if lower else "")
    if keep_empty:
        steps.append(_step(strip_text, f"return [{piece} for part in parts]"))
    else:
        steps.append(_step(strip_text, f"pieces = [{piece} for part in parts]"))
        steps.append(_step("drop the empty pieces", "return [piece for piece in pieces if piece]"))
    cases = (
        (sep.join([s[0], f" {s[1]}", s[2]]),),
        (f"{s[3]}{sep}{sep} {s[4].upper()} {sep}",),
        ("",),
        (None,),
        ("   ",),
        (f" {sep}  ",),
        (42,),
        ([s[0], s[1]],),
    )
    return Spec(
        name,
        (("text", "Optional[str]"),),
        "List[str]",
        summary,
        rules,
        tuple(steps),
        cases,
        (f'.split("{sep}")', ".strip()", "isinstance("),
        f"a {sep!r}-separated string of {noun.plural}",
    )


SPLIT_DELIMITED = Family(
    "split_delimited",
    (
        _axis("sep", ("comma", ""), ("semicolon", "semicolon"), ("pipe", "pipe"), ("slash", "slash")),
        _axis("empty", ("drop", ""), ("keep", "keep_empty")),
        _axis("case", ("keep", ""), ("lower", "lowercased")),
    ),
    ("split", "explode", "unpack"),
    TEXT_NOUNS[5:15],
    _build_split_delimited,
)


# ----------------------------------------------------------------------------------------- family: count items


def _build_count_items(name: str, noun: Noun, o: dict[str, str]) -> Spec:
    arg, s = noun.ident, noun.samples
    ignore, stringify = o["case"] == "ignore", o["non_str"] == "str"
    repeated, pairs = o["min"] == "repeated", o["output"] == "pairs"
    empty = "[]" if pairs else "{}"
    summary = (
        f"Count how often each {noun.singular} occurs in `{arg}`. Strings are stripped of surrounding whitespace "
        "before counting"
        + (" and compared in lowercase (the lowercase form is the key)." if ignore else "; case matters.")
        + (f" Only {noun.plural} that occur at least twice are included." if repeated else "")
        + (
            f" Return a list of ({noun.singular}, count) tuples sorted by count, highest first, ties broken "
            "alphabetically."
            if pairs
            else f" Return a dict mapping each {noun.singular} to its count, in first-seen order."
        )
    )
    rules = (
        f"If `{arg}` is None, return an empty {'list' if pairs else 'dict'}.",
        "None elements are skipped; other non-strings (such as numbers) are converted with str() first."
        if stringify
        else "Non-string elements (None, numbers, ...) are skipped.",
        "Empty and whitespace-only strings are not counted.",
    )
    norm = ".strip().lower()" if ignore else ".strip()"
    if stringify:
        conv = _step(
            "turn the elements into stripped strings, skipping None" + (", lowercased" if ignore else ""),
            f"texts = [str(item){norm} for item in {arg} if item is not None]",
        )
    else:
        conv = _step(
            "keep the strings, stripped" + (" and lowercased" if ignore else ""),
            f"texts = [item{norm} for item in {arg} if isinstance(item, str)]",
        )
    steps = [
        _step("treat a missing sequence as empty", f"if {arg} is None:\n    return {empty}"),
        conv,
        _step(
            "count the non-empty strings",
            """
            counts = {}
            for text in texts:
                if text:
                    counts[text] = counts.get(text, 0) + 1
            """,
        ),
    ]
    if repeated:
        steps.append(
            _step(
                "keep only the ones seen at least twice",
                "counts = {text: count for text, count in counts.items() if count >= 2}",
            )
        )
    if pairs:
        steps.append(
            _step(
                "sort by count (highest first), then alphabetically",
                "return sorted(counts.items(), key=lambda item: (-item[1], item[0]))",
            )
        )
    else:
        steps.append(_step("return the counts", "return counts"))
    cases = (
        ([s[0], s[1], s[0], s[2], s[1], s[0]],),
        ([f" {s[3]} ", s[3].swapcase(), s[3], s[4]],),
        ([s[2], s[4], s[4], s[2], s[1]],),
        ([],),
        (None,),
        (["", "  ", s[2], "\t"],),
        ([1, "1", None, 1, 2.5, s[0]],),
    )
    return Spec(
        name,
        ((arg, SEQ),),
        "List[Tuple[str, int]]" if pairs else "Dict[str, int]",
        summary,
        rules,
        tuple(steps),
        cases,
        (".get(text, 0)", ".strip()", "sorted(" if pairs else "is not None" if stringify else "isinstance("),
        f"a list (or tuple) of {noun.plural}",
    )


COUNT_ITEMS = Family(
    "count_items",
    (
        _axis("case", ("exact", ""), ("ignore", "ignoring_case")),
        _axis("non_str", ("skip", ""), ("str", "stringified")),
        _axis("min", ("all", ""), ("repeated", "repeated")),
        _axis("output", ("dict", ""), ("pairs", "ranked")),
    ),
    ("count", "tally", "frequency_of"),
    TEXT_NOUNS[2:12],
    _build_count_items,
)


# ------------------------------------------------------------------------------------- family: parse booleans


def _build_parse_booleans(name: str, noun: Noun, o: dict[str, str]) -> Spec:
    arg = noun.ident
    lenient, ints, unknown = o["vocab"] == "extended", o["ints"] == "accept", o["unknown"]
    true_words = ("true", "yes", "y", "on", "1") if lenient else ("true",)
    false_words = ("false", "no", "n", "off", "0") if lenient else ("false",)
    quoted = ", ".join(f"'{w}'" for w in true_words), ", ".join(f"'{w}'" for w in false_words)
    summary = (
        f"Convert the {noun.singular} values in `{arg}` to booleans. "
        + (
            f"The strings {quoted[0]} mean True and {quoted[1]} mean False"
            if lenient
            else "The strings 'true' and 'false' are recognised"
        )
        + ", compared after stripping whitespace and ignoring case. Actual bools are kept as they are."
        + (" The ints 1 and 0 mean True and False; other ints are unrecognised." if ints else " Ints are unrecognised.")
        + {
            "skip": " Unrecognised values are skipped.",
            "none": " Unrecognised values become None, so the output has the input's length.",
            "false": " Unrecognised values become False, so the output has the input's length.",
        }[unknown]
    )
    rules = (
        f"If `{arg}` is None, return an empty list.",
        "None elements, floats and other types are unrecognised.",
        "Empty and whitespace-only strings are unrecognised.",
    )
    int_branch = (
        "\n                if isinstance(value, int) and value in (0, 1):\n                    return value == 1"
        if ints
        else ""
    )
    steps = [
        _step("treat a missing sequence as empty", f"if {arg} is None:\n    return []"),
        _step("list the recognised words", f"true_words = {true_words!r}\nfalse_words = {false_words!r}"),
        _step(
            "define how one value is read (None when unrecognised)",
            f"""
            def read(value):
                if isinstance(value, bool):
                    return value{int_branch}
                if isinstance(value, str):
                    word = value.strip().lower()
                    if word in true_words:
                        return True
                    if word in false_words:
                        return False
                return None
            """,
        ),
        _step("read every value", f"results = [read(value) for value in {arg}]"),
    ]
    if unknown == "skip":
        steps.append(
            _step("drop the unrecognised values", "return [result for result in results if result is not None]")
        )
    elif unknown == "false":
        steps.append(_step("treat unrecognised values as False", "return [result is True for result in results]"))
    else:
        steps.append(_step("return the results, None marking unrecognised values", "return results"))
    cases = (
        (list(noun.samples),),
        (["ON", "off", "1", "0", "Y", "n"],),
        ([1, 0, 2, True, False, 1.0],),
        ([],),
        (None,),
        (["", "   ", "\t"],),
        ([None, "TRUE", 3.5, ["yes"]],),
    )
    return Spec(
        name,
        ((arg, SEQ),),
        "List[Optional[bool]]" if unknown == "none" else "List[bool]",
        summary,
        rules,
        tuple(steps),
        cases,
        (".strip().lower()", "isinstance(value, bool)", "true_words"),
        f"a list (or tuple) of {noun.plural}",
    )


FLAG_NOUNS = (
    Noun("flags", "flag", ("true", " False ", "yes", "maybe", "OFF")),
    Noun("answers", "answer", ("Yes", "no ", "TRUE", "dunno", " n")),
    Noun("toggles", "toggle", ("on", "Off", "true", "toggle", " 1 ")),
    Noun("responses", "response", ("Y", "nope", "false", " yes", "0")),
    Noun("checkbox values", "checkbox value", ("checked", "true", " FALSE", "on", "n")),
    Noun("opt-ins", "opt-in", ("yes", "No", "maybe later", "TRUE", "off")),
    Noun("switches", "switch", ("ON", "off ", "1", "enabled", "False")),
    Noun("consents", "consent", ("I agree", "yes", "no", "True", " 0 ")),
)


PARSE_BOOLEANS = Family(
    "parse_booleans",
    (
        _axis("vocab", ("basic", ""), ("extended", "lenient")),
        _axis("unknown", ("skip", ""), ("none", "none_for_unknown"), ("false", "false_for_unknown")),
        _axis("ints", ("reject", ""), ("accept", "with_ints")),
    ),
    ("booleanize", "decode_bools_in", "read_bools_in"),
    FLAG_NOUNS,
    _build_parse_booleans,
)


# ----------------------------------------------------------------------------------------- family: mask ids

_MASK_CHARS = {"star": "*", "hash": "#", "x": "x"}


def _build_mask_identifiers(name: str, noun: Noun, o: dict[str, str]) -> Spec:
    keep, char = noun.info["keep"], _MASK_CHARS[o["mask"]]
    compact, one = o["separators"] == "remove", o["input"] == "one"
    how = (
        "strip surrounding whitespace, "
        + ("remove every character that is not a letter or digit, " if compact else "")
        + f"then replace every letter and digit except the last {keep} with `{char}`"
        + ("." if compact else "; other characters (spaces, dashes, ...) stay where they are.")
    )
    mask_body = ["text = text.strip()"]
    if compact:
        mask_body.append('text = "".join(char for char in text if char.isalnum())')
    mask_loop = f"""
        hidden = sum(char.isalnum() for char in text) - {keep}
        masked = []
        for char in text:
            if char.isalnum() and hidden > 0:
                masked.append("{char}")
                hidden -= 1
            else:
                masked.append(char)
        return "".join(masked)
        """
    samples = noun.samples
    if one:
        arg = noun.singular_ident
        summary = f"Mask the {noun.singular} `{arg}`: {how}"
        rules = (
            f"If `{arg}` is None, return an empty string.",
            "A value that is not a string (for example an int) is converted with str() first.",
            f"If there are {keep} or fewer letters and digits, nothing is masked; a whitespace-only value becomes ''.",
        )
        steps = [
            _step("treat None as an empty string", f'if {arg} is None:\n    return ""'),
            _step("convert to a string and strip surrounding whitespace", f"text = str({arg}).strip()"),
        ]
        if compact:
            steps.append(
                _step(
                    "remove everything that is not a letter or digit",
                    'text = "".join(char for char in text if char.isalnum())',
                )
            )
        steps.append(_step(f"mask every letter and digit except the last {keep}", mask_loop))
        cases = ((samples[0],), (f"  {samples[1]} ",), (None,), ("",), ("   ",), ("12",), (12345678,))
        params, returns, desc = ((arg, "Optional[Any]"),), "str", f"a single {noun.singular}"
    else:
        arg = noun.ident
        summary = f"Mask every {noun.singular} in `{arg}`: {how} Keep the order."
        rules = (
            f"If `{arg}` is None, return an empty list.",
            "Non-string elements are skipped.",
            f"If there are {keep} or fewer letters and digits, nothing is masked; a whitespace-only value becomes ''.",
        )
        inner = "\n".join(mask_body) + "\n" + textwrap.dedent(mask_loop).strip("\n")
        steps = [
            _step("treat a missing sequence as empty", f"if {arg} is None:\n    return []"),
            _step(f"define how one {noun.singular} is masked", "def mask(text):\n" + textwrap.indent(inner, "    ")),
            _step("mask every string element", f"return [mask(item) for item in {arg} if isinstance(item, str)]"),
        ]
        cases = (
            (list(samples),),
            ([f" {samples[1]}", None, 42, "  "],),
            ([],),
            (None,),
            (["", "ab"],),
            ((samples[0],),),
        )
        params, returns, desc = ((arg, SEQ),), "List[str]", f"a list (or tuple) of {noun.plural}"
    return Spec(
        name,
        params,
        returns,
        summary,
        rules,
        tuple(steps),
        cases,
        (".isalnum()", '"".join(', ".strip()"),
        desc,
    )


ID_NOUNS = (
    Noun("card numbers", "card number", ("4111 1111 1111 1234", "5500-0000-0000-0004"), {"keep": 4}),
    Noun("phone numbers", "phone number", ("+1 555-010-9999", "(020) 7946 0018"), {"keep": 2}),
    Noun("account ids", "account id", ("ACC-009-871", "acc 12 34 56"), {"keep": 3}),
    Noun("ibans", "iban", ("DE89 3704 0044 0532 0130 00", "GB82 WEST 1234 5698 7654 32"), {"keep": 4}),
    Noun("license plates", "license plate", ("AB-123-CD", "7ABC 123"), {"keep": 2}),
    Noun("api keys", "api key", ("sk_live_51Hx9", "pk-test-00aa"), {"keep": 4}),
)


MASK_IDENTIFIERS = Family(
    "mask_identifiers",
    (
        _axis("mask", ("star", ""), ("hash", "hash"), ("x", "x")),
        _axis("separators", ("keep", ""), ("remove", "compact")),
        _axis("input", ("one", ""), ("many", "each")),
    ),
    ("mask", "redact", "hide"),
    ID_NOUNS,
    _build_mask_identifiers,
)


# -------------------------------------------------------------------------------------------- the families

FAMILIES: tuple[Family, ...] = (
    STRIP_DROP_EMPTY,
    DEDUPE_KEEP_ORDER,
    NORMALISE_WHITESPACE,
    PARSE_KEY_VALUE,
    CLAMP_NUMBERS,
    DROP_MISSING_VALUES,
    MERGE_COUNTS,
    FLATTEN_NESTED,
    VALIDATE_EMAILS,
    PARSE_INTS,
    TITLE_CASE_NAMES,
    GROUP_RECORDS,
    UNIQUE_CASE_INSENSITIVE,
    TRUNCATE_TEXT,
    FILTER_RECORDS,
    NORMALISE_KEYS,
    SPLIT_DELIMITED,
    COUNT_ITEMS,
    PARSE_BOOLEANS,
    MASK_IDENTIFIERS,
)
