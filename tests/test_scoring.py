"""Text in, uncertainty out: Scorer, score-text, the MLflow text model and Ray Serve."""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from asymvlm import Scorer, tables, tracking
from asymvlm.checkpoints import export_adapter, load_checkpoint
from asymvlm.cli import main as cli_main
from asymvlm.errors import CheckpointError
from asymvlm.scoring import ScoringInputError
from tests.helpers import free_port, hierarcaps_subset, post_json, requires_hierarcaps
from tests.hub_server import serve_hub

pytestmark = [requires_hierarcaps, pytest.mark.slow]
CAPTIONS = ["a dog", "a golden retriever catching a red frisbee", "a red bus"]


@pytest.fixture(scope="module")
def trained(ray_session, tmp_path_factory) -> dict[str, Any]:
    """Tables embedded with a tiny CLIP, an adapter trained on them, its scores and scorer."""
    from asymvlm.data.tiny import save_tiny_clip

    base = tmp_path_factory.mktemp("scoring")
    model = save_tiny_clip(str(base / "tiny-clip"))
    csv, images = hierarcaps_subset(base / "hc", n=8)
    root, checkpoint, scores = str(base / "tables"), str(base / "adapter"), str(base / "s.parquet")
    for command in (
        f"embed --dataset hierarcaps --annotations {csv} --images {images} --model {model} "
        f"--split test --output {root} --batch-size 8",
        f"train --embeddings {root} --split test --method asymvlm-vmf --epochs 3 "
        f"--optimizer adamw --lr 1e-2 --output {checkpoint} --quiet",
        f"score --embeddings {root} --split test --checkpoint {checkpoint} --output {scores} "
        "--quiet",
    ):
        assert cli_main(command.split()) == 0
    split = tables.read_split(root, "test")
    table = pq.read_table(scores)
    assert table.column("caption_id").to_pylist() == list(split.caption_ids)
    scorer = Scorer.from_checkpoint(checkpoint, device="cpu", batch_size=5)
    made = dict(model=model, tables=root, checkpoint=checkpoint, scores=table, images=images)
    return {**made, "texts": list(split.texts), "scorer": scorer}


def test_scorer_gives_the_numbers_of_asymvlm_score_on_embedded_tables(trained) -> None:
    encoder = json.load(open(os.path.join(trained["checkpoint"], "config.json")))["encoder"]
    sha = tables.read_manifest(trained["tables"]).to_dict()["files_sha256"]
    want = dict(model=trained["model"], revision=None, family="clip", files_sha256=sha, dim=24)
    assert encoder == want
    out, scores = trained["scorer"].caption_uncertainty(trained["texts"]), trained["scores"]
    np.testing.assert_allclose(out.kappa, scores.column("kappa").to_numpy(), rtol=2e-5)
    np.testing.assert_allclose(out.uncertainty, scores.column("uncertainty").to_numpy(), rtol=2e-5)
    np.testing.assert_allclose(np.linalg.norm(out.mu, axis=1), 1.0, atol=1e-5)
    records = trained["scorer"].caption_uncertainty(CAPTIONS[:2]).records()
    assert [r["text"] for r in records] == CAPTIONS[:2]
    assert [r["uncertainty"] for r in records] == pytest.approx([1 / r["kappa"] for r in records])


def test_scorer_scores_images_against_captions_as_the_tables_do(trained) -> None:
    from asymvlm.splits import load_split

    split = tables.read_split(trained["tables"], "test")
    files = {os.path.splitext(name)[0]: name for name in os.listdir(trained["images"])}
    paths = [os.path.join(trained["images"], files[i]) for i in split.image_ids]
    got = trained["scorer"].score(paths, trained["texts"])
    method, meta = load_checkpoint(trained["checkpoint"], "cpu")
    data = load_split(trained["tables"], "test", meta["adapter_input"])
    images, texts = method.split_inputs(data)
    with torch.no_grad():
        want = method.score(method.encode_texts(texts), method.encode_images(images)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)
    raw = [open(p, "rb").read() for p in paths[:2]]  # bytes give the same as paths
    same = trained["scorer"].score(raw, trained["texts"][:1])
    np.testing.assert_allclose(same, got[:1, :2], rtol=1e-4)
    with pytest.raises(ScoringInputError, match="image 1: cannot be decoded"):
        trained["scorer"].score([raw[0], b"not an image"], ["a dog"])


