"""The sampler on tiny random models: recorded log-probs, seeding, stopping, code extraction."""

import math

import pytest
import torch

from models.policy import build_tiny_causal_lm
from models.sampling import (
    SamplingConfig,
    _choose_tokens,
    build_chat_prompt,
    code_block_closed,
    collate_completions,
    extract_code,
    format_answer,
    sample,
)

ANSWER = "Sure:\n```python\ndef f():\n    return 1\n```\nIt returns one."


@pytest.fixture(scope="module")
def tiny():
    return build_tiny_causal_lm(seed=0)


@pytest.fixture(scope="module")
def prompts(tiny):
    _, tokenizer = tiny
    return [
        build_chat_prompt(tokenizer, "Write a function that adds two numbers.", "def add(a, b):\n"),
        build_chat_prompt(tokenizer, "Hi"),
    ]


@pytest.fixture(scope="module")
def parrot():
    """A tiny model trained until greedy decoding reproduces ANSWER + eos after the prompt "Write f."."""
    model, tokenizer = build_tiny_causal_lm(seed=1)
    prompt = build_chat_prompt(tokenizer, "Write f.")
    n_prompt = len(tokenizer(prompt, add_special_tokens=False)["input_ids"])
    ids = torch.tensor([tokenizer(prompt + ANSWER + tokenizer.eos_token, add_special_tokens=False)["input_ids"]])
    target = ids[0, n_prompt:]
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-2)
    model.train()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        for _ in range(400):
            logits = model(ids).logits[0, n_prompt - 1 : -1]  # (T, V): predictions of the answer tokens
            if torch.equal(logits.argmax(-1), target):
                break
            loss = torch.nn.functional.cross_entropy(logits, target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    model.eval()
    assert torch.equal(logits.argmax(-1), target), "the parrot did not learn its answer"
    return model, tokenizer, prompt


def _fresh_logps(model, completion, temperature=1.0):
    """log softmax(logits / T)[a_t] from one unpadded forward pass over prompt + completion."""
    ids = torch.tensor([completion.prompt_ids + completion.completion_ids])
    with torch.no_grad():
        logps = (model(ids).logits[0].float() / temperature).log_softmax(-1)  # (L, V)
    start = len(completion.prompt_ids)
    targets = torch.tensor(completion.completion_ids)
    return logps[start - 1 : -1].gather(-1, targets[:, None])[:, 0]


def test_recorded_logps_equal_a_fresh_forward_pass(tiny, prompts):
    model, tokenizer = tiny
    config = SamplingConfig(n=3, temperature=0.7, top_p=0.9, max_new_tokens=12, batch_size=4, seed=3)
    results = sample(model, tokenizer, prompts, config, progress=False)
    # The two prompts differ in length, so the first batch mixes left-padded rows.
    assert len(results[0][0].prompt_ids) != len(results[1][0].prompt_ids)
    for row in results:
        for c in row:
            assert len(c.per_token_logps) == len(c.completion_ids) > 0
            diff = (_fresh_logps(model, c, 0.7) - torch.tensor(c.per_token_logps)).abs().max().item()
            assert diff < 1e-4  # scored at the sampling temperature (TRL's convention), not at T = 1


def test_n_samples_per_prompt_and_collate(tiny, prompts):
    model, tokenizer = tiny
    results = sample(model, tokenizer, prompts, SamplingConfig(n=5, max_new_tokens=6, batch_size=3), progress=False)
    assert [len(row) for row in results] == [5, 5]
    flat = [c for row in results for c in row]
    assert all(len(c.completion_ids) == 6 and c.finish_reason == "length" for c in flat)
    assert all(c.text == tokenizer.decode(c.completion_ids, skip_special_tokens=True) for c in flat)
    # Different samples of one prompt differ (6 tokens from a ~uniform 384-way distribution).
    assert len({tuple(c.completion_ids) for c in results[0]}) == 5

    flat[0].completion_ids = flat[0].completion_ids[:2]
    flat[0].per_token_logps = flat[0].per_token_logps[:2]
    batch = collate_completions(flat, pad_token_id=tokenizer.pad_token_id)
    assert batch["completion_ids"].shape == batch["completion_mask"].shape == batch["per_token_logps"].shape == (10, 6)
    assert batch["per_token_logps"].dtype == torch.float32
    assert batch["completion_mask"][0].tolist() == [1, 1, 0, 0, 0, 0]
    assert batch["completion_ids"][0, 2:].tolist() == [tokenizer.pad_token_id] * 4
    assert batch["per_token_logps"][0, 2:].abs().sum().item() == 0.0
    assert batch["per_token_logps"][1].tolist() == pytest.approx(flat[1].per_token_logps)


def test_same_seed_same_samples_other_seed_differs(tiny, prompts):
    model, tokenizer = tiny
    config = SamplingConfig(n=2, temperature=1.0, top_p=1.0, max_new_tokens=10, seed=7)
    first = sample(model, tokenizer, prompts, config, progress=False)
    again = sample(model, tokenizer, prompts, config, progress=False)
    other = sample(
        model,
        tokenizer,
        prompts,
        SamplingConfig(n=2, temperature=1.0, top_p=1.0, max_new_tokens=10, seed=8),
        progress=False,
    )
    ids = lambda res: [[c.completion_ids for c in row] for row in res]  # noqa: E731
    assert ids(first) == ids(again)
    assert ids(first) != ids(other)


def test_samples_do_not_depend_on_batch_size(tiny, prompts):
    model, tokenizer = tiny
    big = sample(model, tokenizer, prompts, SamplingConfig(n=3, max_new_tokens=10, batch_size=6), progress=False)
    one = sample(model, tokenizer, prompts, SamplingConfig(n=3, max_new_tokens=10, batch_size=1), progress=False)
    assert [[c.completion_ids for c in row] for row in big] == [[c.completion_ids for c in row] for row in one]


def test_greedy_matches_transformers_generate_and_tiny_top_p(tiny, prompts):
    model, tokenizer = tiny
    greedy = SamplingConfig(n=2, temperature=0.0, max_new_tokens=15, stop_on_code_block=False)
    results = sample(model, tokenizer, prompts, greedy, progress=False)
    for prompt, row in zip(prompts, results, strict=True):
        inputs = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)
        with torch.no_grad():
            reference = model.generate(**inputs, max_new_tokens=15, do_sample=False)
        assert row[0].completion_ids == reference[0, inputs["input_ids"].shape[1] :].tolist()
        assert row[0].completion_ids == row[1].completion_ids  # greedy: all n samples are identical
    # A nucleus smaller than the top token's mass keeps only that token: sampling becomes greedy.
    nucleus = SamplingConfig(n=2, temperature=1.0, top_p=1e-6, max_new_tokens=15, stop_on_code_block=False)
    sampled = sample(model, tokenizer, prompts, nucleus, progress=False)
    assert [[c.completion_ids for c in row] for row in sampled] == [[c.completion_ids for c in row] for row in results]


