"""SFT: answer-only labels, accumulation invariance, LoRA isolation, exact resume, early stopping, export.

All on the tiny random Llama of `models.policy.build_tiny_causal_lm` (CPU, seconds).
"""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from models.checkpoint import (
    CheckpointMismatchError,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
)
from models.policy import build_tiny_causal_lm
from models.prompts import signature, user_message
from models.sampling import build_chat_prompt, extract_code
from models.sft import (
    IGNORE_INDEX,
    SFTConfig,
    answer_nll,
    build_sft_examples,
    collate,
    evaluate_loss,
    explanation_sentence,
    render_answer,
    render_messages,
    render_user_message,
    train_sft,
)
from models.training import EarlyStopping

# Small and quick: no periodic evaluation or checkpoint unless a test asks for them. float32 throughout: these tests
# compare numbers to hand computations, TRL and each other (`auto` would autocast to bf16 on a CPU with AVX512-BF16;
# tests/test_training.py checks bf16 against float32 and the integration tests run the default).
BASE = dict(
    mixed_precision="no",
    batch_size=4,
    grad_accum_steps=1,
    max_steps=3,
    learning_rate=2e-4,
    max_seq_len=512,
    warmup_ratio=0.0,
    eval_every=0,
    checkpoint_every=0,
    seed=0,
)


def problem(i: int) -> dict:
    """A data-cleaning problem in the data/README.md schema; the solution length varies with `i`."""
    name = f"clean_{i}"
    prompt = f'def {name}(items):\n    """Strip each string and drop empty ones (variant {i})."""\n'
    solution = (
        "    # Step 1: handle a missing list\n    if items is None:\n        return []\n"
        "    # Step 2: strip each string\n    out = [s.strip() for s in items]\n"
    )
    steps = ["Step 1: handle a missing list", "Step 2: strip each string"]
    if i % 2:
        solution += "    # Step 3: drop the empty strings\n    out = [s for s in out if s]\n"
        steps.append("Step 3: drop the empty strings")
    solution += "    return out\n" + "    # done\n" * (i % 4)
    return {
        "task_id": f"DataClean/strip/{i:04d}",
        "prompt": prompt,
        "entry_point": name,
        "canonical_solution": solution,
        "test": "def check(candidate):\n    assert candidate([' a ', '']) == ['a']\n",
        "steps": steps,
        "instruction": f"Write a Python function `{name}` that strips each string and drops empty ones.",
        "key_patterns": [".strip()"],
        "family": "strip",
        "split": "train",
        "source": "generated:v1",
    }


ROWS = [problem(i) for i in range(12)]


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny matrices: one intra-op thread is fastest and avoids spinning threads on a shared box."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def params_of(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


# ------------------------------------------------------------------------------------------ rendering


def test_user_message_is_the_sampling_prompt_and_answer_is_sentence_plus_one_block():
    _, tok = build_tiny_causal_lm(0)
    p = ROWS[1]
    rendered = tok.apply_chat_template(
        [{"role": "user", "content": render_user_message(p)}], tokenize=False, add_generation_prompt=True
    )
    assert rendered == build_chat_prompt(tok, user_message(p))  # the prompt sampling/gate/RL use
    assert '"""' not in render_user_message(p)  # generated problems: signature only, the instruction says it all
    answer = render_answer(p)
    sentence, block = answer.split("\n\n", 1)
    assert sentence == ("The function `clean_1` below strips each string and drops empty ones; each step is commented.")
    assert block.startswith("```python\n") and block.endswith("\n```") and block.count("```") == 2
    assert extract_code(answer) == (signature(p) + p["canonical_solution"]).rstrip() + "\n"
    other = {
        **p,
        "instruction": "Complete the following Python function so that it does what its docstring says.",
        "steps": [],
    }
    assert explanation_sentence(other) == "Here is the completed `clean_1` function."


# ------------------------------------------------------------------------------ (1) loss on the answer only


