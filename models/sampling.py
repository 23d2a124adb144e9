"""Chat prompting, batched sampling with recorded log-probs, and code extraction.

The sampler is a plain KV-cached decoding loop rather than ``model.generate`` so that three things hold
exactly:

- **Recorded log-probs are the sampling temperature's.** ``per_token_logps[t] = log_softmax(logits_t / T)[a_t]``
  from the very forward pass that produced token a_t (T the sampling temperature; unscaled logits when greedy), with
  no top-p truncation: what a fresh forward pass of the same model over prompt + completion gives at the same T (up
  to floating-point noise), which is what PPO/GRPO ratios exp(logπ_θ − logπ_old) compare against. This is TRL's
  convention (its GRPO divides the logits by the sampling temperature on both sides); at T = 1 it is π_θ itself.
  RL refuses top_p < 1 (the truncated distribution is not the one scored).
- **Per-sample seeding.** Every sample (prompt i, sample j) draws from its own ``torch.Generator`` seeded from
  ``(seed, i, j)``, so a sample does not depend on `batch_size` or on which other samples share its batch
  (beyond floating-point noise from padding). Callers that sample repeatedly (RL steps) must vary `seed`.
- **Per-sequence stopping.** A sample stops at eos, at a stop string, or when its fenced python code block closes;
  finished rows are dropped from the batch (and the KV cache) so they cost nothing afterwards.

All the n samples of a prompt share one prefill: the prompt is run once and its cache repeated.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

# An opening fence line (``` + optional info string), the block body, and a closing fence at a line start.
_FENCED_BLOCK = re.compile(r"^[ \t]*```[ \t]*([\w+.-]*)[^\n]*\n(.*?)^[ \t]*```", re.DOTALL | re.MULTILINE)
_OPEN_FENCE = re.compile(r"^[ \t]*```[ \t]*([\w+.-]*)[^\n]*\n", re.MULTILINE)
_PYTHON_TAGS = {"", "python", "py", "python3"}
_CODE_START = re.compile(r"^(?:def |class |import |from |async def |@)", re.MULTILINE)
_NUCLEUS_CANDIDATES = 256  # tokens searched for the nucleus before falling back to a full sort


@dataclass(frozen=True)
class SamplingConfig:
    """How to sample answers.

    Attributes:
        n: samples per prompt.
        temperature: softmax temperature of the sampling distribution; 0 means greedy (argmax).
        top_p: nucleus sampling mass in (0, 1]; 1 disables it. Ignored when greedy.
        max_new_tokens: the most tokens generated per sample.
        batch_size: the most sequences decoded together (the n samples of a prompt may span batches). 64
            decodes 1.6x more tokens/s than 16 for the 135M model on 2 CPU cores (benchmarks/bench_sampling.py;
            small matrix products are inefficient); the samples themselves do not change.
        seed: base seed; sample j of prompt i uses a generator seeded from (seed, i, j).
        stop: extra stop strings; a sample stops once its decoded completion contains one (the string is
            kept in the completion, so ``text == decode(completion_ids)`` always holds).
        stop_on_code_block: stop a sample as soon as a fenced python (or untagged) code block closes.
    """

    n: int = 1
    temperature: float = 0.8
    top_p: float = 0.95
    max_new_tokens: int = 256
    batch_size: int = 64
    seed: int = 0
    stop: tuple[str, ...] = ()
    stop_on_code_block: bool = True

    def __post_init__(self):
        if self.n < 1 or self.batch_size < 1 or self.max_new_tokens < 1:
            raise ValueError("n, batch_size and max_new_tokens must be >= 1")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")


@dataclass
class Completion:
    """One sampled answer.

    Attributes:
        text: the decoded completion (special tokens skipped); ``tokenizer.decode(completion_ids,
            skip_special_tokens=True)``.
        code: ``extract_code(text)``.
        prompt_ids: the prompt's token ids (no padding), shared by the prompt's samples.
        completion_ids: generated token ids, including the final eos token when the sample ended on one.
        per_token_logps: log softmax(logits / T)[a_t] for each completion token at the sampling temperature T
            (unscaled when greedy; no top-p truncation; see the module doc), same length as `completion_ids`, nats;
            NaN from an engine that does not report them.
        finish_reason: "eos" (the model emitted eos), "stop" (code block closed or stop string), "length".
        sequence_logp: Σ of the tokens' log-probs at T, from an engine that reports only the total
            (`models.openvino_engine`, whose `per_token_logps` are NaN); None otherwise.
    """

    text: str
    code: str
    prompt_ids: list[int]
    completion_ids: list[int]
    per_token_logps: list[float] = field(repr=False)
    finish_reason: str
    sequence_logp: float | None = None


def format_answer(code: str) -> str:
    """The assistant's answer format: `code` in one fenced python block (what `extract_code` reads back)."""
    return f"```python\n{code.rstrip()}\n```"


