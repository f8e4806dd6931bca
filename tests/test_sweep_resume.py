"""A sweep that stops part-way goes on where it stopped: its journal (finished trials read back,
unfinished ones from their latest checkpoint), every epoch in MLflow once, the same results as
a sweep that never stopped; trials that wait for a node too long end the sweep, naming them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
import yaml

from asymvlm import errors, results, tracking
from asymvlm.synthetic import write_world
from tests.conftest import small_world_config

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("resume-world") / "tables"
    return write_world(str(root), small_world_config(splits={"train": 400, "val": 80, "test": 80}))


def _sweep_doc(world: str, output: str, **extra) -> dict:
    return {
        "name": "rs",
        "embeddings": world,
        "output": output,
        "methods": ["asymvlm-vmf"],
        "lr": [1e-3, 1e-2],
        "seeds": [0, 1],
        "epochs": 4,
        "batch_size": 128,
        "optimizer": "adamw",
        "hidden_dim": 32,
        "checkpoint_every": 1,
        "val_split": "val",
        "mlflow": {"experiment": "rs"},
        **extra,
    }


def _records(output: str) -> dict[str, dict]:
    folder = os.path.join(output, "journal", "trials")
    if not os.path.isdir(folder):
        return {}
    out = {}
    for name in os.listdir(folder):
        if name.endswith(".json") and not name.startswith("."):
            with open(os.path.join(folder, name)) as fh:
                out[name[: -len(".json")]] = json.load(fh)
    return out


@pytest.mark.slow
def test_a_sweep_killed_part_way_goes_on_where_it_stopped(world, tmp_path, one_thread) -> None:
    """The driver (and the local Ray it started) killed while one grid trial has finished and
    the other holds after its checkpoint of epoch 2; the same command again reads the finished
    one back, trains the other on from epoch 2, runs stage 2, and lands what a sweep that never
    stopped would: each trial's results equal to its run straight through, one MLflow run per
    trial with every epoch once."""
    from asymvlm.protocol import run_protocol
    from pipelines.schema import sweep_config
    from pipelines.tuning.sweep import select_lr

    output = str(tmp_path / "out")
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(_sweep_doc(world, output)))
    command = [sys.executable, os.path.join(REPO, "pipelines", "sweep.py"), "--config", str(path)]
    marker = tmp_path / "paused"
    env = {
        **os.environ,
        "ASYMVLM_FAULT_INJECTION": f"epoch=2,action=pause,seconds=600,marker={marker}",
    }
    with open(tmp_path / "first.log", "w") as log:
        first = subprocess.Popen(
            command, cwd=REPO, env=env, stdout=log, stderr=log, start_new_session=True
        )
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            records = _records(output)
            finished = [r for r in records.values() if "final" in r]
            held = [r for r in records.values() if "final" not in r and r.get("epoch") == 2]
            if marker.exists() and finished and held:
                break
            assert first.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
            time.sleep(1)
        else:
            pytest.fail("the first run never got there: " + (tmp_path / "first.log").read_text())
    finally:
        os.killpg(first.pid, signal.SIGKILL)  # the driver and the Ray it started
        first.wait()
    assert not os.path.exists(os.path.join(output, "sweep.json"))

    again = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-4000:]
    assert "1 finished trial(s) read back, 1 go on from their checkpoints" in again.stderr
    assert "goes on from the checkpoint an earlier run left" in again.stderr
    with open(os.path.join(output, "sweep.json")) as fh:
        record = json.load(fh)

    # One MLflow run per trial, every epoch once, all FINISHED, under the one sweep run.
    from mlflow import MlflowClient

    client = MlflowClient(tracking.default_tracking_uri(output))
    runs = tracking.child_runs(client.tracking_uri, record["parent_run_id"], status="")
    labels = sorted(r.data.tags["trial"] for r in runs)
    assert labels == [
        "grid-asymvlm-vmf-lr0.001-seed0",
        "grid-asymvlm-vmf-lr0.01-seed0",
        "seeds-asymvlm-vmf-lr0.01-seed1",
    ]
    for run in runs:
        assert run.info.status == "FINISHED"
        steps = [m.step for m in client.get_metric_history(run.info.run_id, "train_loss")]
        assert sorted(steps) == [1, 2, 3, 4], (run.data.tags["trial"], steps)
    sweeps = client.search_runs([runs[0].info.experiment_id], "tags.kind = 'sweep'")
    assert [r.info.status for r in sweeps] == ["FINISHED"]

    # The same results as runs straight through, and the summary and selection made of them.
    sweep = sweep_config(_sweep_doc(world, output))
    rows = {}
    for label, rec in _records(output).items():
        trial = rec["trial"]
        straight = run_protocol(sweep.run_spec(trial["method"], trial["lr"], trial["seed"]))
        for split in ("val", "test"):
            assert rec["final"]["outcome"][split] == json.loads(json.dumps(straight[split])), label
        rows[label] = rec["final"]
    grid = [r for label, r in rows.items() if label.startswith("grid")]
    assert {m: p["lr"] for m, p in record["selection"].items()} == {
        m: p["lr"] for m, p in select_lr(grid).items()
    }
    seeds = [r for r in rows.values() if r["lr"] == record["selection"]["asymvlm-vmf"]["lr"]]
    flat = [
        {
            "method": r["method"],
            "seed": r["seed"],
            **results.retrieval_metric_names(r["outcome"]["test"]),
        }
        for r in seeds
    ]
    assert record["summary"] == json.loads(json.dumps(results.seed_summary(flat)))


def test_trials_that_wait_too_long_for_a_node_end_the_sweep_naming_them(
    ray_session, world, tmp_path
) -> None:
    """A trial no node can take (4 CPUs asked on a 2-CPU cluster) waits; after node_wait_s the
    sweep ends with Unfinished (exit code 75), naming it; its MLflow runs are KILLED, not
    FAILED, for the rerun to reopen."""
    from pipelines.schema import sweep_config
    from pipelines.tuning.sweep import run_sweep

    sweep = sweep_config(
        _sweep_doc(
            world, str(tmp_path / "out"), lr=[1e-3], seeds=[0], cpus_per_worker=4, node_wait_s=3
        )
    )
    started = time.monotonic()
    with pytest.raises(errors.Unfinished) as caught:
        run_sweep(sweep)
    assert time.monotonic() - started < 120
    message = str(caught.value)
    assert "no node could run its trials for 3 s" in message
    assert "asymvlm-vmf lr=0.001 seed=0" in message and "run the same command again" in message
    assert errors.exit_code(caught.value) == errors.EXIT_UNFINISHED == 75
    client_uri = sweep.mlflow.tracking_uri
    _, runs = tracking.experiment_runs(client_uri, "rs")
    assert {r.data.tags["kind"]: r.info.status for r in runs} == {"sweep": "KILLED"}


def _trial(trial_id: str, lr: float = 1e-3) -> SimpleNamespace:
    return SimpleNamespace(
        trial_id=trial_id,
        last_result={},
        config={"trial": {"method": "asymvlm-vmf", "lr": lr, "seed": 0}, "stage": "grid"},
    )


def test_a_retried_trial_and_a_reopened_run_log_each_epoch_once(tmp_path) -> None:
    """Tune's retry reports the epochs after the checkpoint again; a rerun reopens the trial's
    run, which has epochs already: MLflow gets each epoch once, the first value kept."""
    from mlflow import MlflowClient

    from pipelines.schema import sweep_config
    from pipelines.tuning.trial_log import MlflowTrialLogger

    uri = tracking.default_tracking_uri(str(tmp_path))
    sweep = sweep_config(
        _sweep_doc(
            str(tmp_path), str(tmp_path / "o"), mlflow={"tracking_uri": uri, "experiment": "rs"}
        )
    )
    parent = tracking.open_run(uri, "rs", "sweep", kind="sweep")
    logger = MlflowTrialLogger(sweep, parent, {"dataset": "d"})
    try:
        trial = _trial("t1")
        logger.on_trial_start(0, [], trial)
        for epoch in (1, 2, 3, 2, 3, 4):  # killed after 3, retried from the checkpoint of 2
            logger.on_trial_result(
                0, [], trial, {"epoch": epoch, "lr": 0.1 * epoch, "train_loss": float(epoch)}
            )
            logger.flush()
        run_id = logger.child_ids["t1"]
    finally:
        logger.close()
    client = MlflowClient(uri)
    points = sorted((m.step, m.value) for m in client.get_metric_history(run_id, "train_loss"))
    assert points == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 4.0)]

    # A rerun: the trial (a new Tune id) reopens its run, which has 4 epochs; it logs 5 and 6.
    client.set_terminated(run_id, "KILLED")
    label = "grid-asymvlm-vmf-lr0.001-seed0"
    earlier = {label: (run_id, "KILLED")}
    again = MlflowTrialLogger(sweep, parent, {"dataset": "d"}, previous_runs=earlier)
    try:
        trial = _trial("t9")
        again.on_trial_start(0, [], trial)
        for epoch in (4, 5, 6):
            again.on_trial_result(
                0, [], trial, {"epoch": epoch, "lr": 0.1 * epoch, "train_loss": 10.0 * epoch}
            )
        assert again.child_ids["t9"] == run_id
    finally:
        again.close()
    steps = sorted(m.step for m in client.get_metric_history(run_id, "train_loss"))
    assert steps == [1, 2, 3, 4, 5, 6]
    assert client.get_run(run_id).info.status == "RUNNING"


def test_the_journal_reuses_only_records_of_the_same_run(tmp_path, caplog) -> None:
    from pipelines.schema import sweep_config
    from pipelines.tuning.journal import Journal

    doc = _sweep_doc(str(tmp_path), str(tmp_path / "o"))
    journal = Journal(sweep_config(doc))
    trial = {"method": "asymvlm-vmf", "lr": 1e-3, "seed": 0}
    other = {"method": "asymvlm-vmf", "lr": 1e-2, "seed": 0}
    journal.record("grid", trial, checkpoint="s3://b/c1", epoch=2)
    journal.record(
        "grid",
        other,
        checkpoint="s3://b/c2",
        epoch=4,
        final={
            "method": "asymvlm-vmf",
            "lr": 1e-2,
            "seed": 0,
            "stage": "grid",
            "outcome": {"test": {}},
        },
    )
    journal.set_run_id("abc")
    previous = Journal(sweep_config(doc)).previous()
    assert previous.resume("grid", [trial]) == "s3://b/c1" and not previous.finished("grid", trial)
    assert previous.finished("grid", other) and previous.resume("grid", [other]) is None
    assert previous.counts() == (1, 1) and Journal(sweep_config(doc)).run_id() == "abc"
    # A pack's checkpoint resumes only the same pack.
    journal.record("grid", trial, checkpoint="s3://b/pack", pack=["a", "b"])
    assert Journal(sweep_config(doc)).previous().resume("grid", [trial]) is None
    # Another config (more epochs): nothing is reused, and the user is told.
    with caplog.at_level("WARNING", logger="pipelines.sweep"):
        changed = Journal(sweep_config({**doc, "epochs": 5})).previous()
    assert changed.records == {} and "2 trial record(s) of another config" in caplog.text