def test_labels_are_ignore_exactly_on_the_prompt_tokens():
    _, tok = build_tiny_causal_lm(0)
    p = ROWS[0]
    (ex,) = build_sft_examples(tok, [p])
    # Hand-built: ChatML prompt with the generation header, then the answer up to <|im_end|> (the template's
    # trailing newline is never generated, so it is not trained on).
    prompt_text = f"<|im_start|>user\n{render_user_message(p)}<|im_end|>\n<|im_start|>assistant\n"
    answer_text = f"{render_answer(p)}<|im_end|>"
    prompt_ids = tok(prompt_text, add_special_tokens=False)["input_ids"]
    answer_ids = tok(answer_text, add_special_tokens=False)["input_ids"]
    assert ex["input_ids"] == prompt_ids + answer_ids
    assert ex["labels"] == [IGNORE_INDEX] * len(prompt_ids) + answer_ids
    assert ex["n_prompt_tokens"] == len(prompt_ids) and answer_ids[-1] == tok.eos_token_id
    # truncation keeps the prompt and cuts the answer; a prompt that fills max_seq_len is an error
    (short,) = build_sft_examples(tok, [p], max_seq_len=len(prompt_ids) + 3)
    assert short["truncated"] and short["labels"] == [IGNORE_INDEX] * len(prompt_ids) + answer_ids[:3]
    with pytest.raises(ValueError, match="no room for the answer"):
        build_sft_examples(tok, [p], max_seq_len=len(prompt_ids))


def test_loss_is_cross_entropy_over_answer_tokens_only():
    model, tok = build_tiny_causal_lm(0)
    examples = build_sft_examples(tok, ROWS[:3])
    batch = collate(examples, tok.pad_token_id)  # padded: unequal lengths
    assert batch["input_ids"].shape == (3, max(len(e["input_ids"]) for e in examples))
    with torch.no_grad():
        nll, n = answer_nll(model, batch)
        nll_full, n_full = answer_nll(model, batch, logits_mask=False)  # full logits path agrees
        manual, count = 0.0, 0
        for ex in examples:  # one unpadded sequence at a time, a plain loop over answer positions
            ids = torch.tensor([ex["input_ids"]])
            logp = torch.log_softmax(model(ids).logits[0].double(), dim=-1)  # (T, V)
            for t in range(ex["n_prompt_tokens"], len(ex["input_ids"])):
                manual -= logp[t - 1, ex["input_ids"][t]].item()
                count += 1
    assert n == n_full == count == sum(len(e["input_ids"]) - e["n_prompt_tokens"] for e in examples)
    assert nll.item() / n == pytest.approx(manual / count, abs=1e-5)
    assert nll_full.item() == pytest.approx(nll.item(), abs=1e-4)
    # packing (one row, position ids restarting per example) gives the same loss as padding
    with torch.no_grad():
        packed, n_packed = answer_nll(model, collate(examples, tok.pad_token_id, packing=True))
    assert n_packed == n and packed.item() == pytest.approx(nll.item(), abs=1e-4)


def test_prompt_that_is_not_a_token_prefix_is_a_clear_error():
    _, tok = build_tiny_causal_lm(0)
    tok.chat_template = (
        "{% for m in messages %}{{ m['role'] + ': ' + m['content'] + '\\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}"
    )
    with pytest.raises(ValueError, match="not a prefix"):
        build_sft_examples(tok, ROWS[:1])


# -------------------------------------------------------------------------- (2) accumulation invariance


def test_grad_accumulation_4x2_equals_batch_8_and_packing_equals_padding(tmp_path):
    """One optimizer step (full fine-tuning, float64 so Adam's first step does not amplify rounding)."""
    cfg = dict(BASE, lora=False, max_steps=1, learning_rate=1e-3)
    results = {}
    for name, extra in {
        "batch8": dict(batch_size=8),
        "accum4x2": dict(batch_size=2, grad_accum_steps=4),
        "packed4x2": dict(batch_size=2, grad_accum_steps=4, packing=True),
    }.items():
        model, tok = build_tiny_causal_lm(0)
        model.double()
        train_sft(model, tok, ROWS, [], SFTConfig(**{**cfg, **extra}), tmp_path / name)
        results[name] = params_of(model)
    # the micro-batches have unequal answer-token counts, so per-micro-batch means would not match
    _, tok = build_tiny_causal_lm(0)
    order = torch.randperm(len(ROWS), generator=torch.Generator().manual_seed(0)).tolist()[:8]
    counts = [
        sum(len(e["input_ids"]) - e["n_prompt_tokens"] for e in build_sft_examples(tok, [ROWS[i] for i in pair]))
        for pair in (order[0:2], order[2:4], order[4:6], order[6:8])
    ]
    assert len(set(counts)) > 1
    initial = params_of(build_tiny_causal_lm(0)[0].double())
    for key, value in results["batch8"].items():
        assert not torch.equal(value, initial[key]) or "norm" in key  # the step moved the weights
        torch.testing.assert_close(results["accum4x2"][key], value, atol=1e-5, rtol=0)
        torch.testing.assert_close(results["packed4x2"][key], value, atol=1e-5, rtol=0)


