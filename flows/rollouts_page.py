"""`didpo rollouts`: an offline HTML page of the RL stage's rollouts, one card per prompt and step.

Each group's answers side by side with their outcome (tests passed / total) and the verifier's reason; identical
answers marked (the update trains them once, with their multiplicity as weight). Every line of an answer's code is
coloured by the credit the update gives it:

- ``didpo``: the line's DiD shaped reward F_j (docs/DIDPO.md, "Potential-based shaping"); its token advantage
  A = [(R_i − mean_k R_k) − w_did·G_{i,j−1}] / (std_k R_k + ε) on hover (the critic-free advantage);
- ``grpo`` / ``dapo``: the group advantage (R_i − mean_k R_k) / (std_k R_k + ε), the same on every token;
- ``rft``: 1 on the passing answers it trains on, nothing on the others.

The page is one file, with the data embedded as JSON and a short inline script that draws it: no network request,
so it opens from disk or an artifact store. Read from the rollouts JSONL the stage writes (`models.rl._RolloutLog`:
one line per answer with ``step``, ``task_id``, ``sample``, ``completion``, ``passed``, ``total``, ``reason``,
``reward``, ``gap``, ``shaped``, ``trained``).
"""

from __future__ import annotations

import html
import json
import statistics
from pathlib import Path

from models.config import ALGOS
from models.sampling import extract_code


def group_cards(rows: list[dict], algo: str, w_did: float, eps: float) -> list[dict]:
    """The page's data: one card per (step, draw, task_id) group, answers in sample order.

    Each answer: ``sample``, ``passed``, ``total``, ``reason``, ``reward``, ``trained``, ``duplicate_of`` (the
    first identical answer's sample, or None), ``text`` (the whole answer), and ``lines``: the code's non-blank
    lines in order, each ``{"text", "credit", "advantage"}`` (credit: F_j for didpo, the sequence advantage for
    grpo/dapo, 1/0 for rft; advantage: the token advantage of the line's tokens, None for rft).

    Raises:
        ValueError: a row misses a key the page needs (named, with its line's step and task).
    """
    needed = ("step", "task_id", "sample", "completion", "passed", "total", "reason", "reward")
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        missing = [k for k in needed if k not in row]
        if missing:
            raise ValueError(f"rollout row (step {row.get('step')}, {row.get('task_id')}) misses {missing}")
        groups.setdefault((row["step"], row.get("draw", 0), row["task_id"]), []).append(row)
    cards = []
    for (step, draw, task_id), members in groups.items():
        members.sort(key=lambda r: r["sample"])
        rewards = [float(r["reward"]) for r in members]
        mean = statistics.fmean(rewards)
        std = statistics.stdev(rewards) if len(rewards) > 1 else 0.0  # unbiased, as torch.std in the update
        seen: dict[str, int] = {}
        answers = []
        for r in members:
            outcome_term = float(r["reward"]) - mean
            code_lines = [line for line in extract_code(r["completion"]).splitlines() if line.strip()]
            gaps, shaped = r.get("gap") or [], r.get("shaped") or []
            lines = []
            for j, text in enumerate(code_lines):
                if algo == "rft":
                    credit, advantage = (1.0 if r.get("trained") else 0.0), None
                elif algo == "didpo" and j < len(shaped):
                    credit = float(shaped[j])
                    advantage = (outcome_term - w_did * float(gaps[j] if j < len(gaps) else 0.0)) / (std + eps)
                else:
                    credit = advantage = outcome_term / (std + eps)
                lines.append({"text": text, "credit": credit, "advantage": advantage})
            answers.append(
                {
                    "sample": r["sample"],
                    "passed": r["passed"],
                    "total": r["total"],
                    "reason": r["reason"],
                    "reward": float(r["reward"]),
                    "trained": bool(r.get("trained", False)),
                    "duplicate_of": seen.get(r["completion"]),
                    "text": r["completion"],
                    "lines": lines,
                }
            )
            seen.setdefault(r["completion"], r["sample"])
        cards.append({"step": step, "draw": draw, "task_id": task_id, "answers": answers})
    return cards


