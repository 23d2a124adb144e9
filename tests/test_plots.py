"""`didpo plots`: dvc.yaml's plots rendered offline (issue 19: `dvc plots show` loads Vega from a CDN)."""

import json

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
    assert headline(report, ("n_problems", "splits.val", "splits.heldout", "leakage.group_overlap")) == {
        "n_problems": 5,
        "splits.val": 2,
        "leakage.group_overlap": 0,
    }  # a key the report lacks (no held-out split) is left out
    metrics = {"base": {"val": {"pass@1": 0.1}, "seconds": 3.0}, "sft": {"val": {"pass@1": 0.3}, "humaneval": {}}}
    deltas = {"base_to_sft": {"val": {"delta": 0.2, "p_value": 0.01, "mde": 0.07}}}
    assert evaluate_headline(metrics, deltas) == {
        "base.val.pass@1": 0.1,
        "sft.val.pass@1": 0.3,
        "sft_vs_base.val.delta": 0.2,
        "sft_vs_base.val.p_value": 0.01,
    }