# --------------------------------------------------------------------------------- (3) + (6) LoRA export


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    """A LoRA run that, after every optimizer step, compares each base weight with its initial value bit for bit
    (the model object is wrapped in place, so its base layers stay reachable by name until the final merge)."""
    out = tmp_path_factory.mktemp("lora")
    model, tok = build_tiny_causal_lm(0)
    initial = params_of(model)
    base_unchanged = []

    def check_base(metrics, step):
        if "sft/loss" in metrics:
            current = {k.replace(".base_layer", ""): v for k, v in model.state_dict().items() if "lora_" not in k}
            base_unchanged.append(
                current.keys() == initial.keys() and all(torch.equal(current[k], v) for k, v in initial.items())
            )

    cfg = SFTConfig(**dict(BASE, learning_rate=1e-2, lora_r=4, lora_alpha=8, checkpoint_every=3))
    result = train_sft(model, tok, ROWS, [], cfg, out, emit=check_base)
    return result, cfg, base_unchanged


def test_lora_changes_only_adapter_weights(lora_run):
    from transformers import AutoModelForCausalLM

    result, cfg, base_unchanged = lora_run
    assert base_unchanged == [True] * cfg.max_steps  # bit-identical base weights after every step
    base = params_of(build_tiny_causal_lm(0)[0])
    merged = params_of(AutoModelForCausalLM.from_pretrained(result.merged_path))
    adapter = load_file(result.adapter_path / "adapter_model.safetensors")
    trained = load_checkpoint(latest_checkpoint(result.merged_path.parent / "checkpoints")).tensors["trainable"]
    assert trained and all(".lora_A." in k or ".lora_B." in k for k in trained)
    targeted = set()
    for key in adapter:
        if ".lora_A." in key:
            module = key.split("base_model.model.", 1)[1].split(".lora_A.")[0]
            b = adapter[key.replace("lora_A", "lora_B")]
            assert b.abs().max() > 0  # the adapter learned something
            delta = (cfg.lora_alpha / cfg.lora_r) * b @ adapter[key]
            torch.testing.assert_close(merged[f"{module}.weight"], base[f"{module}.weight"] + delta, atol=1e-6, rtol=0)
            targeted.add(f"{module}.weight")
    names = {k.rsplit(".", 2)[-2] for k in targeted}
    assert names == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    assert result.target_modules == sorted(names)
    for key, value in base.items():
        if key not in targeted:  # embeddings, norms: bit-identical
            assert torch.equal(merged[key], value), key


def test_merged_checkpoint_reloads_with_the_peft_models_logits(lora_run):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    result, _, _ = lora_run
    peft_model = PeftModel.from_pretrained(build_tiny_causal_lm(0)[0], result.adapter_path).eval()
    merged = AutoModelForCausalLM.from_pretrained(result.merged_path).eval()
    tok = AutoTokenizer.from_pretrained(result.merged_path)
    ids = torch.tensor([build_sft_examples(tok, ROWS[:1])[0]["input_ids"]])
    with torch.no_grad():
        a, b = peft_model(ids).logits, merged(ids).logits
    assert (a - b).abs().max().item() < 1e-4
    assert tok.chat_template == build_tiny_causal_lm(0)[1].chat_template


# ------------------------------------------------------------------------------------- (4) exact resume


class Crash(RuntimeError):
    pass


def rng_snapshot():
    return torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy()


