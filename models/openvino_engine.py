"""Generation through OpenVINO GenAI on CPU, behind the contract of `models.sampling.sample`.

A Hugging Face checkpoint folder is exported once to OpenVINO IR (``optimum-cli export openvino``, task
``text-generation-with-past``, fp32 weights) and cached by the sha256 of its weights and config (a checkpoint that
differs from a cached one in its decoder projections only, as LoRA-merged ones do, is patched from it: `export`); an
``openvino_genai.LLMPipeline`` then answers each prompt ``n`` times. What comes back is what `sample` returns —
text, ``extract_code(text)``, prompt ids, completion ids (with the final eos when there is one), finish reason —
except the per-token log-probs, which the pipeline does not give: ``per_token_logps`` holds NaN for each token.
RL can still sample from it (``didpo.rollout_engine: openvino``): `OpenVINOSampler.load_weights` writes the
policy's LoRA-merged weights into the IR's weight buffer before each step (no re-export), the old log-probs are the
trainer's forward, and with the sampler's log-probs unknown the truncated importance weight is 1 (TRL's rule for a
NaN sampling log-prob); the fp32 engine's log-probs matched a torch forward within 2e-4 (issue 16's measurement).

Why a separate tool environment for the export: the exporter (optimum-intel 2.2) requires transformers < 5.6 and the
project pins transformers 5.24, so ``make export-env`` builds ``.venv-export`` (optimum-intel, transformers 5.5.4,
the same CPU torch) and the export runs there as a subprocess; the runtime (openvino, openvino-genai) needs neither
torch nor transformers and lives in the project's environment. Without ``.venv-export`` (or without
openvino-genai) :func:`engine_available` says why and callers use the torch sampler.

Differences from the torch sampler (measured and explained in ``benchmarks/bench_generation.py``): the random stream
is the engine's (one seed per call of ``batch_size`` rows: the same prompts in the same order give the same answers,
but they are not the torch sampler's samples and depend on the prompts sharing the call); the code-block stop is
the stop string ``\\n```\\n`` plus eos, so an answer may end one token later than the torch sampler's (after the
closing fence's newline). Greedy answers (temperature 0) are compared token for token by the benchmark.

Sources: OpenVINO GenAI ``LLMPipeline`` / ``GenerationConfig`` (docs.openvino.ai, GenAI API), optimum-intel's
exporter (huggingface/optimum-intel, ``optimum/exporters/openvino``).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import shutil
import subprocess
import tempfile
import threading
import warnings
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path

import numpy as np

from models.lora import merged_weights
from models.sampling import Completion, SamplingConfig, code_block_closed, extract_code

EXPORT_ENV = Path(__file__).resolve().parents[1] / ".venv-export"
STOP_FENCE = "\n```\n"
PRECISIONS = ("f32", "bf16")


def interruptible(call: Callable[[], object], poll_s: float = 0.2) -> object:
    """``call()`` in a daemon thread while this thread waits in short joins, so that a Ctrl-C (KeyboardInterrupt) or
    a SIGTERM (Prefect's TerminationSignal) is raised here at once instead of when the call returns.

    One ``LLMPipeline.generate`` call of 64 rows takes up to a minute or two on 2 cores, and Python runs a signal
    handler only between bytecodes of the main thread: issue 19's re-trial measured 42 s from a SIGINT to the stage's
    reaction during the baseline's sampling. ``generate`` releases the GIL (measured: the waiting thread ran 1,150
    times in a 11.8 s call), and no streamer can cancel it here (OpenVINO GenAI 2026.4 refuses a streamer for batched
    inputs or ``num_return_sequences`` > 1). The abandoned call finishes in the background; the process exiting does
    not wait for it (a SIGINT 2 s into a 400-token call: exit 130 after 1.7 s, three times of three).

    Returns ``call()``'s value; raises its exception, or the interrupt.
    """
    outcome: dict[str, object] = {}

    def run() -> None:
        try:
            outcome["value"] = call()
        except BaseException as exc:  # handed to the waiting thread
            outcome["error"] = exc

    worker = threading.Thread(target=run, name="openvino-generate", daemon=True)
    worker.start()
    while worker.is_alive():
        worker.join(poll_s)
    if "error" in outcome:
        raise outcome["error"]  # type: ignore[misc]
    return outcome["value"]


class EngineUnavailable(RuntimeError):
    """OpenVINO GenAI or the export environment is missing; the message says which and how to get it."""


def engine_available() -> str | None:
    """None when checkpoints can be exported and run here, else the reason (for a one-time log line)."""
    try:
        import openvino_genai  # noqa: F401
    except ImportError:
        return "openvino-genai is not installed (pip install openvino-genai)"
    if not (EXPORT_ENV / "bin" / "optimum-cli").exists():
        return f"the export environment {EXPORT_ENV} is missing (make export-env)"
    return None


def checkpoint_digest(checkpoint_dir: Path) -> str:
    """sha256 (hex) of a checkpoint's config.json and weight files (*.safetensors, *.bin), names included."""
    h = hashlib.sha256()
    folder = Path(checkpoint_dir)
    for path in sorted([folder / "config.json", *folder.glob("*.safetensors"), *folder.glob("*.bin")]):
        h.update(path.name.encode())
        with path.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 24), b""):
                h.update(chunk)
    return h.hexdigest()


