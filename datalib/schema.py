"""The fields of each dataset, in one place (data/README.md documents them; docs/DESIGN.md, "Data", names them)."""

PROBLEM_FIELDS = (
    "task_id",
    "prompt",
    "entry_point",
    "canonical_solution",
    "test",
    "steps",
    "instruction",
    "key_patterns",
    "family",
    "split",
    "source",
)
EVENT_FIELDS = (
    "event_id",
    "ts",
    "user_id",
    "session_id",
    "prompt",
    "response",
    "rating",
    "category",
    "model_version",
)
PAIR_FIELDS = ("prompt", "chosen", "rejected", "annotator", "dimension")