def build_chat_prompt(tokenizer, instruction: str, prompt_code: str | None = None, system: str | None = None) -> str:
    """Render a coding request with the tokenizer's chat template, ready for generation.

    The user message is `instruction`, followed (when given) by `prompt_code` (e.g. the function signature
    and docstring) in a fenced python block. `system` adds a system message; without it the template's own
    default applies (SmolLM2's adds one). The generation prompt (``<|im_start|>assistant\\n``) is appended.

    Returns:
        the prompt string; tokenize it with ``add_special_tokens=False`` (the template holds the specials).

    Raises:
        ValueError: the tokenizer has no chat template (from transformers).
    """
    content = instruction.strip()
    if prompt_code and prompt_code.strip():
        content += "\n\n" + format_answer(prompt_code)
    messages = [{"role": "system", "content": system}] if system else []
    messages.append({"role": "user", "content": content})
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def pad_token_id(tokenizer) -> int:
    """The id used to pad batches: the tokenizer's pad token, else its eos token.

    Raises:
        ValueError: the tokenizer has neither.
    """
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if pad_id is None:
        raise ValueError("the tokenizer has neither a pad nor an eos token")
    return pad_id


def code_block_closed(text: str) -> bool:
    """True when `text` contains a closed fenced code block tagged python/py/python3 or untagged (the block
    `extract_code` returns); closed blocks in other languages (```bash) do not count."""
    return any(m.group(1).lower() in _PYTHON_TAGS for m in _FENCED_BLOCK.finditer(text))


def _looks_like_code(source: str) -> bool:
    """Parses as Python and has at least one statement that is not a bare expression ("yes" parses too)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return False
    return any(not isinstance(node, ast.Expr) for node in tree.body)


def extract_code(text: str) -> str:
    """The Python code in an answer.

    In order: the body of the first closed fenced block tagged python/py/python3 or untagged (blocks in other
    languages are skipped); else, when the first python/untagged fence is never closed (a truncated answer),
    everything after it; else the text itself when it is code (parses, with at least one non-expression
    statement); else the longest parsing stretch that starts at the first ``def``/``class``/``import``/
    ``from``/``@`` line (prose before and after code); else "".

    Returns:
        the code, with the fence lines removed ("" when there is none).
    """
    for match in _FENCED_BLOCK.finditer(text):
        if match.group(1).lower() in _PYTHON_TAGS:
            return match.group(2)
    for match in _OPEN_FENCE.finditer(text):
        rest = text[match.end() :]
        if match.group(1).lower() in _PYTHON_TAGS and "```" not in rest:
            return rest
    if _looks_like_code(text):
        return text
    start = _CODE_START.search(text)
    if start is None:
        return ""
    lines = text[start.start() :].splitlines(keepends=True)
    for end in range(len(lines), 0, -1):
        candidate = "".join(lines[:end])
        if _looks_like_code(candidate):
            return candidate
    return ""


def _row_seed(seed: int, prompt_index: int, sample_index: int) -> int:
    import numpy as np

    return int(np.random.SeedSequence([seed, prompt_index, sample_index]).generate_state(1, np.uint64)[0] >> 1)


def _choose_tokens(logits, config: SamplingConfig, generators):
    """Next tokens (B,) from unscaled logits (B, V) float32: argmax when greedy, else inverse-CDF sampling
    from the tempered, top-p-truncated distribution with one uniform per row from that row's generator."""
    import torch

    if config.temperature == 0:
        return logits.argmax(dim=-1)
    probs = torch.softmax(logits / config.temperature, dim=-1)  # (B, V)
    order = None
    if config.top_p < 1:
        # The nucleus lies inside the top k whenever those k tokens hold more than top_p of the mass (token
        # k+1 then has more than top_p before it); a partial top-k is much cheaper than sorting the vocabulary.
        top = probs.topk(min(_NUCLEUS_CANDIDATES, probs.shape[-1]), dim=-1)  # sorted, descending
        if bool((top.values.sum(dim=-1) > config.top_p).all()):
            probs, order = top.values, top.indices  # (B, k)
        else:
            probs, order = probs.sort(dim=-1, descending=True)  # (B, V)
        mass_before = probs.cumsum(dim=-1) - probs
        probs = probs.masked_fill(mass_before > config.top_p, 0.0)  # the top token always survives
    cdf = probs.cumsum(dim=-1)  # (B, V) or (B, k)
    # u in (0, 1]: the first index with cdf >= u * total always has positive probability.
    u = torch.stack([1.0 - torch.rand((), generator=g) for g in generators]).to(logits.device)
    picked = torch.searchsorted(cdf, (u * cdf[:, -1]).unsqueeze(-1)).squeeze(-1)
    picked = picked.clamp(max=probs.shape[-1] - 1)
    return picked if order is None else order.gather(-1, picked.unsqueeze(-1)).squeeze(-1)