def export(checkpoint_dir: Path, cache_root: Path) -> Path:
    """The OpenVINO IR folder of ``checkpoint_dir`` (made on first use, then reused): ``cache_root/<digest>``.

    Made one of two ways, each writing a temporary sibling that is renamed into place (a crash never leaves a half IR):
    - **patched**, when the cache holds the IR of a checkpoint of the same family (every non-weight file equal: config,
      tokenizer, chat template, generation config) that differs only in decoder projection weights
      (``model.layers.N.{self_attn,mlp}.*_proj.weight``, what a merged LoRA adapter changes): the donor's folder is
      copied and those weights are written over their fp32 constants in its weight buffer. Each overwritten constant
      is checked to be the donor's tensor verbatim (its bytes' sha256 is the one the donor's ``weights.json``
      recorded), so the result is the IR a fresh export writes, byte for byte (tested on a tiny model). About 3 s for
      SmolLM2-135M instead of about 45 s;
    - **exported** otherwise: ``optimum-cli export openvino`` in ``.venv-export``.
    Either way ``weights.json`` records the family digest and each weight tensor's sha256 (fp32 bytes), which makes
    the folder a donor for the next checkpoint of its family.

    Raises:
        EngineUnavailable: as `engine_available`.
        RuntimeError: the exporter failed (its last output lines are in the message).
    """
    reason = engine_available()
    if reason:
        raise EngineUnavailable(reason)
    checkpoint_dir, cache_root = Path(checkpoint_dir), Path(cache_root)
    out = cache_root / checkpoint_digest(checkpoint_dir)
    if (out / "openvino_model.xml").is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".", dir=out.parent))
    weights = _fp32_weights(checkpoint_dir)
    manifest = {
        "family": _family_digest(checkpoint_dir),
        "tensors": {name: hashlib.sha256(array.tobytes()).hexdigest() for name, array in weights.items()},
    }
    donor = _patch_donor(cache_root, manifest)
    if donor is not None:
        try:
            _patch(donor, weights, manifest, tmp)
        except ValueError as why:  # not expected (the donor's export recorded these tensors): say so, export instead
            warnings.warn(f"OpenVINO IR of {checkpoint_dir} not patched from {donor}: {why}; exporting", stacklevel=2)
            donor = None
            shutil.rmtree(tmp)
            tmp.mkdir()
    if donor is None:
        _optimum_export(checkpoint_dir, tmp)
    (tmp / MANIFEST).write_text(json.dumps(manifest, sort_keys=True))
    try:
        tmp.rename(out)
    except OSError:  # another process exported the same checkpoint meanwhile
        shutil.rmtree(tmp, ignore_errors=True)
    return out


MANIFEST = "weights.json"  # in each IR folder: {"family": sha256, "tensors": {name: sha256 of the fp32 bytes}}
PATCHABLE = re.compile(r"model\.layers\.\d+\.(self_attn|mlp)\.\w+_proj\.weight")
WEIGHT_FILES = ("*.safetensors", "*.bin", "*.index.json")


