"""The OpenVINO engine: availability reasons, the export cache key, and — where the export environment exists
(``make export-env``) — greedy answers equal to the torch sampler's on a tiny model, token for token."""

import pytest

import models.openvino_engine as engine
from models.policy import build_tiny_causal_lm
from models.sampling import SamplingConfig, build_chat_prompt, sample


def test_without_the_export_environment_the_engine_says_why(tmp_path, monkeypatch):
    monkeypatch.setattr(engine, "EXPORT_ENV", tmp_path / "missing")
    reason = engine.engine_available()
    assert reason is not None and "make export-env" in reason and str(tmp_path / "missing") in reason
    with pytest.raises(engine.EngineUnavailable, match="make export-env"):
        engine.export(tmp_path, tmp_path / "cache")


def test_the_cache_key_is_the_weights_and_config(tmp_path):
    model, _ = build_tiny_causal_lm(seed=0)
    model.save_pretrained(tmp_path / "a")
    model.save_pretrained(tmp_path / "b")
    assert engine.checkpoint_digest(tmp_path / "a") == engine.checkpoint_digest(tmp_path / "b")
    build_tiny_causal_lm(seed=1)[0].save_pretrained(tmp_path / "c")
    assert engine.checkpoint_digest(tmp_path / "c") != engine.checkpoint_digest(tmp_path / "a")
    with pytest.raises(ValueError, match="precision"):
        engine.OpenVINOSampler(tmp_path, None, precision="int8")


def assert_greedy(model, answers) -> None:
    """Every token an engine chose greedily is `model`'s argmax given the engine's own prefix (teacher forcing, so a
    near-tie cannot derail the rest of the comparison), within 1e-3 of the best logit: the two runtimes' fp32
    logits differ by up to ~2.5e-4 on the tiny random model, whose logits are all ≈ 0.3, so exact token equality
    can flip on a near-tie (on SmolLM2-135M greedy answers are compared token for token by bench_generation.py)."""
    import torch

    for answer in answers:
        ids = torch.tensor([answer.prompt_ids + answer.completion_ids])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, len(answer.prompt_ids) - 1 : -1]  # (T, V)
        chosen = logits[torch.arange(len(answer.completion_ids)), torch.tensor(answer.completion_ids)]
        assert (logits.max(-1).values - chosen).max().item() < 1e-3


needs_export = pytest.mark.skipif(engine.engine_available() is not None, reason=str(engine.engine_available()))


@needs_export
def test_greedy_answers_equal_the_torch_sampler_and_sampling_keeps_the_contract(tmp_path):
    model, tokenizer = build_tiny_causal_lm(seed=0)
    model.save_pretrained(tmp_path / "tiny")
    tokenizer.save_pretrained(tmp_path / "tiny")
    ir = engine.export(tmp_path / "tiny", tmp_path / "cache")
    assert engine.export(tmp_path / "tiny", tmp_path / "cache") == ir  # cached by digest: no second export
    sampler = engine.OpenVINOSampler(ir, tokenizer, threads=1)
    prompts = [build_chat_prompt(tokenizer, "Write add(a, b)."), build_chat_prompt(tokenizer, "Reverse a list.")]
    greedy = SamplingConfig(n=2, temperature=0.0, max_new_tokens=24, stop_on_code_block=False)
    ours, theirs = sample(model, tokenizer, prompts, greedy, progress=False), sampler.sample(prompts, greedy)
    for a_group, b_group in zip(ours, theirs, strict=True):
        for a, b in zip(a_group, b_group, strict=True):
            assert b.prompt_ids == a.prompt_ids and b.text == tokenizer.decode(
                b.completion_ids, skip_special_tokens=True
            )
    assert_greedy(model, [g[0] for g in theirs])
    sampled = SamplingConfig(n=3, temperature=0.8, top_p=0.95, max_new_tokens=16, seed=5)
    first, again = sampler.sample(prompts, sampled), sampler.sample(prompts, sampled)
    assert [[c.completion_ids for c in g] for g in first] == [[c.completion_ids for c in g] for g in again]
    assert [len(g) for g in first] == [3, 3]
    for c in (c for g in first for c in g):
        assert 1 <= len(c.completion_ids) <= 16 and c.finish_reason in ("eos", "length")
        assert len(c.per_token_logps) == len(c.completion_ids) and all(x != x for x in c.per_token_logps)  # NaN
    other_seed = sampler.sample(prompts, SamplingConfig(n=3, temperature=0.8, top_p=0.95, max_new_tokens=16, seed=6))
    assert [[c.completion_ids for c in g] for g in other_seed] != [[c.completion_ids for c in g] for g in first]


def _exported_tiny(tmp_path):
    model, tokenizer = build_tiny_causal_lm(seed=0)
    model.save_pretrained(tmp_path / "tiny")
    tokenizer.save_pretrained(tmp_path / "tiny")
    return model, tokenizer, engine.export(tmp_path / "tiny", tmp_path / "cache")


@needs_export
def test_loaded_weights_make_the_engine_answer_as_the_trained_policy(tmp_path):
    """RL's weight sync without a re-export: LoRA adapters with visible weights on the exported checkpoint; after
    `load_weights` every greedy token of the engine is the adapted policy's argmax (and the answers are not those
    of the checkpoint it was exported from)."""
    import torch

    from models.lora import apply_lora

    model, tokenizer, ir = _exported_tiny(tmp_path)
    sampler = engine.OpenVINOSampler(ir, tokenizer, threads=1)
    prompts = [build_chat_prompt(tokenizer, "Write add(a, b)."), build_chat_prompt(tokenizer, "Reverse a list.")]
    greedy = SamplingConfig(n=1, temperature=0.0, max_new_tokens=24, stop_on_code_block=False)
    before = [g[0].completion_ids for g in sampler.sample(prompts, greedy, progress=False)]
    policy = apply_lora(model, 4, 8.0, 0.0, "auto", 0)
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5, generator=torch.Generator().manual_seed(1))
    n = sampler.load_weights(policy)
    adapted = [name for name, m in policy.named_modules() if hasattr(m, "lora_A") and hasattr(m, "base_layer")]
    assert n == len(adapted) > 0  # every adapted projection written, nothing else
    answers = [g[0] for g in sampler.sample(prompts, greedy, progress=False)]
    assert [a.completion_ids for a in answers] != before
    assert_greedy(policy, answers)


