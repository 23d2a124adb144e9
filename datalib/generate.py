"""Generator v1 of the bundled data-cleaning problems: render, select, split by variant group, measure leakage.

A problem is a dict with exactly the fields of data/README.md (:data:`FIELDS`). Its ``prompt`` is HumanEval-style
(imports, signature, a docstring with the edge-case behaviour and one example), its ``canonical_solution`` carries one
``# Step k: ...`` comment per step (``steps`` lists their texts), and its ``test`` is ``def check(candidate):`` with one
``assert candidate(...) == expected`` per line. The expected values are computed by running the reference solution
itself, so they are right by construction; the generator also checks that the reference does not modify its inputs
and that every expected value survives ``repr`` -> ``ast.literal_eval``.

Determinism: every random choice comes from ``random.Random`` seeded with a SHA-256 of (seed, label), never from
``hash()``, and no set is iterated, so ``generate_problems(n, seed)`` gives the same JSON bytes in every process.

Leakage-free splits: :func:`split_key` maps a problem to its *variant group* (family + behaviour options, see
:attr:`datalib.problem_families.Variant.group`); :func:`assign_splits` holds out whole groups per family, so two
problems that differ only in noun, verb, phrasing or returned container never straddle train/val/test.
:func:`leakage_report` measures what is left.
"""

from __future__ import annotations

import ast
import copy
import hashlib
import random
import re
import statistics
import textwrap
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from functools import cache
from typing import Any

from datalib.problem_families import FAMILIES, INSTRUCTION_TEMPLATES, Spec, Variant, catalogue, family_by_name
from datalib.schema import PROBLEM_FIELDS

GENERATOR_VERSION = "v1"
SOURCE = f"generated:{GENERATOR_VERSION}"
TASK_PREFIX = "DataClean"
FIELDS = PROBLEM_FIELDS
SPLITS = ("train", "val", "test")
_TYPING_NAMES = ("Any", "Dict", "List", "Optional", "Sequence", "Tuple")
_TASK_ID = re.compile(rf"^{TASK_PREFIX}/([a-z_]+)/(\d+)$")


def capacity() -> int:
    """How many distinct problems generator v1 can produce (the sum of the families' catalogues)."""
    return sum(len(catalogue(family)) for family in FAMILIES)


def generate_problems(n: int, seed: int) -> list[dict]:
    """``n`` distinct problems chosen with ``seed``, balanced over the families, ``split`` left as "".

    Each family's catalogue is shuffled with its own seeded stream and the families are visited round-robin (in a
    seeded order) until ``n`` are picked, so every family contributes about n / 20 problems and
    ``generate_problems(m, seed)`` is a prefix of ``generate_problems(n, seed)`` for m <= n.
    The same (n, seed) gives the same list, byte for byte after ``json.dumps(p, sort_keys=True)``.

    Raises:
        ValueError: ``n`` is negative or larger than :func:`capacity`.
    """
    total = capacity()
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if n > total:
        raise ValueError(
            f"n={n} exceeds the {total} distinct problems generator {GENERATOR_VERSION} can produce "
            f"({len(FAMILIES)} families); ask for at most {total}"
        )
    order = list(FAMILIES)
    _rng(seed, "families").shuffle(order)
    queues = []
    for family in order:
        variants = list(catalogue(family))
        _rng(seed, f"variants/{family.name}").shuffle(variants)
        queues.append(variants)
    picked: list[Variant] = []
    for rank in range(max(len(q) for q in queues)):
        for queue in queues:
            if rank < len(queue) and len(picked) < n:
                picked.append(queue[rank])
    return [render_problem(variant) for variant in picked]


def render_problem(variant: Variant) -> dict:
    """The problem dict of one variant (fields :data:`FIELDS`, ``split`` = "").

    Raises:
        RuntimeError: the family definition is broken (see :func:`render_spec`).
    """
    spec = variant.spec()
    name = spec.entry_point
    instruction = INSTRUCTION_TEMPLATES[variant.phrasing].format(
        call=f"{name}({', '.join(p for p, _ in spec.params)})",
        signature=_signature(spec).removeprefix("def "),
        name=name,
        input_desc=spec.input_desc,
        summary=spec.summary,
        rules=" ".join(spec.rules),
    )
    return {
        "task_id": f"{TASK_PREFIX}/{variant.family.name}/{variant.index:04d}",
        **render_spec(spec),
        "instruction": instruction,
        "family": variant.family.name,
        "split": "",
        "source": SOURCE,
    }