def _fp32_weights(checkpoint_dir: Path) -> dict[str, np.ndarray]:
    """``{name: fp32 array}`` of the checkpoint's ``*.safetensors`` tensors (bf16 widened exactly); empty when the
    weights are in another format (such a checkpoint is always exported, never patched)."""
    from safetensors import safe_open

    weights = {}
    for path in sorted(checkpoint_dir.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():
                weights[name] = f.get_tensor(name).float().numpy()
    return weights


def _family_digest(checkpoint_dir: Path) -> str:
    """sha256 of every file in the checkpoint folder but the weights (names and bytes): two checkpoints of one family
    export to the same graph and tokenizer and differ only in their weight constants."""
    skip = {p for pattern in WEIGHT_FILES for p in checkpoint_dir.glob(pattern)}
    h = hashlib.sha256()
    for path in sorted(p for p in checkpoint_dir.iterdir() if p.is_file() and p not in skip):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def _patch_donor(cache_root: Path, manifest: dict) -> Path | None:
    """The cached IR folder of the same family whose weights differ from ``manifest``'s in the fewest tensors, all of
    them `PATCHABLE` (same names, same shapes implied by the family); None when there is none."""
    best, fewest = None, None
    tensors = manifest["tensors"]
    if not tensors:
        return None
    for path in sorted(cache_root.glob(f"*/{MANIFEST}")):
        if "." in path.parent.name:  # another process's export, not yet renamed into place
            continue
        try:
            donor = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if donor.get("family") != manifest["family"] or set(donor.get("tensors", {})) != set(tensors):
            continue
        differing = [name for name, sha in tensors.items() if donor["tensors"][name] != sha]
        if all(PATCHABLE.fullmatch(name) for name in differing) and (fewest is None or len(differing) < fewest):
            best, fewest = path.parent, len(differing)
    return best


def _patch(donor: Path, weights: dict[str, np.ndarray], manifest: dict, tmp: Path) -> None:
    """Write into ``tmp`` the donor IR with ``weights``' differing tensors over their constants (see `export`).

    Raises:
        ValueError: a differing tensor with no fp32 constant of its name and shape in the donor, or a constant that is
            not the donor's tensor verbatim (the exporter transformed it): the donor cannot be patched.
    """
    donor_tensors = json.loads((donor / MANIFEST).read_text())["tensors"]
    for path in donor.iterdir():
        if path.is_file() and path.name not in ("openvino_model.bin", MANIFEST):
            shutil.copy2(path, tmp / path.name)
    xml = (donor / "openvino_model.xml").read_text()
    constants = _named_constants(xml)
    buffer = np.fromfile(donor / "openvino_model.bin", dtype=np.uint8)
    for name, sha in manifest["tensors"].items():
        if donor_tensors[name] == sha:
            continue
        array = weights[name]
        span = _constant_bytes(constants, name, array.shape, donor)
        if hashlib.sha256(buffer[span].tobytes()).hexdigest() != donor_tensors[name]:
            raise ValueError(f"{name}: the constant in {donor} is not the donor's tensor verbatim")
        buffer[span] = np.ascontiguousarray(array, dtype=np.float32).view(np.uint8).reshape(-1)
    buffer.tofile(tmp / "openvino_model.bin")


def _optimum_export(checkpoint_dir: Path, tmp: Path) -> None:
    """``optimum-cli export openvino`` (text-generation-with-past, fp32 weights) of the checkpoint into ``tmp``.

    Raises RuntimeError with the exporter's last output lines when it fails (``tmp`` removed)."""
    command = [
        str(EXPORT_ENV / "bin" / "optimum-cli"),
        "export",
        "openvino",
        "--model",
        str(checkpoint_dir),
        "--task",
        "text-generation-with-past",
        "--weight-format",
        "fp32",
        str(tmp),
    ]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0 or not (tmp / "openvino_model.xml").is_file():
        shutil.rmtree(tmp, ignore_errors=True)
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-15:])
        raise RuntimeError(f"OpenVINO export of {checkpoint_dir} failed (exit {done.returncode}):\n{tail}")