def test_choose_tokens_follows_tempered_nucleus_distribution():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log().repeat(4000, 1)  # (4000, 4)
    generators = [torch.Generator().manual_seed(k) for k in range(4000)]
    # top_p = 0.7: token 0 (mass before 0) and token 1 (mass before 0.5) stay, token 2 (mass before 0.8) goes.
    picked = _choose_tokens(logits, SamplingConfig(temperature=1.0, top_p=0.7), generators)
    counts = torch.bincount(picked, minlength=4).float() / 4000
    assert counts[2:].sum().item() == 0.0
    assert counts[0].item() == pytest.approx(0.5 / 0.8, abs=0.03)
    # Temperature 2 without nucleus: p_i ∝ sqrt(p_i).
    generators = [torch.Generator().manual_seed(k) for k in range(4000)]
    picked = _choose_tokens(logits, SamplingConfig(temperature=2.0, top_p=1.0), generators)
    counts = torch.bincount(picked, minlength=4).float() / 4000
    expected = probs.sqrt() / probs.sqrt().sum()
    assert counts.tolist() == pytest.approx(expected.tolist(), abs=0.03)


def test_nucleus_shortcut_matches_full_sort(monkeypatch):
    import models.sampling as sampling

    logits = 4.0 * torch.randn(64, 1000, generator=torch.Generator().manual_seed(0))  # peaked: top-256 path
    config = SamplingConfig(temperature=0.9, top_p=0.9)
    seeds = range(64)
    shortcut = _choose_tokens(logits, config, [torch.Generator().manual_seed(k) for k in seeds])
    monkeypatch.setattr(sampling, "_NUCLEUS_CANDIDATES", 10_000)  # always the full sort
    full = _choose_tokens(logits, config, [torch.Generator().manual_seed(k) for k in seeds])
    assert torch.equal(shortcut, full)


