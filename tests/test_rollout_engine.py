"""RL rollouts from another engine than the trainer (issue 22 item 3, issue 16 item 3): truncated importance weights
by hand, the LoRA-merged weights an engine loads, `models.vllm_engine.VLLMSampler` against vLLM's public API (vLLM
does not install on this CPU machine: its offline API is replaced by a recording stand-in), and the RL loop with an
engine: weights synced every step, the trainer's forward as the old log-probs, TIS on the update.

On CPU with the tiny random model of `models.policy.build_tiny_causal_lm`; nothing here needs vLLM or a GPU.
"""

from __future__ import annotations

import copy
import math
import sys
import types
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

from models.lora import apply_lora, merged_weights
from models.policy import build_tiny_causal_lm
from models.rl import RLConfig, train_rl, truncated_is_weights
from models.rl_losses import grpo_loss
from models.sampling import SamplingConfig, sample
from tests.test_rl_loop import BASE, PROBLEMS, IndexVerifier, one_thread  # noqa: F401 (autouse: 1 thread)


def test_truncated_is_weights_by_hand():
    trainer = torch.tensor([[-1.0, -2.0, -0.5]])
    sampler = torch.tensor([[-1.0, -2.0 - math.log(3.0), -0.5 + math.log(2.0)]])
    weights, capped = truncated_is_weights(trainer, sampler, cap=2.0)
    # exp(0) = 1; exp(log 3) = 3 → capped at 2; exp(−log 2) = 0.5
    assert weights[0].tolist() == pytest.approx([1.0, 2.0, 0.5])
    assert capped.tolist() == [[False, True, False]]


@pytest.mark.parametrize("loss_type", ["dapo", "grpo"])
def test_is_weights_multiply_the_per_token_loss_before_aggregation(loss_type):
    """TRL's vllm_importance_sampling_correction: per_token_loss × w, then the loss type's aggregation. With
    ratio 1 (logps = old) the per-token loss is −A, so the loss is −Σ w·A·mask aggregated: checked by hand."""
    logps = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.7, 0.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    advantages = torch.tensor([1.0, -2.0])
    w = torch.tensor([[1.0, 0.5, 2.0], [0.25, 1.0, 7.0]])  # the padding's weight must not count
    loss, _ = grpo_loss(logps, logps.detach(), advantages, mask, loss_type=loss_type, is_weights=w)
    if loss_type == "dapo":  # token mean over the 5 valid tokens of −w·A
        expected = -(1.0 * 1 + 0.5 * 1 + 2.0 * 1 + 0.25 * -2 + 1.0 * -2) / 5
    else:  # per-sequence token means, then their mean
        expected = (-(1.0 + 0.5 + 2.0) / 3 + -(0.25 * -2 + 1.0 * -2) / 2) / 2
    assert loss.item() == pytest.approx(expected)
    unweighted, _ = grpo_loss(logps, logps.detach(), advantages, mask, loss_type=loss_type)
    ones, _ = grpo_loss(logps, logps.detach(), advantages, mask, loss_type=loss_type, is_weights=torch.ones(2, 3))
    assert ones.item() == unweighted.item()  # weights of 1 change nothing
    loss.backward()
    assert logps.grad is not None  # the weights scale the gradient, they take none


def test_merged_weights_are_what_merge_and_unload_gives():
    model, _ = build_tiny_causal_lm(0)
    model = apply_lora(model, 4, 8.0, 0.0, "auto", 0)
    with torch.no_grad():  # B starts at 0: make the adapters matter
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1)
    expected = dict(copy.deepcopy(model).merge_and_unload().named_parameters())
    got = dict(merged_weights(model))
    assert set(got) == set(expected)
    for name, tensor in expected.items():
        assert torch.allclose(got[name], tensor, atol=1e-6), name
    q_proj = model.get_base_model().get_submodule("model.layers.0.self_attn.q_proj")
    # the LoRA delta was merged into the targeted projection, not left out
    assert not torch.allclose(got["model.layers.0.self_attn.q_proj.weight"], q_proj.base_layer.weight)


# --------------------------------------------------------------------------- VLLMSampler against vLLM's API


