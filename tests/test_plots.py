"""`didpo plots`: dvc.yaml's plots rendered offline (issue 19: `dvc plots show` loads Vega from a CDN)."""

import json
from pathlib import Path

import pytest

from flows.plots import readable, render, slug
from tasks.io import split_history


def test_history_splits_into_uniform_plot_tables():
    history = [
        {"step": 1, "sft/loss": 1.2, "sft/learning_rate": 0.0},
        {"step": 2, "sft/loss": 1.1, "sft/learning_rate": 1e-4},
        {"step": 2, "sft/eval_loss": 0.9},
    ]
    tables = split_history(history)
    assert [r["step"] for r in tables["train"]] == [1, 2] and all("sft/loss" in r for r in tables["train"])
    assert tables["eval"] == [{"step": 2, "sft/eval_loss": 0.9}]
    assert split_history([{"step": 1, "didpo/pass_rate": 0.5}])["eval"] == []


def test_plots_render_to_a_page_that_needs_no_network_and_to_pngs(tmp_path):
    spec = {
        "$schema": "https://vega.github.io/schema/vega-lite/v5.json",
        "data": {"values": [{"step": 1, "loss": 1.0}, {"step": 2, "loss": 0.5}]},
        "mark": "line",
        "encoding": {"x": {"field": "step", "type": "quantitative"}, "y": {"field": "loss", "type": "quantitative"}},
    }
    page = render({"SFT loss (train)": spec}, tmp_path)
    assert slug("SFT loss (train)") == "sft_loss_train" and slug("pass@k on val") == "pass_k_on_val"
    png = (tmp_path / "sft_loss_train.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 1000
    html = page.read_text()
    assert "<script src" not in html  # every library is inlined: the page opens offline
    assert "window.vegaEmbed" in html and f"vegaEmbed('#plot0', {json.dumps(readable(spec))});" in html
    assert readable(spec)["encoding"]["x"]["axis"] == {"format": "d", "tickMinStep": 1, "values": [1, 2]}


def test_headline_keeps_the_named_figures_only():
    from tasks.evaluate import evaluate_headline
    from tasks.io import headline

    report = {"n_problems": 5, "splits": {"train": 3, "val": 2}, "leakage": {"group_overlap": 0}}
    columns = {
        "problems": "n_problems",
        "val": "splits.val",
        "heldout": "splits.heldout",
        "overlap": "leakage.group_overlap",
    }
    assert headline(report, columns) == {"problems": 5, "val": 2, "overlap": 0}  # no held-out split: left out
    metrics = {
        "base": {"val": {"pass@1": 0.1, "pass@4": 0.2}, "test": {"pass@1": 0.0}, "seconds": 3.0},
        "sft": {"val": {"pass@1": 0.3}, "humaneval": {"pass@1": 0.05}, "heldout": {}},
    }
    assert evaluate_headline(metrics) == {
        "base": {"val.pass@1": 0.1},
        "sft": {"val.pass@1": 0.3, "humaneval.pass@1": 0.05},
    }


def test_dvc_metrics_are_the_stages_headlines():
    """`dvc metrics show` is one table whose columns are the union of every metric file's keys (issue 19: 697
    columns, then 4,280 characters a line): every declared metric is a stage's headline.json, and the stages' headline
    columns, evaluate's (one file a checkpoint) included, stay under 20 in all."""
    import yaml

    from tasks import baseline, didpo, dpo, gate, mine, prepare, register, selfplay, sft  # headlines live with the work

    stages = yaml.safe_load(Path("dvc.yaml").read_text())["stages"]
    metrics = [next(iter(m)) if isinstance(m, dict) else m for s in stages.values() for m in s.get("metrics", [])]
    assert metrics and all(Path(m).name == "headline.json" or m == "data/evaluate/headline" for m in metrics), metrics
    columns = set().union(*(f.HEADLINE for f in (baseline, didpo, dpo, gate, mine, prepare, register, selfplay, sft)))
    columns |= {"quarantined", "val.pass@1", "humaneval.pass@1"}  # validate's and evaluate's
    assert len(columns) < 20, sorted(columns)


def test_dvc_specs_are_drawn_readable(monkeypatch):
    """DVC's real `dvc plots show --json` spec of `pass@k on val` (the workspace's evaluate output, when there is
    one): the rows of a k without figures are dropped (k 1 and 2 of 1, 2, 5, 10, 16 at n = 4), the k axis has the
    ticks 1 and 2 only, and with one revision each checkpoint has its own colour instead of one colour and four dash
    patterns; a spec of two revisions keeps DVC's colour by revision."""
    import os
    import sys

    from flows.plots import dvc_plot_specs

    if not Path("data/evaluate/passk_val.json").is_file():
        pytest.skip("no evaluate output in this workspace")
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")  # this env's dvc
    specs, _ = dvc_plot_specs()
    spec = specs["pass@k on val"]
    rows = spec["data"]["values"]
    assert len(rows) == 20 and sum(r["dvc_inferred_y_value"] is None for r in rows) == 12  # 4 checkpoints × 5 k
    drawn = readable(spec)
    assert sorted({(r["field"], r["k"]) for r in drawn["data"]["values"]}) == [
        (name, k) for name in ("base", "didpo", "dpo", "sft") for k in (1, 2)
    ]
    assert drawn["encoding"]["color"]["field"] == "series" and drawn["encoding"]["x"]["axis"]["values"] == [1, 2]
    colours = [layer["encoding"]["color"] for layer in drawn["layer"] if "color" in layer.get("encoding", {})]
    assert len(colours) == 3 and all(c["field"] == "series" for c in colours)
    assert "rev" not in json.dumps(drawn["encoding"]["color"]) and spec["encoding"]["color"]["field"] == "rev"
    two = json.loads(json.dumps(spec))
    two["data"]["values"] += [dict(r, rev="HEAD~1") for r in rows]
    assert readable(two)["encoding"]["color"] == spec["encoding"]["color"]  # a diff of revisions: colour by revision


# ---------------------------------------------------------------- what DVC fills, from scratch files (issue 44, 4)


def dvc_specs(root: Path, plots: dict, files: dict[str, object], monkeypatch) -> dict[str, dict]:
    """`dvc plots show --json` of a scratch DVC project at `root`: dvc.yaml's top-level ``plots`` (title → {x, y}),
    and the data files (path → JSON)."""
    import os
    import subprocess
    import sys

    import yaml

    from flows.plots import dvc_plot_specs

    bin_dir = Path(sys.executable).parent
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")  # this env's dvc
    subprocess.run([str(bin_dir / "dvc"), "init", "--no-scm", "-q"], cwd=root, check=True)
    (root / "dvc.yaml").write_text(yaml.safe_dump({"plots": [{t: p} for t, p in plots.items()]}, sort_keys=False))
    for path, data in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(json.dumps(data))
    monkeypatch.chdir(root)
    specs, problems = dvc_plot_specs()
    assert not problems, problems
    return specs


def passk(n_problems: int | None, **series) -> dict:
    """A pass@k file as evaluate writes it: a row per k of 1, 2, 5, 10, 16 (None past the answers' reach)."""
    ks = (1, 2, 5, 10, 16)
    rows = [
        {"k": k, **{name: values[i] if i < len(values) else None for name, values in series.items()}}
        for i, k in enumerate(ks)
    ]
    if n_problems is not None:
        rows = [dict(row, n_problems=n_problems) for row in rows]
    return {"passk": rows}


PASSK = {"x": "k", "y": {"data/evaluate/passk_val.json": ["base", "sft", "dpo", "didpo"]}}


def test_pass_k_has_whole_k_ticks_and_series_named_by_checkpoint_and_algorithm(tmp_path, monkeypatch):
    from flows.plots import DataContext, drawable

    files = {
        "data/evaluate/passk_val.json": passk(88, base=[0.0, 0.0], sft=[0.25, 0.5], dpo=[0.25, 0.5], didpo=[0.5, 0.75])
    }
    specs = dvc_specs(tmp_path, {"pass@k on val": PASSK}, files, monkeypatch)
    kept, left = drawable(specs, DataContext(algo="rft"))
    assert list(kept) == ["pass@k on val"] and left == []
    drawn = readable(kept["pass@k on val"], DataContext(algo="rft"))
    assert sorted({r["k"] for r in drawn["data"]["values"]}) == [1, 2]  # k 5, 10, 16 have no figure at 4 answers
    x_axes = [x["axis"] for x in _encodings(drawn, "x")]
    assert x_axes and all(a == {"format": "d", "tickMinStep": 1, "values": [1, 2]} for a in x_axes)  # no k = 1.5
    # SFT and DPO drew the same points: one line, both named; the RL checkpoint by its algorithm
    assert drawn["encoding"]["color"]["scale"]["domain"] == ["base", "SFT = DPO", "RL (rft)"]
    assert drawn["encoding"]["color"]["title"] == "checkpoint"
    assert {(r["series"], r["k"], r["dvc_inferred_y_value"]) for r in drawn["data"]["values"]} == {
        ("base", 1, 0.0), ("base", 2, 0.0), ("SFT = DPO", 1, 0.25), ("SFT = DPO", 2, 0.5),
        ("RL (rft)", 1, 0.5), ("RL (rft)", 2, 0.75),
    }  # fmt: skip
    assert all(c["field"] == "series" for c in _encodings(drawn, "color"))  # no colour by revision left
    loess = [n for n in _nodes(drawn) if "loess" in n]
    assert loess and all("series" in n["groupby"] for n in loess)  # the smoothed line keeps its colour
    assert readable(kept["pass@k on val"])["encoding"]["color"]["scale"]["domain"][-1] == "RL"  # algorithm unknown


def test_a_split_too_small_for_pass_k_is_not_drawn_and_says_which_key(tmp_path, monkeypatch):
    """A 1-problem test split (evaluate.test_problems: 1) drew pass@k 1.0 for RL: it is left out with its reason,
    from the rows' n_problems, or for a file written before rows carried it, from the protocol's split sizes."""
    from flows.plots import DataContext, drawable, workspace_context

    plots = {
        "pass@k on test": {"x": "k", "y": {"data/evaluate/passk_test.json": ["base", "didpo"]}},
        "pass@k on held-out families": {"x": "k", "y": {"data/evaluate/passk_heldout.json": ["base", "didpo"]}},
        "pass@k on val": {"x": "k", "y": {"data/evaluate/passk_val.json": ["base", "didpo"]}},
    }
    files = {
        "data/evaluate/passk_test.json": passk(1, base=[None, None], didpo=[None, None]),  # as evaluate writes it now
        "data/evaluate/passk_heldout.json": passk(None, base=[0.0, 0.0], didpo=[0.0, 0.5]),  # an older file
        "data/evaluate/passk_val.json": passk(None, base=[0.0, 0.0], didpo=[0.5, 0.75]),
        "data/evaluate/protocol.json": {"splits": {"val": [f"v{i}" for i in range(8)], "heldout": ["h0", "h1"]}},
        "data/didpo/headline.json": {"algo": "grpo", "step": 6},
    }
    specs = dvc_specs(tmp_path, plots, files, monkeypatch)
    context = workspace_context(tmp_path)
    assert context == DataContext(
        algo="grpo",
        problems={"pass@k on held-out families": 2, "pass@k on val": 8},
        splits={"pass@k on test": "test", "pass@k on held-out families": "heldout", "pass@k on val": "val"},
    )
    kept, left = drawable(specs, context)
    assert list(kept) == ["pass@k on val"]  # 8 problems: the floor itself is drawn
    assert left == [
        "pass@k on test: 1 problem, fewer than 8: raise evaluate.test_problems",
        "pass@k on held-out families: 2 problems, fewer than 8: raise evaluate.heldout_per_family",
    ]
    # drawing revisions (the files of git commits): an older file's size is not known, so it is drawn
    assert drawable(specs, workspace_context(tmp_path, files=False))[1] == [left[0]]
    assert readable(kept["pass@k on val"], context)["encoding"]["color"]["scale"]["domain"] == ["base", "RL (grpo)"]


def test_training_curves_have_readable_legends(tmp_path, monkeypatch):
    """The KL plot (one series) said `rev: workspace`; the RL curves were named didpo/… while the algorithm was rft;
    the pass rate and the outcome reward (identical without partial credit) were two lines on top of each other;
    SFT's were `train.json::sft/loss` and `eval.json::sft/eval_loss`."""
    from flows.plots import DataContext

    rl = [{"step": s, "didpo/pass_rate": p, "didpo/reward/outcome": p, "didpo/kl_start": kl} for s, p, kl in
          ((1, 0.25, 0.0), (2, 0.5, 0.001), (3, 0.75, 0.002))]  # fmt: skip
    plots = {
        "KL": {"x": "step", "y": {"data/didpo/plots/train.json": "didpo/kl_start"}},
        "pass rate": {"x": "step", "y": {"data/didpo/plots/train.json": ["didpo/pass_rate", "didpo/reward/outcome"]}},
        "SFT loss": {
            "x": "step",
            "y": {"data/sft/plots/train.json": "sft/loss", "data/sft/plots/eval.json": "sft/eval_loss"},
        },
    }
    files = {
        "data/didpo/plots/train.json": rl,
        "data/sft/plots/train.json": [{"step": s, "sft/loss": 2.0 / s} for s in range(1, 41)],
        "data/sft/plots/eval.json": [{"step": 20, "sft/eval_loss": 0.2}, {"step": 40, "sft/eval_loss": 0.1}],
    }
    specs = dvc_specs(tmp_path, plots, files, monkeypatch)
    context = DataContext(algo="rft")
    kl = readable(specs["KL"], context)
    assert specs["KL"]["encoding"]["color"]["field"] == "rev"  # DVC's: one entry, "workspace"
    assert kl["encoding"]["color"] == {
        "field": "series", "type": "nominal", "title": "series", "scale": {"domain": ["KL to the start policy (rft)"]}
    }  # fmt: skip
    assert "workspace" not in json.dumps([kl["encoding"], kl["layer"]])
    assert kl["encoding"]["x"]["axis"]["values"] == [1, 2, 3]  # RL steps: no 1.5
    rate = readable(specs["pass rate"], context)
    assert rate["encoding"]["color"]["scale"]["domain"] == ["pass rate = outcome reward (rft)"]
    assert len(rate["data"]["values"]) == 3  # one line of 3 steps, not two on top of each other
    sft = readable(specs["SFT loss"], context)
    assert sft["encoding"]["color"]["scale"]["domain"] == ["train", "held-out"]
    assert sft["encoding"]["x"]["axis"] == {"format": "d", "tickMinStep": 1}  # 40 steps: whole-number ticks


def _nodes(node):
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from _nodes(value)
    elif isinstance(node, list):
        for value in node:
            yield from _nodes(value)


def _encodings(spec: dict, channel: str) -> list[dict]:
    return [n[channel] for n in _nodes(spec) if isinstance(n.get(channel), dict) and "field" in n[channel]]
