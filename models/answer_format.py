"""The answer format users want, checked: a short explanation, then one fenced python block, nothing unsafe.

The format SFT trains (`models.sft.render_answer`) and DPO rewards::

    The function `clean` below strips each string and drops empty ones; each step is commented.

    ```python
    def clean(items):
        # Step 1: ...
    ```

`check_format` reports the parts; an answer is *compliant* when all of these hold:

1. **explanation**: the prose before the first code fence has 1 to `MAX_EXPLANATION_SENTENCES` sentences, at most
   `MAX_EXPLANATION_CHARS` characters, at least two words of letters, and is not itself code;
2. **exactly one python block**: one closed fenced block tagged ``python``/``py``/``python3`` and no other fence
   (an untagged or other-language block, or an unclosed fence, breaks compliance);
3. **no unsafe pattern** in the block's code (`unsafe_patterns`);
4. **nothing substantial after the block**: at most `MAX_TRAILING_CHARS` characters of prose after the closing fence.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from models.sampling import extract_code

MAX_EXPLANATION_SENTENCES = 3
MAX_EXPLANATION_CHARS = 400
MAX_TRAILING_CHARS = 80

_FENCE_LINE = re.compile(r"^[ \t]*```[ \t]*([\w+.-]*)[^\n]*$", re.MULTILINE)
_PYTHON_TAGS = {"python", "py", "python3"}
_SENTENCE_SPLIT = re.compile(r"(?<=[.!?])\s+|\n\s*\n")
_WORD = re.compile(r"[A-Za-z]{2,}")
_CODE_LINE = re.compile(r"^\s*(?:def |class |import |from \S+ import |return |@\w)", re.MULTILINE)

# Modules whose import alone is flagged: process control, raw sockets, native code, arbitrary deserialisation.
UNSAFE_MODULES = frozenset({"os", "subprocess", "socket", "ctypes", "shutil", "pickle", "marshal", "multiprocessing"})
# Fully qualified calls that are flagged (after resolving import aliases); see also _REPORTED_AS_PREFIX.
_UNSAFE_CALLS = (
    "os.system",
    "os.popen",
    "os.remove",
    "os.unlink",
    "os.rmdir",
    "os.removedirs",
    "os.kill",
    "os.fork",
    "shutil.rmtree",
    "pickle.loads",
    "pickle.load",
    "marshal.loads",
    "importlib.import_module",
)
_UNSAFE_BUILTINS = frozenset({"eval", "exec", "__import__"})
_WRITE_METHODS = frozenset({"write_text", "write_bytes"})

_REGEX_FALLBACK = (
    ("os.system", re.compile(r"\bos\s*\.\s*system\s*\(")),
    ("os.popen", re.compile(r"\bos\s*\.\s*popen\s*\(")),
    ("subprocess", re.compile(r"\bsubprocess\b")),
    ("socket", re.compile(r"\bsocket\b")),
    ("ctypes", re.compile(r"\bctypes\b")),
    ("shutil.rmtree", re.compile(r"\bshutil\s*\.\s*rmtree\b")),
    ("pickle.loads", re.compile(r"\bpickle\s*\.\s*loads?\s*\(")),
    ("eval", re.compile(r"(?<![\w.])eval\s*\(")),
    ("exec", re.compile(r"(?<![\w.])exec\s*\(")),
    ("__import__", re.compile(r"\b__import__\s*\(")),
    ("open(write)", re.compile(r"(?<![\w.])open\s*\([^)]*['\"][rbt]*[wax+]")),
    ("import os", re.compile(r"^\s*(?:import|from)\s+os\b", re.MULTILINE)),
)


@dataclass(frozen=True)
class FormatReport:
    """What `check_format` found in one answer.

    Attributes:
        has_explanation: the prose before the first fence is a short explanation (module docstring, rule 1).
        n_code_blocks: closed fenced blocks tagged python/py/python3.
        unsafe: `unsafe_patterns` of the code of every fenced block (or of the bare code when there is no
            fence), sorted, without repeats.
        compliant: all four rules of the module docstring hold.
    """

    has_explanation: bool
    n_code_blocks: int
    unsafe: tuple[str, ...]
    compliant: bool


def _blocks(text: str) -> tuple[list[tuple[str, str]], bool, int, int]:
    """Fenced blocks as ``(tag, body)``, whether a fence is left open, where the first fence starts (len(text)
    without a fence) and where the last closed block ends."""
    fences = list(_FENCE_LINE.finditer(text))
    blocks = []
    for opening, closing in zip(fences[::2], fences[1::2], strict=False):
        blocks.append((opening.group(1).lower(), text[opening.end() + 1 : closing.start()]))
    first = fences[0].start() if fences else len(text)
    last_end = fences[len(blocks) * 2 - 1].end() if blocks else len(text)
    return blocks, len(fences) % 2 == 1, first, last_end


def _is_explanation(prose: str) -> bool:
    prose = prose.strip()
    if not prose or len(prose) > MAX_EXPLANATION_CHARS or len(_WORD.findall(prose)) < 2:
        return False
    if _CODE_LINE.search(prose):
        return False
    sentences = [s for s in _SENTENCE_SPLIT.split(prose) if s.strip()]
    return 1 <= len(sentences) <= MAX_EXPLANATION_SENTENCES


def check_format(text: str) -> FormatReport:
    """Check an assistant answer against the project's answer format (see the module docstring).

    Args:
        text: the decoded answer (no chat-template tokens).

    Returns:
        a `FormatReport`.
    """
    blocks, unclosed, first_fence, last_end = _blocks(text)
    has_explanation = _is_explanation(text[:first_fence])
    python_blocks = [body for tag, body in blocks if tag in _PYTHON_TAGS]
    codes = [body for _, body in blocks] or [extract_code(text)]
    unsafe = tuple(sorted({name for code in codes for name in unsafe_patterns(code)}))
    trailing = text[last_end:].strip() if blocks else ""
    compliant = (
        has_explanation
        and len(python_blocks) == 1
        and len(blocks) == 1
        and not unclosed
        and not unsafe
        and len(trailing) <= MAX_TRAILING_CHARS
        and "```" not in trailing
    )
    return FormatReport(
        has_explanation=has_explanation, n_code_blocks=len(python_blocks), unsafe=unsafe, compliant=compliant
    )


def _dotted(node: ast.AST) -> str | None:
    """``a.b.c`` for a Name/Attribute chain, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