def test_score_text_files_to_parquet_equal_asymvlm_score(trained, tmp_path) -> None:
    txt, parquet = tmp_path / "captions.txt", tmp_path / "captions.parquet"
    txt.write_text("\n".join(trained["texts"]) + "\n\n")  # trailing blank lines are no captions
    pq.write_table(pa.table({"caption": trained["texts"]}), parquet)
    argv = ["score-text", "--checkpoint", trained["checkpoint"], "--device", "cpu"]
    for source, extra in ((txt, ["--batch-size", "4"]), (parquet, ["--column", "caption"])):
        out = tmp_path / "out" / f"{source.name}.parquet"
        assert cli_main([*argv, "--input", str(source), "--output", str(out), *extra]) == 0
        table = pq.read_table(out)
        assert table.column("text").to_pylist() == trained["texts"]
        for name in ("kappa", "uncertainty"):
            want = trained["scores"].column(name).to_numpy()
            np.testing.assert_allclose(table.column(name).to_numpy(), want, rtol=2e-5)


def test_bad_captions_are_named_and_nothing_is_left_half_written(trained, tmp_path, capsys) -> None:
    ck = ["score-text", "--checkpoint", trained["checkpoint"]]
    txt, parquet, out = tmp_path / "c.txt", tmp_path / "c.parquet", tmp_path / "o.parquet"
    txt.write_text("a dog\na cat\n\na bird\n")
    pq.write_table(pa.table({"text": ["a dog", None]}), parquet)
    blank, empty = tmp_path / "blank.txt", tmp_path / "empty.parquet"
    blank.write_text("\n \n\n")
    pq.write_table(pa.table({"text": pa.array([], pa.string())}), empty)
    for argv, message in (
        ([*ck, "--input", str(blank), "--output", str(out)], f"error: {blank}: no captions in it"),
        ([*ck, "--input", str(empty), "--output", str(out)], f"error: {empty}: no captions in it"),
        ([*ck, "a dog", "--input", str(blank)], "--input: not allowed with argument CAPTION"),
        ([*ck, "--input", "c.csv"], "error: --input c.csv: give a .txt file (a caption a line) or"),
        ([*ck, "a dog", " "], "error: caption 1: empty"),
        ([*ck, "--input", str(txt), "--output", str(out)], f"{txt} line 3: empty caption"),
        ([*ck, "--input", str(parquet)], f"{parquet} row 1: 'text' is not a caption (None)"),
        ([*ck, "--input", str(parquet), "--column", "x"], "no column 'x' (columns: text)"),
        (ck, "error: no captions given: give them on the command line or --input FILE\n"),
    ):
        assert cli_main(argv) == 2
        assert message in capsys.readouterr().err
    assert not out.exists() and not os.path.exists(str(out) + ".tmp")


def test_a_random_test_encoder_is_said(trained, tmp_path, caplog, capsys) -> None:
    """The tiny models are marked in their config file; the scorer warns of them, once."""
    assert cli_main(["score-text", "--checkpoint", trained["checkpoint"], "a dog"]) == 0
    said = [line for line in capsys.readouterr().err.splitlines() if "random" in line]
    assert said == [
        f"warning: the encoder {trained['model']} is a random test model: its scores mean nothing"
    ]
    real = tmp_path / "real"
    shutil.copytree(trained["model"], real)
    config = json.loads((real / "config.json").read_text())
    assert config.pop("random_test_model") is True
    (real / "config.json").write_text(json.dumps(config))
    for encoder, warned in ((trained["model"], 1), (str(real), 0)):
        caplog.clear()
        Scorer.from_checkpoint(trained["checkpoint"], encoder=encoder, device="cpu")
        assert sum("random test model" in r.getMessage() for r in caplog.records) == warned


