"""A tracking store that goes away for longer than the client's retries (shortened here: none):
inside ``outage_queue`` the writes wait, in order, and land when it is back; a write that is
wrong in itself still raises; outside it an outage raises."""

from __future__ import annotations

import threading
import time
import types
from pathlib import Path

import pandas as pd
import pytest
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException

from asymvlm import tracking
from asymvlm.tracking.writer import is_transient, writer
from tests.helpers import free_port


@pytest.fixture(autouse=True)
def short_retries(monkeypatch):
    """No retry, no backoff: a stopped server is seen at once."""
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "60")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """MLflow's tracking server in this process, restartable on the same port and database."""
    from mlflow import server as mlflow_server
    from werkzeug.serving import make_server

    root, port = tmp_path_factory.mktemp("mlflow-server"), free_port()
    one = types.SimpleNamespace(uri=f"http://127.0.0.1:{port}")

    def start() -> None:
        one.http = make_server("127.0.0.1", port, mlflow_server.app, threaded=True)
        threading.Thread(target=one.http.serve_forever, daemon=True).start()

    def stop() -> None:
        one.http.shutdown()
        one.http.server_close()

    one.start, one.stop = start, stop
    with pytest.MonkeyPatch.context() as env:
        env.setenv(mlflow_server.BACKEND_STORE_URI_ENV_VAR, f"sqlite:///{root / 'db'}")
        env.setenv(mlflow_server.SERVE_ARTIFACTS_ENV_VAR, "true")
        env.setenv(mlflow_server.ARTIFACT_ROOT_ENV_VAR, "mlflow-artifacts:/")
        env.setenv(mlflow_server.ARTIFACTS_DESTINATION_ENV_VAR, str(root / "art"))
        start()
        with tracking.outage_queue(drain_s=0):
            yield one
        stop()


def _history(client, run_id: str, key: str) -> list[tuple[int, float]]:
    return [(m.step, m.value) for m in client.get_metric_history(run_id, key)]


class Doubler:  # its input times the factor in its file
    def __init__(self, path: str) -> None:
        self.factor = float(Path(path).read_text())

    def predict(self, model_input, params=None):
        return model_input * self.factor


def _load_pyfunc(data_path: str) -> Doubler:  # this module is the logged model's loader
    return Doubler(data_path)


def test_failures_of_the_store_are_told_from_wrong_writes() -> None:
    """Only the errors' types decide, never a logged value quoted in a message ("timeout")."""
    import sqlite3

    import sqlalchemy
    from mlflow.exceptions import RestException
    from mlflow.protos.databricks_pb2 import TEMPORARILY_UNAVAILABLE

    with pytest.raises(MlflowException) as refused:
        MlflowClient(f"http://127.0.0.1:{free_port()}").get_experiment_by_name("e")
    assert is_transient(refused.value)
    # how MLflow's SQL stores raise a locked database (the statement's values follow)
    locked_db = sqlite3.OperationalError("database is locked")
    database = sqlalchemy.exc.OperationalError("INSERT INTO p VALUES (?)", ("timeout",), locked_db)
    locked = MlflowException(str(database), error_code=TEMPORARILY_UNAVAILABLE)
    locked.__cause__ = database
    assert is_transient(locked)
    wrong = {"error_code": "INVALID_PARAMETER_VALUE", "message": "Param key='timeout' timed out"}
    assert not is_transient(RestException(wrong))
    assert not is_transient(sqlite3.OperationalError("no such table: runs"))


def test_writes_to_an_unreachable_store_wait_in_order(caplog) -> None:
    """Outside the queue an outage raises; inside, writes wait in order; the rest is dropped."""
    dead = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(MlflowException, match="Connection refused"):
        tracking.open_run(dead, "e", "trial", kind="trial")
    with tracking.outage_queue(drain_s=0):
        sweep = tracking.open_run(dead, "e", "sweep", kind="sweep", params={"seeds": 2})
        trial = tracking.open_run(dead, "e", "trial", kind="trial", parent=sweep)
        trial.log_metrics({"loss": 1.0}, step=1)
        trial.log_json("results.json", {"r1": 0.5})
        trial.end("FAILED", "diverged")
        assert (sweep.id, trial.id) == (None, None)
        ops = "create_run log_batch create_run log_batch log_artifact log_batch set_terminated"
        assert [op["op"] for op in writer(dead).queue] == ops.split()
        [copy] = [op["path"] for op in writer(dead).queue if op["op"] == "log_artifact"]
        assert Path(copy).read_text().startswith("{")
    assert tracking.pending() == 0 and "7 tracking writes never reached" in caplog.text
    assert not Path(copy).exists()


