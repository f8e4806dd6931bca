"""The served adapter (MLflow pyfunc): bad requests get HTTP 400 and a message, never NaN."""

from __future__ import annotations

import json
import math
import socket
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import pandas as pd
import pytest

from asymvlm import tracking
from asymvlm.checkpoints import load_checkpoint
from asymvlm.protocol import train
from asymvlm.scoring.models import CaptionUncertaintyModel, log_adapter_models
from asymvlm.training import TrainConfig

DIM = 16  # the small world's


@pytest.fixture(scope="module")
def checkpoint(small_world, tmp_path_factory) -> str:
    out = str(tmp_path_factory.mktemp("serve") / "ckpt")
    cfg = TrainConfig(
        method="asymvlm-vmf",
        epochs=1,
        lr=1e-3,
        optimizer="adamw",
        batch_size=128,
        hidden_dim=16,
        depth=1,
    )
    train(small_world, "train", cfg, output=out, progress=False)
    return out


def _adapter(folder: str) -> CaptionUncertaintyModel:
    model = CaptionUncertaintyModel()
    model.method, model.meta = load_checkpoint(folder)
    return model


def _frame(embedding, norm=8.0) -> pd.DataFrame:
    return pd.DataFrame({"embedding": [embedding], "norm": [norm]})


UNIT = list(np.eye(DIM)[0])


# -- predict() directly --------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("frame", "message"),
    [
        (_frame(UNIT[:8]), "row 0: 'embedding' has 8 values; this adapter expects dim 16"),
        (_frame([math.nan] + UNIT[1:]), "row 0: 'embedding' holds a NaN or infinite value"),
        (_frame([math.inf] + UNIT[1:]), "row 0: 'embedding' holds a NaN or infinite value"),
        (_frame(["a"] * DIM), "row 0: 'embedding' must be a list of 16 numbers"),
        (_frame(None), "row 0: 'embedding' has shape (); this adapter expects dim 16"),
        (_frame(UNIT, math.nan), "row 0: 'norm' must be a positive finite number, got nan"),
        (_frame(UNIT, -1.0), "row 0: 'norm' must be a positive finite number, got -1.0"),
        (_frame(UNIT, "big"), "row 0: 'norm' must be a positive finite number, got 'big'"),
        (pd.DataFrame({"embedding": [UNIT]}), "input needs a 'norm' column"),
        (pd.DataFrame({"text": ["a dog"]}), "input needs a 'embedding' column"),
        (pd.DataFrame({"embedding": [], "norm": []}), "input has no rows"),
    ],
)
def test_bad_input_is_an_invalid_parameter(checkpoint, frame, message) -> None:
    from mlflow.exceptions import MlflowException

    with pytest.raises(MlflowException) as err:
        _adapter(checkpoint).predict(None, frame)
    assert err.value.error_code == "INVALID_PARAMETER_VALUE"
    assert err.value.get_http_status_code() == 400
    assert err.value.message.startswith(message)


def test_the_bad_row_is_named(checkpoint) -> None:
    from mlflow.exceptions import MlflowException

    frame = pd.DataFrame({"embedding": [UNIT, UNIT, UNIT[:3]], "norm": [8.0, 8.0, 8.0]})
    with pytest.raises(MlflowException, match="^row 2: 'embedding' has 3 values"):
        _adapter(checkpoint).predict(None, frame)


def test_a_method_without_kappa_answers_null_not_nan(small_world, tmp_path) -> None:
    out = str(tmp_path / "clip")
    train(small_world, "train", TrainConfig(method="clip"), output=out, progress=False)
    result = _adapter(out).predict(None, _frame(UNIT))
    assert result.to_dict("records") == [{"uncertainty": None, "kappa": None}]


# -- through MLflow's scoring server ------------------------------------------------------------
@pytest.fixture(scope="module")
def server(checkpoint, tmp_path_factory):
    """The logged model served by MLflow's scoring app (uvicorn on a free local port)."""
    import mlflow
    import uvicorn
    from mlflow.pyfunc import scoring_server

    uri = tracking.default_tracking_uri(str(tmp_path_factory.mktemp("mlflow")))
    before = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(uri)
    run = tracking.open_run(uri, "serve", "trial", kind="trial")
    log_adapter_models(run, checkpoint)
    run.end()
    model = mlflow.pyfunc.load_model(f"runs:/{run.id}/adapter")
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    app = scoring_server.init(model)
    srv = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not srv.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.02)
    yield f"http://127.0.0.1:{port}/invocations"
    srv.should_exit = True
    thread.join(timeout=10)
    sock.close()
    mlflow.set_tracking_uri(before)


def _post(url: str, columns: list[str], rows: list[list]) -> tuple[int, dict]:
    body = json.dumps({"dataframe_split": {"columns": columns, "data": rows}}).encode()
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_served_good_request_gets_finite_numbers(server) -> None:
    status, body = _post(server, ["embedding", "norm"], [[UNIT, 8.0], [list(np.eye(DIM)[3]), 7.5]])
    assert status == 200
    rows = body["predictions"]
    assert len(rows) == 2
    for row in rows:
        assert math.isfinite(row["kappa"]) and row["kappa"] > 0
        assert row["uncertainty"] == pytest.approx(1.0 / row["kappa"], rel=1e-5)


def test_served_bad_input_is_a_400_naming_the_row(server) -> None:
    status, body = _post(server, ["embedding", "norm"], [[UNIT[:8], 8.0]])
    assert status == 400
    assert body["error_code"] == "INVALID_PARAMETER_VALUE"
    assert "row 0: 'embedding' has 8 values; this adapter expects dim 16" in body["message"]
    # Python's json writes NaN / Infinity tokens, which MLflow's server parses.
    for columns, row, message in (
        (["embedding", "norm"], [[math.nan] + UNIT[1:], 8.0], "holds a NaN or infinite value"),
        (["embedding", "norm"], [UNIT, math.inf], "'norm' must be a positive finite number"),
        (["embedding"], [UNIT], "norm"),
    ):
        status, body = _post(server, columns, [row])
        assert status == 400 and message in body["message"]
