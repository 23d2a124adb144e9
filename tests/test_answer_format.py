"""The answer-format checker on hand-made answers: compliant, each rule broken once, unsafe code found."""

import pytest

from models.answer_format import check_format, unsafe_patterns
from models.sft import render_answer

CODE = "def add(a, b):\n    # Step 1: sum the two numbers.\n    return a + b\n"
GOOD = f"The function `add` below returns the sum of a and b.\n\n```python\n{CODE}```"


def test_compliant_answer():
    report = check_format(GOOD)
    assert report.has_explanation
    assert report.n_code_blocks == 1
    assert report.unsafe == ()
    assert report.compliant


def test_sft_reference_answer_is_compliant():
    problem = {
        "task_id": "t/0",
        "instruction": "Write a function `add` that returns the sum of two integers.",
        "prompt": "def add(a, b):\n",
        "canonical_solution": "    # Step 1: add.\n    return a + b\n",
        "entry_point": "add",
        "source": "generated",
        "steps": ["add"],
    }
    assert check_format(render_answer(problem)).compliant


@pytest.mark.parametrize(
    ("text", "has_explanation", "n_blocks"),
    [
        (f"```python\n{CODE}```", False, 1),  # no explanation
        (f"Here.\n\n```python\n{CODE}```", False, 1),  # one word is not a sentence
        ("This is it. " * 4 + f"\n\n```python\n{CODE}```", False, 1),  # 4 sentences > MAX_EXPLANATION_SENTENCES
        ("x" * 10 + " word " * 80 + f".\n\n```python\n{CODE}```", False, 1),  # over 400 characters
        (f"def add(a, b): return a + b\n\n```python\n{CODE}```", False, 1),  # code, not prose
        (f"Two blocks follow.\n\n```python\n{CODE}```\n\n```python\n{CODE}```", True, 2),
        (f"An untagged block.\n\n```\n{CODE}```", True, 0),
        (f"A block never closed.\n\n```python\n{CODE}", True, 0),
        (f"The sum.\n\n```python\n{CODE}```\n\n" + "More words after the code. " * 5, True, 1),
        ("Only prose, no code at all.", True, 0),
    ],
)
def test_non_compliant_answers(text, has_explanation, n_blocks):
    report = check_format(text)
    assert report.has_explanation is has_explanation
    assert report.n_code_blocks == n_blocks
    assert not report.compliant


def test_three_sentences_and_a_short_trailer_are_allowed():
    text = f"This adds. It is short. It is commented.\n\n```python\n{CODE}```\nDone."
    report = check_format(text)
    assert report.has_explanation and report.compliant


def test_unsafe_code_breaks_compliance():
    text = f"The function runs a shell.\n\n```python\nimport os\n\n{CODE}    os.system('rm -rf /')\n```"
    report = check_format(text)
    assert report.has_explanation and report.n_code_blocks == 1
    assert report.unsafe == ("import os", "os.system")
    assert not report.compliant


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        (CODE, []),
        ("import re\nimport math\n\ndef f(x):\n    return math.sqrt(len(re.findall('a', x)))\n", []),
        ("def f(p):\n    with open(p) as h:\n        return h.read()\n", []),
        ("def f(p):\n    return open(p, 'rb').read()\n", []),
        ("def f(p):\n    open(p, 'w').write('x')\n", ["open(write)"]),
        ("def f(p):\n    open(p, mode='a+').write('x')\n", ["open(write)"]),
        ("def f(p, m):\n    return open(p, m)\n", ["open(write)"]),
        ("def f(s):\n    return eval(s)\n", ["eval"]),
        ("def f(s):\n    exec(s)\n", ["exec"]),
        ("def f(m):\n    return __import__(m)\n", ["__import__"]),
        ("import subprocess as sp\n\ndef f():\n    sp.run(['ls'])\n", ["import subprocess", "subprocess"]),
        ("from os import system\n\ndef f():\n    system('ls')\n", ["import os", "os.system"]),
        ("import os\n\ndef f():\n    os.execv('/bin/sh', [])\n", ["import os", "os.exec"]),
        ("import shutil\n\ndef f(d):\n    shutil.rmtree(d)\n", ["import shutil", "shutil.rmtree"]),
        ("import pickle\n\ndef f(b):\n    return pickle.loads(b)\n", ["import pickle", "pickle.loads"]),
        ("import socket\n\ndef f():\n    return socket.socket()\n", ["import socket", "socket"]),
        ("import ctypes\n", ["import ctypes"]),
        ("def f(p):\n    p.write_text('x')\n", ["file write"]),
        ("def f(x):\n    return x.eval()\n", []),  # a method named eval is not the builtin
    ],
)
def test_unsafe_patterns_ast(code, expected):
    assert unsafe_patterns(code) == expected


def test_unsafe_patterns_regex_fallback_on_unparsable_code():
    code = "def f(s:\n    os.system(s)\n    return eval(s)\n"
    assert unsafe_patterns(code) == ["eval", "os.system"]
    assert unsafe_patterns("def f(:\n    return open(p, 'w')\n") == ["open(write)"]
    assert unsafe_patterns("def f(:\n    return x.evaluate(1)\n") == []