_REPORTED_AS_PREFIX = ("subprocess", "socket", "ctypes", "os.exec", "os.spawn")


def _call_is_unsafe(name: str) -> str | None:
    """The reported name when the fully qualified call `name` is unsafe, else None."""
    for prefix in _REPORTED_AS_PREFIX:
        if name == prefix or name.startswith(prefix + ".") or (prefix.startswith("os.") and name.startswith(prefix)):
            return prefix
    return name if name in _UNSAFE_CALLS else None


def _open_mode_writes(call: ast.Call) -> bool:
    mode = call.args[1] if len(call.args) > 1 else next((k.value for k in call.keywords if k.arg == "mode"), None)
    if mode is None:
        return False
    if isinstance(mode, ast.Constant) and isinstance(mode.value, str):
        return any(c in mode.value for c in "wax+")
    return True  # a computed mode cannot be shown to be read-only


def unsafe_patterns(code: str) -> list[str]:
    """Names of the unsafe constructs in a piece of Python code, sorted, without repeats.

    Flagged (AST-based when `code` parses; import aliases such as ``import subprocess as sp`` or
    ``from os import system`` are resolved to the full name):

    - ``import <m>`` for any module in `UNSAFE_MODULES` (os, subprocess, socket, ctypes, shutil, pickle, marshal,
      multiprocessing), ``from <m> import ...`` included;
    - calls to ``os.system``, ``os.popen``, ``os.remove``, ``os.unlink``, ``os.rmdir``, ``os.removedirs``,
      ``os.kill``, ``os.fork``, ``os.exec*`` (reported "os.exec"), ``os.spawn*`` ("os.spawn"), any ``subprocess.*``
      ("subprocess"), any ``socket.*`` ("socket"), any ``ctypes.*`` ("ctypes"), ``shutil.rmtree``,
      ``pickle.load(s)``, ``marshal.loads``, ``importlib.import_module``;
    - calls to the builtins ``eval``, ``exec``, ``__import__``;
    - ``open(...)`` in a write/append/create/update mode (a mode containing w, a, x or +, or a computed mode),
      reported "open(write)"; ``.write_text(...)``/``.write_bytes(...)`` method calls, reported "file write".

    When `code` does not parse, a regex fallback looks for: os.system/os.popen calls, the words subprocess,
    socket and ctypes, shutil.rmtree, pickle.load(s) calls, eval/exec/__import__ calls, ``open(`` with a
    write-mode string literal, and ``import os``/``from os``.

    Args:
        code: Python source (may not parse).

    Returns:
        names such as ``["eval", "import os", "os.system"]``; [] for safe code.
    """
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return sorted({name for name, pattern in _REGEX_FALLBACK if pattern.search(code)})
    found: set[str] = set()
    aliases: dict[str, str] = {}  # local name -> fully qualified name
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                aliases[(alias.asname or alias.name).split(".")[0]] = (
                    alias.name if alias.asname else alias.name.split(".")[0]
                )
                if alias.name.split(".")[0] in UNSAFE_MODULES:
                    found.add(f"import {alias.name.split('.')[0]}")
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            root = node.module.split(".")[0]
            if root in UNSAFE_MODULES:
                found.add(f"import {root}")
            for alias in node.names:
                aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = _dotted(node.func)
        if name is not None:
            head, _, rest = name.partition(".")
            full = aliases.get(head, head) + ("." + rest if rest else "")
            if full in _UNSAFE_BUILTINS and head not in aliases:
                found.add(full)
            elif (hit := _call_is_unsafe(full)) is not None:
                found.add(hit)
            elif full in ("open", "io.open", "builtins.open") and _open_mode_writes(node):
                found.add("open(write)")
        if isinstance(node.func, ast.Attribute) and node.func.attr in _WRITE_METHODS:
            found.add("file write")
    return sorted(found)