@pytest.mark.slow
def test_an_outage_longer_than_the_retries_is_bridged(server, tmp_path) -> None:
    """Metrics, tags, an artifact, a model (its file gone by then), a new run and the ends written
    while the server is down return at once; back on the same port and database, ``drain`` lands
    them in order, the new run under its parent, at the times of the calls."""
    import mlflow

    sweep = tracking.open_run(server.uri, "outage", "sweep", kind="sweep")
    trial = tracking.open_run(
        server.uri, "outage", "t", kind="trial", parent=sweep, params={"lr": 0.1}
    )
    trial.log_metrics({"loss": 1.0}, step=1)
    assert tracking.pending() == 0  # nothing waited so far

    server.stop()
    began = time.monotonic()
    for epoch in (2, 3):
        trial.log_metrics({"loss": 1.0 / epoch}, step=epoch)
    trial.set_tags({"stage": "grid"})
    trial.log_text("notes.txt", "written during the outage")
    factor = tmp_path / "factor.txt"
    factor.write_text("3")
    trial.log_model("adapter", __name__, str(factor), pip_requirements=[])
    factor.unlink()  # a copy waits
    late = tracking.open_run(server.uri, "outage", "late", kind="trial", parent=sweep)
    for run in (trial, late, sweep):
        run.end("FINISHED")
    before_end = int(1000 * time.time())
    assert time.monotonic() - began < 30  # no write waited for the server
    assert late.id is None and tracking.pending() == 9
    assert tracking.drain(0) == 9  # still down

    server.start()
    assert tracking.drain(120) == 0 and late.id is not None
    client = MlflowClient(server.uri)
    assert _history(client, trial.id, "loss") == [(e, 1.0 / e) for e in (1, 2, 3)]
    got = client.get_run(trial.id)
    assert got.data.tags["stage"] == "grid" and got.data.params == {"lr": "0.1"}
    assert got.info.end_time <= before_end  # when end() was called, not when it landed
    notes = tracking.download(f"runs:/{trial.id}/notes.txt", server.uri)
    assert Path(notes).read_text() == "written during the outage"
    assert [client.get_run(r.id).info.status for r in (sweep, trial, late)] == ["FINISHED"] * 3
    assert client.get_run(late.id).data.tags["mlflow.parentRunId"] == sweep.id
    with tracking.global_tracking_uri(server.uri):
        model = mlflow.pyfunc.load_model(f"runs:/{trial.id}/adapter")
    assert model.predict(pd.DataFrame({"x": [1.0, 2.0]}))["x"].tolist() == [3.0, 6.0]


@pytest.mark.slow
def test_a_wrong_write_still_raises_while_the_server_is_up(server) -> None:
    """A write the store refuses raises at once; an ended run can be resumed."""
    with pytest.raises(MlflowException, match="RESOURCE_DOES_NOT_EXIST"):
        tracking.resume_run(server.uri, "0" * 32)
    run = tracking.open_run(server.uri, "wrong", "trial", kind="trial", params={"lr": 0.1})
    with pytest.raises(MlflowException, match="INVALID_PARAMETER_VALUE"):
        run.log_params({"lr": 0.2})
    assert tracking.pending() == 0
    run.end()
    client, again = MlflowClient(server.uri), tracking.resume_run(server.uri, run.id)
    assert (again.id, again.ended, client.get_run(run.id).info.status) == (run.id, False, "RUNNING")
    again.log_metrics({"loss": 0.1}, step=7)
    again.end()
    assert client.get_run(run.id).info.status == "FINISHED"
    assert _history(client, run.id, "loss") == [(7, 0.1)]