_SCRIPT = """
const data = JSON.parse(document.getElementById('rollouts').textContent);
const root = document.getElementById('cards');
const scale = Math.max(1e-9, ...data.cards.flatMap(c => c.answers.flatMap(a => a.lines.map(l => Math.abs(l.credit)))));
function colour(v) {
  const a = Math.min(1, Math.abs(v) / scale) * 0.55;
  return v >= 0 ? `rgba(0,150,60,${a})` : `rgba(210,30,30,${a})`;
}
for (const card of data.cards) {
  const box = document.createElement('section');
  box.className = 'card';
  const head = document.createElement('h2');
  head.textContent = `step ${card.step} · ${card.task_id}` + (card.draw ? ` · refill ${card.draw}` : '');
  box.appendChild(head);
  const row = document.createElement('div');
  row.className = 'answers';
  for (const a of card.answers) {
    const col = document.createElement('div');
    col.className = 'answer' + (a.passed === a.total && a.total > 0 ? ' pass' : ' fail');
    const title = document.createElement('div');
    title.className = 'title';
    title.textContent = `#${a.sample}: ${a.passed}/${a.total} tests, ${a.reason}, reward ${a.reward.toFixed(3)}`
      + (a.trained ? ', trained' : '') + (a.duplicate_of !== null ? `, duplicate of #${a.duplicate_of}` : '');
    col.appendChild(title);
    const pre = document.createElement('pre');
    if (!a.lines.length) pre.textContent = a.text;
    for (const line of a.lines) {
      const span = document.createElement('span');
      span.className = 'line';
      span.textContent = line.text;
      span.style.background = colour(line.credit);
      const hover = line.advantage === null ? '' : `, token advantage ${line.advantage.toFixed(4)}`;
      span.title = `credit ${line.credit.toFixed(4)}` + hover;
      pre.appendChild(span);
    }
    col.appendChild(pre);
    row.appendChild(col);
  }
  box.appendChild(row);
  root.appendChild(box);
}
document.getElementById('status').textContent = `${data.cards.length} groups, ${data.n_answers} answers (${data.algo})`;
document.body.dataset.loaded = 'yes';
"""

_STYLE = """
body { font: 13px system-ui, sans-serif; margin: 16px; color: #222; }
h1 { font-size: 18px; } h2 { font-size: 14px; margin: 4px 0; }
.card { border: 1px solid #ccc; border-radius: 6px; padding: 8px; margin-bottom: 12px; }
.answers { display: flex; gap: 8px; overflow-x: auto; }
.answer { min-width: 320px; max-width: 420px; border-top: 4px solid #bbb; }
.answer.pass { border-top-color: #1a8f3c; } .answer.fail { border-top-color: #c62828; }
.title { font-weight: 600; margin: 4px 0; }
pre { font: 11px ui-monospace, monospace; white-space: pre-wrap; overflow-wrap: anywhere; margin: 0; }
.line { display: block; min-height: 1.2em; overflow-wrap: anywhere; }
"""


def write_page(rollouts_path: Path, out_path: Path, algo: str, w_did: float = 1.0, eps: float = 1e-4) -> Path:
    """Write the page for the rollouts JSONL at `rollouts_path` to `out_path` (HTML, one file) and return it.

    Raises:
        FileNotFoundError: no rollouts file (the message names the path and how to make one).
        ValueError: an unknown `algo`, an empty file or a malformed line (its number).
    """
    rollouts_path, out_path = Path(rollouts_path), Path(out_path)
    if algo not in ALGOS:
        raise ValueError(f"unknown RL algorithm {algo!r}: one of {', '.join(ALGOS)}")
    if not rollouts_path.is_file():
        raise FileNotFoundError(f"no rollouts at {rollouts_path}: run the RL stage (didpo stage didpo) first")
    rows = []
    for number, line in enumerate(rollouts_path.read_text().splitlines(), start=1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as error:
                raise ValueError(f"{rollouts_path}:{number} is not JSON ({error.msg})") from None
    if not rows:
        raise ValueError(f"{rollouts_path} holds no rollouts")
    cards = group_cards(rows, algo, w_did, eps)
    payload = {"algo": algo, "n_answers": len(rows), "cards": cards}
    data = json.dumps(payload).replace("</", "<\\/")  # no "</script>" inside the JSON block
    title = f"RL rollouts ({algo}): {html.escape(str(rollouts_path))}"
    page = (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{title}</title><style>{_STYLE}</style></head>"
        f"<body><h1>{title}</h1><p id='status'>loading…</p><p>Line colour: the credit the update gives the line "
        f"(green positive, red negative; didpo: its shaped reward F, grpo/dapo: the group advantage, rft: trained "
        f"or not). Hover a line for its token advantage.</p><div id='cards'></div>"
        f"<script type='application/json' id='rollouts'>{data}</script><script>{_SCRIPT}</script></body></html>"
    )
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(page)
    return out_path