def test_exact_resume_after_a_crash(tmp_path):
    cfg = SFTConfig(**dict(BASE, max_steps=6, checkpoint_every=3, eval_every=2, learning_rate=1e-2, lora_dropout=0.2))
    train, evals = ROWS[:10], ROWS[10:]

    model, tok = build_tiny_causal_lm(0)
    straight = train_sft(model, tok, train, evals, cfg, tmp_path / "straight")
    straight_rng, straight_params = rng_snapshot(), params_of(model)

    def crash_at_step_4(metrics, step):
        if step == 4:
            raise Crash

    model, tok = build_tiny_causal_lm(0)
    with pytest.raises(Crash):
        train_sft(model, tok, train, evals, cfg, tmp_path / "resumed", emit=crash_at_step_4)
    assert [p.name for p in list_checkpoints(tmp_path / "resumed/checkpoints")] == ["checkpoint-00000003"]
    torch.manual_seed(123)  # the crashed process's RNG state must not matter
    model, tok = build_tiny_causal_lm(0)  # a new model object, as in a new process
    resumed = train_sft(model, tok, train, evals, cfg, tmp_path / "resumed", resume=True)
    resumed_rng, resumed_params = rng_snapshot(), params_of(model)

    for key, value in straight_params.items():
        torch.testing.assert_close(resumed_params[key], value, atol=1e-6, rtol=0)
    assert torch.equal(resumed_rng[0], straight_rng[0])
    assert resumed_rng[1] == straight_rng[1] and np.array_equal(resumed_rng[2], straight_rng[2])
    ckpts = [load_checkpoint(latest_checkpoint(tmp_path / d / "checkpoints")) for d in ("straight", "resumed")]
    assert ckpts[0].step == ckpts[1].step == 6
    assert torch.equal(ckpts[0].objects["rng"]["generators"]["data"], ckpts[1].objects["rng"]["generators"]["data"])
    assert ckpts[0].state["data_order"] == ckpts[1].state["data_order"]

    def timeless(history):
        return [{k: v for k, v in h.items() if k != "sft/tokens_per_s"} for h in history]

    assert timeless(resumed.history) == timeless(straight.history)
    assert resumed.best_eval_loss == straight.best_eval_loss and resumed.global_step == 6
    # a checkpoint only resumes the run that wrote it
    with pytest.raises(CheckpointMismatchError, match="another sft config"):
        train_sft(
            build_tiny_causal_lm(0)[0],
            tok,
            train,
            evals,
            dataclasses.replace(cfg, learning_rate=1e-3),
            tmp_path / "resumed",
        )


def test_a_new_run_deletes_the_previous_checkpoint_only_after_saving_its_own(tmp_path):
    """Issue 15: starting over (resume=False) keeps the previous run's checkpoint until this run has saved."""
    ckpts = tmp_path / "checkpoints"
    old_cfg = SFTConfig(**dict(BASE, max_steps=4, checkpoint_every=2))
    train_sft(build_tiny_causal_lm(0)[0], build_tiny_causal_lm(0)[1], ROWS, [], old_cfg, tmp_path)
    (old,) = list_checkpoints(ckpts)
    old_state = load_checkpoint(old).state
    new_cfg = dataclasses.replace(old_cfg, learning_rate=1e-3, checkpoint_every=3)  # saves at steps 3 and 4

    def crash_at_step_1(metrics, step):
        raise Crash

    model, tok = build_tiny_causal_lm(0)
    with pytest.raises(Crash):
        train_sft(model, tok, ROWS, [], new_cfg, tmp_path, emit=crash_at_step_1, resume=False)
    assert list_checkpoints(ckpts) == [old] and load_checkpoint(old).state == old_state
    assert train_sft(build_tiny_causal_lm(0)[0], tok, ROWS, [], old_cfg, tmp_path).global_step == 4  # resumable

    listings = {}

    def watch(metrics, step):  # emitted before the step's checkpoint
        listings[step] = [p.name for p in list_checkpoints(ckpts)]

    train_sft(build_tiny_causal_lm(0)[0], tok, ROWS, [], new_cfg, tmp_path, emit=watch, resume=False)
    assert listings == {1: [old.name], 2: [old.name], 3: [old.name], 4: ["checkpoint-00000003"]}
    (new,) = list_checkpoints(ckpts)
    assert new.name == "checkpoint-00000004" and load_checkpoint(new).state["fingerprint"] != old_state["fingerprint"]


def test_max_seq_len_below_the_longest_prompt_is_refused_before_training(tmp_path):
    _, tok = build_tiny_causal_lm(0)
    rows = [dict(r) for r in ROWS[:6]]
    rows[3]["instruction"] += " Keep the order of the strings and never modify the input list in place."
    n_prompt = [e["n_prompt_tokens"] for e in build_sft_examples(tok, rows)]
    longest = max(n_prompt)
    assert n_prompt.index(longest) == 3 and sorted(n_prompt)[-2] < longest  # row 3 alone is longest
    cfg = SFTConfig(**dict(BASE, max_seq_len=longest))
    steps = []
    with pytest.raises(ValueError) as info:
        train_sft(build_tiny_causal_lm(0)[0], tok, rows, [], cfg, tmp_path, emit=lambda m, s: steps.append(s))
    assert str(info.value).startswith(
        f"sft.max_seq_len={longest} leaves no room for the answer of 1 of 6 rows: the longest prompt "
        f"(DataClean/strip/0003) has {longest} tokens; set sft.max_seq_len > {longest}"
    )
    assert steps == [] and not (tmp_path / "checkpoints").exists()
    with pytest.raises(ValueError, match=rf"of 6 of 6 rows: the longest prompt \(DataClean/strip/0003\) has {longest}"):
        build_sft_examples(tok, rows, max_seq_len=min(n_prompt))
    assert len(build_sft_examples(tok, rows, max_seq_len=longest + 1)) == 6


