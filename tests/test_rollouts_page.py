"""`didpo rollouts`: the page's data computed by hand, and the page itself drawn by a headless Chromium (it must load
its embedded data and draw the answers, offline)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from flows.rollouts_page import group_cards, write_page

ROOT = Path(__file__).parents[1]
COMMITTED = ROOT / "docs/results/default_run/data/didpo/rollouts.jsonl"


def row(sample: int, completion: str, reward: float, passed: int, gap=(), shaped=(), trained=False) -> dict:
    return {
        "step": 1,
        "task_id": "T/x/0",
        "draw": 0,
        "sample": sample,
        "completion": completion,
        "passed": passed,
        "total": 2,
        "reason": "ok" if passed == 2 else "assertion",
        "reward": reward,
        "gap": list(gap),
        "shaped": list(shaped),
        "trained": trained,
    }


GOOD = "```python\ndef f(x):\n    return x\n```"
BAD = "```python\ndef f(x):\n\n    return 0\n```"


def test_didpo_credit_and_token_advantage_by_hand():
    """Rewards 1, 0, 0: mean 1/3, std (unbiased) √(1/3) = 0.57735; line j's advantage is
    [(R − mean) − w_did·G_j] / (std + ε) with G_j the gap before the line; its credit is F_j."""
    rows = [
        row(0, GOOD, 1.0, 2, gap=[0.0, 0.2, 0.1], shaped=[0.2, -0.2], trained=True),
        row(1, BAD, 0.0, 0, gap=[0.0, -0.1, -0.3], shaped=[-0.1, 0.1], trained=True),
        row(2, BAD, 0.0, 0, gap=[0.0, -0.1, -0.3], shaped=[-0.1, 0.1], trained=True),
    ]
    (card,) = group_cards(rows, "didpo", w_did=1.0, eps=0.0)
    std = (1 / 3) ** 0.5
    good, bad, dup = card["answers"]
    assert [line["text"] for line in good["lines"]] == ["def f(x):", "    return x"]  # blank lines are not steps
    assert [line["credit"] for line in good["lines"]] == [0.2, -0.2]
    assert good["lines"][0]["advantage"] == pytest.approx((2 / 3 - 0.0) / std)
    assert good["lines"][1]["advantage"] == pytest.approx((2 / 3 - 0.2) / std)
    assert bad["lines"][1]["advantage"] == pytest.approx((-1 / 3 + 0.1) / std)
    assert (good["duplicate_of"], bad["duplicate_of"], dup["duplicate_of"]) == (None, None, 1)


def test_grpo_and_rft_credit():
    rows = [row(0, GOOD, 1.0, 2, trained=True), row(1, BAD, 0.0, 0), row(2, BAD, 0.0, 0), row(3, BAD, 0.0, 0)]
    (grpo,) = group_cards(rows, "grpo", w_did=1.0, eps=1e-4)
    std = 0.5  # rewards 1, 0, 0, 0: mean 0.25, unbiased variance 0.25
    assert grpo["answers"][0]["lines"][0]["credit"] == pytest.approx(0.75 / (std + 1e-4))
    assert grpo["answers"][3]["lines"][1]["advantage"] == pytest.approx(-0.25 / (std + 1e-4))
    (rft,) = group_cards(rows, "rft", w_did=1.0, eps=1e-4)
    assert [a["lines"][0]["credit"] for a in rft["answers"]] == [1.0, 0.0, 0.0, 0.0]
    assert rft["answers"][0]["lines"][0]["advantage"] is None


def test_bad_input_is_named(tmp_path):
    with pytest.raises(ValueError, match="unknown RL algorithm 'ppo'"):
        write_page(COMMITTED, tmp_path / "page.html", "ppo")
    with pytest.raises(FileNotFoundError, match="run the RL stage"):
        write_page(tmp_path / "none.jsonl", tmp_path / "page.html", "rft")
    (tmp_path / "bad.jsonl").write_text('{"step": 1}\nnot json\n')
    with pytest.raises(ValueError, match="bad.jsonl:2 is not JSON"):
        write_page(tmp_path / "bad.jsonl", tmp_path / "page.html", "rft")
    (tmp_path / "short.jsonl").write_text(json.dumps({"step": 1, "task_id": "T"}) + "\n")
    with pytest.raises(ValueError, match=r"misses \['sample'"):
        write_page(tmp_path / "short.jsonl", tmp_path / "page.html", "rft")


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium (make setup-dev installs it as root)")
def test_the_page_of_the_committed_run_draws_its_answers_offline(tmp_path):
    """Chromium, headless and offline, opens the page of the committed default run's 96 rollouts: after its script
    ran, the DOM holds 12 group cards, the status line and an answer's title (the data loaded and was drawn), and the
    screenshot is not blank (> 5% of its pixels off the white background)."""
    from PIL import Image

    page = write_page(COMMITTED, tmp_path / "rollouts.html", "rft")
    common = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--virtual-time-budget=5000"]
    dom = subprocess.run(
        [*common, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    assert 'data-loaded="yes"' in dom and "12 groups, 96 answers (rft)" in dom
    assert dom.count('class="card"') == 12 and "tests, " in dom and "duplicate of #" in dom
    shot = tmp_path / "shot.png"
    subprocess.run(
        [*common, f"--screenshot={shot}", "--window-size=1200,900", page.as_uri()],
        capture_output=True,
        timeout=120,
        check=True,
    )
    image = Image.open(shot).convert("L")
    off_white = sum(image.histogram()[:245]) / (image.width * image.height)
    assert off_white > 0.05, off_white
