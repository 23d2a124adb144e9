"""`didpo plots`: dvc.yaml's plots rendered offline (issue 19: `dvc plots show` loads Vega from a CDN)."""

import json
from pathlib import Path

from flows.plots import render, slug
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
    assert "window.vegaEmbed" in html and f"vegaEmbed('#plot0', {json.dumps(spec)});" in html


def test_headline_keeps_the_named_figures_only():
    from flows.evaluate import evaluate_headline
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
    columns, then 4,280 characters a line): every declared metric is a stage's headline.json, and the flows' headline
    columns, evaluate's (one file a checkpoint) included, stay under 20 in all."""
    import yaml

    from flows import baseline, didpo, dpo, gate, mine, prepare, register, selfplay, sft

    stages = yaml.safe_load(Path("dvc.yaml").read_text())["stages"]
    metrics = [next(iter(m)) if isinstance(m, dict) else m for s in stages.values() for m in s.get("metrics", [])]
    assert metrics and all(Path(m).name == "headline.json" or m == "data/evaluate/headline" for m in metrics), metrics
    columns = set().union(*(f.HEADLINE for f in (baseline, didpo, dpo, gate, mine, prepare, register, selfplay, sft)))
    columns |= {"quarantined", "val.pass@1", "humaneval.pass@1"}  # validate's and evaluate's
    assert len(columns) < 20, sorted(columns)


def test_dvc_specs_are_drawn_readable(monkeypatch):
    """DVC's real `dvc plots show --json` spec of `pass@k on val` (the committed evaluate output): the rows of a k
    without figures are dropped (k 1 and 2 of 1, 2, 5, 10, 16 at n = 4), and with one revision each checkpoint has its
    own colour instead of one colour and four dash patterns; a spec of two revisions keeps DVC's colour by revision."""
    import os
    import sys

    from flows.plots import dvc_plot_specs, readable

    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")  # this env's dvc
    specs, _ = dvc_plot_specs()
    spec = specs["pass@k on val"]
    rows = spec["data"]["values"]
    assert len(rows) == 20 and sum(r["dvc_inferred_y_value"] is None for r in rows) == 12  # 4 checkpoints × 5 k
    drawn = readable(spec)
    assert sorted({(r["field"], r["k"]) for r in drawn["data"]["values"]}) == [
        (name, k) for name in ("base", "didpo", "dpo", "sft") for k in (1, 2)
    ]
    assert drawn["encoding"]["color"]["field"] == "field"
    colours = [layer["encoding"]["color"] for layer in drawn["layer"] if "color" in layer.get("encoding", {})]
    assert len(colours) == 3 and all(c["field"] == "field" for c in colours)
    assert "rev" not in json.dumps(drawn["encoding"]["color"]) and spec["encoding"]["color"]["field"] == "rev"
    two = json.loads(json.dumps(spec))
    two["data"]["values"] += [dict(r, rev="HEAD~1") for r in rows]
    assert readable(two)["encoding"] == spec["encoding"]  # a diff of revisions: colour stays the revision