@needs_export
def test_a_checkpoint_differing_in_projections_is_patched_to_the_exported_ir(tmp_path, monkeypatch):
    """A LoRA-merged checkpoint (decoder projections changed) gets its IR by patching the cached one of its family:
    no exporter call, and the result equals a fresh export byte for byte (XML and weights). A changed norm is not
    patchable: that checkpoint is exported."""
    import torch

    model, tokenizer, first = _exported_tiny(tmp_path)
    exports = []
    real_export = engine._optimum_export
    monkeypatch.setattr(engine, "_optimum_export", lambda *a: exports.append(a[0]) or real_export(*a))
    with torch.no_grad():
        model.model.layers[0].self_attn.q_proj.weight.add_(0.25)
        model.model.layers[1].mlp.down_proj.weight.mul_(-1.0)
    model.save_pretrained(tmp_path / "merged")
    tokenizer.save_pretrained(tmp_path / "merged")
    patched = engine.export(tmp_path / "merged", tmp_path / "cache")
    assert exports == [] and patched != first
    fresh = engine.export(tmp_path / "merged", tmp_path / "fresh_cache")  # no donor there: the exporter
    assert exports == [tmp_path / "merged"]
    for name in ("openvino_model.xml", "openvino_model.bin", "openvino_tokenizer.bin", engine.MANIFEST):
        assert (patched / name).read_bytes() == (fresh / name).read_bytes(), name
    assert (patched / "openvino_model.bin").read_bytes() != (first / "openvino_model.bin").read_bytes()
    with torch.no_grad():
        model.model.norm.weight.add_(0.5)
    model.save_pretrained(tmp_path / "full")
    tokenizer.save_pretrained(tmp_path / "full")
    engine.export(tmp_path / "full", tmp_path / "cache")
    assert exports == [tmp_path / "merged", tmp_path / "full"]


@needs_export
def test_rl_samples_from_the_openvino_engine(tmp_path):
    """Two RL steps with the engine: the policy's weights go into it before each step, the old log-probs are the
    trainer's, and with the engine's log-probs unknown (NaN) every importance weight is 1."""
    from models.config import ProcessRewardConfig
    from models.rl import RLConfig, train_rl
    from tests.test_rl_loop import PROBLEMS, IndexVerifier

    model, tokenizer, ir = _exported_tiny(tmp_path)
    sampler = engine.OpenVINOSampler(ir, tokenizer, threads=1)
    reward = ProcessRewardConfig(control="group", overlong_max=0, overlong_cache=0)
    cfg = RLConfig(
        algo="grpo", steps=2, prompts_per_step=2, group_size=4, max_new_tokens=12, lora_r=4, lora_alpha=8.0,
        minibatch_size=4, device="cpu", checkpoint_every=0, target_kl=0.0, screen_samples=0, reward=reward,
        rollout_engine="openvino", learning_rate=1e-3,
    )  # fmt: skip
    result = train_rl(model, tokenizer, PROBLEMS, cfg, IndexVerifier(), tmp_path / "rl", engine=sampler)
    for record in result.history:
        assert record["didpo/is_weight_mean"] == 1.0 and record["didpo/is_capped_frac"] == 0.0
        assert record["didpo/time/weight_sync_s"] > 0 and "didpo/logprob_diff" not in record
        # the engine's sequence log-probs (its scores, at T) against the trainer's forward: float32 noise only
        assert record["didpo/seq_logprob_diff"] < 1e-3
        assert record["didpo/groups_trained"] == 2


INTERRUPTED_CALL = """
import signal, threading
from models.openvino_engine import interruptible

release, returned = threading.Event(), threading.Event()

def blocked():
    release.wait(60)  # like generate: waits without the GIL
    returned.set()

def ctrl_c(signum, frame):
    raise KeyboardInterrupt

signal.signal(signal.SIGALRM, ctrl_c)
signal.setitimer(signal.ITIMER_REAL, 0.3)
try:
    interruptible(blocked)
except KeyboardInterrupt:
    print("interrupted; the call had returned:", returned.is_set())
release.set()
print("then it returned:", returned.wait(10))
"""


def test_interruptible_returns_raises_and_lets_an_interrupt_through_at_once():
    """`models.openvino_engine.interruptible`: the call's value and its exception come back as from a direct call;
    a KeyboardInterrupt (a SIGALRM standing in for Ctrl-C) is raised in the waiting thread while the call, blocked
    outside the GIL as ``generate`` is, has not returned. The interrupt runs in a fresh process: a signal delivered
    to this test process after the OpenVINO tests above segfaulted it 2 times in 3 (a bare SIGALRM during
    ``time.sleep`` too, without `interruptible`; a plain script that loads OpenVINO and torch took 30 without harm)."""
    import subprocess
    import sys

    from models.openvino_engine import interruptible

    assert interruptible(lambda: 42) == 42
    with pytest.raises(ZeroDivisionError):
        interruptible(lambda: 1 / 0)
    done = subprocess.run([sys.executable, "-c", INTERRUPTED_CALL], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["interrupted; the call had returned: False", "then it returned: True"]
