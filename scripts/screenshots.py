"""Screenshots of the views a person opens after a run, taken by a real headless browser on this machine, offline.

    .venv/bin/python scripts/screenshots.py [--out docs/screenshots]

It serves the project's own state as `didpo ui` does (``flows.ui``: ``mlflow ui`` on ``tracking.tracking_uri``,
``prefect server start`` on ``PREFECT_HOME=.prefect``, here on free ports), renders `didpo plots`' offline page, and
has Chromium (Debian's ``chromium`` package: ``apt-get install chromium``) draw each page with its scripts run to
completion:

- ``mlflow_experiment.png``: the experiment's runs (``#/experiments/<id>``);
- ``mlflow_pipeline_run.png``: the latest pipeline run, its stage runs nested under it;
- ``mlflow_sft_metrics.png``: the latest SFT run's metric charts (loss per step);
- ``mlflow_model.png``: the registered model's versions and aliases (``#/models/<name>``);
- ``prefect_runs.png``: the flow runs, each stage a subflow of its pipeline run;
- ``dvc_plots.png``: `didpo plots`' page (dvc_plots/index.html) opened from disk.

A page that comes out blank (almost every pixel the background's colour) fails the script: a screenshot that shows
nothing proves nothing. Nothing is downloaded: the servers are local and the machine needs no internet.

Source: Chromium's headless mode (``--headless --screenshot --virtual-time-budget``); MLflow's UI routes
(mlflow/server/js/src/experiment-tracking/routes.tsx); Prefect's ``prefect server start``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

BIN = Path(sys.executable).parent


def chromium() -> str:
    """The Chromium binary, or SystemExit saying how to install it."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if path := shutil.which(name):
            return path
    raise SystemExit("no Chromium here: `apt-get install chromium` (Debian's package), then run this again")


@contextlib.contextmanager
def browser_page(executable: str) -> Iterator:
    """A Playwright page in headless Chromium (`executable`, the system's: Playwright downloads nothing here)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=["--no-sandbox", "--disable-gpu"])
        try:
            yield browser.new_page(viewport={"width": 1440, "height": 1000})
        finally:
            browser.close()


def screenshot(page, url: str, path: Path, expect: str | re.Pattern, settle_ms: int = 4000) -> None:
    """Open `url`, wait until `expect` (a text or pattern the page shows only once its data has loaded) is visible,
    let charts finish drawing for `settle_ms`, and save the page to `path`.

    Raises:
        RuntimeError: `expect` never appeared (within 90 s), or the page is blank.
    """
    page.goto(url)
    try:
        page.get_by_text(expect).first.wait_for(state="visible", timeout=90_000)
    except Exception as err:  # Playwright's TimeoutError
        page.screenshot(path=path)
        raise RuntimeError(f"{url}: '{expect}' never appeared (what it showed: {path})") from err
    page.wait_for_timeout(settle_ms)
    close = page.locator('[data-component-id="mlflow.assistant.chat_panel.close"]')  # MLflow's chat side panel
    if close.count():  # it opens on its own a while after the page's data
        close.first.click()
        page.wait_for_timeout(1000)
    page.screenshot(path=path)
    ink = drawn_fraction(path)
    if ink < 0.02:
        raise RuntimeError(f"{path.name}: {url} came out blank ({ink:.1%} of the pixels differ from the background)")
    print(f"{path}: {url} ({ink:.0%} of the page drawn)")


def drawn_fraction(path: Path) -> float:
    """The fraction of pixels that differ from the image's most common colour (its background)."""
    from PIL import Image

    image = Image.open(path).convert("RGB").quantize(colors=64)
    counts = sorted(image.getcolors(), reverse=True)
    return 1.0 - counts[0][0] / (image.width * image.height)


# MLflow 3's UI opens in its GenAI view unless told otherwise (a browser-local setting, not the experiment's kind).
ML_VIEW = "?workflowType=machine_learning"


