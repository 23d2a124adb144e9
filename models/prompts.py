"""How a problem is put to the model and how its reference answer reads: one definition for SFT, sampling and RL.

The user turn is the natural-language instruction followed by the code to complete in a fenced python block. For the
bundled generated problems the instruction already states the whole task (edge cases included), so the block holds
only the imports and the signature — repeating the docstring would double the prompt's length (≈ 450 → ≈ 200
tokens) for no information. HumanEval-style problems, whose instruction is generic, keep their full prompt.
"""

from __future__ import annotations

import ast

from models.sampling import format_answer as fenced  # one definition of the answer's code block


def signature(problem: dict) -> str:
    """The problem's prompt up to and including the entry point's ``def`` line(s), without its docstring.

    Falls back to the whole prompt when it does not parse or has no such function.
    """
    prompt = problem["prompt"]
    try:
        tree = ast.parse(prompt)
    except SyntaxError:
        return prompt
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == problem["entry_point"] and node.body:
            first = node.body[0]
            is_docstring = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
            if not is_docstring:
                return prompt
            return "".join(prompt.splitlines(keepends=True)[: first.lineno - 1])
    return prompt


def code_to_complete(problem: dict) -> str:
    """What the user shows the model: the signature alone for generated problems, the full prompt otherwise."""
    return signature(problem) if str(problem.get("source", "")).startswith("generated") else problem["prompt"]


def user_message(problem: dict) -> str:
    """The user turn: the instruction, then :func:`code_to_complete` in a fenced python block."""
    content = problem["instruction"].strip()
    code = code_to_complete(problem)
    if code.strip():
        content += "\n\n" + fenced(code)
    return content


def reference_code(problem: dict) -> str:
    """The complete reference program as the answer shows it: :func:`code_to_complete` + the canonical body."""
    return code_to_complete(problem) + problem["canonical_solution"]
