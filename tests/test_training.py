"""The shared training toolkit (models/training.py): the resume policy, the loop state round trip, the optimizer's
decay groups, the schedule's hand-computed values, and bf16 autocast's numerics against float32 on one batch."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from models.checkpoint import CheckpointMismatchError, list_checkpoints
from models.policy import build_tiny_causal_lm
from models.sft import answer_nll, build_sft_examples, collate
from models.training import (
    DataOrder,
    EarlyStopping,
    adamw,
    autocast_factory,
    cosine_schedule,
    native_bf16,
    open_checkpoints,
    restore_loop_state,
    resume_or_start_over,
    save_loop_state,
)
from tests.test_sft import ROWS


def _state(seed: int):
    model, _ = build_tiny_causal_lm(seed)
    model.train()
    optimizer, params = adamw(model, 1e-2, 0.1)
    scheduler = cosine_schedule(optimizer, 0.25, 8)
    order = DataOrder(7, seed)
    stopper = EarlyStopping(2)
    return model, optimizer, params, scheduler, order, stopper


def _one_step(model, optimizer, scheduler):
    ids = torch.arange(1, 9).unsqueeze(0)
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)


def test_the_loop_state_round_trips_and_the_run_continues_identically(tmp_path, capsys):
    """Save after 2 steps, restore into fresh objects: weights, optimizer moments, schedule, data order, early
    stopping and the data generator are back, and the next step and draws equal the uninterrupted run's."""
    model, optimizer, _, scheduler, order, stopper = _state(0)
    for _ in range(2):
        _one_step(model, optimizer, scheduler)
    order.take(5)
    stopper.update(0.7, 1)
    stopper.update(0.9, 2)
    gens = {"data": order.generator}
    path = save_loop_state(tmp_path, 2, model, optimizer, order, gens, "fp", [], scheduler, stopper, state={"x": 1})
    assert path.name == "checkpoint-00000002"
    assert f"checkpoint: {path} (step 2)" in capsys.readouterr().out  # said where the progress bar is

    ckpt, superseded = open_checkpoints(tmp_path, True, "fp", "another config")
    assert ckpt is not None and ckpt.step == 2 and ckpt.state["x"] == 1 and superseded == []
    model2, optimizer2, _, scheduler2, order2, stopper2 = _state(1)  # other weights, other data order
    restore_loop_state(ckpt, model2, optimizer2, order2, {"data": order2.generator}, scheduler2, stopper2)
    assert (stopper2.best, stopper2.best_step, stopper2.bad_evals) == (0.7, 1, 1)
    assert scheduler2.get_last_lr() == scheduler.get_last_lr()
    assert order2.take(6) == order.take(6)  # crosses the epoch boundary: the generator was restored too
    _one_step(model, optimizer, scheduler)
    _one_step(model2, optimizer2, scheduler2)
    for (name, a), (_, b) in zip(model.named_parameters(), model2.named_parameters(), strict=True):
        assert torch.equal(a, b), name


def test_the_resume_policy_refuses_another_run_and_deletes_nothing_before_the_new_save(tmp_path):
    model, optimizer, _, scheduler, order, stopper = _state(0)
    gens = {"data": order.generator}
    save_loop_state(tmp_path, 5, model, optimizer, order, gens, "run-a", [], scheduler, stopper)
    assert open_checkpoints(tmp_path / "none", True, "x", "y") == (None, [])

    with pytest.raises(CheckpointMismatchError, match="another sft config or other data") as err:
        open_checkpoints(tmp_path, True, "run-b", "another sft config or other data")
    assert "checkpoint-00000005" in str(err.value) and "resume=False" in str(err.value)

    ckpt, superseded = open_checkpoints(tmp_path, False, "run-b", "another sft config or other data")
    assert ckpt is None and [p.name for p in superseded] == ["checkpoint-00000005"]
    assert [p.name for p in list_checkpoints(tmp_path)] == ["checkpoint-00000005"]  # still there
    save_loop_state(tmp_path, 1, model, optimizer, order, gens, "run-b", superseded, scheduler, stopper)
    # the new run's step 1 replaced the old run's step 5 (which would otherwise outrank it as "latest")
    assert [p.name for p in list_checkpoints(tmp_path)] == ["checkpoint-00000001"] and superseded == []
    assert open_checkpoints(tmp_path, True, "run-b", "z")[0].step == 1