class OpenVINOSampler:
    """Answers prompts with an exported checkpoint: ``sample(prompts, config)`` as `models.sampling.sample`.

    Args:
        ir_dir: an `export` folder. tokenizer: the checkpoint's Hugging Face tokenizer (prompt ids in, text out).
        precision: ``f32`` or ``bf16`` (OpenVINO's inference precision hint; the weights stay fp32).
        threads: CPU threads (None: OpenVINO's default).
    Raises:
        ValueError: an unknown precision. EngineUnavailable: openvino-genai is not installed.
    """

    def __init__(self, ir_dir: Path, tokenizer, precision: str = "f32", threads: int | None = None):
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
        try:
            import openvino_genai
        except ImportError as exc:
            raise EngineUnavailable("openvino-genai is not installed") from exc
        options = {"INFERENCE_PRECISION_HINT": precision}
        if threads:
            options["INFERENCE_NUM_THREADS"] = threads
        self.ir_dir, self.options = Path(ir_dir), options
        self.pipe = openvino_genai.LLMPipeline(str(ir_dir), "CPU", **options)
        self._weights = (
            None  # the IR's XML, weight buffer, named constants, tokenizer: read on the first `load_weights`
        )
        self.tokenizer = tokenizer
        self.precision = precision
        self.eos_ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()

    def load_weights(self, model) -> int:
        """Load `model`'s current LoRA-merged weights (`models.lora.merged_weights`, the adapted projections only:
        the rest equals the exported checkpoint) into the engine; returns how many tensors were written.

        The IR's weight file is read once into memory; each weight is written over its named constant there
        (``self.<parameter name>``, fp32, the torch layout), and the pipeline is rebuilt from the XML and the patched
        buffer (``LLMPipeline(model, weights, tokenizer, device)``): no re-export. The IR must be the export of the
        checkpoint `model` started from (its other weights are taken as they are).

        Raises:
            ValueError: a weight with no constant of that name and shape in the IR (another architecture, or a
                full fine-tune whose norms were folded by the exporter).
        """
        import openvino as ov
        import openvino_genai

        if self._weights is None:
            xml = (self.ir_dir / "openvino_model.xml").read_text()
            buffer = np.fromfile(self.ir_dir / "openvino_model.bin", dtype=np.uint8)
            self._weights = (xml, buffer, _named_constants(xml), openvino_genai.Tokenizer(str(self.ir_dir)))
        xml, buffer, constants, tokenizer = self._weights
        n = 0
        for name, tensor in merged_weights(model, adapted_only=True):
            span = _constant_bytes(constants, name, tuple(tensor.shape), self.ir_dir)
            buffer[span].view(np.float32).reshape(tensor.shape)[...] = tensor.detach().float().cpu().numpy()
            n += 1
        self.pipe = openvino_genai.LLMPipeline(
            xml, ov.Tensor(buffer, shared_memory=True), tokenizer, "CPU", **self.options
        )
        return n

    def _config(self, config: SamplingConfig, seed: int):
        import openvino_genai

        stops = set(config.stop) | ({STOP_FENCE} if config.stop_on_code_block else set())
        greedy = config.temperature == 0
        kwargs = {
            "max_new_tokens": config.max_new_tokens,
            "do_sample": not greedy,
            "num_return_sequences": 1 if greedy else config.n,
            "stop_strings": stops,
            "include_stop_str_in_output": True,
            "rng_seed": seed,
        }
        if not greedy:
            kwargs.update(temperature=config.temperature, top_p=config.top_p, top_k=0)
        return openvino_genai.GenerationConfig(**kwargs)

    def sample(self, prompts: Sequence[str], config: SamplingConfig, progress: bool = True) -> list[list[Completion]]:
        """``config.n`` answers for each chat-rendered prompt (``completions[i][j]``, as `models.sampling.sample`).

        Prompts go to the engine ``config.batch_size // n`` at a time (left-padded, one call: 4 prompts × 16
        answers at the default 64 rows), each call seeded from ``(seed, index of its first prompt)``: the same
        prompts in the same order give the same answers, but a prompt's answers depend on the prompts it shares a
        call with (unlike the torch sampler's per-answer seeds). ``progress``: a bar per prompt answered, with the
        rate, the ETA and the generated tokens per second (stderr).

        Raises:
            ValueError: an empty prompt.
        """
        import time

        import openvino as ov
        import openvino_genai
        from tqdm.auto import tqdm

        prompt_ids = [self.tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
        if any(not ids for ids in prompt_ids):
            raise ValueError("empty prompt")
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
        per_call = max(1, config.batch_size // config.n)
        results: list[list[Completion]] = []
        bar = tqdm(total=len(prompt_ids), desc="sampling (openvino)", unit="prompt", disable=not progress)
        started, generated = time.perf_counter(), 0
        for start in range(0, len(prompt_ids), per_call):
            chunk = prompt_ids[start : start + per_call]
            width = max(len(ids) for ids in chunk)
            tokens = np.full((len(chunk), width), pad, dtype=np.int64)
            mask = np.zeros((len(chunk), width), dtype=np.int64)
            for k, ids in enumerate(chunk):  # left padding, as the torch sampler
                tokens[k, width - len(ids) :], mask[k, width - len(ids) :] = ids, 1
            seed = int(np.random.SeedSequence([config.seed, start]).generate_state(1, np.uint32)[0])
            inputs = openvino_genai.TokenizedInputs(ov.Tensor(tokens), ov.Tensor(mask))
            generate = partial(self.pipe.generate, inputs, self._config(config, seed))
            generated_ = interruptible(generate)  # a Ctrl-C is seen at once, not when the call returns
            sequences = [list(t) for t in generated_.tokens]
            scores = [float(x) for x in generated_.scores]  # Σ log-probs at the sampling temperature (see _completion)
            per_prompt = 1 if config.temperature == 0 else config.n
            for k, ids in enumerate(chunk):
                mine = list(zip(sequences, scores, strict=True))[k * per_prompt : (k + 1) * per_prompt]
                if config.temperature == 0:
                    mine = mine * config.n  # greedy: one answer, the same n times
                results.append([self._completion(ids, t, config, score) for t, score in mine])
            generated += sum(len(t) for t in sequences)
            bar.set_postfix(tok_s=f"{generated / max(time.perf_counter() - started, 1e-9):.0f}", refresh=False)
            bar.update(len(chunk))
        bar.close()
        return results

    def _completion(
        self, prompt_ids: list[int], tokens: list[int], config: SamplingConfig, score: float | None = None
    ) -> Completion:
        """A `Completion` of the engine's tokens; ``per_token_logps`` NaN (the pipeline gives none per token),
        ``sequence_logp`` the pipeline's score: the sum of the tokens' log-probs at the sampling temperature (the
        processed distribution when ``logprobs`` is not requested; measured against a torch forward at T 0.7: within
        1e-3 a token on SmolLM2-135M). Greedy scores are not log-probs of a sampling distribution: None."""
        text = self.tokenizer.decode(tokens, skip_special_tokens=True)
        if tokens and tokens[-1] in self.eos_ids:
            reason = "eos"
        elif (config.stop_on_code_block and code_block_closed(text)) or any(s in text for s in config.stop):
            reason = "stop"
        else:
            reason = "length"
        sequence_logp = score if config.temperature > 0 else None
        return Completion(
            text, extract_code(text), list(prompt_ids), tokens, [math.nan] * len(tokens), reason, sequence_logp
        )


def _constant_bytes(constants: dict, name: str, shape: tuple[int, ...], ir: Path) -> slice:
    """The byte span, in the IR's weight buffer, of parameter `name`'s fp32 constant (``self.<name>``, torch layout).

    Raises:
        ValueError: no constant of that name and shape in the IR at `ir` (another architecture, or a full fine-tune
            whose norms were folded by the exporter).
    """
    found = constants.get(f"self.{name}")
    if found is None or found[1] != tuple(shape):
        raise ValueError(f"{name} {tuple(shape)}: no fp32 constant of that name and shape in {ir}")
    offset = found[0]
    return slice(offset, offset + int(np.prod(shape)) * 4)


def _named_constants(xml: str) -> dict[str, tuple[int, tuple[int, ...]]]:
    """``{constant name: (byte offset, shape)}`` of the IR's named fp32 constants (``<layer type="Const">`` with
    ``<data element_type="f32" shape=... offset=...>``), the weights the exporter keeps under their torch names."""
    import xml.etree.ElementTree as ET

    out = {}
    for layer in ET.fromstring(xml).iter("layer"):
        data = layer.find("data")
        if layer.get("type") != "Const" or data is None or data.get("element_type") != "f32":
            continue
        shape = tuple(int(x) for x in data.get("shape", "").split(",") if x.strip())
        out[layer.get("name")] = (int(data.get("offset")), shape)
    return out
