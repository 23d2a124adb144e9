"""Self-play pairs from hand-made answers and verdicts; merging with mined and human pairs."""

import pytest

from models.config import SelfplayConfig
from models.prompts import user_message
from models.selfplay import merge_pairs, score_answer, selfplay_pairs

PROBLEM = {
    "task_id": "DataClean/add/0001",
    "instruction": "Write a function `add` that returns the sum of two integers.",
    "prompt": "def add(a, b):\n",
    "entry_point": "add",
    "source": "generated:v1",
}
GOOD = "The function `add` returns the sum.\n\n```python\ndef add(a, b):\n    # Step 1: add.\n    return a + b\n```"
GOOD_BARE = "def add(a, b):\n    return a + b\n"  # correct but not in the answer format
WRONG = "The function `add` returns the sum.\n\n```python\ndef add(a, b):\n    return a - b\n```"
BROKEN = "The function `add` returns the sum.\n\n```python\ndef add(a, b)\n    return a + b\n```"  # syntax error
UNSAFE = GOOD.replace("def add", "import os\n\ndef add").replace("# Step 1: add.", "os.system('ls')")


def test_best_correct_compliant_answer_beats_the_worst():
    pairs = selfplay_pairs(PROBLEM, [WRONG, GOOD, GOOD_BARE, BROKEN], [0.0, 1.0, 1.0, 0.0])
    assert len(pairs) == 1
    pair = pairs[0]
    assert pair["prompt"] == user_message(PROBLEM)
    assert pair["chosen"] == GOOD  # same test fraction as GOOD_BARE, but compliant
    assert pair["rejected"] == BROKEN  # WRONG and BROKEN tie on (0 tests, compliant); BROKEN does not parse
    assert pair["source"] == "selfplay" and pair["task_id"] == PROBLEM["task_id"]
    assert pair["chosen_score"] == [1.0, True] and pair["rejected_score"] == [0.0, True]


def test_correctness_comes_before_format():
    pairs = selfplay_pairs(PROBLEM, [GOOD_BARE, WRONG], [1.0, 0.0])
    assert pairs[0]["chosen"] == GOOD_BARE and pairs[0]["rejected"] == WRONG


def test_format_breaks_a_tie_in_correctness():
    pairs = selfplay_pairs(PROBLEM, [GOOD_BARE, GOOD], [1.0, 1.0])
    assert pairs[0]["chosen"] == GOOD and pairs[0]["rejected"] == GOOD_BARE


def test_unsafe_or_unparsable_answers_are_never_chosen():
    # the unsafe answer passes every test, but only the partly correct safe one may be chosen
    pairs = selfplay_pairs(PROBLEM, [UNSAFE, WRONG, BROKEN], [1.0, 0.5, 0.0])
    assert pairs[0]["chosen"] == WRONG and pairs[0]["rejected"] == BROKEN
    assert selfplay_pairs(PROBLEM, [UNSAFE, BROKEN], [1.0, 0.0]) == []  # nothing eligible
    assert score_answer(BROKEN, 0.0).parses is False
    assert score_answer("No code here at all.", 0.0).parses is False
    assert score_answer(UNSAFE, 1.0).unsafe == ("import os", "os.system")


def test_no_pair_without_a_preference():
    assert selfplay_pairs(PROBLEM, [GOOD, GOOD.replace("Step 1", "Step one")], [1.0, 1.0]) == []  # equal scores
    assert selfplay_pairs(PROBLEM, [GOOD, GOOD.replace("Step 1", "Step one")], [1.0, 0.0]) != []  # verdicts differ
    assert selfplay_pairs(PROBLEM, [GOOD, " " + GOOD], [1.0, 1.0]) == []


def test_bad_inputs_are_clear_errors():
    with pytest.raises(ValueError, match="2 completions but 1 test results"):
        selfplay_pairs(PROBLEM, [GOOD, WRONG], [1.0])
    with pytest.raises(ValueError, match="test_fraction"):
        selfplay_pairs(PROBLEM, [GOOD, WRONG], [1.5, 0.0])
    with pytest.raises(ValueError, match="selfplay.k"):
        SelfplayConfig(k=1)