def eos_ids(model, tokenizer) -> set[int]:
    """The token ids `sample` stops at: the tokenizer's eos and the generation config's (an int or a list)."""
    ids = set()
    for value in (tokenizer.eos_token_id, getattr(model.generation_config, "eos_token_id", None)):
        if isinstance(value, int):
            ids.add(value)
        elif value is not None:
            ids.update(value)
    return ids


def _stopped(text: str, config: SamplingConfig) -> bool:
    if config.stop_on_code_block and code_block_closed(text):
        return True
    return any(s in text for s in config.stop)


def _sample_batch(model, tokenizer, prompt_ids, rows, config, stop_ids, pad_id, on_step=None):
    """Decode one batch. `rows` is a list of (prompt_index, sample_index); returns one Completion per row.

    ``on_step(finished, new_tokens)``, when given, is called after every decode step with how many rows finished at it
    and how many tokens it generated (one per live row)."""
    import torch

    device = next(model.parameters()).device
    unique = sorted({i for i, _ in rows})
    slot = {p: k for k, p in enumerate(unique)}
    width = max(len(prompt_ids[p]) for p in unique)
    # Left padding: every prompt ends at the same column, so the next token goes to the same place for all.
    input_ids = torch.full((len(unique), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(unique), width), dtype=torch.long)
    for k, p in enumerate(unique):
        ids = prompt_ids[p]
        input_ids[k, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
        mask[k, width - len(ids) :] = 1
    input_ids, mask = input_ids.to(device), mask.to(device)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)

    out = model(input_ids=input_ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1)
    # One prefill per distinct prompt, then each row takes its prompt's cache and last logits.
    expand = torch.tensor([slot[i] for i, _ in rows], device=device)
    cache = out.cache
    cache.reorder_cache(expand)
    logits = out.logits[:, -1, :].float()[expand]  # (B, V)
    mask = mask[expand]

    generators = [torch.Generator().manual_seed(_row_seed(config.seed, i, j)) for i, j in rows]
    active = list(range(len(rows)))  # row index of each live batch position
    tokens = [[] for _ in rows]
    logps = [[] for _ in rows]
    reasons = ["length"] * len(rows)
    for step in range(config.max_new_tokens):
        next_tokens = _choose_tokens(logits, config, generators)  # (B,)
        scaled = logits / config.temperature if config.temperature > 0 else logits  # (B, V)
        next_logps = torch.log_softmax(scaled, dim=-1).gather(-1, next_tokens.unsqueeze(-1)).squeeze(-1)
        keep = []
        for pos, (row, tok, lp) in enumerate(zip(active, next_tokens.tolist(), next_logps.tolist(), strict=True)):
            tokens[row].append(tok)
            logps[row].append(lp)
            if tok in stop_ids:
                reasons[row] = "eos"
            elif (config.stop_on_code_block or config.stop) and _stopped(
                tokenizer.decode(tokens[row], skip_special_tokens=True), config
            ):
                reasons[row] = "stop"
            else:
                keep.append(pos)
        last = not keep or step == config.max_new_tokens - 1
        if on_step is not None:
            on_step(len(active) if last else len(active) - len(keep), len(active))
        if last:
            break
        if len(keep) < len(active):
            index = torch.tensor(keep, device=device)
            cache.reorder_cache(index)
            mask, next_tokens = mask[index], next_tokens[index]
            active = [active[k] for k in keep]
            generators = [generators[k] for k in keep]
        mask = torch.cat([mask, mask.new_ones((len(active), 1))], dim=-1)
        positions = mask.sum(-1, keepdim=True) - 1
        out = model(
            input_ids=next_tokens.unsqueeze(-1),
            attention_mask=mask,
            position_ids=positions,
            cache=cache,
            use_cache=True,
        )
        cache = out.cache
        logits = out.logits[:, -1, :].float()

    completions = []
    for row, (i, _) in enumerate(rows):
        text = tokenizer.decode(tokens[row], skip_special_tokens=True)
        completions.append(
            Completion(
                text=text,
                code=extract_code(text),
                prompt_ids=prompt_ids[i],
                completion_ids=tokens[row],
                per_token_logps=logps[row],
                finish_reason=reasons[row],
            )
        )
    return completions