def mlflow_pages(tracking_uri: str, experiment: str) -> dict[str, tuple[str, str | re.Pattern]]:
    """``{file stem: (MLflow UI route, a text it shows once loaded)}`` for the experiment, its latest pipeline and
    SFT runs and the registered model (a page whose run or model does not exist yet is left out, and said).

    Raises:
        SystemExit: the experiment does not exist (nothing has run).
    """
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=tracking_uri)
    found = client.get_experiment_by_name(experiment)
    if found is None:
        raise SystemExit(f"no MLflow experiment '{experiment}' at {tracking_uri}: run `make run` first")
    eid = found.experiment_id
    runs = client.search_runs([eid], order_by=["start_time DESC"], max_results=200)
    # the list shows top-level runs; a pipeline's stage runs are collapsed under it until it is expanded
    top = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    if not top:
        raise SystemExit(f"the MLflow experiment '{experiment}' has no runs: run `make run` first")
    pages = {"mlflow_experiment": (f"#/experiments/{eid}{ML_VIEW}", top[0].info.run_name)}
    for stem, stage, tab, expect in (
        ("mlflow_pipeline_run", "pipeline", "", "Parameters"),
        ("mlflow_sft_metrics", "sft", "/model-metrics", "tokens_per_s"),
    ):
        # the latest finished one (a run stopped by Ctrl-C has only part of its curves), else the latest
        query = f"tags.`didpo.stage` = '{stage}'"
        runs = client.search_runs(
            [eid], f"{query} and attributes.status = 'FINISHED'", order_by=["start_time DESC"], max_results=1
        ) or client.search_runs([eid], query, order_by=["start_time DESC"], max_results=1)
        if runs:
            pages[stem] = (f"#/experiments/{eid}/runs/{runs[0].info.run_id}{tab}{ML_VIEW}", expect)
        else:
            print(f"no {stage} run in MLflow yet: {stem}.png skipped")
    models = client.search_registered_models(max_results=1)
    if models:
        version = max(int(v.version) for v in client.search_model_versions(f"name='{models[0].name}'"))
        pages["mlflow_model"] = (f"#/models/{models[0].name}{ML_VIEW}", f"Version {version}")
    else:
        print("no registered model yet: mlflow_model.png skipped")
    return pages


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("docs/screenshots"))
    args = parser.parse_args()
    os.chdir(ROOT)
    from flows.env import setup_environment
    from flows.ui import Server, free_port, mlflow_command, prefect_command, serving
    from tasks.config import load_params

    setup_environment()
    executable = chromium()
    args.out.mkdir(parents=True, exist_ok=True)
    logs = Path(".cache/screenshots")
    logs.mkdir(parents=True, exist_ok=True)
    tracking = load_params().tracking
    uri = os.environ.get("MLFLOW_TRACKING_URI") or tracking.tracking_uri

    subprocess.run([str(BIN / "didpo"), "plots"], check=True)
    with browser_page(executable) as page:
        screenshot(page, (ROOT / "dvc_plots" / "index.html").as_uri(), args.out / "dvc_plots.png", "SFT loss")

        port = free_port()
        with serving(Server(mlflow_command(uri, port), f"http://127.0.0.1:{port}/health", logs / "mlflow.log")):
            for stem, (route, expect) in mlflow_pages(uri, tracking.experiment).items():
                screenshot(page, f"http://127.0.0.1:{port}/{route}", args.out / f"{stem}.png", expect, settle_ms=8000)

        port = free_port()
        command, env = prefect_command(port)
        with serving(Server(command, f"http://127.0.0.1:{port}/api/health", logs / "prefect.log", env)):
            runs = re.compile(r"^[1-9][0-9]* (Flow )?runs?$", re.IGNORECASE)  # the list's count, once it has loaded
            screenshot(page, f"http://127.0.0.1:{port}/runs", args.out / "prefect_runs.png", runs)


if __name__ == "__main__":
    main()
