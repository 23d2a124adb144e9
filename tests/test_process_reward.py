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
    Control,
    ProcessRewardConfig,
    control_at,
    did_rewards,
    format_reward,
    lint_violations,
    mean_control,
    outcome_reward,
    overlong_penalty,
    prefix_score,
    prefix_scores,
    progress,
    reference_curve,
    rollout_curve,
    similarity,
    syntax_ok,
    terminal_reward,
    token_gaps,
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
    assert prefix_score(["import os", "x=1;"], {}, [], cfg) == pytest.approx(0.7)  # 1 − 0.1 × 3 violations
    assert prefix_score(["import os", "x=1;"], {}, [], dataclasses.replace(cfg, style_scale=0.5)) == 0.0  # floored


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


def test_phi_is_the_weighted_mean_of_its_components_in_0_1():
    """Weights 1, 0.5, 2, 1 (sum 4.5), style_scale 0.2; prefix "def f(x):" / "    return x + 2;" against the
    reference "def f(x):" / "    return x + 1", key pattern "+ 1": syntax 1, style 1 − 0.2 (one E703) = 0.8,
    semantic 18/21, task 0 → (1 + 0.4 + 2·18/21) / 4.5; every component 0 or 1 keeps Φ in [0, 1]."""
    cfg = ProcessRewardConfig(w_syntax=1.0, w_style=0.5, w_semantic=2.0, w_task=1.0, style_scale=0.2)
    problem = {"key_patterns": ["+ 1"]}
    reference = ["def f(x):", "    return x + 1"]
    score = prefix_score(["def f(x):", "    return x + 2;"], problem, reference, cfg)
    assert score == pytest.approx((1 + 0.4 + 2 * 18 / 21) / 4.5, abs=1e-12)
    np.testing.assert_allclose(reference_curve(reference, problem, cfg), [3.5 / 4.5, 3.5 / 4.5, 1.0], atol=1e-12)
    assert prefix_score(["x = )"], problem, [], ProcessRewardConfig(w_syntax=1, w_style=0, w_semantic=0, w_task=0)) == 0
    assert prefix_score(["x = 1"], problem, [], ProcessRewardConfig(w_syntax=0, w_style=0, w_semantic=0, w_task=0)) == 0


def test_progress_depends_on_the_prefix_and_the_controls_length_only():
    np.testing.assert_allclose(progress(4, 2.0), [0, 0.5, 1, 1, 1])  # capped at 1 past L_x
    np.testing.assert_allclose(progress(2, 4.0), [0, 0.25, 0.5])  # a short program never reaches 1
    np.testing.assert_allclose(progress(3, 0.0), [0, 1, 1, 1])  # a control without code
    assert progress(0, 3.0).tolist() == [0.0]
    # the same prefix gets the same progress whatever the completion's final length (version 1's j/N did not)
    assert progress(2, 5.0)[2] == progress(7, 5.0)[2]
    with pytest.raises(ValueError, match="control_lines"):
        progress(2, -1.0)


def test_control_curves_place_each_rollout_on_its_own_progress_and_average():
    """Rollout Φ = [0.5, 0.5, 1, 1, 1] (4 lines): knots at u = 0, ¼, ½, ¾, 1, linear between; with a second
    rollout [0.5, 0.5, 0.5] (2 lines, knots 0, ½, 1) the control is their mean, exact on the union of the knots,
    and L_x = 3."""
    curve = rollout_curve([0.5, 0.5, 1.0, 1.0, 1.0], np.array([0, 0.25, 1 / 3, 0.5, 1]))
    np.testing.assert_allclose(curve, [0.5, 0.5, 2 / 3, 1, 1], atol=1e-12)
    np.testing.assert_allclose(rollout_curve([0.7], np.array([0.0, 0.4, 1.0])), 0.7)  # no code: constant Φ(empty)
    control = mean_control([[0.5, 0.5, 1.0, 1.0, 1.0], [0.5, 0.5, 0.5]])
    assert control.lines == 3.0
    np.testing.assert_allclose(control.knots, [0, 0.25, 0.5, 0.75, 1])
    np.testing.assert_allclose(control.curve, [0.5, 0.5, 0.75, 0.75, 0.75])
    np.testing.assert_allclose(control_at(control, [0, 1 / 3, 2 / 3, 1]), [0.5, 7 / 12, 0.75, 0.75], atol=1e-12)
    with pytest.raises(ValueError, match="at least one rollout"):
        mean_control([])


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


