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
from pathlib import Path

OUT = Path("dvc_plots")


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


def readable(spec: dict) -> dict:
    """A copy of a DVC-filled Vega-Lite spec (DVC's ``linear`` template) drawn for reading:

    - points without a y value are dropped (evaluate writes a row for every k of its list, null where n answers
      allow no estimate: pass@k on val drew an x axis to 16 for figures at k 1 and 2);
    - with one revision, each series gets its own colour (DVC colours by revision and tells series apart by dash
      pattern alone: four checkpoints in one colour); a ``dvc plots diff`` of several revisions keeps DVC's encoding.
    """
    spec = copy.deepcopy(spec)
    values = spec.get("data", {}).get("values")
    if values is None:
        return spec
    spec["data"]["values"] = [row for row in values if row.get("dvc_inferred_y_value", 0) is not None]
    dash = spec.get("encoding", {}).get("strokeDash")
    key = dash.get("field") if isinstance(dash, dict) else None  # what tells series apart: field, filename::field
    if len({row.get("rev") for row in values}) == 1 and key and any(key in row for row in values):
        series = sorted({row[key] for row in values if key in row})
        colour = {"field": key, "type": "nominal", "title": "series", "scale": {"domain": series}}

        def recolour(node):
            if isinstance(node, dict):
                if isinstance(node.get("color"), dict) and node["color"].get("field") == "rev":
                    node["color"] = colour
                for value in node.values():
                    recolour(value)
            elif isinstance(node, list):
                for value in node:
                    recolour(value)

        recolour(spec)
        dash["title"] = "series"  # the same field, title and domain as the colour: one legend
        dash.pop("legend", None)
    return spec


def slug(title: str) -> str:
    """A file name for a plot title: lowercase ASCII words joined by ``_`` (``pass@k on val`` → ``pass_k_on_val``)."""
    return re.sub(r"[^a-z0-9]+", "_", title.lower()).strip("_") or "plot"


def render(specs: dict[str, dict], out: Path = OUT) -> Path:
    """Write ``out/index.html`` (every plot, the Vega libraries inlined) and ``out/<slug>.png`` per plot, each spec
    through `readable`; returns the page's path."""
    import vl_convert as vlc

    out.mkdir(parents=True, exist_ok=True)
    divs, calls = [], []
    for i, (title, spec) in enumerate(specs.items()):
        spec = readable(spec)
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