def render_spec(spec: Spec) -> dict:
    """A spec's ``prompt``, ``entry_point``, ``canonical_solution``, ``test``, ``steps`` and ``key_patterns``.

    The expected values of the tests come from running the reference solution on the spec's cases.

    Raises:
        RuntimeError: the spec is broken (a reference that raises, modifies its input, returns a value that is not a
            Python literal, has fewer than 5 test cases, or a key pattern missing from the solution).
    """
    name = spec.entry_point
    solution = "".join(f"    # Step {k}: {text}\n{code}\n" for k, (text, code) in enumerate(spec.steps, 1))
    fn = _load(_imports(spec) + _signature(spec) + ":\n" + solution, name)
    cases = [(args, _run_reference(fn, args, name)) for args in spec.cases]
    _check_spec(spec, solution, cases)
    test = "def check(candidate):\n" + "".join(
        f"    assert candidate({_args_src(args)}) == {expected!r}\n" for args, expected in cases
    )
    return {
        "prompt": _imports(spec) + _signature(spec) + ":\n" + _docstring(spec, cases),
        "entry_point": name,
        "canonical_solution": solution,
        "test": test,
        "steps": [text for text, _ in spec.steps],
        "key_patterns": list(spec.key_patterns),
    }


# ------------------------------------------------------------------------------------------------- rendering


def _imports(spec: Spec) -> str:
    annotations = " ".join([a for _, a in spec.params] + [spec.returns])
    names = [n for n in _TYPING_NAMES if re.search(rf"\b{n}\b", annotations)]
    lines = [f"import {module}" for module in spec.modules]
    if names:
        lines.append(f"from typing import {', '.join(names)}")
    return "\n".join(lines) + "\n\n\n" if lines else ""


def _signature(spec: Spec) -> str:
    params = ", ".join(f"{p}: {a}" for p, a in spec.params)
    return f"def {spec.entry_point}({params}) -> {spec.returns}"


def _docstring(spec: Spec, cases: list[tuple[tuple, Any]]) -> str:
    lines = textwrap.wrap(spec.summary, 100)
    if spec.rules:
        lines.append("")
    for rule in spec.rules:
        lines += textwrap.wrap(rule, 100, initial_indent="- ", subsequent_indent="  ")
    # The example: the first case whose output is not empty and differs from the input, else the first non-empty.
    shown = [c for c in cases if "\\" not in _args_src(c[0]) + repr(c[1]) and c[1] not in ([], (), {}, "")]
    example = next((c for c in shown if c[1] != c[0][0]), shown[0] if shown else None)
    if example is not None:
        lines += ["", f">>> {spec.entry_point}({_args_src(example[0])})", repr(example[1])]
    body = "\n".join(("    " + line) if line else "" for line in lines)
    return f'    """{body.lstrip()}\n    """\n'


def _args_src(args: tuple) -> str:
    return ", ".join(repr(a) for a in args)


def _load(source: str, name: str) -> Callable[..., Any]:
    namespace: dict[str, Any] = {}
    exec(compile(source, f"<reference {name}>", "exec"), namespace)  # our own reference code, not user input
    return namespace[name]


def _run_reference(fn: Callable[..., Any], args: tuple, name: str) -> Any:
    before = repr(args)
    work = copy.deepcopy(args)
    try:
        result = fn(*work)
    except Exception as exc:  # a broken family definition: say which problem and input
        raise RuntimeError(f"reference {name}{before} raised {exc!r}") from exc
    if repr(work) != before:
        raise RuntimeError(f"reference {name} modified its input {before} -> {work!r}")
    text = repr(result)
    if repr(ast.literal_eval(text)) != text:
        raise RuntimeError(f"reference {name}{before} returned {text}, which does not round-trip as a literal")
    return result


def _check_spec(spec: Spec, solution: str, cases: list[tuple[tuple, Any]]) -> None:
    name = spec.entry_point
    if len(cases) < 5:
        raise RuntimeError(f"{name}: {len(cases)} test cases, need at least 5")
    if not 1 <= len(spec.key_patterns) <= 3 or any(p not in solution for p in spec.key_patterns):
        raise RuntimeError(f"{name}: key patterns {spec.key_patterns} must be 1-3 substrings of the solution")
    if all(expected is None for _, expected in cases):
        raise RuntimeError(f"{name}: every expected value is None, so `return None` would pass")
    if any("\n" in text for text, _ in spec.steps):
        raise RuntimeError(f"{name}: a step text spans lines")