@pytest.mark.parametrize("name", list(COMPLETIONS))
def test_phi_of_real_code_lies_in_0_1_and_the_reference_against_itself_has_zero_gaps(name):
    rng = np.random.default_rng(len(name))
    cfg = ProcessRewardConfig(*rng.uniform(0, 2, size=4), style_scale=0.3)
    phi = prefix_scores(COMPLETIONS[name], PROBLEM, REFERENCE, cfg)
    assert phi.shape == (len(COMPLETIONS[name]) + 1,) and np.all((phi >= 0) & (phi <= 1))
    psi = reference_curve(REFERENCE, PROBLEM, cfg)
    own = did_rewards(psi, mean_control([psi]))
    np.testing.assert_allclose(own.gap, 0.0, atol=1e-12)


def random_control(rng) -> Control:
    phis = [rng.uniform(0, 1, size=rng.integers(1, 25)) for _ in range(rng.integers(1, 9))]
    return mean_control(phis)


def test_invariance_potential_shaping_sums_to_zero_for_any_curve_control_and_completion():
    """DIDPO.md "Must hold": Σ_t of the shaped per-token rewards = R_i (potential mode) to 1e-12, for random Φ
    curves, controls, completions (lengths, step ends with repeats) and outcomes; in bonus mode the sum is
    R_i + G_{i,N} (version 1's reading)."""
    rng = np.random.default_rng(0)
    for _ in range(500):
        n = int(rng.integers(0, 30))
        phi = rng.uniform(0, 1, size=n + 1)
        control = random_control(rng)
        length = n + int(rng.integers(1, 40))
        ends = sorted(rng.integers(0, length, size=n).tolist())
        outcome = float(rng.choice([0.0, 1.0]) + 0.5 * rng.uniform())
        scores = did_rewards(phi, control, "potential")
        per_token = np.zeros(length)
        np.add.at(per_token, np.asarray(ends, dtype=np.int64), scores.shaped)
        per_token[-1] += outcome
        assert abs(per_token.sum() - outcome) <= 1e-12
        assert abs(float(token_rewards(scores.shaped, ends, outcome, length).sum()) - outcome) < 1e-5  # float32
        bonus = did_rewards(phi, control, "bonus")
        assert bonus.shaped.sum() == pytest.approx(bonus.gap[-1], abs=1e-12)
        np.testing.assert_allclose(bonus.d, scores.d, atol=0)
        np.testing.assert_allclose(scores.gap[0], 0.0, atol=0)