class FakeLLM:
    """vLLM's ``LLM`` as the sampler uses it: ``generate(prompts, params, use_tqdm)`` returning one RequestOutput per
    prompt with ``outputs[j].token_ids``, ``.logprobs`` (a dict per token: id → Logprob) and ``.finish_reason``; and
    ``llm_engine.model_executor.driver_worker.worker.model_runner.model.load_weights``, ``reset_prefix_cache``."""

    def __init__(self, **kwargs):
        self.kwargs = kwargs
        self.loaded: list = []
        self.resets = 0
        model = SimpleNamespace(load_weights=lambda weights: self.loaded.append(list(weights)))
        runner = SimpleNamespace(model=model)
        self.llm_engine = SimpleNamespace(
            model_executor=SimpleNamespace(driver_worker=SimpleNamespace(worker=SimpleNamespace(model_runner=runner)))
        )
        self.calls = []

    def reset_prefix_cache(self):
        self.resets += 1

    def generate(self, prompts, params, use_tqdm=True):
        self.calls.append((prompts, params))
        out = []
        for prompt, p in zip(prompts, params, strict=True):
            outputs = []
            for j in range(p.n):
                tokens = [5 + j, 6, 2] if j % 2 == 0 else [7, 8, 9]  # even: ends on eos (id 2); odd: cut off
                logprobs = [{t: SimpleNamespace(logprob=-0.1 * (k + 1))} for k, t in enumerate(tokens)]
                reason = "stop" if j % 2 == 0 else "length"
                outputs.append(SimpleNamespace(token_ids=tokens, logprobs=logprobs, finish_reason=reason))
            out.append(SimpleNamespace(prompt_token_ids=prompt["prompt_token_ids"], outputs=outputs))
        return out


@pytest.fixture
def fake_vllm(monkeypatch):
    vllm = types.ModuleType("vllm")
    vllm.LLM = FakeLLM
    vllm.SamplingParams = lambda **kw: SimpleNamespace(**kw)
    inputs = types.ModuleType("vllm.inputs")
    inputs.TokensPrompt = lambda prompt_token_ids: {"prompt_token_ids": prompt_token_ids}
    vllm.inputs = inputs
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.inputs", inputs)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    return vllm


def test_the_engine_says_why_it_cannot_run_here(monkeypatch):
    from models import vllm_engine

    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm raises ImportError
    assert "not installed" in vllm_engine.engine_available()
    with pytest.raises(vllm_engine.EngineUnavailable, match="not installed"):
        vllm_engine.VLLMSampler("model", None)


def test_vllm_sampler_keeps_the_sampling_contract(fake_vllm, tmp_path):
    from models.vllm_engine import STOP_FENCE, VLLMSampler

    _, tok = build_tiny_causal_lm(0)
    engine = VLLMSampler(tmp_path, tok, dtype="float32", seed=3)
    assert engine.llm.kwargs["logprobs_mode"] == "processed_logprobs"  # log-probs after temperature, as ours
    assert engine.llm.kwargs["dtype"] == "float32" and engine.llm.kwargs["seed"] == 3
    config = SamplingConfig(n=2, temperature=0.7, top_p=1.0, max_new_tokens=9, seed=11, stop=("<end>",))
    out = engine.sample(["hello world", "def f():"], config, progress=False)
    prompts, params = engine.llm.calls[0]
    ids = [tok(text, add_special_tokens=False)["input_ids"] for text in ("hello world", "def f():")]
    assert [p["prompt_token_ids"] for p in prompts] == ids
    first = params[0]
    assert (first.n, first.temperature, first.top_p, first.max_tokens, first.logprobs) == (2, 0.7, 1.0, 9, 0)
    assert first.stop == ["<end>", STOP_FENCE] and first.include_stop_str_in_output
    assert params[0].seed != params[1].seed  # one seed per prompt, from (seed, index)
    assert [len(group) for group in out] == [2, 2]
    a, b = out[0]
    assert a.completion_ids == [5, 6, 2] and a.per_token_logps == pytest.approx([-0.1, -0.2, -0.3])
    assert tok.eos_token_id == 2 and a.finish_reason == "eos"  # ended on eos (vLLM says "stop")
    assert b.finish_reason == "length" and a.prompt_ids == prompts[0]["prompt_token_ids"]
    assert a.text == tok.decode([5, 6, 2], skip_special_tokens=True)

    greedy = engine.sample(["x"], SamplingConfig(n=3, temperature=0.0, max_new_tokens=4), progress=False)
    assert engine.llm.calls[-1][1][0].n == 1 and len(greedy[0]) == 3  # one greedy answer, repeated n times
    assert greedy[0][0] is greedy[0][2]


def test_vllm_sampler_loads_the_merged_policy_weights(fake_vllm, tmp_path):
    from models.vllm_engine import VLLMSampler

    model, tok = build_tiny_causal_lm(0)
    model = apply_lora(model, 4, 8.0, 0.0, "auto", 0)
    engine = VLLMSampler(tmp_path, tok)
    n = engine.load_weights(model)
    (loaded,) = engine.llm.loaded
    assert n == len(loaded) == len(list(merged_weights(model))) and engine.llm.resets == 1
    assert not any("lora_" in name or "base_layer" in name for name, _ in loaded)