# ------------------------------------------------------------------------------------------------- splitting


def split_key(problem: dict) -> str:
    """The variant group of a problem: ``family[option=value,...]`` for generator-v1 problems, else its task_id.

    Problems in one group differ only in noun, verb, phrasing or returned container; they must share a split.

    Raises:
        ValueError: a ``generated:v1`` problem whose task_id is malformed or does not match the v1 catalogue
            (for example data written by another generator version).
    """
    if problem.get("source") != SOURCE:
        return str(problem["task_id"])
    match = _TASK_ID.match(str(problem.get("task_id", "")))
    if match is None:
        raise ValueError(f"task_id {problem.get('task_id')!r} is not of the form {TASK_PREFIX}/<family>/<index>")
    variant = _variant(match.group(1), int(match.group(2)))
    if variant is None or variant.entry_point != problem.get("entry_point"):
        raise ValueError(
            f"problem {problem['task_id']!r} ({problem.get('entry_point')!r}) is not in the {SOURCE} catalogue; "
            "was it generated by another version?"
        )
    return variant.group


def assign_splits(
    problems: Sequence[dict],
    seed: int,
    val_frac: float = 0.1,
    test_frac: float = 0.1,
    heldout_families: Sequence[str] = (),
) -> list[dict]:
    """New dicts with ``split`` set to train/val/test, holding out whole variant groups (:func:`split_key`), and
    ``heldout`` for every problem of a family named in ``heldout_families`` (whole families never trained on, so
    "generalises to unseen tasks" is measured on our own data too).

    Per other family, the groups are shuffled with a stream seeded by (seed, family); groups go to test while that
    brings the family's test count closer to ``test_frac`` of its problems, then likewise to val, and the rest to
    train (always at least one train group per family). Fractions are therefore met per family up to one group's
    size. The result depends only on the problems and the arguments, not on the input order.

    Raises:
        ValueError: a fraction outside [0, 1), or val_frac + test_frac >= 1; a held-out family that is not in the
            catalogue, or every family of ``problems`` held out; see also :func:`split_key`.
    """
    known = {family.name for family in FAMILIES}
    unknown = sorted(set(heldout_families) - known)
    if unknown:
        raise ValueError(f"held-out families {unknown} are not in the catalogue; known: {sorted(known)}")
    present = {str(p.get("family", "")) for p in problems}
    if present and present <= set(heldout_families):
        raise ValueError(f"every family of the problems is held out ({sorted(present)}): nothing is left to train on")
    for label, frac in (("val_frac", val_frac), ("test_frac", test_frac)):
        if not 0.0 <= frac < 1.0:
            raise ValueError(f"{label} must be in [0, 1), got {frac}")
    if val_frac + test_frac >= 1.0:
        raise ValueError(f"val_frac + test_frac must be < 1, got {val_frac + test_frac}")
    keys = [split_key(p) for p in problems]
    sizes: dict[str, Counter] = defaultdict(Counter)
    for problem, key in zip(problems, keys, strict=True):
        sizes[str(problem.get("family", ""))][key] += 1
    split_of: dict[str, str] = {}
    for family in sorted(sizes):
        groups = sorted(sizes[family])
        if family in heldout_families:
            split_of.update(dict.fromkeys(groups, "heldout"))
            continue
        _rng(seed, f"split/{family}").shuffle(groups)
        total = sum(sizes[family].values())
        start = 0
        for split, frac in (("test", test_frac), ("val", val_frac)):
            target, taken = frac * total, 0
            while start < len(groups) - 1:
                size = sizes[family][groups[start]]
                if abs(taken + size - target) >= abs(taken - target):
                    break
                split_of[groups[start]] = split
                taken += size
                start += 1
        for group in groups[start:]:
            split_of[group] = "train"
    return [{**problem, "split": split_of[key]} for problem, key in zip(problems, keys, strict=True)]


# --------------------------------------------------------------------------------------------------- leakage


def normalise_text(text: str) -> str:
    """Lowercase, remove digits, collapse whitespace runs to one space, strip (as tasks.validate's leakage key)."""
    return re.sub(r"\s+", " ", re.sub(r"\d", "", text.lower())).strip()


def prompt_hash(problem: dict, mask_name: bool = False) -> str:
    """SHA-256 hex of the normalised prompt; with ``mask_name`` the entry point is replaced by ``<fn>`` first."""
    prompt = problem["prompt"]
    if mask_name:
        prompt = prompt.replace(problem["entry_point"], "<fn>")
    return hashlib.sha256(normalise_text(prompt).encode("utf-8")).hexdigest()