def test_hand_worked_two_line_example():
    """Every number by hand. Weights: w_syntax 1, w_task 1, the others 0 (Φ = (syntax + task) / 2); key
    pattern "+ 1".

    Completion (N = 2): "def f(x):" / "    return x + 1": Φ = [½ (empty: valid, no pattern), ½, 1].
    Control = two start-policy rollouts: "def f(x):" / "    return x" (Φ = [½, ½, ½], 2 lines) and
    "def f(x):" / "    y = x + 1" / "    z = y" / "    return z" (Φ = [½, ½, 1, 1, 1], 4 lines):
      L_x = 3; u = [0, ⅓, ⅔];
      the second placed on its own progress: ½ at u ≤ ¼, linear to 1 at ½, then 1: at ⅓ → ⅔, at ⅔ → 1;
      C = mean = [½, (½ + ⅔)/2, (½ + 1)/2] = [½, 7/12, ¾].
    Gaps G = [0, ½ − 7/12, 1 − ¾] = [0, −1/12, ¼]; d = [−1/12, ⅓].
    Potential shaping F = [d_1, −G_1] = [−1/12, 1/12] (Σ = 0); bonus F = d (Σ = ¼ = G_2).
    Tokens (length 6): line 1 ends on token 1, line 2 on token 4; per-token gaps G_{j(t)−1} = [0, 0, −1/12, −1/12,
    −1/12, 0] (tokens after the last step: the outcome alone).
    Group of two: this rollout passes (R = 1), the other has no code (R = 0, gaps 0, 3 tokens); mean ½, std
    (Bessel) √½, ε = 1e-4, w_did = 1:
      A = [(1 − ½) − G] / (√½ + ε) = [½, ½, 7/12, 7/12, 7/12, ½] / (√½ + ε); the other: −½ / (√½ + ε).
    Critic (w_did = 2): token rewards [0, −1/6, 0, 0, 1/6, 1]; GAE with γ = λ = 1 and V = 0 is the reward-to-go
      [1, 1, 7/6, 7/6, 7/6, 1] = R − w_did·G_{j(t)−1}.
    """
    from models.advantages import didpo_group_advantages

    cfg = ProcessRewardConfig(w_syntax=1.0, w_style=0.0, w_semantic=0.0, w_task=1.0)
    problem = {"key_patterns": ["+ 1"]}
    reference = ["def f(x):", "    return x + 1"]
    phi = prefix_scores(["def f(x):", "    return x + 1"], problem, reference, cfg)
    np.testing.assert_allclose(phi, [0.5, 0.5, 1.0], atol=1e-12)
    c1 = prefix_scores(["def f(x):", "    return x"], problem, reference, cfg)
    c2 = prefix_scores(["def f(x):", "    y = x + 1", "    z = y", "    return z"], problem, reference, cfg)
    np.testing.assert_allclose(c1, [0.5, 0.5, 0.5], atol=1e-12)
    np.testing.assert_allclose(c2, [0.5, 0.5, 1.0, 1.0, 1.0], atol=1e-12)
    control = mean_control([c1, c2])
    assert control.lines == 3.0
    scores = did_rewards(phi, control, "potential")
    np.testing.assert_allclose(scores.progress, [0, 1 / 3, 2 / 3], atol=1e-12)
    np.testing.assert_allclose(scores.control, [0.5, 7 / 12, 0.75], atol=1e-12)
    np.testing.assert_allclose(scores.gap, [0.0, -1 / 12, 0.25], atol=1e-12)
    np.testing.assert_allclose(scores.d, [-1 / 12, 1 / 3], atol=1e-12)
    np.testing.assert_allclose(scores.shaped, [-1 / 12, 1 / 12], atol=1e-12)
    np.testing.assert_allclose(did_rewards(phi, control, "bonus").shaped, [-1 / 12, 1 / 3], atol=1e-12)

    gaps = token_gaps(scores.gap, [1, 4], length=6)
    np.testing.assert_allclose(gaps, [0, 0, -1 / 12, -1 / 12, -1 / 12, 0], atol=1e-12)
    returns = torch.tensor([1.0, 0.0], dtype=torch.float64)
    token_gap = torch.zeros(2, 6, dtype=torch.float64)
    token_gap[0] = torch.from_numpy(gaps)
    mask = torch.tensor([[1.0] * 6, [1.0] * 3 + [0.0] * 3], dtype=torch.float64)
    advantages = didpo_group_advantages(returns, token_gap, mask, group_size=2, w_did=1.0, eps=1e-4)
    s = 0.5**0.5 + 1e-4
    expected = (
        torch.tensor([[0.5, 0.5, 7 / 12, 7 / 12, 7 / 12, 0.5], [-0.5, -0.5, -0.5, 0.0, 0.0, 0.0]], dtype=torch.float64)
        / s
    )
    torch.testing.assert_close(advantages, expected, atol=1e-12, rtol=0)

    rewards = token_rewards(2.0 * scores.shaped, [1, 4], 1.0, length=6).double()
    torch.testing.assert_close(
        rewards, torch.tensor([0, -1 / 6, 0, 0, 1 / 6, 1], dtype=torch.float64), atol=1e-7, rtol=0
    )
    advantages, returns_to_go = gae(rewards[None], torch.zeros(1, 6, dtype=torch.float64), torch.ones(1, 6), 1.0, 1.0)
    expected = torch.tensor([[1, 1, 7 / 6, 7 / 6, 7 / 6, 1]], dtype=torch.float64)
    torch.testing.assert_close(advantages, expected, atol=1e-7, rtol=0)
    torch.testing.assert_close(returns_to_go, 1.0 - 2.0 * torch.from_numpy(gaps)[None], atol=1e-7, rtol=0)


def test_token_gaps_follow_step_ends_with_repeats():
    # steps end on tokens 0, 2, 2, 5 (two lines end on token 2); gaps G_0..G_4
    out = token_gaps([0.0, 0.1, 0.2, 0.3, 0.4], [0, 2, 2, 5], length=8)
    np.testing.assert_allclose(out, [0.0, 0.1, 0.1, 0.3, 0.3, 0.3, 0.0, 0.0])
    np.testing.assert_allclose(token_gaps([0.0], [], length=3), 0.0)
    with pytest.raises(ValueError, match="gaps for"):
        token_gaps([0.0, 0.1], [], length=3)


def test_edge_cases_no_code_and_an_empty_control():
    control = mean_control([[0.4]])  # a control that wrote no code: L_x = 0, C ≡ Φ(empty)
    assert control.lines == 0.0
    empty = did_rewards([0.4], control)
    assert empty.gap.tolist() == [0.0] and empty.d.shape == empty.shaped.shape == (0,)
    scores = did_rewards([0.4, 0.9, 0.2], control)
    np.testing.assert_allclose(scores.progress, [0, 1, 1])
    np.testing.assert_allclose(scores.gap, [0.0, 0.5, -0.2], atol=1e-12)
    np.testing.assert_allclose(scores.shaped, [0.5, -0.5], atol=1e-12)
    with pytest.raises(ValueError, match="shaping"):
        did_rewards([0.4], control, "telescope")


