"""The repository stands alone and cites past work by date or commit (docs/DESIGN.md, "The repository stands alone").

Every git-tracked file (its path and, unless it is binary, its text) is checked: none may name a path outside the
repository (the sibling folder the design notes were once read from) or refer to a numbered past work period (the
word for a work period followed by its number, in any of the forms below); README.md stays a user's document of at
most 260 lines. Binary files (a NUL byte in their first 8,000 bytes, git's own test) are the only files left out.
This file spells its examples in pieces so that it passes its own check.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README_MAX_LINES = 260

# A path outside the repository: the sibling folder the design notes were once read from, or its two notes.
OUTSIDE = re.compile(r"\.\./shared\b|(?<![\w.-])shared/(?:DESIGN|DIDPO)\.md")
# A numbered work period: the word, singular or plural, any case of its first letter, then its number after a
# space, a hyphen, an underscore or nothing (test_the_patterns_catch_what_they_mean spells each form out).
PERIOD = re.compile(r"(?<![A-Za-z])[Ss]essions?[ _-]?\d+")
WORD = "sess" + "ion"  # the word, in pieces (see the module docstring)
UP = "../" + "shared"


def tracked_files() -> list[str]:
    """The repository's git-tracked paths (the index: what a commit of the working tree would hold)."""
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: no tracked files to check")
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    return [path for path in out.decode("utf-8", errors="surrogateescape").split("\0") if path]


def text_of(path: str) -> str | None:
    """The file's text, or None for a binary file or a tracked file deleted from the working tree."""
    file = ROOT / path
    if not file.is_file():
        return None
    data = file.read_bytes()
    if b"\0" in data[:8000]:
        return None
    return data.decode("utf-8", errors="replace")


def offenders(pattern: re.Pattern[str]) -> list[str]:
    """``path:line: text`` for every match of `pattern` in a tracked file's path or text."""
    found = []
    for path in tracked_files():
        if pattern.search(path):
            found.append(f"{path}: (the file's path)")
        text = text_of(path)
        if text is None:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            match = pattern.search(line)
            if match:
                found.append(f"{path}:{number}: {line.strip()[:160]}")
    return found


def test_the_patterns_catch_what_they_mean():
    """The checker itself: each form a past reference took is caught, and the words the code needs are not."""
    for text in (f"see {UP}/DESIGN.md", f"(`{UP}/DIDPO.md` v2)", "shared" + "/DIDPO.md, Loss"):
        assert OUTSIDE.search(text), text
    for text in ("docs/DIDPO.md", "docs/DESIGN.md", "a shared DVC remote", "SysV shared memory"):
        assert not OUTSIDE.search(text), text
    caught = (
        f"{WORD} 13",
        f"{WORD.title()} 15 re-ran",
        f"{WORD}s 16–17",
        f"the {WORD}-15 run",
        f"fresh_run_{WORD}7",
        f"{WORD}_7",
    )
    for text in caught:
        assert PERIOD.search(text), text
    for text in (f"{WORD}_id", f"its own {WORD}", f"a {WORD}'s fresh-clone run", f"ob{WORD} 4", "2026-12-03"):
        assert not PERIOD.search(text), text


def test_no_tracked_file_refers_outside_the_repository():
    """A clone has nothing beside it: the design and the RL algorithm are in docs/DESIGN.md and docs/DIDPO.md."""
    found = offenders(OUTSIDE)
    assert not found, "paths outside the repository (point at docs/ instead):\n" + "\n".join(found)


def test_no_tracked_file_refers_to_numbered_work_periods():
    """Past work is cited by date or commit (`git log`), never by how the work was organised."""
    found = offenders(PERIOD)
    assert not found, "numbered work periods (cite a date or a commit instead):\n" + "\n".join(found)


def test_readme_is_a_users_document_of_at_most_260_lines():
    """README.md is read first: the lab notes live in docs/results/LAB_NOTES.md, the design in docs/."""
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines (at most {README_MAX_LINES})"
    head = "\n".join(lines[:15])
    assert "make run" in head and "make test" in head, "README's first lines name the two commands"