def sample(
    model, tokenizer, prompts: Sequence[str], config: SamplingConfig, progress: bool = True
) -> list[list[Completion]]:
    """Sample ``config.n`` answers for each chat-rendered prompt.

    Prompts are tokenized with ``add_special_tokens=False`` (the chat template already holds the special
    tokens), left-padded and decoded on the model's device in the model's dtype; log-probs are computed in
    float32. The model is put in eval mode (dropout, LoRA dropout off) for the call and its mode restored.

    Args:
        model: a causal LM (``PreTrainedModel`` or a PEFT wrapper) whose forward accepts ``position_ids``,
            ``cache`` (transformers >= 5 naming) and ``logits_to_keep``.
        tokenizer: its tokenizer; needs a pad or eos token.
        prompts: P prompt strings, e.g. from `build_chat_prompt`.
        config: see `SamplingConfig`.
        progress: show a tqdm bar over the P·n answers, advanced as each one finishes, with the tokens generated per
            second (refreshed at least once a second while a batch decodes).

    Returns:
        ``completions[i][j]``: sample j of prompt i (P lists of n).

    Raises:
        ValueError: the tokenizer has neither pad nor eos token, or a prompt is empty.
    """
    import time

    import torch
    from tqdm.auto import tqdm

    pad_id = pad_token_id(tokenizer)
    prompt_ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    if any(len(ids) == 0 for ids in prompt_ids):
        raise ValueError("empty prompt")
    stop_ids = eos_ids(model, tokenizer)
    rows = [(i, j) for i in range(len(prompts)) for j in range(config.n)]
    results: list[list[Completion]] = [[] for _ in prompts]
    was_training = model.training
    model.eval()
    started, generated, shown = time.perf_counter(), 0, 0.0

    def on_step(finished: int, new_tokens: int) -> None:
        nonlocal generated, shown
        generated += new_tokens
        now = time.perf_counter()
        bar.set_postfix(tok_s=f"{generated / max(now - started, 1e-9):.0f}", refresh=False)
        bar.update(finished)
        if now - shown >= 1.0:
            bar.refresh()
            shown = now

    try:
        with (
            torch.inference_mode(),
            tqdm(total=len(rows), desc="sampling", unit="answer", disable=not progress) as bar,
        ):
            for start in range(0, len(rows), config.batch_size):
                batch = rows[start : start + config.batch_size]
                for (i, _), completion in zip(
                    batch,
                    _sample_batch(model, tokenizer, prompt_ids, batch, config, stop_ids, pad_id, on_step),
                    strict=True,
                ):
                    results[i].append(completion)
    finally:
        model.train(was_training)
    return results


def collate_completions(completions: Sequence[Completion], pad_token_id: int) -> dict:
    """Right-padded tensors of a flat list of N completions, for RL.

    Returns:
        ``{"completion_ids": LongTensor (N, T), "completion_mask": LongTensor (N, T) (1 on real tokens),
        "per_token_logps": FloatTensor (N, T) float32 (0 on padding)}``, T = the longest completion
        (at least 1).
    """
    import torch

    width = max([len(c.completion_ids) for c in completions] + [1])
    ids = torch.full((len(completions), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(completions), width), dtype=torch.long)
    logps = torch.zeros((len(completions), width), dtype=torch.float32)
    for k, c in enumerate(completions):
        t = len(c.completion_ids)
        ids[k, :t] = torch.tensor(c.completion_ids, dtype=torch.long)
        mask[k, :t] = 1
        logps[k, :t] = torch.tensor(c.per_token_logps, dtype=torch.float32)
    return {"completion_ids": ids, "completion_mask": mask, "per_token_logps": logps}