def test_nucleus_wider_than_the_shortcut():
    # p_i ∝ 1 - i/2000 over 600 tokens: the top 256 hold ~46% of the mass, so top_p = 0.9 needs a full sort.
    weights = 1 - torch.arange(600) / 2000
    probs = weights / weights.sum()
    last_kept = int(((probs.cumsum(0) - probs) <= 0.9).nonzero().max())
    logits = probs.log().repeat(3000, 1)
    picked = _choose_tokens(
        logits, SamplingConfig(temperature=1.0, top_p=0.9), [torch.Generator().manual_seed(k) for k in range(3000)]
    )
    assert picked.max().item() <= last_kept
    assert picked.max().item() > 500 and (picked > 256).float().mean().item() > 0.4


def test_stops_when_the_code_block_closes(parrot):
    model, tokenizer, prompt = parrot
    c = sample(model, tokenizer, [prompt], SamplingConfig(temperature=0, max_new_tokens=60), progress=False)[0][0]
    assert c.finish_reason == "stop"
    assert c.text.rstrip("\n") == "Sure:\n```python\ndef f():\n    return 1\n```"
    assert c.code == "def f():\n    return 1\n"


def test_eos_length_and_stop_string(parrot):
    model, tokenizer, prompt = parrot
    free = SamplingConfig(temperature=0, max_new_tokens=60, stop_on_code_block=False)
    c = sample(model, tokenizer, [prompt], free, progress=False)[0][0]
    assert c.finish_reason == "eos"
    assert c.completion_ids[-1] == tokenizer.eos_token_id
    assert c.text == ANSWER
    assert c.per_token_logps[-1] > math.log(0.5)  # the parrot is sure it ends there

    cut = SamplingConfig(temperature=0, max_new_tokens=60, stop_on_code_block=False, stop=("return",))
    c = sample(model, tokenizer, [prompt], cut, progress=False)[0][0]
    assert c.finish_reason == "stop"
    assert c.text.endswith("return") and c.text.count("return") == 1
    assert "return" not in tokenizer.decode(c.completion_ids[:-1])

    short = SamplingConfig(temperature=0, max_new_tokens=3)
    c = sample(model, tokenizer, [prompt], short, progress=False)[0][0]
    assert c.finish_reason == "length" and len(c.completion_ids) == 3