# ------------------------------------------------------------------------------------------------ terminal terms


def test_outcome_is_v1_plus_bounded_partial_credit_and_no_code_earns_nothing():
    v1, partial = ProcessRewardConfig(), ProcessRewardConfig(w_partial=0.4)
    assert outcome_reward(3, 4, v1) == 0.0 and outcome_reward(4, 4, v1) == 1.0
    assert outcome_reward(3, 4, partial) == pytest.approx(0.3) and outcome_reward(4, 4, partial) == pytest.approx(1.4)
    assert outcome_reward(0, 0, partial) == 0.0
    assert outcome_reward(0, 3, partial, "no_code") == 0.0 and outcome_reward(3, 3, v1, "no_code") == 0.0
    for passed, total in [(5, 4), (-1, 2), (0, -1)]:
        with pytest.raises(ValueError, match="passed"):
            outcome_reward(passed, total, v1)
    with pytest.raises(ValueError, match=r"didpo\.reward\.w_partial must be in \[0, 1\)"):
        ProcessRewardConfig(w_partial=1.0)


def test_dapo_overlong_penalty():
    cfg = ProcessRewardConfig(overlong_max=100, overlong_cache=20)
    # eq. 13: 0 up to 80 tokens, (80 − L)/20 on (80, 100], −1 beyond
    assert [overlong_penalty(n, cfg) for n in (0, 80, 81, 90, 100, 101, 500)] == [0, 0, -0.05, -0.5, -1, -1, -1]
    hard = ProcessRewardConfig(overlong_max=100, overlong_cache=0)
    assert [overlong_penalty(n, hard) for n in (100, 101)] == [0, -1]
    assert overlong_penalty(10_000, ProcessRewardConfig(overlong_max=0, overlong_cache=0)) == 0.0  # 0 disables
    assert overlong_penalty(352, ProcessRewardConfig()) == -0.5  # params.yaml's ramp: 320 → 384 tokens
    with pytest.raises(ValueError, match="overlong_cache"):
        ProcessRewardConfig(overlong_max=10, overlong_cache=20)


def test_format_reward_and_terminal_reward():
    one = "Here:\n```python\ndef f():\n    pass\n```\n"
    assert format_reward(one) == 1.0
    assert format_reward("```py\nx = 1\n```\nand\n```bash\nls\n```") == 1.0  # one python block, one bash block
    assert format_reward(one + one) == 0.0
    assert format_reward("def f():\n    pass\n") == 0.0  # no fence
    assert format_reward("```python\ndef f():\n") == 0.0  # never closed
    cfg = ProcessRewardConfig(w_format=0.5, w_partial=0.2)
    assert terminal_reward(1, 2, one, cfg) == pytest.approx(0.1 + 0.5)
    assert terminal_reward(0, 2, one, cfg, "no_code") == 0.0  # a fenced block without code is not paid
    with pytest.raises(ValueError, match=r"w_format \(0.8\) must be < 1 - didpo.reward.w_partial \(0.8\)"):
        ProcessRewardConfig(w_format=0.8, w_partial=0.2)


def test_token_rewards_validates_its_input():
    with pytest.raises(ValueError, match="length"):
        token_rewards(np.zeros(0), [], 1.0, 0)
    with pytest.raises(ValueError, match="step end tokens"):
        token_rewards(np.zeros(2), [0], 1.0, 3)
    with pytest.raises(ValueError, match="lie in"):
        token_rewards(np.zeros(1), [3], 1.0, 3)
    assert token_rewards(np.zeros(0), [], 1.5, 3).tolist() == [0.0, 0.0, 1.5]


def test_config_rejects_unknown_choices_and_negative_weights():
    with pytest.raises(ValueError, match="didpo.reward.control"):
        ProcessRewardConfig(control="oracle")
    with pytest.raises(ValueError, match="didpo.reward.shaping"):
        ProcessRewardConfig(shaping="telescope")
    with pytest.raises(ValueError, match="style_scale"):
        ProcessRewardConfig(style_scale=-1)
    with pytest.raises(ValueError, match="didpo.reward.w_semantic must be >= 0"):
        ProcessRewardConfig(w_semantic=-0.5)
    assert dataclasses.replace(ProcessRewardConfig(), control="group").control == "group"