def test_checkpoint_writes_are_atomic_and_pruned(tmp_path):
    t = {"w": {"x": torch.arange(3.0)}}
    save_checkpoint(tmp_path, 1, tensors=t, objects={"o": {"a": torch.ones(2)}}, state={"k": 1})
    with pytest.raises(TypeError):  # not JSON: nothing is written, the previous checkpoint stays
        save_checkpoint(tmp_path, 2, tensors=t, objects={}, state={"k": object()})
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint-00000001"]
    save_checkpoint(tmp_path, 3, tensors=t, objects={}, state={"k": 3})
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint-00000003"]
    loaded = load_checkpoint(latest_checkpoint(tmp_path))
    assert loaded.step == 3 and loaded.state["k"] == 3 and torch.equal(loaded.tensors["w"]["x"], torch.arange(3.0))


# ----------------------------------------------------------------------------------- (5) early stopping


def test_early_stopping_counts_evaluations_without_a_new_best():
    stopper = EarlyStopping(patience=2)
    seen = [
        (loss, stopper.update(loss, step), stopper.should_stop)
        for step, loss in enumerate([3.0, 2.0, 2.5, 1.9, 2.0, 1.9], 1)
    ]
    assert [s[1] for s in seen] == [True, True, False, True, False, False]
    assert [s[2] for s in seen] == [False, False, False, False, False, True]
    assert (stopper.best, stopper.best_step) == (1.9, 4)
    assert not EarlyStopping(patience=0).should_stop


def test_training_stops_when_eval_loss_stops_improving(tmp_path):
    # lr 0: the weights never move, so every evaluation repeats the first loss exactly (no strict improvement)
    cfg = SFTConfig(**dict(BASE, max_steps=20, eval_every=1, early_stopping_patience=2, learning_rate=0.0))
    model, tok = build_tiny_causal_lm(0)
    result = train_sft(model, tok, ROWS[:8], ROWS[8:], cfg, tmp_path / "flat")
    evals = [h["sft/eval_loss"] for h in result.history if "sft/eval_loss" in h]
    assert result.stopped_early and result.global_step == 3 and result.best_step == 1
    assert len(evals) == 3 and evals[0] == evals[1] == evals[2] == result.best_eval_loss

    # an improving run does not stop; best weights = the last ones, and the returned model has that loss
    cfg = SFTConfig(**dict(BASE, max_steps=4, eval_every=1, early_stopping_patience=1, learning_rate=1e-2))
    model, tok = build_tiny_causal_lm(0)
    result = train_sft(model, tok, ROWS[:8], ROWS[:8], cfg, tmp_path / "improving")
    evals = [h["sft/eval_loss"] for h in result.history if "sft/eval_loss" in h]
    assert not result.stopped_early and result.global_step == 4
    assert all(b < a for a, b in zip(evals, evals[1:], strict=False)) and result.best_step == 4
    held_out = evaluate_loss(model, build_sft_examples(tok, ROWS[:8]), 4, tok.pad_token_id)
    assert held_out == pytest.approx(result.best_eval_loss, abs=1e-5)


def test_lora_on_the_last_layers_only_leaves_the_lower_layers_bit_identical(tmp_path):
    """``lora_layers=1``: adapters on the top decoder layer only; after training and merging, every weight below
    it equals the base model's bit for bit, the top layer's projections moved, and no autograd node is built
    below the top layer (the backward pass stops there: what makes it cheaper)."""
    from transformers import AutoModelForCausalLM

    model, tok = build_tiny_causal_lm(0)
    n_layers = model.config.num_hidden_layers
    assert n_layers >= 2
    top = f"model.layers.{n_layers - 1}."
    lower_grads = []  # does layer 0's output need a gradient? (True with adapters in layer 0)
    model.model.layers[0].register_forward_hook(
        lambda m, i, o: lower_grads.append((o[0] if isinstance(o, tuple) else o).requires_grad)
    )
    cfg = SFTConfig(**dict(BASE, learning_rate=1e-2, lora_r=4, lora_alpha=8, lora_layers=1))
    result = train_sft(model, tok, ROWS, [], cfg, tmp_path)
    assert lower_grads and not any(lower_grads)  # layer 0's outputs never needed a gradient
    base = params_of(build_tiny_causal_lm(0)[0])
    merged = params_of(AutoModelForCausalLM.from_pretrained(result.merged_path))
    moved = {k for k in base if not torch.equal(merged[k], base[k])}
    assert moved and all(k.startswith(top) and k.endswith("_proj.weight") for k in moved), moved
    assert result.trainable_params == sum(cfg.lora_r * sum(base[k].shape) for k in moved)  # r·(in + out) each

    with pytest.raises(ValueError, match=rf"lora_layers must be in \[0, {n_layers}\]"):
        train_sft(
            build_tiny_causal_lm(0)[0], tok, ROWS, [], SFTConfig(**dict(BASE, lora_layers=n_layers + 1)), tmp_path
        )
    with pytest.raises(ValueError, match="sft.lora_layers must be >= 0"):
        SFTConfig(lora_layers=-1)