def test_progress_counts_every_answer_and_token_as_it_is_decoded(tiny, prompts, monkeypatch):
    """The bar's callback: finished rows add up to the answers, new tokens to the tokens of the completions, and it
    fires at every decode step (so the bar moves inside a batch, not once per batch)."""
    import models.sampling as sampling

    model, tokenizer = tiny
    calls: list[tuple[int, int]] = []
    original = sampling._sample_batch

    def spy(*args):
        *rest, on_step = args
        return original(*rest, lambda finished, new: (calls.append((finished, new)), on_step(finished, new)))

    monkeypatch.setattr(sampling, "_sample_batch", spy)
    config = SamplingConfig(n=3, temperature=1.0, max_new_tokens=12, stop_on_code_block=False, batch_size=4, seed=1)
    out = sampling.sample(model, tokenizer, prompts, config, progress=True)
    answers = [c for per_prompt in out for c in per_prompt]
    assert sum(f for f, _ in calls) == len(answers) == 3 * len(prompts)
    assert sum(n for _, n in calls) == sum(len(c.completion_ids) for c in answers)
    batches = -(-len(answers) // 4)
    assert batches < len(calls) <= batches * 12  # once per decode step (≤ 12 a batch), not once per batch


def test_sampling_restores_training_mode(tiny, prompts):
    model, tokenizer = tiny
    model.train()
    try:
        sample(model, tokenizer, prompts[:1], SamplingConfig(max_new_tokens=2), progress=False)
        assert model.training
    finally:
        model.eval()


def test_config_validation():
    with pytest.raises(ValueError):
        SamplingConfig(top_p=0.0)
    with pytest.raises(ValueError):
        SamplingConfig(temperature=-1.0)
    with pytest.raises(ValueError):
        SamplingConfig(n=0)


def test_build_chat_prompt(tiny):
    _, tokenizer = tiny
    text = build_chat_prompt(tokenizer, "Remove empty strings.", "def clean(items):\n", system="Be brief.")
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nRemove empty strings.\n\n```python\ndef clean(items):\n```<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert build_chat_prompt(tokenizer, "Hi") == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("Here:\n```python\ndef f(x):\n    return x\n```\nDone.", "def f(x):\n    return x\n"),
        ("```py\nx = 1\n```", "x = 1\n"),
        ("```\nimport os\n```", "import os\n"),
        ("```python\na = 1\n```\nor\n```python\nb = 2\n```", "a = 1\n"),
        ("```bash\nls\n```\n```python\nc = 3\n```", "c = 3\n"),
        ("```python\ndef g():\n    return", "def g():\n    return"),
        ("def h(s):\n    return s.strip()\n", "def h(s):\n    return s.strip()\n"),
        ("Use this:\ndef h(s):\n    return s\nIt works well.", "def h(s):\n    return s\n"),
        ("The answer is simple.", ""),
        ("yes", ""),
        ("", ""),
    ],
)
def test_extract_code(text, code):
    assert extract_code(text) == code


def test_code_block_closed_and_format_answer():
    assert not code_block_closed("Sure:\n```python\ndef f():\n")
    assert not code_block_closed("Sure:\n```python")
    assert code_block_closed("Sure:\n```python\ndef f():\n    pass\n```")
    assert code_block_closed("```python\n```")
    assert not code_block_closed("inline ``` fence ``` only")
    assert not code_block_closed("```bash\npip install x\n```")
    assert code_block_closed("```bash\nls\n```\n```\nx = 1\n```")
    answer = format_answer("def f():\n    return 1\n\n")
    assert answer == "```python\ndef f():\n    return 1\n```"
    assert extract_code(answer) == "def f():\n    return 1\n"


def test_lora_policy_samples_in_eval_mode():
    from peft import LoraConfig, get_peft_model

    model, tokenizer = build_tiny_causal_lm(seed=2)
    lora = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], lora_dropout=0.5, init_lora_weights=False)
    policy = get_peft_model(model, lora)
    policy.train()  # LoRA dropout would perturb the log-probs if sampling did not switch it off
    prompt = build_chat_prompt(tokenizer, "Write f.")
    completions = sample(policy, tokenizer, [prompt], SamplingConfig(n=2, max_new_tokens=8), progress=False)[0]
    assert policy.training
    policy.eval()
    for c in completions:
        diff = (_fresh_logps(policy, c, 0.8) - torch.tensor(c.per_token_logps)).abs().max().item()
        assert diff < 1e-4
