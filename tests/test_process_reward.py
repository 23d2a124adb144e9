"""Process rewards: code steps → end tokens, the prefix score Φ and its components, DiD rewards (telescoping, the
hand-worked two-line example, edge cases), outcome / overlong / format terms and per-token rewards."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from models.advantages import gae
from models.code_steps import code_line_ends, code_span
from models.policy import build_tiny_tokenizer
from models.process_reward import (
    ProcessRewardConfig,
    did_rewards,
    format_reward,
    lint_violations,
    outcome_reward,
    overlong_penalty,
    prefix_score,
    prefix_scores,
    progress,
    reference_curve,
    similarity,
    syntax_ok,
    terminal_reward,
    token_rewards,
)
from models.sampling import extract_code

# ------------------------------------------------------------------------------------------------ code steps


class FakeTokenizer:
    """Token id i decodes to VOCAB[i]; the last id is a special token (skipped like eos)."""

    def __init__(self, vocab):
        self.vocab = list(vocab) + ["<eos>"]
        self.eos = len(vocab)

    def decode(self, ids, skip_special_tokens=True):
        return "".join("" if (i == self.eos and skip_special_tokens) else self.vocab[i] for i in ids)

    def batch_decode(self, batch, skip_special_tokens=True):
        return [self.decode(ids, skip_special_tokens) for ids in batch]


def test_line_ends_on_the_token_holding_the_newline_and_blank_lines_are_not_steps():
    tok = FakeTokenizer(["Here:\n", "```python\n", "def f(x):", "\n", "    y = x\n\n    return", " y\n", "```"])
    lines, ends = code_line_ends(tok, [0, 1, 2, 3, 4, 5, 6, tok.eos])
    assert lines == ["def f(x):", "    y = x", "    return y"]
    # "def f(x):" ends with token 3 ("\n"); "    y = x" with token 4 (its first newline; the blank line after it
    # is not a step); "    return y" with token 5.
    assert ends == [3, 4, 5]


def test_several_lines_ending_on_one_token_keep_that_token():
    tok = FakeTokenizer(["```python\n", "def f(x):\n    y = 1\n", "    return y\n```", "\nDone."])
    lines, ends = code_line_ends(tok, [0, 1, 2, 3])
    assert lines == ["def f(x):", "    y = 1", "    return y"]
    assert ends == [1, 1, 2]
    # rewards placed on a repeated token add up
    rewards = token_rewards(np.array([0.5, 0.25, -1.0]), ends, outcome=2.0, length=4)
    assert rewards.tolist() == [0.0, 0.75, -1.0, 2.0]


def test_unfenced_code_and_a_last_line_without_newline():
    tok = FakeTokenizer(["def f", "(x):\n", "    return", " x"])
    assert code_line_ends(tok, [0, 1, 2, 3]) == (["def f(x):", "    return x"], [1, 3])


def test_no_code_no_steps():
    tok = FakeTokenizer(["Sorry, ", "I cannot help."])
    assert code_line_ends(tok, [0, 1]) == ([], [])
    assert code_line_ends(tok, []) == ([], [])


@pytest.mark.parametrize(
    "text",
    [
        "Sure:\n```python\ndef f(x):\n    return x\n```\nbye",
        "```bash\nls\n```\n```python\nx = 1\n```",
        "Truncated:\n```python\ndef f(x):\n    return",
        "def f(x):\n    return x\n",
        "I think this works.\ndef f(x):\n    return x\nHope it helps!",
        "No code here.",
    ],
)
def test_code_span_is_where_extract_code_reads(text):
    start, end = code_span(text)
    assert text[start:end] == extract_code(text)


def test_line_ends_with_a_real_byte_level_tokenizer_and_multibyte_characters():
    tok = build_tiny_tokenizer()
    text = "Sure 😀:\n```python\ndef clean(items):\n    # café ✓ étape\n\n    return [x.strip() for x in items]\n```\n"
    ids = tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    assert tok.decode(ids, skip_special_tokens=True) == text
    lines, ends = code_line_ends(tok, ids)
    assert lines == ["def clean(items):", "    # café ✓ étape", "    return [x.strip() for x in items]"]
    search = text.index("```python\n") + len("```python\n")
    for line, t in zip(lines, ends, strict=True):
        newline = text.index(line + "\n", search) + len(line)
        search = newline + 1
        # token t is the first whose decoded prefix includes the line's newline
        assert len(tok.decode(ids[:t], skip_special_tokens=True)) <= newline
        assert tok.decode(ids[: t + 1], skip_special_tokens=True).startswith(text[: newline + 1])


# ------------------------------------------------------------------------------------------------ Φ components


def test_syntax_is_valid_so_far():
    assert syntax_ok("")
    assert syntax_ok("def f(x):\n")  # an open block: incomplete, not wrong
    assert syntax_ok("x = (1,\n")  # an open bracket
    assert syntax_ok("def f(x):\n    return x\n")
    assert not syntax_ok("x = )\n")
    assert not syntax_ok("x = 1 +\n")
    assert not syntax_ok("def f(x):\nreturn x\n")  # missing indentation
    assert not syntax_ok("return 1\n")  # compile error: return outside a function


def test_style_counts_real_lint_violations():
    assert lint_violations("def f(x):\n    return x + 1\n") == ()
    assert lint_violations("x=1\n") == ("E225",)  # pycodestyle: missing whitespace around operator
    assert lint_violations("x = 1   \n") == ("W291",)  # trailing whitespace
    assert lint_violations("x = '" + "a" * 130 + "'\n") == ("E501",)  # longer than 120
    assert lint_violations("import os\n") == ("UnusedImport",)  # pyflakes
    assert lint_violations("def f():\n    return y\n") == ("UndefinedName",)
    assert sorted(lint_violations("import os\nx=1;\n")) == ["E225", "E703", "UnusedImport"]
    # an unfinished prefix: no syntax-error code (that is the syntax component's), pyflakes skipped
    assert lint_violations("def f(x):\n") == ()
    cfg = ProcessRewardConfig(w_syntax=0, w_style=1, w_semantic=0, w_task=0, style_scale=0.1)
    assert prefix_score(["import os", "x=1;"], {}, [], cfg) == pytest.approx(-0.3)


def test_semantic_is_token_similarity_and_task_is_the_fraction_of_key_patterns():
    assert similarity("def f(x):\n    return x + 1\n", "def f(x):\n    return x+1  # one\n") == 1.0
    # tokens def f ( x ) : return x + 2 ; (11) vs def f ( x ) : return x + 1 (10): 9 match → 2·9/21
    assert similarity("def f(x):\n    return x + 2;\n", "def f(x):\n    return x + 1\n") == pytest.approx(18 / 21)
    assert similarity("", "") == 1.0 and similarity("x = 1\n", "") == 0.0
    cfg = ProcessRewardConfig(w_syntax=0, w_style=0, w_semantic=0, w_task=1)
    problem = {"key_patterns": [".strip()", "is None", "not in seen"]}
    assert prefix_score(["if s is None:", "    return s.strip()"], problem, [], cfg) == pytest.approx(2 / 3)
    assert prefix_score(["return s.strip()"], {"key_patterns": []}, [], cfg) == 0.0
    assert prefix_score(["return s.strip()"], {}, [], cfg) == 0.0


def test_progress_alignment():
    np.testing.assert_allclose(progress(["a", "b", "c", "d"], ["x", "y"]), [0, 0.25, 0.5, 0.75, 1])
    # lines: "a = 1" ↔ ref 0 (1/4), "zzz" unmatched keeps 1/4, "b = 2" ↔ ref 1 (2/4), the last step reaches 1
    lines = ["a = 1", "zzz", "  b = 2  ", "return"]
    reference = ["a = 1", "b = 2", "c = 3", "d = 4"]
    np.testing.assert_allclose(progress(lines, reference, "lines"), [0, 0.25, 0.25, 0.5, 1.0])
    assert progress([], reference, "lines").tolist() == [0.0]
    with pytest.raises(ValueError, match="alignment"):
        progress(lines, reference, "tokens")


# ------------------------------------------------------------------------------------------------ DiD rewards

PROBLEM = {
    "key_patterns": ["is None", ".strip()", "not in seen"],
    "entry_point": "clean",
}
REFERENCE = [
    "def clean(items):",
    "    # Step 1: treat a missing list as empty",
    "    if items is None:",
    "        return []",
    "    seen = set()",
    "    out = []",
    "    for item in items:",
    "        item = item.strip()",
    "        if item and item not in seen:",
    "            seen.add(item)",
    "            out.append(item)",
    "    return out",
]
COMPLETIONS = {
    "reference": REFERENCE,
    "short": ["def clean(items):", "    return [x.strip() for x in items or [] if x.strip()]"],
    "broken": ["def clean(items):", "    out = [", "    return out)", "import os"],
    "messy": ["import os, re", "def clean(items):", "    out=[]", "    for i in items :", "        out.append(i)"],
    "one line": ["x = 1"],
}


@pytest.mark.parametrize("alignment", ["progress", "lines"])
@pytest.mark.parametrize("name", list(COMPLETIONS))
def test_did_rewards_telescope(name, alignment):
    rng = np.random.default_rng(len(name))
    weights = rng.uniform(-1, 2, size=4)
    cfg = ProcessRewardConfig(*weights, style_scale=0.3, alignment=alignment)
    lines = COMPLETIONS[name]
    did = did_rewards(lines, REFERENCE, PROBLEM, cfg)
    n, m = len(lines), len(REFERENCE)
    assert did.phi.shape == (n + 1,) and did.psi.shape == (m + 1,) and did.progress.shape == (n + 1,)
    assert did.r.shape == did.c.shape == did.d.shape == (n,)
    np.testing.assert_allclose(did.phi, prefix_scores(lines, PROBLEM, REFERENCE, cfg), rtol=0, atol=0)
    np.testing.assert_allclose(did.psi, reference_curve(REFERENCE, PROBLEM, cfg), rtol=0, atol=0)
    assert did.r.sum() == pytest.approx(did.phi[-1] - did.phi[0], abs=1e-12)
    expected = (did.phi[-1] - did.phi[0]) - (did.psi[-1] - did.psi[0])
    assert did.d.sum() == pytest.approx(expected, abs=1e-12)
    np.testing.assert_allclose(did.d, did.r - did.c, rtol=0, atol=0)
    assert np.all(np.diff(did.progress) >= 0) and did.progress[0] == 0 and did.progress[-1] == 1


def test_the_reference_against_itself_has_zero_did_rewards():
    did = did_rewards(REFERENCE, REFERENCE, PROBLEM, ProcessRewardConfig())
    np.testing.assert_allclose(did.d, 0.0, atol=1e-12)
    np.testing.assert_allclose(did.phi, did.psi, atol=1e-12)


def test_edge_cases_empty_completion_and_empty_reference():
    cfg = ProcessRewardConfig()
    empty = did_rewards([], REFERENCE, PROBLEM, cfg)
    # Φ(empty) = w_syntax·1 (empty is valid) + w_semantic·1 (empty vs the empty aligned prefix) = 2
    assert empty.phi.tolist() == [2.0] and empty.progress.tolist() == [0.0]
    assert empty.r.shape == empty.c.shape == empty.d.shape == (0,)
    no_reference = did_rewards(COMPLETIONS["short"], [], PROBLEM, cfg)
    assert no_reference.psi.shape == (1,)
    np.testing.assert_allclose(no_reference.c, 0.0, atol=0)
    np.testing.assert_allclose(no_reference.d, no_reference.r, atol=0)
    both = did_rewards([], [], {}, cfg)
    assert both.phi.shape == both.psi.shape == (1,) and both.d.shape == (0,)


def test_hand_worked_two_line_example():
    """Reference ``def f(x): return x + 1``; the completion writes ``return x + 2;``.

    Weights: w_syntax 1, w_style 0.5 (style_scale 0.2), w_semantic 2, w_task 1; key pattern "+ 1".

    Completion (N = 2), progress u = [0, 1/2, 1], aligned reference prefixes of ⌊u·2 + ½⌋ = 0, 1, 2 lines:
      Φ0 = 1·1 (empty is valid) + 0 + 2·1 (empty vs empty) + 0 = 3
      Φ1 = "def f(x):": valid so far 1, no lint, identical to reference line 1 → 1 + 2·1 = 3
      Φ2 = valid 1; one lint (E703 semicolon) → 0.5·(−0.2) = −0.1; tokens 9 of 11 vs 10 shared → 2·18/21 = 12/7;
           "+ 1" absent → 0.  Φ2 = 0.9 + 12/7
      r = [0, Φ2 − Φ1] = [0, 12/7 − 2.1] = [0, −27/70]
    Reference (M = 2): Ψ0 = 3, Ψ1 = 3 (like Φ1), Ψ2 = 1 + 0 + 2·1 + 1·1 = 4; Ψ(u) at u = 0, ½, 1 = 3, 3, 4
      c = [0, 1];  d = r − c = [0, −97/70]
    Tokens: line 1 ends on token 1, line 2 on token 2, length 4; outcome V2 = 1 of 4 tests passed = 0.25 on token 3:
      rewards = [0, 0, −97/70, 0.25]
    GAE with values V = [0.5, 0.2, −0.4, 0.1], γ = 1, λ = ½ (bootstrap 0 after the last token):
      δ3 = 0.25 − 0.1 = 0.15                  A3 = 0.15 = 3/20
      δ2 = −97/70 + 0.1 + 0.4 = −31/35        A2 = −31/35 + ½·3/20 = −227/280
      δ1 = 0 − 0.4 − 0.2 = −0.6               A1 = −3/5 + ½·(−227/280) = −563/560
      δ0 = 0 + 0.2 − 0.5 = −0.3               A0 = −3/10 + ½·(−563/560) = −899/1120
      returns = A + V = [−339/1120, −451/560, −339/280, 1/4]
    """
    cfg = ProcessRewardConfig(w_syntax=1.0, w_style=0.5, w_semantic=2.0, w_task=1.0, style_scale=0.2)
    problem = {"key_patterns": ["+ 1"]}
    reference = ["def f(x):", "    return x + 1"]
    completion = ["def f(x):", "    return x + 2;"]
    did = did_rewards(completion, reference, problem, cfg)
    np.testing.assert_allclose(did.phi, [3.0, 3.0, 0.9 + 12 / 7], atol=1e-12)
    np.testing.assert_allclose(did.psi, [3.0, 3.0, 4.0], atol=1e-12)
    np.testing.assert_allclose(did.r, [0.0, -27 / 70], atol=1e-12)
    np.testing.assert_allclose(did.c, [0.0, 1.0], atol=1e-12)
    np.testing.assert_allclose(did.d, [0.0, -97 / 70], atol=1e-12)

    outcome = outcome_reward(1, 4, cfg)
    assert outcome == 0.25
    rewards = token_rewards(did.d, [1, 2], outcome, length=4)
    torch.testing.assert_close(rewards, torch.tensor([0.0, 0.0, -97 / 70, 0.25]))
    values = torch.tensor([[0.5, 0.2, -0.4, 0.1]], dtype=torch.float64)
    advantages, returns = gae(rewards.double()[None], values, torch.ones(1, 4), gamma=1.0, lam=0.5)
    # token rewards are float32: compare to 1e-6
    expected_advantages = torch.tensor([[-899 / 1120, -563 / 560, -227 / 280, 3 / 20]], dtype=torch.float64)
    expected_returns = torch.tensor([[-339 / 1120, -451 / 560, -339 / 280, 1 / 4]], dtype=torch.float64)
    torch.testing.assert_close(advantages, expected_advantages, atol=1e-6, rtol=0)
    torch.testing.assert_close(returns, expected_returns, atol=1e-6, rtol=0)


def naive_gae(rewards, values, lengths, gamma, lam):
    """cleanrl-style: per row, a reversed loop over its own tokens with a 0 bootstrap after the last."""
    out = np.zeros_like(rewards)
    for b, n in enumerate(lengths):
        last = 0.0
        for t in reversed(range(n)):
            next_value = values[b, t + 1] if t + 1 < n else 0.0
            delta = rewards[b, t] + gamma * next_value - values[b, t]
            last = delta + gamma * lam * last
            out[b, t] = last
    return out


def test_with_zero_process_weights_didpo_advantages_are_plain_ppo_gae():
    cfg = ProcessRewardConfig(w_syntax=0, w_style=0, w_semantic=0, w_task=0)
    tok = FakeTokenizer(["```python\n", "def f(x):\n", "    y = x\n", "    return y\n", "```", "Done."])
    answers = [[0, 1, 2, 3, 4, 5, 6], [0, 1, 3, 4], [5, 6]]  # ids; 6 is eos
    outcomes = [1.0, 0.5, 0.0]
    lengths = [len(a) for a in answers]
    width = max(lengths)
    rewards = torch.zeros(len(answers), width, dtype=torch.float64)
    plain = np.zeros((len(answers), width))
    for b, ids in enumerate(answers):
        lines, ends = code_line_ends(tok, ids)
        did = did_rewards(lines, REFERENCE, PROBLEM, cfg)
        assert np.all(did.d == 0)
        rewards[b, : len(ids)] = token_rewards(did.d, ends, outcomes[b], len(ids)).double()
        plain[b, len(ids) - 1] = outcomes[b]  # outcome-only reward: R_out on the last token
    mask = torch.tensor([[1.0] * n + [0.0] * (width - n) for n in lengths], dtype=torch.float64)
    values = torch.randn(len(answers), width, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) * mask
    advantages, _ = gae(rewards, values, mask, gamma=1.0, lam=0.95)
    expected = naive_gae(plain, values.numpy(), lengths, 1.0, 0.95)
    np.testing.assert_allclose(advantages.numpy(), expected, atol=1e-12)


# ------------------------------------------------------------------------------------------------ terminal terms


def test_outcome_reward_v1_v2():
    v1, v2 = ProcessRewardConfig(outcome="v1"), ProcessRewardConfig(outcome="v2")
    assert outcome_reward(3, 4, v2) == 0.75 and outcome_reward(3, 4, v1) == 0.0
    assert outcome_reward(4, 4, v1) == 1.0 and outcome_reward(4, 4, v2) == 1.0
    assert outcome_reward(0, 0, v1) == outcome_reward(0, 0, v2) == 0.0
    for passed, total in [(5, 4), (-1, 2), (0, -1)]:
        with pytest.raises(ValueError, match="passed"):
            outcome_reward(passed, total, v2)


def test_dapo_overlong_penalty():
    cfg = ProcessRewardConfig(overlong_max=100, overlong_cache=20)
    # eq. 13: 0 up to 80 tokens, (80 − L)/20 on (80, 100], −1 beyond
    assert [overlong_penalty(n, cfg) for n in (0, 80, 81, 90, 100, 101, 500)] == [0, 0, -0.05, -0.5, -1, -1, -1]
    hard = ProcessRewardConfig(overlong_max=100, overlong_cache=0)
    assert [overlong_penalty(n, hard) for n in (100, 101)] == [0, -1]
    assert overlong_penalty(10_000, ProcessRewardConfig()) == 0.0  # disabled by default
    with pytest.raises(ValueError, match="overlong_cache"):
        ProcessRewardConfig(overlong_max=10, overlong_cache=20)


def test_format_reward_and_terminal_reward():
    one = "Here:\n```python\ndef f():\n    pass\n```\n"
    assert format_reward(one) == 1.0
    assert format_reward("```py\nx = 1\n```\nand\n```bash\nls\n```") == 1.0  # one python block, one bash block
    assert format_reward(one + one) == 0.0
    assert format_reward("def f():\n    pass\n") == 0.0  # no fence
    assert format_reward("```python\ndef f():\n") == 0.0  # never closed
    cfg = ProcessRewardConfig(w_format=0.5, overlong_max=100, overlong_cache=20)
    assert terminal_reward(1, 2, one, 90, cfg) == pytest.approx(0.5 + 0.5 - 0.5)


def test_token_rewards_validates_its_input():
    with pytest.raises(ValueError, match="length"):
        token_rewards(np.zeros(0), [], 1.0, 0)
    with pytest.raises(ValueError, match="step end tokens"):
        token_rewards(np.zeros(2), [0], 1.0, 3)
    with pytest.raises(ValueError, match="lie in"):
        token_rewards(np.zeros(1), [3], 1.0, 3)
    assert token_rewards(np.zeros(0), [], 1.5, 3).tolist() == [0.0, 0.0, 1.5]


def test_config_rejects_unknown_choices():
    with pytest.raises(ValueError, match="outcome"):
        ProcessRewardConfig(outcome="v3")
    with pytest.raises(ValueError, match="alignment"):
        ProcessRewardConfig(alignment="tokens")
    with pytest.raises(ValueError, match="style_scale"):
        ProcessRewardConfig(style_scale=-1)
    assert dataclasses.replace(ProcessRewardConfig(), alignment="lines").alignment == "lines"