def leakage_report(problems: Sequence[dict]) -> dict:
    """How far val/test problems are from train ones; the hard counts must all be 0 for a clean split.

    Returns a dict with
    - ``n`` and ``groups``: problems and variant groups per split;
    - ``group_overlap``, ``entry_point_overlap``: groups / entry points found in more than one split;
    - ``prompt_hash_collisions``: normalised-prompt hashes (:func:`prompt_hash`) found in more than one split, and
      ``masked_prompt_hash_collisions`` the same with entry points masked (a stricter check);
    - ``similarity``: for every val/test problem, the highest Jaccard similarity between the word-bigram sets of
      its instruction and of any train problem's of the same family (lowercased, digits removed, entry point
      masked; punctuation marks count as words, so `;` vs `,` matters); ``mean``/``median``/``max`` per held-out
      split (0.0 when it has none);
    - ``most_similar``: the five closest (held-out, train) pairs.
    Comparing within families keeps it fast (well under a second for 2,000 problems).
    """
    splits = sorted({str(p.get("split", "")) for p in problems})
    report: dict[str, Any] = {
        "n": {s: sum(1 for p in problems if p.get("split") == s) for s in splits},
        "groups": {s: len({split_key(p) for p in problems if p.get("split") == s}) for s in splits},
        "group_overlap": _overlap(problems, split_key),
        "entry_point_overlap": _overlap(problems, lambda p: p["entry_point"]),
        "prompt_hash_collisions": _overlap(problems, prompt_hash),
        "masked_prompt_hash_collisions": _overlap(problems, lambda p: prompt_hash(p, mask_name=True)),
    }
    train: dict[str, list[tuple[str, frozenset]]] = defaultdict(list)
    for p in problems:
        if p.get("split") == "train":
            train[p["family"]].append((p["task_id"], _shingles(p)))
    best: dict[str, list[float]] = {"val": [], "test": []}
    pairs = []
    for p in problems:
        split = p.get("split")
        if split not in best:
            continue
        tokens = _shingles(p)
        top, top_id = 0.0, None
        for task_id, other in train[p["family"]]:
            shared = len(tokens & other)
            score = shared / (len(tokens) + len(other) - shared)
            if score > top:
                top, top_id = score, task_id
        best[split].append(top)
        pairs.append((top, p["task_id"], top_id))
    report["similarity"] = {
        "metric": "word-bigram Jaccard of instructions (digits removed, name masked), max over same-family train",
        **{split: _summary(values) for split, values in best.items()},
    }
    pairs.sort(key=lambda item: (-item[0], item[1]))
    report["most_similar"] = [{"task_id": a, "train_task_id": b, "similarity": round(s, 4)} for s, a, b in pairs[:5]]
    return report


def _shingles(problem: dict) -> frozenset:
    """Word bigrams of the normalised instruction (entry point masked); punctuation marks count as words."""
    text = normalise_text(problem["instruction"].replace(problem["entry_point"], " fn "))
    words = re.findall(r"[a-z_]+|[^\sa-z_]", text)
    # Joined into strings: a str caches its hash, a tuple does not (this is the report's hot loop).
    return frozenset(f"{a} {b}" for a, b in zip(words[:-1], words[1:], strict=True))


def _overlap(problems: Iterable[dict], key: Callable[[dict], str]) -> int:
    seen: dict[str, set[str]] = defaultdict(set)
    for p in problems:
        seen[key(p)].add(str(p.get("split", "")))
    return sum(1 for found in seen.values() if len(found) > 1)


def _summary(values: list[float]) -> dict[str, float]:
    if not values:
        return {"n": 0, "mean": 0.0, "median": 0.0, "max": 0.0}
    return {
        "n": len(values),
        "mean": round(statistics.fmean(values), 4),
        "median": round(statistics.median(values), 4),
        "max": round(max(values), 4),
    }


# ----------------------------------------------------------------------------------------------------- misc


def _rng(seed: int, label: str) -> random.Random:
    """A random stream for (seed, label) that is the same in every process (no salted hash())."""
    digest = hashlib.sha256(f"{GENERATOR_VERSION}/{seed}/{label}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


@cache
def _variant(family: str, index: int) -> Variant | None:
    try:
        variants = catalogue(family_by_name(family))
    except KeyError:
        return None
    return variants[index] if 0 <= index < len(variants) else None