def test_answer_tokens_and_loss_equal_trl_sft_trainers(tmp_path):
    """TRL 1.16's SFTTrainer (prompt-completion, completion-only loss) on our rendered messages: the same prompt
    tokens, the same answer tokens up to the template's trailing newline after ``<|im_end|>`` (TRL trains on it; we
    drop it, since the model stops at the eos and never generates it), and on one batch the same mean loss as
    ``answer_nll / n_tokens``."""
    from datasets import Dataset
    from trl import SFTConfig as TRLConfig
    from trl import SFTTrainer

    model, tok = build_tiny_causal_lm(0)
    rows = [*ROWS[:2], *ROWS[5:7]]
    messages = [render_messages(r) for r in rows]
    data = Dataset.from_list([{"prompt": m[:1], "completion": m[1:]} for m in messages])
    args = TRLConfig(
        output_dir=str(tmp_path), per_device_train_batch_size=4, report_to=[], use_cpu=True, save_strategy="no",
        max_length=None, padding_free=False, dataloader_num_workers=0,
    )  # fmt: skip
    trainer = SFTTrainer(model=model, args=args, train_dataset=data, processing_class=tok)
    ours = build_sft_examples(tok, rows)
    newline = tok("\n", add_special_tokens=False)["input_ids"]
    theirs = [trainer.train_dataset[i] for i in range(len(rows))]
    for mine, trl_row in zip(ours, theirs, strict=True):
        assert trl_row["input_ids"] == mine["input_ids"] + newline  # the template's "\n" after <|im_end|>
        assert trl_row["labels"] == mine["labels"] + newline  # -100 on exactly our prompt tokens
    # The same batch through both losses: TRL's compute_loss (fused LM head on labelled positions) and ours.
    batch = collate(ours, tok.pad_token_id)
    model.train()  # dropout 0 in the tiny config: train mode changes nothing but TRL's metric bookkeeping
    with torch.no_grad():
        trl_loss = trainer.compute_loss(trainer.model, dict(batch))
        nll, n = answer_nll(model, batch)
    assert trl_loss.item() == pytest.approx(nll.item() / n, rel=1e-5)
    # and on TRL's own collated batch (its tokens, the trailing newline included) the loss is ours on those tokens
    trl_batch = trainer.data_collator(theirs)
    with torch.no_grad():
        trl_own = trainer.compute_loss(
            trainer.model, {k: trl_batch[k] for k in ("input_ids", "attention_mask", "labels")}
        )
        nll_own, n_own = answer_nll(model, {k: trl_batch[k] for k in ("input_ids", "attention_mask", "labels")})
    assert n_own == n + len(rows) * len(newline)
    assert trl_own.item() == pytest.approx(nll_own.item() / n_own, rel=1e-5)


def test_bf16_on_a_cpu_without_native_bf16_warns_and_auto_stays_float32(monkeypatch):
    """``auto`` never autocasts on CPU; ``bf16`` there warns when the CPU lacks AVX512-BF16 and AMX (oneDNN emulates
    bf16: > 10x slower a step, measured) and not when it has them; ``no`` never autocasts."""
    import warnings

    import torch

    from models.training import autocast_factory

    assert autocast_factory("auto", "cpu") is None
    assert autocast_factory("no", "cpu") is None
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    with pytest.warns(UserWarning, match="bf16 is emulated"):
        factory = autocast_factory("bf16", "cpu")
    with factory():
        assert torch.get_autocast_dtype("cpu") == torch.bfloat16 and torch.is_autocast_enabled("cpu")
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert autocast_factory("bf16", "cpu") is not None