def test_the_encoder_is_found_or_the_error_says_what_to_do(
    trained, small_world, tmp_path, hub_cache
) -> None:
    from asymvlm.data.tiny import save_tiny_clip

    # a moved checkpoint whose encoder folder moved too: say so, take --encoder
    moved = tmp_path / "adapter"
    shutil.copytree(trained["checkpoint"], moved)
    meta = json.loads((moved / "config.json").read_text())
    meta["encoder"]["model"] = str(tmp_path / "gone" / "tiny-clip")
    (moved / "config.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="encoder files .*gone/tiny-clip.* are not here"):
        Scorer.from_checkpoint(str(moved), device="cpu")
    scorer = Scorer.from_checkpoint(str(moved), encoder=trained["model"], device="cpu")
    assert scorer.caption_uncertainty(["a dog"]).kappa.shape == (1,)
    # other weights in the recorded folder: refused (the numbers would be another encoder's)
    other = tmp_path / "other-clip"
    save_tiny_clip(str(other), seed=1)
    meta["encoder"]["model"] = str(other)
    (moved / "config.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="differ from the ones the tables were embedded"):
        Scorer.from_checkpoint(str(moved), device="cpu")
    # a Hub encoder neither cached nor reachable: named before the library's retries
    hub = "openai/clip-vit-base-patch32"
    with pytest.raises(CheckpointError, match=f": the encoder '{hub}' is not in the Hugging Face"):
        Scorer.from_checkpoint(trained["checkpoint"], encoder=hub)
    argv = ["score-text", "--checkpoint", trained["checkpoint"], "--encoder", hub, "x"]
    assert cli_main(argv) == 2
    # an adapter of the synthetic world has no encoder to embed text with
    synthetic = str(tmp_path / "synthetic-adapter")
    argv = f"train --embeddings {small_world} --method clip --output {synthetic} --quiet"
    assert cli_main(argv.split()) == 0
    with pytest.raises(CheckpointError, match="without an encoder .*give the encoder"):
        Scorer.from_checkpoint(synthetic, device="cpu")


def test_the_logged_mlflow_models_give_the_numbers_of_score_text(trained, tmp_path) -> None:
    """A trial's adapter (runs:/) and text model give the Scorer's numbers."""
    import mlflow
    import pandas as pd
    from mlflow.exceptions import MlflowException

    from asymvlm.scoring.models import log_adapter_models

    uri = tracking.default_tracking_uri(str(tmp_path))
    run = tracking.open_run(uri, "e", "trial", kind="trial")
    run.log_metrics({"t2i_recall_at_1": 0.5, "val_i2t_spearman": -0.75, "rsum": 321, "loss": 1})
    assert log_adapter_models(run, trained["checkpoint"]) == ["adapter", "text-adapter"]
    run.end()
    config = export_adapter(f"runs:/{run.id}/adapter", str(tmp_path / "card"), tracking_uri=uri)
    assert config["source"]["mlflow_run_id"] == run.id and config["metrics"]["rsum"] == 321
    card = (tmp_path / "card" / "README.md").read_text()  # the run's numbers, with meanings
    assert f"MLflow run `{run.id}` (experiment `e`)" in card and "| loss |" not in card
    assert "| t2i_recall_at_1 | test | 0.5000 |" in card and "* `rsum`: RSUM" in card
    assert "| val_i2t_spearman | validation | -0.7500 |" in card
    want = trained["scorer"].caption_uncertainty(CAPTIONS)
    logged = Scorer.from_checkpoint(f"runs:/{run.id}/adapter", device="cpu", tracking_uri=uri)
    np.testing.assert_array_equal(logged.caption_uncertainty(CAPTIONS).kappa, want.kappa)
    with pytest.raises(CheckpointError, match="cannot download the model"):
        Scorer.from_checkpoint(f"runs:/{'0' * 32}/adapter", tracking_uri=uri)
    before = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(uri)
    try:
        model = mlflow.pyfunc.load_model(f"runs:/{run.id}/text-adapter")
    finally:
        mlflow.set_tracking_uri(before)
    got = model.predict(pd.DataFrame({"text": CAPTIONS}))
    assert list(got.columns) == ["uncertainty", "kappa"]
    np.testing.assert_allclose(got["kappa"], want.kappa, rtol=1e-6)
    np.testing.assert_allclose(got["uncertainty"], want.uncertainty, rtol=1e-6)
    with pytest.raises(MlflowException, match="row 1: empty"):
        model.predict(pd.DataFrame({"text": ["a dog", " "]}))


def test_score_text_from_the_exported_folder_and_the_hub(
    trained, hub_cache, monkeypatch, tmp_path, capsys
) -> None:
    folder = str(tmp_path / "exported")
    argv = ["export", "--checkpoint", trained["checkpoint"], "--output", folder]
    assert cli_main([*argv, "--repo", "someone/tiny"]) == 0

    def score_text(source: str) -> list[dict]:
        capsys.readouterr()
        assert cli_main(["score-text", "--checkpoint", source, "--device", "cpu", *CAPTIONS]) == 0
        return [json.loads(line) for line in capsys.readouterr().out.splitlines()]

    with serve_hub(monkeypatch) as hub:
        hub.add("someone/tiny", folder)
        expected = score_text(trained["checkpoint"])
        assert [r["text"] for r in expected] == CAPTIONS and all(r["kappa"] > 0 for r in expected)
        assert score_text(folder) == expected == score_text("hf-hub:someone/tiny")
        assert cli_main(["score-text", "--checkpoint", "hf-hub:someone/missing", "a dog"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "hf-hub:someone/missing: cannot download the model" in err[0]


@pytest.fixture(scope="module")
def served(trained):
    """The adapter deployed with Ray Serve on 127.0.0.1 (batching on); (url, port)."""
    from ray import serve

    from asymvlm_ray.schema import ServeConfig
    from asymvlm_ray.serving import check, deploy

    port = free_port()
    limits = dict(max_caption_chars=200, max_captions=50, max_batch_size=8)
    rest = dict(batch_wait_timeout_s=0.05, name="test-scorer", device="cpu")
    cfg = ServeConfig(checkpoint=trained["checkpoint"], port=port, **limits, **rest)
    assert check(cfg)["method"] == "asymvlm-vmf"
    try:
        yield deploy(cfg), port
    finally:
        serve.shutdown()


def test_serve_answers_the_numbers_of_the_scorer_over_http(trained, served) -> None:
    url, scorer = served[0], trained["scorer"]
    with urllib.request.urlopen(url + "/health", timeout=30) as response:
        health = json.loads(response.read())
    assert health == dict(status="ok", method="asymvlm-vmf", dim=24, encoder=trained["model"])
    # concurrent requests are batched together and each gets its own answers back
    many = [CAPTIONS] + [[f"caption number {i}", f"another caption {i}"] for i in range(11)]
    with ThreadPoolExecutor(12) as pool:
        answers = list(pool.map(lambda c: post_json(url + "/uncertainty", {"captions": c}), many))
    for sent, (status, body) in zip(many, answers, strict=True):
        assert status == 200 and [r["text"] for r in body["results"]] == sent
        want = scorer.caption_uncertainty(sent)
        np.testing.assert_allclose([r["kappa"] for r in body["results"]], want.kappa, rtol=1e-5)
        got = [r["uncertainty"] for r in body["results"]]
        np.testing.assert_allclose(got, want.uncertainty, rtol=1e-5)
    names = sorted(os.listdir(trained["images"]))[:2]
    raw = [open(os.path.join(trained["images"], n), "rb").read() for n in names]
    images = [base64.b64encode(b).decode() for b in raw]
    status, body = post_json(url + "/score", {"captions": CAPTIONS[:2], "images": images})
    assert status == 200
    np.testing.assert_allclose(body["scores"], scorer.score(raw, CAPTIONS[:2]), rtol=1e-4)


def test_serve_refuses_bad_requests_with_a_4xx_and_the_reason(served) -> None:
    not_an_image = base64.b64encode(b"GIF89a this is no image").decode()
    for route, payload, code, reason in [
        ("uncertainty", {"captions": ["a dog", ""]}, 400, "caption 1: empty"),
        ("uncertainty", {"captions": ["a", "x" * 201]}, 400, "caption 1: 201 characters"),
        ("uncertainty", {"captions": []}, 400, "no captions"),
        ("uncertainty", {"captions": ["a"] * 51}, 400, "51 captions; at most 50 a request"),
        ("uncertainty", {"captions": ["a dog", 3]}, 422, "captions"),
        ("uncertainty", {"text": "a dog"}, 422, "captions"),
        ("score", {"captions": ["a"], "images": [not_an_image]}, 400, "image 0: cannot be decoded"),
        ("score", {"captions": ["a dog"], "images": ["%%%"]}, 400, "image 0: not base64"),
    ]:
        status, body = post_json(f"{served[0]}/{route}", payload)
        assert status == code and reason in json.dumps(body), (payload, body)


def test_serve_refuses_a_bad_checkpoint_before_deploying(tmp_path, capsys) -> None:
    from pipelines.serve import main

    assert main(["--checkpoint", str(tmp_path / "nothing"), "--no-block"]) == 2
    assert "nothing: no such folder" in capsys.readouterr().err
    bad = tmp_path / "serve.yaml"
    bad.write_text(f"checkpoint: {tmp_path}\nreplica: 2\n")
    assert main(["--config", str(bad), "--no-block"]) == 2
    assert "replica: unknown key (did you mean 'replicas'?)" in capsys.readouterr().err


def test_serve_stops_its_own_app_on_sigterm(trained, served, ray_session, tmp_path) -> None:
    """On SIGTERM ``pipelines/serve.py`` deletes its own app only and exits with one line."""
    url, port = served
    env = {**os.environ, "RAY_ADDRESS": ray_session.get_runtime_context().gcs_address}
    script = os.path.join(os.path.dirname(os.path.dirname(__file__)), "pipelines", "serve.py")
    sets = [f"port={port}", "device=cpu", "name=sigterm", "route_prefix=/sigterm"]
    argv = [sys.executable, script, "--checkpoint", trained["checkpoint"]]
    argv += [a for s in sets for a in ("--set", s)]
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        # the signal comes as soon as the app answers: that can be before serve.run has
        # returned (the deployment still being watched), and it must end the same way there
        deadline = time.monotonic() + 120
        while post_json(f"{url}/sigterm/uncertainty", {"captions": ["a dog"]})[0] != 200:
            assert proc.poll() is None and time.monotonic() < deadline, "the app never answered"
            time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130 and "error: interrupted" in err, err
    assert "SIGTERM received" not in err
    printed = [line for line in out.splitlines() if line.strip()]
    assert len(printed) <= 1  # printed once deployed, if the signal came after that
    for line in printed:
        assert json.loads(line) == dict(url=f"{url}/sigterm", method="asymvlm-vmf", name="sigterm")
    assert post_json(f"{url}/uncertainty", {"captions": ["a dog"]})[0] == 200  # the other app


def test_curation_gives_the_kappa_of_the_scorer_score_and_serve(trained, served, tmp_path) -> None:
    """κ of a pool's captions (embedded by the job) equals the other three ways to 1e-6."""
    from asymvlm.curation import CurateConfig, curate

    texts = trained["texts"]
    (tmp_path / "pool").mkdir()
    pool = pa.table({"key": [str(i) for i in range(len(texts))], "caption": texts})
    pq.write_table(pool, tmp_path / "pool" / "00000.parquet")
    cfg = CurateConfig(
        pool=str(tmp_path / "pool"), checkpoint=trained["checkpoint"], output=str(tmp_path / "out")
    )
    assert curate(cfg).rows == len(texts)
    kappa = pq.read_table(tmp_path / "out" / "scores" / "00000.parquet")["kappa"].to_numpy()
    status, body = post_json(served[0] + "/uncertainty", {"captions": texts})
    assert status == 200
    np.testing.assert_allclose(kappa, trained["scorer"].caption_uncertainty(texts).kappa, rtol=1e-6)
    np.testing.assert_allclose(kappa, trained["scores"]["kappa"].to_numpy(), rtol=1e-6)
    np.testing.assert_allclose(kappa, [r["kappa"] for r in body["results"]], rtol=1e-6)
