"""models.checkpoint: weights_digest (the starting-weights part of every resume fingerprint) and a new run's first
save superseding a previous run's checkpoints."""

import pytest
import torch

from models.checkpoint import latest_checkpoint, list_checkpoints, load_checkpoint, save_checkpoint, weights_digest
from models.policy import build_tiny_causal_lm


def test_weights_digest_tells_weights_apart_and_nothing_else():
    a, b = build_tiny_causal_lm(0)[0], build_tiny_causal_lm(0)[0]
    assert weights_digest(a) == weights_digest(b)  # same seed, same weights: same digest, whatever the object
    with torch.no_grad():
        next(b.parameters()).view(-1)[0] += 1e-3
    assert weights_digest(a) != weights_digest(b)
    assert weights_digest(a) != weights_digest(build_tiny_causal_lm(1)[0])
    # dtypes are part of it (bf16 bytes hash too: numpy has no bf16, the digest reads raw bytes)
    assert weights_digest(a.to(torch.bfloat16)) != weights_digest(build_tiny_causal_lm(0)[0])


def test_a_superseded_run_is_deleted_only_once_the_new_checkpoint_is_complete(tmp_path):
    t = {"w": {"x": torch.arange(3.0)}}
    for step in (4, 6):  # the previous run, keep_last=2
        save_checkpoint(tmp_path, step, tensors=t, objects={}, state={"run": "old"}, keep_last=2)
    old = list_checkpoints(tmp_path)
    assert [p.name for p in old] == ["checkpoint-00000004", "checkpoint-00000006"]
    with pytest.raises(TypeError):  # the new run's first write fails: the old run stays, complete and latest
        save_checkpoint(tmp_path, 1, tensors=t, objects={}, state={"run": object()}, supersedes=old)
    assert list_checkpoints(tmp_path) == old and load_checkpoint(latest_checkpoint(tmp_path)).state["run"] == "old"
    # the new run's step 1 is below the old steps: without `supersedes` pruning would keep 6 and delete 1
    save_checkpoint(tmp_path, 1, tensors=t, objects={}, state={"run": "new"}, supersedes=old)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["checkpoint-00000001"]
    assert load_checkpoint(latest_checkpoint(tmp_path)).state == {"run": "new", "step": 1}


def test_a_superseded_checkpoint_of_the_same_step_is_replaced_not_deleted(tmp_path):
    t = {"w": {"x": torch.arange(3.0)}}
    old = [save_checkpoint(tmp_path, 2, tensors=t, objects={}, state={"run": "old"})]
    save_checkpoint(tmp_path, 2, tensors=t, objects={}, state={"run": "new"}, supersedes=old)
    assert load_checkpoint(latest_checkpoint(tmp_path)).state["run"] == "new"
