"""Text in, uncertainty out: asymvlm.Scorer and `asymvlm score-text` against `asymvlm score` on
tables the embedding stage wrote with the same (tiny, random) CLIP."""

from __future__ import annotations

import json
import os
import shutil
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from asymvlm import tables
from asymvlm.cli import main as cli_main
from asymvlm.errors import CheckpointError
from tests.helpers import hierarcaps_subset, requires_hierarcaps

pytestmark = [requires_hierarcaps, pytest.mark.slow]


@pytest.fixture(scope="module")
def trained(ray_session, tmp_path_factory) -> dict[str, str]:
    """Tables embedded by `asymvlm embed` with a tiny CLIP, and an adapter trained on them."""
    from asymvlm.data.tiny import save_tiny_clip

    base = tmp_path_factory.mktemp("scoring")
    model = save_tiny_clip(str(base / "tiny-clip"))
    csv, images = hierarcaps_subset(base / "hc", n=8)
    root = str(base / "tables")
    assert (
        cli_main(
            (
                f"embed --dataset hierarcaps --annotations {csv} --images {images} --model "
                f"{model} --split test --output {root} --batch-size 8"
            ).split()
        )
        == 0
    )
    checkpoint = str(base / "adapter")
    assert (
        cli_main(
            (
                f"train --embeddings {root} --split test --method asymvlm-vmf --epochs 3 "
                f"--optimizer adamw --lr 1e-2 --output {checkpoint} --quiet"
            ).split()
        )
        == 0
    )
    scores = str(base / "scores.parquet")
    assert (
        cli_main(
            (
                f"score --embeddings {root} --split test --checkpoint {checkpoint} "
                f"--output {scores} --quiet"
            ).split()
        )
        == 0
    )
    return {
        "model": model,
        "tables": root,
        "checkpoint": checkpoint,
        "scores": scores,
        "images": images,
        "base": str(base),
    }


def _table_captions(trained: dict[str, str]) -> tuple[list[str], pa.Table]:
    split = tables.read_split(trained["tables"], "test")
    scores = pq.read_table(trained["scores"])
    assert scores.column("caption_id").to_pylist() == list(split.caption_ids)
    return list(split.texts), scores


def test_the_checkpoint_records_the_encoder_of_its_tables(trained) -> None:
    meta = json.load(open(os.path.join(trained["checkpoint"], "config.json")))
    manifest = tables.read_manifest(trained["tables"]).to_dict()
    assert meta["encoder"] == {
        "model": trained["model"],
        "revision": None,
        "family": "clip",
        "files_sha256": manifest["files_sha256"],
        "dim": 24,
    }
    assert len(meta["encoder"]["files_sha256"]) == 64


def test_scorer_gives_the_numbers_of_asymvlm_score_on_embedded_tables(trained) -> None:
    from asymvlm import Scorer

    texts, scores = _table_captions(trained)
    scorer = Scorer.from_checkpoint(trained["checkpoint"], device="cpu", batch_size=5)
    out = scorer.caption_uncertainty(texts)
    np.testing.assert_allclose(out.kappa, scores.column("kappa").to_numpy(), rtol=2e-5)
    np.testing.assert_allclose(out.uncertainty, scores.column("uncertainty").to_numpy(), rtol=2e-5)
    np.testing.assert_allclose(np.linalg.norm(out.mu, axis=1), 1.0, atol=1e-5)
    assert out.kappa.shape == (len(texts),) and (out.kappa > 0).all()
    # a longer, more specific caption is another caption: its own kappa
    two = scorer.caption_uncertainty(["a dog", "a golden retriever catching a red frisbee"])
    assert two.kappa[0] != two.kappa[1]
    assert [r["text"] for r in two.records()] == [
        "a dog",
        "a golden retriever catching a red frisbee",
    ]
    np.testing.assert_allclose(
        [r["uncertainty"] for r in two.records()], 1.0 / two.kappa, rtol=1e-6
    )


