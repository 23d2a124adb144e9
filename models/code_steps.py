"""Steps of a sampled answer: the lines of its code, and the token that completes each line.

DiDPO puts a process reward on the token that completes each step (DIDPO.md, "Objects": a step is one line of
code; step j ends at token t_j). The code is the one `models.sampling.extract_code` reads from the answer (the
first fenced python block, or the whole text when it is code), so rewards and the verifier see the same program.
"""

from __future__ import annotations

import bisect
import os
import re

from models.sampling import _CODE_START, _FENCED_BLOCK, _OPEN_FENCE, _PYTHON_TAGS, _looks_like_code, extract_code


def code_span(text: str) -> tuple[int, int]:
    """Where `extract_code(text)` lies in `text`: ``(start, end)`` with ``text[start:end] == extract_code(text)``.

    Follows `extract_code`'s order of rules (first closed python/untagged fenced block, else an unclosed
    one, else the whole text when it is code, else the longest parsing stretch from the first
    ``def``/``class``/``import``/``from``/``@`` line); ``(0, 0)`` when there is no code.
    """
    for match in _FENCED_BLOCK.finditer(text):
        if match.group(1).lower() in _PYTHON_TAGS:
            return match.start(2), match.end(2)
    for match in _OPEN_FENCE.finditer(text):
        if match.group(1).lower() in _PYTHON_TAGS and "```" not in text[match.end() :]:
            return match.end(), len(text)
    if _looks_like_code(text):
        return 0, len(text)
    start = _CODE_START.search(text)
    if start is None:
        return 0, 0
    code = extract_code(text)
    return start.start(), start.start() + len(code)


def _char_ends(tokenizer, completion_ids: list[int], text: str) -> list[int]:
    """For each token i, how many characters of `text` the tokens 0..i decode to (non-decreasing).

    Decodes every prefix (one batched call; about 30 ms for 256 tokens): exact for any tokenizer, including
    multi-character tokens and multi-byte characters split over tokens. A prefix that is not a prefix of `text`
    (it ends inside a character and decodes to a replacement character, or the decoder tidies spaces
    differently) counts for the characters it shares with `text`.
    """
    prefixes = tokenizer.batch_decode(
        [completion_ids[: i + 1] for i in range(len(completion_ids))], skip_special_tokens=True
    )
    ends, end = [], 0
    for decoded in prefixes:
        shared = len(decoded) if text.startswith(decoded) else len(os.path.commonprefix([decoded, text]))
        end = max(end, shared)
        ends.append(end)
    return ends


def code_line_ends(tokenizer, completion_ids: list[int]) -> tuple[list[str], list[int]]:
    """The code lines (steps) of a completion and, for each, the index of the token that completes it.

    The completion is decoded with ``skip_special_tokens=True`` (as the sampler's ``Completion.text``); its
    code is `extract_code`'s. Steps are the code's lines without their newline; blank (whitespace-only) lines
    are not steps. Line j's end token is the one whose decoded text contains the line's terminating newline,
    or, for a last line without one, the token holding the line's last character. One token holding several
    newlines ends several lines: its index then repeats (rewards placed on it add up).

    Args:
        tokenizer: a Hugging Face tokenizer (``batch_decode``).
        completion_ids: the completion's token ids (special tokens such as a final eos allowed).

    Returns:
        ``(lines, end_tokens)``: N lines and N non-decreasing indices into `completion_ids` (both empty when
        the answer has no code).
    """
    if not completion_ids:
        return [], []
    text = tokenizer.decode(completion_ids, skip_special_tokens=True)
    start, end = code_span(text)
    if start == end:
        return [], []
    ends = _char_ends(tokenizer, completion_ids, text)
    lines, end_tokens = [], []
    for match in re.finditer(r"[^\n]*(\n|$)", text[start:end]):
        line = match.group(0).rstrip("\n")
        if not line.strip():
            continue
        # The character that completes the line: its newline, else its last character.
        last_char = start + match.end() - 1
        token = bisect.bisect_right(ends, last_char)
        lines.append(line)
        end_tokens.append(min(token, len(completion_ids) - 1))
    return lines, end_tokens