def test_merge_tags_sources_and_drops_duplicates():
    human = [{"prompt": "p", "chosen": "a", "rejected": "b", "annotator": "h1"}]
    mined = [
        {"prompt": "p", "chosen": "a ", "rejected": "b", "source": "logs"},  # duplicate of the human pair
        {"prompt": "q", "chosen": "c", "rejected": "d", "source": "logs"},
        {"prompt": "q", "chosen": "same", "rejected": "same", "source": "logs"},  # no preference
    ]
    selfplay = [
        {"prompt": "q", "chosen": "c", "rejected": "d", "source": "selfplay"},
        {"prompt": "r", "chosen": "e", "rejected": "f", "source": "selfplay"},
    ]
    merged = merge_pairs(human, mined, selfplay)
    assert [(m["prompt"], m["source"]) for m in merged] == [("p", "human"), ("q", "mined"), ("r", "selfplay")]
    assert merged[0]["annotator"] == "h1" and merged[1]["origin"] == "logs" and "origin" not in merged[2]


def test_merge_sources_counts_human_pairs_the_mine_stage_carried_as_human():
    from tasks.selfplay import merge_sources

    def pair(prompt, source=None):
        row = {"prompt": prompt, "chosen": "good", "rejected": "bad"}
        return row if source is None else {**row, "source": source}

    mined = [pair("m1", "logs"), pair("carried", "human"), pair("dup", "logs")]
    human = [pair("h1"), pair("dup")]
    selfplay = [pair("s1"), pair("m1")]  # s1 new; m1 a duplicate of a mined pair
    merged = merge_sources(selfplay, mined, human)
    assert [(p["prompt"], p["source"]) for p in merged] == [
        ("h1", "human"),
        ("dup", "human"),  # human wins over the mined duplicate
        ("carried", "human"),
        ("m1", "mined"),
        ("s1", "selfplay"),
    ]
    assert merged[3]["origin"] == "logs"


def test_why_a_prompt_gave_no_pair():
    from tasks.selfplay import no_pair_reason

    other = GOOD.replace("Step 1", "Step one")
    assert selfplay_pairs(PROBLEM, [UNSAFE, BROKEN], [1.0, 0.0]) == []
    assert no_pair_reason([UNSAFE, BROKEN], [1.0, 0.0]) == "no_usable_answer"
    assert no_pair_reason([GOOD, other], [1.0, 1.0]) == "all_passed"
    assert no_pair_reason([WRONG, WRONG.replace("sum", "total")], [0.0, 0.0]) == "all_failed"
    assert no_pair_reason([GOOD, other], [0.5, 0.5]) == "equal_scores"
    assert selfplay_pairs(PROBLEM, [GOOD, GOOD], [1.0, 0.0]) == []  # a flaky test: the same text scored twice
    assert no_pair_reason([GOOD, GOOD], [1.0, 0.0]) == "same_text"


def test_zero_selfplay_pairs_warns_with_the_reasons_counts_and_the_knobs():
    from tasks.selfplay import no_selfplay_pairs_warning

    cfg = SelfplayConfig()
    stats = {"n_prompts": 16, "n_answers": 64, "n_selfplay_pairs": 0, "no_pair/no_usable_answer": 3}
    stats |= {"no_pair/all_passed": 9, "no_pair/all_failed": 4, "no_pair/equal_scores": 0, "no_pair/same_text": 0}
    assert no_selfplay_pairs_warning(stats, cfg, 0) == (
        "self-play made 0 pairs from 16 prompts (no_usable_answer 3, all_passed 9, all_failed 4); DPO gets no pair "
        "from any source; to get pairs: more prompts (selfplay.n_prompts = 16; 0 = every train problem); more answers "
        "per prompt (selfplay.k = 4) or more varied ones (selfplay.temperature = 0.8); a longer answer budget "
        "(selfplay.max_new_tokens = 320) if answers are cut off"
    )
    assert "DPO gets the 1158 mined and human pairs" in no_selfplay_pairs_warning(stats, cfg, 1158)
    assert no_selfplay_pairs_warning({**stats, "n_selfplay_pairs": 2}, cfg, 2) is None