# ------------------------------------------------------------------------------------ the RL loop with an engine


class TorchEngine:
    """An engine that samples with the torch sampler from the weights it was last given (a deep copy, as a real
    engine holds its own); its log-probs are `shift` nats off on every other token (0: it agrees with the trainer)."""

    def __init__(self, tokenizer, shift: float = 0.0):
        self.tokenizer, self.shift, self.model, self.syncs = tokenizer, shift, None, 0

    def load_weights(self, model):
        self.model = copy.deepcopy(model).eval()
        self.syncs += 1

    def sample(self, prompts, config, progress=False):
        groups = sample(self.model, self.tokenizer, prompts, config, progress=False)
        for group in groups:
            for c in group:
                c.per_token_logps[:] = [
                    x + (self.shift if t % 2 == 0 else 0.0) for t, x in enumerate(c.per_token_logps)
                ]
        return groups


def run(tmp_path, engine=None, **overrides):
    model, tok = build_tiny_causal_lm(0)
    cfg = RLConfig(**{**BASE, "algo": "grpo", "steps": 2, "screen_samples": 0, **overrides})
    engine = engine(tok) if engine else None
    result = train_rl(model, tok, PROBLEMS, cfg, IndexVerifier(), tmp_path, engine=engine)
    adapter = load_file(result.adapter_path / "adapter_model.safetensors")  # the returned model is merged
    assert max(v.abs().max().item() for k, v in adapter.items() if "lora_B" in k) > 1e-4  # B starts at 0: it moved
    return result, adapter, engine


def test_an_engine_that_agrees_with_the_trainer_trains_what_the_torch_sampler_does(tmp_path):
    """Same weights, same seeds, same samples: with the trainer's forward as the old log-probs and importance
    weights ≈ 1, the run ends with the torch-sampler run's adapters (float32 noise only); the engine got the
    policy's weights before each of the 2 steps."""
    plain, plain_params, _ = run(tmp_path / "torch")
    engined, engine_params, engine = run(tmp_path / "engine", engine=TorchEngine)
    assert engine.syncs == 2
    for key, value in plain_params.items():
        assert torch.allclose(engine_params[key], value, atol=1e-6), key
    first = engined.history[0]
    assert first["didpo/is_weight_mean"] == pytest.approx(1.0, abs=1e-5) and first["didpo/is_capped_frac"] == 0.0
    assert "didpo/time/weight_sync_s" in first and "didpo/is_weight_mean" not in plain.history[0]


def test_an_engine_that_disagrees_is_corrected_by_capped_weights(tmp_path):
    """The engine's log-probs are log 3 too low on every other token: there exp(trainer − engine) = 3 is capped at
    is_cap 2, elsewhere it is 1, so the mean weight is 1 + the capped fraction and the mean log-prob gap is log 3 ×
    that fraction; the unequal weights change the update (equal ones would not: AdamW divides out a common scale)."""
    shifted = lambda tok: TorchEngine(tok, shift=-math.log(3.0))  # noqa: E731
    result, params, _ = run(tmp_path / "shifted", engine=shifted, is_cap=2.0)
    first = result.history[0]
    capped = first["didpo/is_capped_frac"]
    assert 0.3 < capped < 0.7
    assert first["didpo/is_weight_mean"] == pytest.approx(1.0 + capped, abs=1e-5)
    assert first["didpo/logprob_diff"] == pytest.approx(math.log(3.0) * capped, abs=1e-4)
    _, plain_params, _ = run(tmp_path / "torch")
    assert any(not torch.allclose(params[k], v, atol=1e-6) for k, v in plain_params.items())


def test_rollout_engine_settings_are_checked():
    with pytest.raises(ValueError, match="didpo.rollout_engine"):
        RLConfig(rollout_engine="ctranslate2")
    with pytest.raises(ValueError, match="didpo.is_cap"):
        RLConfig(is_cap=0.5)


def test_the_measuring_stages_take_vllm_where_it_runs(fake_vllm, monkeypatch, tmp_path):
    from tasks.measure import make_sampler, resolve_engine

    assert resolve_engine("vllm", "bf16", "evaluate") == ("vllm", "bf16")
    _, tok = build_tiny_causal_lm(0)
    sampler = make_sampler(tmp_path, tok, ("vllm", "bf16"))
    assert sampler.llm.kwargs["dtype"] == "bfloat16" and sampler.llm.kwargs["model"] == str(tmp_path)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_engine("vllm", "bf16", "evaluate") == ("torch", "f32")  # no CUDA: the torch sampler, said once
    with pytest.raises(ValueError, match="didpo.lora"):
        RLConfig(rollout_engine="openvino", lora=False)
    assert RLConfig(rollout_engine="torch", lora=False).lora is False
