"""``didpo plots``: every plot of dvc.yaml rendered offline, as one self-contained HTML page and one PNG per plot.

``dvc plots show`` writes an HTML page that loads Vega from a CDN, so it is blank on a machine without the internet.
Here DVC still fills the plots (``dvc plots show --json``: the Vega-Lite specs with their data, the same plots
``dvc plots show`` and ``dvc plots diff`` draw), and vl-convert (the Vega project's converter, which bundles the
Vega, Vega-Lite and Vega-Embed libraries) renders them: the page inlines the libraries, so it opens from disk.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import yaml

OUT = Path("dvc_plots")
PASSK_FILE = re.compile(r"data/evaluate/passk_(\w+)\.json")  # a pass@k plot's file, by split
FEW_TICKS = 16  # an x axis of at most this many whole numbers gets a tick at each
# readable names of the training curves' metrics (the part after the stage's "<stage>/")
METRIC_LABELS = {
    "loss": "train",
    "eval_loss": "held-out",
    "pass_rate": "pass rate",
    "reward/outcome": "outcome reward",
    "reward/sequence": "sequence reward",
    "kl_start": "KL to the start policy",
}


def unknown_revisions(revisions: list[str] | tuple[str, ...], root: str | Path = ".") -> list[str]:
    """Those of `revisions` that name no commit of the git repository at `root` (``git rev-parse --verify``; DVC's
    ``workspace``, the files as they are, is one), in the order given."""
    unknown = []
    for rev in revisions:
        if rev == "workspace":
            continue
        proc = subprocess.run(
            ["git", "rev-parse", "--verify", "--quiet", "--end-of-options", f"{rev}^{{commit}}"],
            cwd=root,
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            unknown.append(rev)
    return unknown


def dvc_plot_specs(revisions: tuple[str, ...] = ()) -> tuple[dict[str, dict], list[str]]:
    """``({title: Vega-Lite spec}, [what could not be drawn])`` from ``dvc plots show --json`` (``dvc plots diff
    --json REV…`` when `revisions` are given). A plot whose files are missing (its stage has not run) or lack a
    field is reported, not drawn.

    Raises:
        RuntimeError: DVC failed (the last line of its stderr, DVC's error, in the message).
    """
    command = ["dvc", "plots", "diff", *revisions, "--json"] if revisions else ["dvc", "plots", "show", "--json"]
    proc = subprocess.run(command, capture_output=True, text=True)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no message"])[-1]  # DVC's error line
        raise RuntimeError(f"{' '.join(command)} failed: {last}")
    report = json.loads(proc.stdout)
    specs = {
        title: entries[0]["content"]
        for title, entries in report.get("data", {}).items()
        if entries and entries[0].get("type") == "vega"
    }
    problems = sorted(
        {f"{e.get('name') or e.get('source', '?')}: {e.get('msg', e.get('type'))}" for e in report.get("errors", [])}
    )
    return specs, problems


@dataclass(frozen=True)
class DataContext:
    """What the drawn files do not say themselves, read from the workspace (`workspace_context`).

    algo: the RL stage's algorithm (``data/didpo/headline.json``), so the RL checkpoint and curves are named by it;
    problems: ``{plot title: problems of its split}`` for pass@k files written before their rows carried
    ``n_problems`` (from ``data/evaluate/protocol.json``); splits: ``{pass@k plot title: its split}`` (dvc.yaml).
    """

    algo: str | None = None
    problems: dict[str, int] = field(default_factory=dict)
    splits: dict[str, str] = field(default_factory=dict)


def plot_files(dvc_yaml: str | Path = "dvc.yaml") -> dict[str, list[str]]:
    """``{plot title: [its data files]}`` of the top-level plots of `dvc_yaml`."""
    path = Path(dvc_yaml)
    plots = (yaml.safe_load(path.read_text()) or {}).get("plots", []) if path.is_file() else []
    out: dict[str, list[str]] = {}
    for entry in plots:
        if isinstance(entry, dict):
            for title, spec in entry.items():
                y = (spec or {}).get("y", {})
                out[title] = list(y) if isinstance(y, dict) else [str(y)]
    return out


def workspace_context(root: str | Path = ".", files: bool = True) -> DataContext:
    """The `DataContext` of the files as they are: the split of every pass@k plot of dvc.yaml
    (``data/evaluate/passk_<split>.json``) and, with ``files`` (the workspace is what is drawn), the RL algorithm of
    data/didpo/headline.json and the problems of each split in data/evaluate/protocol.json; what is missing or
    unreadable is left out."""
    root = Path(root)
    splits = {
        title: m.group(1)
        for title, paths in plot_files(root / "dvc.yaml").items()
        for m in map(PASSK_FILE.fullmatch, paths)
        if m
    }
    if not files:
        return DataContext(splits=splits)

    def read(path: str) -> dict:
        try:
            data = json.loads((root / path).read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    algo = read("data/didpo/headline.json").get("algo")
    measured = read("data/evaluate/protocol.json").get("splits", {})
    problems = {title: len(measured[split]) for title, split in splits.items() if isinstance(measured.get(split), list)}
    return DataContext(algo if isinstance(algo, str) else None, problems, splits)


def series_label(key: str, algo: str | None = None) -> str:
    """A legend's name for a DVC series key (``field`` or ``filename::field``): a checkpoint of a pass@k file by
    `tasks.evaluate.checkpoint_label` (``didpo`` → ``RL (rft)``), a training metric ``<stage>/<metric>`` by what it
    is (`METRIC_LABELS`, else the metric with spaces), the RL stage's followed by its algorithm (``pass rate (rft)``).
    """
    from tasks.evaluate import CHECKPOINT_LABELS, checkpoint_label

    name = key.split("::")[-1]
    if name in CHECKPOINT_LABELS or name == "didpo":
        return checkpoint_label(name, algo)
    stage, _, metric = name.partition("/")
    if not metric:
        return name
    label = METRIC_LABELS.get(metric, metric.replace("_", " ").replace("/", " "))
    return f"{label} ({algo})" if stage == "didpo" and algo else label


def _walk(node, visit) -> None:
    """Call ``visit(d)`` on every dict of a JSON-like tree."""
    if isinstance(node, dict):
        visit(node)
        for value in node.values():
            _walk(value, visit)
    elif isinstance(node, list):
        for value in node:
            _walk(value, visit)


def too_few(spec: dict, context: DataContext | None = None) -> int | None:
    """The problems of the split a pass@k spec draws when fewer than `tasks.evaluate.MIN_PROBLEMS` (the rows'
    ``n_problems``, else the context's figure for the spec's title); None when it is drawn."""
    from tasks.evaluate import MIN_PROBLEMS

    values = spec.get("data", {}).get("values") or []
    sizes = [row["n_problems"] for row in values if isinstance(row.get("n_problems"), int)]
    if not sizes and context is not None:
        title = spec.get("title", {})
        title = title.get("text") if isinstance(title, dict) else title
        sizes = [context.problems[title]] if title in context.problems else []
    n = min(sizes, default=None)
    return n if n is not None and n < MIN_PROBLEMS else None


def drawable(specs: dict[str, dict], context: DataContext | None = None) -> tuple[dict[str, dict], list[str]]:
    """``(the specs worth drawing, ["<title>: why not", ...])``: a pass@k plot of a split under
    `tasks.evaluate.MIN_PROBLEMS` problems (`too_few`), or a plot with no figure at all, is not drawn."""
    from tasks.evaluate import MIN_PROBLEMS, SPLIT_SIZE_KEYS

    kept, left = {}, []
    for title, spec in specs.items():
        n = too_few(spec, context)
        values = spec.get("data", {}).get("values")
        if n is not None:
            key = SPLIT_SIZE_KEYS.get(context.splits.get(title, "")) if context is not None else None
            more = f": raise {key}" if key else ""
            left.append(f"{title}: {n} problem{'s' if n != 1 else ''}, fewer than {MIN_PROBLEMS}{more}")
        elif values is not None and all(row.get("dvc_inferred_y_value", 0) is None for row in values):
            left.append(f"{title}: no figures")
        else:
            kept[title] = spec
    return kept, left


def readable(spec: dict, context: DataContext | None = None) -> dict:
    """A copy of a DVC-filled Vega-Lite spec (DVC's ``linear`` template) drawn for reading:

    - points without a y value are dropped (evaluate writes a row for every k of its list, null where n answers
      allow no estimate: pass@k on val drew an x axis to 16 for figures at k 1 and 2);
    - an x axis of whole numbers (k, steps) has whole-number ticks (the values themselves when there are at most
      `FEW_TICKS`): no k = 1.1 … 1.9 between k 1 and 2;
    - with one revision, each series gets its own colour and a readable name (`series_label`: ``RL (rft)``, not
      ``didpo``; ``train``, not ``train.json::sft/loss``), a plot of one series too (DVC's legend there is
      ``rev: workspace``); series with the same points are drawn once, named together (``base = SFT``). A ``dvc plots
      diff`` of several revisions keeps DVC's encoding (colour: revision, dash: series).

    context: the algorithm the RL series are named by (`workspace_context`); None: named without it.
    """
    from tasks.config import CHECKPOINT_NAMES

    spec = copy.deepcopy(spec)
    values = spec.get("data", {}).get("values")
    if values is None:
        return spec
    values = [row for row in values if row.get("dvc_inferred_y_value", 0) is not None]
    spec["data"]["values"] = values
    _whole_number_axis(spec, values)
    if len({row.get("rev") for row in values}) != 1:
        return spec
    algo = context.algo if context is not None else None
    encoding = spec.setdefault("encoding", {})
    dash = encoding.get("strokeDash")
    key = dash.get("field") if isinstance(dash, dict) else None  # what tells series apart: field, filename::field
    if key and any(key in row for row in values):
        points: dict[str, list] = {}
        for row in values:
            points.setdefault(row.get(key), []).append((row.get(encoding.get("x", {}).get("field")), _y(row)))
        names, same = {}, {}  # key -> label; the first key of every set of identical series -> its members
        for series, drawn in points.items():
            first = next((s for s in same if sorted(points[s], key=str) == sorted(drawn, key=str)), None)
            same.setdefault(first or series, []).append(series)
        for first, members in same.items():
            names[first] = _joined([series_label(str(m), algo) for m in members], algo)
        values = [dict(row, series=names[row.get(key)]) for row in values if row.get(key) in names]
        checkpoints = all(str(s).split("::")[-1] in (*CHECKPOINT_NAMES, "champion") for s in points)
    else:  # one series: DVC colours it by revision (legend "rev: workspace"); name it instead
        y_name = _y_field(spec)
        label = series_label(y_name, algo) if y_name else "series"
        values = [dict(row, series=label) for row in values]
        names, checkpoints = {None: label}, False
    spec["data"]["values"] = values
    domain = list(dict.fromkeys(names.values()))
    title = "checkpoint" if checkpoints else "series"
    colour = {"field": "series", "type": "nominal", "title": title, "scale": {"domain": domain}}

    def recolour(node):
        if isinstance(node.get("color"), dict) and node["color"].get("field") == "rev":
            node["color"] = colour
        if "loess" in node and "series" not in node.get("groupby", []):  # the smoothed line keeps its series
            node["groupby"] = [*node.get("groupby", []), "series"]

    _walk(spec, recolour)
    if key:  # the same field, title and domain as the colour: one legend
        encoding["strokeDash"] = {"field": "series", "type": "nominal", "title": title, "scale": {"domain": domain}}
    else:
        encoding.pop("strokeDash", None)
    return spec


def _joined(labels: list[str], algo: str | None) -> str:
    """Names of identical series joined with `` = ``, a shared ``(<algo>)`` said once."""
    tail = f" ({algo})"
    if algo and len(labels) > 1 and all(label.endswith(tail) for label in labels):
        return " = ".join(label[: -len(tail)] for label in labels) + tail
    return " = ".join(labels)


def _y(row: dict):
    return row.get("dvc_inferred_y_value")


def _y_field(spec: dict) -> str | None:
    """The data field of a one-series spec's y encoding (DVC names it in every layer)."""
    found = []

    def visit(node):
        y = node.get("y")
        if isinstance(y, dict) and isinstance(y.get("field"), str) and y["field"] != "dvc_inferred_y_value":
            found.append(y["field"])

    _walk(spec, visit)
    return found[0] if found else None


def _whole_number_axis(spec: dict, values: list[dict]) -> None:
    """Whole-number ticks on the x axis when every x value is a whole number (in place)."""
    x = spec.get("encoding", {}).get("x", {})
    field_name = x.get("field") if isinstance(x, dict) else None
    xs = [row.get(field_name) for row in values]
    if not field_name or not xs or not all(isinstance(v, int | float) and float(v).is_integer() for v in xs):
        return
    axis = {"format": "d", "tickMinStep": 1}
    distinct = sorted({int(v) for v in xs})
    if len(distinct) <= FEW_TICKS:
        axis["values"] = distinct

    def visit(node):
        enc = node.get("x")
        if isinstance(enc, dict) and enc.get("field") == field_name and enc.get("type") == "quantitative":
            enc["axis"] = {**enc.get("axis", {}), **axis}

    _walk(spec, visit)


def slug(title: str) -> str:
    """A file name for a plot title: lowercase ASCII words joined by ``_`` (``pass@k on val`` → ``pass_k_on_val``)."""
    return re.sub(r"[^a-z0-9]+", "_", title.lower()).strip("_") or "plot"


def render(specs: dict[str, dict], out: Path = OUT, context: DataContext | None = None) -> Path:
    """Write ``out/index.html`` (every plot, the Vega libraries inlined) and ``out/<slug>.png`` per plot, each spec
    through `readable` (``context``: what names the RL series); returns the page's path. `drawable` says first
    which specs are worth drawing."""
    import vl_convert as vlc

    out.mkdir(parents=True, exist_ok=True)
    divs, calls = [], []
    for i, (title, spec) in enumerate(specs.items()):
        spec = readable(spec, context)
        (out / f"{slug(title)}.png").write_bytes(vlc.vegalite_to_png(spec, scale=2))
        divs.append(f'<div id="plot{i}"></div>')
        calls.append(f"vegaEmbed('#plot{i}', {json.dumps(spec)});")
    # the bundle is a classic script that sets window.vegaEmbed; the function scope keeps its own names private
    page = (
        '<!DOCTYPE html>\n<html>\n<head>\n<meta charset="utf-8">\n<title>didpo plots</title>\n'
        f"<script>(function () {{\n{vlc.javascript_bundle()}\n}})();</script>\n</head>\n<body>\n"
        + "\n".join(divs)
        + "\n<script>\n"
        + "\n".join(calls)
        + "\n</script>\n</body>\n</html>\n"
    )
    (out / "index.html").write_text(page, encoding="utf-8")
    return out / "index.html"