def test_scorer_scores_images_against_captions_as_the_tables_do(trained) -> None:
    from asymvlm import Scorer
    from asymvlm.checkpoints import load_checkpoint
    from asymvlm.splits import load_split

    split = tables.read_split(trained["tables"], "test")
    files = {os.path.splitext(name)[0]: name for name in os.listdir(trained["images"])}
    paths = [os.path.join(trained["images"], files[i]) for i in split.image_ids]
    scorer = Scorer.from_checkpoint(trained["checkpoint"], device="cpu")
    got = scorer.score(paths, list(split.texts))
    method, meta = load_checkpoint(trained["checkpoint"], "cpu")
    data = load_split(trained["tables"], "test", meta["adapter_input"], "cpu")
    images, texts = method.split_inputs(data)
    with torch.no_grad():
        want = method.score(method.encode_texts(texts), method.encode_images(images)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)
    # images as bytes give the same; bytes that are no image are refused by position
    raw = [open(p, "rb").read() for p in paths[:2]]
    np.testing.assert_allclose(
        scorer.score(raw, ["a dog"]), scorer.score(paths[:2], ["a dog"]), rtol=1e-6
    )
    from asymvlm.scoring import ScoringInputError

    with pytest.raises(ScoringInputError, match="image 1: cannot be decoded"):
        scorer.score([raw[0], b"not an image"], ["a dog"])


def test_score_text_prints_one_json_object_per_caption(trained, capsys) -> None:
    from asymvlm import Scorer

    captions = ["a dog", "a golden retriever catching a red frisbee", "a photo"]
    code = cli_main(
        ["score-text", "--checkpoint", trained["checkpoint"], "--device", "cpu", *captions]
    )
    assert code == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [sorted(r) for r in lines] == [["kappa", "text", "uncertainty"]] * 3
    want = Scorer.from_checkpoint(trained["checkpoint"], device="cpu").caption_uncertainty(captions)
    assert [r["text"] for r in lines] == captions
    np.testing.assert_allclose([r["kappa"] for r in lines], want.kappa, rtol=1e-6)


def test_score_text_files_to_parquet_equal_asymvlm_score(trained, tmp_path) -> None:
    texts, scores = _table_captions(trained)
    txt = tmp_path / "captions.txt"
    txt.write_text("\n".join(texts) + "\n\n")  # trailing blank lines are no captions
    out = tmp_path / "out" / "scored.parquet"
    assert (
        cli_main(
            (
                f"score-text --checkpoint {trained['checkpoint']} --device cpu --input "
                f"{txt} --output {out} --batch-size 4 --quiet"
            ).split()
        )
        == 0
    )
    table = pq.read_table(out)
    assert table.column("text").to_pylist() == texts
    np.testing.assert_allclose(
        table.column("kappa").to_numpy(), scores.column("kappa").to_numpy(), rtol=2e-5
    )
    parquet = tmp_path / "captions.parquet"
    pq.write_table(pa.table({"caption": texts}), parquet)
    out2 = tmp_path / "scored2.parquet"
    assert (
        cli_main(
            (
                f"score-text --checkpoint {trained['checkpoint']} --device cpu --input "
                f"{parquet} --column caption --output {out2} --quiet"
            ).split()
        )
        == 0
    )
    again = pq.read_table(out2)  # another batch size: the same numbers to float32 rounding
    assert again.column("text").to_pylist() == texts
    for name in ("kappa", "uncertainty"):
        np.testing.assert_allclose(
            again.column(name).to_numpy(), table.column(name).to_numpy(), rtol=1e-6
        )


def test_bad_captions_are_named_and_nothing_is_left_half_written(trained, tmp_path, capsys) -> None:
    ck = trained["checkpoint"]
    assert cli_main(["score-text", "--checkpoint", ck, "--device", "cpu", "a dog", " "]) == 2
    assert "error: caption 1: empty" in capsys.readouterr().err
    txt = tmp_path / "c.txt"
    txt.write_text("a dog\na cat\n\na bird\n")
    out = tmp_path / "o.parquet"
    assert (
        cli_main(
            ["score-text", "--checkpoint", ck, "--input", str(txt), "--output", str(out), "--quiet"]
        )
        == 2
    )
    assert f"{txt} line 3: empty caption" in capsys.readouterr().err
    assert not out.exists() and not os.path.exists(str(out) + ".tmp")
    parquet = tmp_path / "c.parquet"
    pq.write_table(pa.table({"text": ["a dog", None]}), parquet)
    assert cli_main(["score-text", "--checkpoint", ck, "--input", str(parquet), "--quiet"]) == 2
    assert f"{parquet} row 1: 'text' is not a caption (None)" in capsys.readouterr().err
    assert (
        cli_main(["score-text", "--checkpoint", ck, "--input", str(parquet), "--column", "caption"])
        == 2
    )
    assert "no column 'caption' (columns: text)" in capsys.readouterr().err
    assert cli_main(["score-text", "--checkpoint", ck]) == 2
    assert "give captions on the command line or --input FILE" in capsys.readouterr().err


