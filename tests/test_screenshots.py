"""scripts/screenshots.py without a browser: the blank-page measure (hand-computed) and the MLflow pages it opens for
a tracking store (routes in MLflow's model-training view, each with a text that proves its data loaded)."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).parents[1]
spec = importlib.util.spec_from_file_location("screenshots", ROOT / "scripts/screenshots.py")
screenshots = importlib.util.module_from_spec(spec)
spec.loader.exec_module(screenshots)


def test_drawn_fraction_is_the_share_of_pixels_off_the_background(tmp_path):
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (100, 50), "white")  # 5,000 pixels
    ImageDraw.Draw(image).rectangle([0, 0, 24, 19], fill="black")  # 25 × 20 = 500 pixels: 10%
    image.save(tmp_path / "page.png")
    assert abs(screenshots.drawn_fraction(tmp_path / "page.png") - 0.10) < 1e-9
    Image.new("RGB", (100, 50), "white").save(tmp_path / "blank.png")
    assert screenshots.drawn_fraction(tmp_path / "blank.png") == 0.0


def test_mlflow_pages_for_a_store(tmp_path):
    import mlflow

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = mlflow.MlflowClient(tracking_uri=uri)
    eid = client.create_experiment("didpo-pipeline", artifact_location=str(tmp_path / "art"))
    sft = client.create_run(eid, run_name="sft", tags={"didpo.stage": "sft"})
    client.set_terminated(sft.info.run_id)
    pages = screenshots.mlflow_pages(uri, "didpo-pipeline")
    view = "?workflowType=machine_learning"
    assert pages == {
        "mlflow_experiment": (f"#/experiments/{eid}{view}", "sft"),
        "mlflow_sft_metrics": (f"#/experiments/{eid}/runs/{sft.info.run_id}/model-metrics{view}", "tokens_per_s"),
    }  # no pipeline run and no registered model yet: those pages are left out

    # an SFT run stopped by Ctrl-C after it holds part of the curves: the page stays on the finished one
    stopped = client.create_run(eid, run_name="sft", tags={"didpo.stage": "sft"})
    client.set_terminated(stopped.info.run_id, status="KILLED")
    assert screenshots.mlflow_pages(uri, "didpo-pipeline")["mlflow_sft_metrics"][0].startswith(
        f"#/experiments/{eid}/runs/{sft.info.run_id}/"
    )

    client.create_registered_model("didpo-coder")
    for _ in range(2):
        client.create_model_version("didpo-coder", str(tmp_path / "art"), run_id=sft.info.run_id)
    pages = screenshots.mlflow_pages(uri, "didpo-pipeline")
    assert pages["mlflow_model"] == (f"#/models/didpo-coder{view}", "Version 2")

    # a pipeline run's stage runs are collapsed under it in the list: the page waits for the pipeline, not its
    # latest stage (a fresh-user trial's `make screenshots` waited for 'register' in vain)
    pipeline = client.create_run(eid, run_name="pipeline-x", tags={"didpo.stage": "pipeline"})
    client.create_run(eid, run_name="register", tags={"mlflow.parentRunId": pipeline.info.run_id})
    assert screenshots.mlflow_pages(uri, "didpo-pipeline")["mlflow_experiment"][1] == "pipeline-x"