def test_resume_or_start_over_retries_once_without_resume_on_a_mismatch_only():
    calls = []

    def mismatched(resume: bool):
        calls.append(resume)
        if resume:
            raise CheckpointMismatchError("another run")
        return "fresh"

    assert resume_or_start_over(mismatched) == "fresh" and calls == [True, False]
    calls.clear()
    assert resume_or_start_over(lambda resume: calls.append(resume) or "resumed") == "resumed" and calls == [True]

    def broken(resume: bool):
        raise ValueError("not a checkpoint problem")

    with pytest.raises(ValueError, match="not a checkpoint problem"):
        resume_or_start_over(broken)


def test_adamw_decays_matrices_only_and_refuses_a_frozen_model():
    model, _ = build_tiny_causal_lm(0)
    optimizer, params = adamw(model, 3e-4, 0.1)
    decay, no_decay = optimizer.param_groups
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0 and decay["lr"] == 3e-4
    assert all(p.ndim >= 2 for p in decay["params"]) and all(p.ndim < 2 for p in no_decay["params"])
    assert len(decay["params"]) + len(no_decay["params"]) == len(params) == len(list(model.parameters()))
    model.requires_grad_(False)
    with pytest.raises(ValueError, match="no trainable parameters"):
        adamw(model, 3e-4, 0.1)


def test_cosine_schedule_matches_the_formula_by_hand():
    """warm-up ceil(0.25 · 8) = 2 steps: lr·step/2; then lr·½(1 + cos(π·(step − 2)/6)), 0 at step 8."""
    param = torch.nn.Parameter(torch.zeros(2, 2))
    optimizer = torch.optim.AdamW([param], lr=1.0)
    scheduler = cosine_schedule(optimizer, 0.25, 8)
    seen = []
    for _ in range(9):
        seen.append(scheduler.get_last_lr()[0])
        optimizer.step()
        scheduler.step()
    expected = [0.0, 0.5] + [0.5 * (1 + math.cos(math.pi * (s - 2) / 6)) for s in range(2, 9)]
    assert seen == pytest.approx(expected, abs=1e-12)
    assert seen[2] == 1.0 and seen[5] == pytest.approx(0.5) and seen[8] == pytest.approx(0.0, abs=1e-12)


def test_bf16_autocast_matches_float32_on_a_batch():
    """The numerics check of issue 16 item 4: one SFT batch of the tiny model, answer-token NLL and its gradient,
    float32 against bf16 autocast (weights stay float32): the loss within 1% and the gradient's direction within a
    cosine of 0.99 (bf16 keeps 8 bits of mantissa: ≈ 0.4% per rounding)."""
    model, tokenizer = build_tiny_causal_lm(0)
    batch = collate(build_sft_examples(tokenizer, ROWS[:4], max_seq_len=512), tokenizer.pad_token_id)

    def loss_and_grad(context):
        model.zero_grad(set_to_none=True)
        with context():
            nll, n = answer_nll(model, batch)
        (nll / n).backward()
        return (nll / n).item(), torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])

    fp32_loss, fp32_grad = loss_and_grad(lambda: torch.autocast("cpu", enabled=False))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # emulated bf16 warns on a CPU without it (tests/test_sft.py checks that)
        bf16 = autocast_factory("bf16", "cpu")
    bf16_loss, bf16_grad = loss_and_grad(bf16)
    assert bf16_loss == pytest.approx(fp32_loss, rel=1e-2) and bf16_loss != fp32_loss  # bf16 really ran
    assert torch.nn.functional.cosine_similarity(bf16_grad, fp32_grad, dim=0) > 0.99
    assert all(p.dtype == torch.float32 for p in model.parameters())


def test_native_bf16_follows_the_cpu_flags(monkeypatch):
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    assert not native_bf16("cpu")
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True)
    assert native_bf16("cpu")
    assert not native_bf16("mps")


def test_auto_autocasts_sft_on_a_cpu_with_native_bf16_only(monkeypatch):
    """``auto``: SFT (``auto_on_cpu``) gets bf16 on a CPU with AVX512-BF16 or AMX and float32 elsewhere; DPO and RL
    (no ``auto_on_cpu``) stay float32 on every CPU; ``no`` never autocasts."""
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True)
    factory = autocast_factory("auto", "cpu", auto_on_cpu=True)
    with factory():
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
    assert autocast_factory("auto", "cpu") is None
    assert autocast_factory("no", "cpu", auto_on_cpu=True) is None
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    assert autocast_factory("auto", "cpu", auto_on_cpu=True) is None