def test_the_encoder_is_found_or_the_error_says_what_to_do(trained, small_world, tmp_path) -> None:
    from asymvlm import Scorer

    # a moved checkpoint whose encoder folder moved too: say so, take --encoder
    moved = tmp_path / "adapter"
    shutil.copytree(trained["checkpoint"], moved)
    meta = json.loads((moved / "config.json").read_text())
    meta["encoder"]["model"] = str(tmp_path / "gone" / "tiny-clip")
    (moved / "config.json").write_text(json.dumps(meta))
    with pytest.raises(
        CheckpointError, match="encoder files .*gone/tiny-clip.* are not here: give their new place"
    ):
        Scorer.from_checkpoint(str(moved), device="cpu")
    scorer = Scorer.from_checkpoint(str(moved), encoder=trained["model"], device="cpu")
    assert scorer.caption_uncertainty(["a dog"]).kappa.shape == (1,)
    # other weights in the recorded folder: refused (the numbers would be another encoder's)
    other = tmp_path / "other-clip"
    shutil.copytree(trained["model"], other)
    from asymvlm.data.tiny import save_tiny_clip

    save_tiny_clip(str(other), seed=1)
    meta["encoder"]["model"] = str(other)
    (moved / "config.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="differ from the ones the tables were embedded"):
        Scorer.from_checkpoint(str(moved), device="cpu")
    # an adapter of the synthetic world has no encoder to embed text with
    synthetic = tmp_path / "synthetic-adapter"
    assert (
        cli_main(
            (
                f"train --embeddings {small_world} --split train --method asymvlm-vmf "
                f"--epochs 1 --output {synthetic} --quiet"
            ).split()
        )
        == 0
    )
    with pytest.raises(CheckpointError, match="without an encoder .*give the encoder"):
        Scorer.from_checkpoint(str(synthetic), device="cpu")
    assert cli_main(["score-text", "--checkpoint", str(synthetic), "a dog"]) == 2


def test_a_hub_encoder_that_cannot_be_had_is_named_at_once(trained, hub_cache) -> None:
    """Neither cached nor reachable (the Hub is a closed port): the scorer says so before
    the encoder library's retries (score-text: exit 2 with that line)."""
    from asymvlm import Scorer

    with pytest.raises(
        CheckpointError,
        match=r": the encoder 'openai/clip-vit-base-patch32' "
        r"is not in the Hugging Face cache .* the Hub cannot be asked",
    ):
        Scorer.from_checkpoint(trained["checkpoint"], encoder="openai/clip-vit-base-patch32")
    assert (
        cli_main(
            [
                "score-text",
                "--checkpoint",
                trained["checkpoint"],
                "--encoder",
                "openai/clip-vit-base-patch32",
                "a dog",
            ]
        )
        == 2
    )


def test_a_logged_mlflow_model_is_a_checkpoint_source(trained, tmp_path) -> None:
    from asymvlm import Scorer, tracking
    from asymvlm.scoring.models import log_adapter_models

    uri = tracking.default_tracking_uri(str(tmp_path))
    run = tracking.open_run(uri, "e", "trial", kind="trial")
    log_adapter_models(run, trained["checkpoint"])
    run.end()
    captions = ["a dog", "a red car"]
    local = Scorer.from_checkpoint(trained["checkpoint"], device="cpu")
    logged = Scorer.from_checkpoint(f"runs:/{run.id}/adapter", device="cpu", tracking_uri=uri)
    np.testing.assert_array_equal(
        logged.caption_uncertainty(captions).kappa, local.caption_uncertainty(captions).kappa
    )
    with pytest.raises(CheckpointError, match="cannot download the model"):
        Scorer.from_checkpoint(f"runs:/{'0' * 32}/adapter", tracking_uri=uri)


# -- Ray Serve ----------------------------------------------------------------------------------
def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(url: str, payload: Any) -> tuple[int, Any]:
    import urllib.error
    import urllib.request

    request = urllib.request.Request(
        url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"null")


@pytest.fixture(scope="module")
def served(trained):
    """The demo-like adapter deployed with Ray Serve on 127.0.0.1 (batching on)."""
    from ray import serve

    from pipelines.schema import ServeConfig
    from pipelines.serving import check, deploy

    cfg = ServeConfig(
        checkpoint=trained["checkpoint"],
        device="cpu",
        port=_free_port(),
        name="test-scorer",
        max_caption_chars=200,
        max_captions=50,
        max_batch_size=8,
        batch_wait_timeout_s=0.05,
    )
    assert check(cfg)["method"] == "asymvlm-vmf"
    url = deploy(cfg)
    try:
        yield url
    finally:
        serve.shutdown()


def test_serve_answers_the_numbers_of_the_scorer_over_http(trained, served) -> None:
    import urllib.request
    from concurrent.futures import ThreadPoolExecutor

    from asymvlm import Scorer

    with urllib.request.urlopen(served + "/health", timeout=30) as response:
        health = json.loads(response.read())
    assert health == {
        "status": "ok",
        "method": "asymvlm-vmf",
        "dim": 24,
        "encoder": trained["model"],
    }
    scorer = Scorer.from_checkpoint(trained["checkpoint"], device="cpu")
    captions = ["a dog", "a golden retriever catching a red frisbee", "a red bus"]
    status, body = _post(served + "/uncertainty", {"captions": captions})
    assert status == 200
    want = scorer.caption_uncertainty(captions).records()
    assert [r["text"] for r in body["results"]] == captions
    for got, ref in zip(body["results"], want, strict=True):
        assert got["kappa"] == pytest.approx(ref["kappa"], rel=1e-5)
        assert got["uncertainty"] == pytest.approx(ref["uncertainty"], rel=1e-5)
    # concurrent requests are batched together and each gets its own answers back
    many = [[f"caption number {i}", f"another caption {i}"] for i in range(12)]
    with ThreadPoolExecutor(12) as pool:
        answers = list(pool.map(lambda c: _post(served + "/uncertainty", {"captions": c}), many))
    for sent, (status, body) in zip(many, answers, strict=True):
        assert status == 200 and [r["text"] for r in body["results"]] == sent
        ref = scorer.caption_uncertainty(sent).kappa
        np.testing.assert_allclose([r["kappa"] for r in body["results"]], ref, rtol=1e-5)
    # images in base64: the scorer's log-likelihoods
    import base64

    names = sorted(os.listdir(trained["images"]))[:2]
    raw = [open(os.path.join(trained["images"], n), "rb").read() for n in names]
    status, body = _post(
        served + "/score",
        {"captions": captions[:2], "images": [base64.b64encode(b).decode() for b in raw]},
    )
    assert status == 200
    np.testing.assert_allclose(body["scores"], scorer.score(raw, captions[:2]), rtol=1e-4)


def test_serve_refuses_bad_requests_with_a_4xx_and_the_reason(served) -> None:
    import base64

    cases = [
        ({"captions": ["a dog", ""]}, 400, "caption 1: empty"),
        ({"captions": ["a dog", "x" * 201]}, 400, "caption 1: 201 characters; at most 200"),
        ({"captions": []}, 400, "no captions"),
        ({"captions": ["a"] * 51}, 400, "51 captions; at most 50 a request"),
        ({"captions": ["a dog", 3]}, 422, "captions"),
        ({"text": "a dog"}, 422, "captions"),
    ]
    for payload, code, reason in cases:
        status, body = _post(served + "/uncertainty", payload)
        assert status == code, (payload, body)
        assert reason in json.dumps(body), (payload, body)
    not_an_image = base64.b64encode(b"GIF89a this is no image").decode()
    status, body = _post(served + "/score", {"captions": ["a dog"], "images": [not_an_image]})
    assert status == 400 and "image 0: cannot be decoded" in body["detail"]
    status, body = _post(served + "/score", {"captions": ["a dog"], "images": ["%%%"]})
    assert status == 400 and body["detail"] == "image 0: not base64"
    # still serving after the bad requests
    assert _post(served + "/uncertainty", {"captions": ["a dog"]})[0] == 200


def test_serve_refuses_a_bad_checkpoint_before_deploying(tmp_path, capsys) -> None:
    from pipelines.serve import main

    assert main(["--checkpoint", str(tmp_path / "nothing"), "--no-block"]) == 2
    assert "not a checkpoint folder (no config.json)" in capsys.readouterr().err
    bad = tmp_path / "serve.yaml"
    bad.write_text(f"checkpoint: {tmp_path}\nreplica: 2\n")
    assert main(["--config", str(bad), "--no-block"]) == 2
    assert "replica: unknown key (did you mean 'replicas'?)" in capsys.readouterr().err


def test_serve_stops_cleanly_on_sigterm(trained, tmp_path) -> None:
    """`python pipelines/serve.py` serves until Ctrl-C or SIGTERM, then takes the app down and
    exits with one line (no fatal-signal stack dump from Ray)."""
    import signal
    import subprocess
    import sys
    import time
    import urllib.request

    port = _free_port()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # its own local Ray
    proc = subprocess.Popen(
        [
            sys.executable,
            os.path.join(root, "pipelines", "serve.py"),
            "--checkpoint",
            trained["checkpoint"],
            "--set",
            f"port={port}",
            "--set",
            "device=cpu",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=str(tmp_path),
    )
    try:
        # the signal comes as soon as the app answers: that can be before serve.run has
        # returned (the deployment still being watched), and it must end the same way there
        deadline = time.monotonic() + 90
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                    assert json.loads(r.read())["status"] == "ok"
                break
            except OSError:
                assert time.monotonic() < deadline, "the app never answered"
                time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130
    assert "error: interrupted" in err and "SIGTERM received" not in err
    assert "Started Serve" not in err  # Serve's INFO lines only with --verbose
    printed = [line for line in out.splitlines() if line.strip()]
    assert len(printed) <= 1  # printed once deployed, if the signal came after that; nothing
    # else on stdout (taking down all of Serve printed a failed-task line of Ray's there)
    for line in printed:
        assert json.loads(line) == {
            "url": f"http://127.0.0.1:{port}",
            "method": "asymvlm-vmf",
            "name": "asymvlm-scorer",
        }


def test_the_mlflow_text_model_gives_the_numbers_of_score_text(trained, tmp_path) -> None:
    """The text-input model a trial logs beside the embedding-input one: captions in, the
    Scorer's kappa and uncertainty out; a bad caption is an MlflowException naming the row."""
    import mlflow
    import pandas as pd
    from mlflow.exceptions import MlflowException

    from asymvlm import Scorer, tracking
    from asymvlm.scoring.models import log_adapter_models

    uri = tracking.default_tracking_uri(str(tmp_path))
    run = tracking.open_run(uri, "e", "trial", kind="trial")
    log_adapter_models(run, trained["checkpoint"])  # embeddings in, and captions in
    run.end()
    mlflow.set_tracking_uri(uri)
    model = mlflow.pyfunc.load_model(f"runs:/{run.id}/text-adapter")
    assert model.metadata.get_input_schema().input_names() == ["text"]
    captions = ["a dog", "a golden retriever catching a red frisbee", "a red bus"]
    got = model.predict(pd.DataFrame({"text": captions}))
    want = Scorer.from_checkpoint(trained["checkpoint"], device="cpu").caption_uncertainty(captions)
    assert list(got.columns) == ["uncertainty", "kappa"]
    np.testing.assert_allclose(got["kappa"], want.kappa, rtol=1e-6)
    np.testing.assert_allclose(got["uncertainty"], want.uncertainty, rtol=1e-6)
    with pytest.raises(MlflowException, match="row 1: empty"):
        model.predict(pd.DataFrame({"text": ["a dog", " "]}))
    with pytest.raises(MlflowException, match=r"missing inputs \['text'\]"):  # its schema
        model.predict(pd.DataFrame({"caption": ["a dog"]}))


def test_the_text_model_served_by_mlflow_answers_over_http(trained, tmp_path) -> None:
    """`mlflow models serve`'s app (in process, on 127.0.0.1) with the text model: captions in
    a JSON request, the Scorer's numbers out; an empty caption is a 400 naming the row."""
    import socket
    import threading
    import time

    import mlflow
    import uvicorn
    from mlflow.pyfunc import scoring_server

    from asymvlm import Scorer, tracking
    from asymvlm.scoring.models import log_adapter_models

    uri = tracking.default_tracking_uri(str(tmp_path))
    run = tracking.open_run(uri, "e", "trial", kind="trial")
    log_adapter_models(run, trained["checkpoint"])
    run.end()
    before = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(uri)
    try:
        model = mlflow.pyfunc.load_model(f"runs:/{run.id}/text-adapter")
    finally:
        mlflow.set_tracking_uri(before)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}/invocations"
    server = uvicorn.Server(uvicorn.Config(scoring_server.init(model), log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
            time.sleep(0.02)
        captions = ["a dog", "a red bus"]
        status, body = _post(url, {"dataframe_records": [{"text": c} for c in captions]})
        assert status == 200
        want = Scorer.from_checkpoint(trained["checkpoint"], device="cpu")
        want = want.caption_uncertainty(captions)
        np.testing.assert_allclose([r["kappa"] for r in body["predictions"]], want.kappa, rtol=1e-6)
        status, body = _post(url, {"dataframe_records": [{"text": "a dog"}, {"text": ""}]})
        assert status == 400 and body["error_code"] == "INVALID_PARAMETER_VALUE"
        assert "row 1: empty" in body["message"]
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()
