"""A sweep that stops part-way goes on where it stopped (``Tuner.restore``): every epoch in
MLflow once, the results of a sweep that never stopped; trials that wait for a node too long
end the sweep, naming them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
import yaml
from mlflow import MlflowClient

from asymvlm import entry, errors, tracking
from asymvlm_ray.schema import sweep_config
from tests.helpers import REPO, library_lines, sigkill_when


def _sweep_doc(world: str, output: str, **extra) -> dict:
    space = {"methods": ["asymvlm-vmf"], "lr": [1e-3, 1e-2], "seeds": [0, 1], "epochs": 3}
    sizes = {"batch_size": 128, "optimizer": "adamw", "hidden_dim": 32, "checkpoint_every": 1}
    where = {"name": "rs", "embeddings": world, "output": output, "mlflow": {"experiment": "rs"}}
    return {**space, **sizes, **where, **extra}


def _trial_runs(output: str) -> list:
    if not os.path.exists(os.path.join(output, "mlflow.db")):
        return []
    try:
        _, runs = tracking.experiment_runs(tracking.default_tracking_uri(output), "rs")
    except ValueError:  # not created yet
        return []
    return [r for r in runs if r.data.tags.get("kind") == "trial"]


@pytest.mark.slow
def test_a_sweep_killed_part_way_goes_on_where_it_stopped(pre_world, tmp_path, one_thread) -> None:
    """The driver and its Ray killed with one grid trial done and the other held after epoch 2;
    the same command restores the sweep and lands what a sweep that never stopped would: equal
    results per trial, one MLflow run per trial with every epoch once."""
    from asymvlm.runner import train_and_evaluate
    from asymvlm_ray.tuning.lr_selection import select_lr
    from asymvlm_ray.tuning.sweep_driver import read_record

    output = str(tmp_path / "out")
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(_sweep_doc(pre_world, output)))
    command = [sys.executable, os.path.join(REPO, "pipelines", "sweep.py"), "--config", str(path)]
    marker = tmp_path / "paused"
    env = dict(os.environ, TUNE_GLOBAL_CHECKPOINT_S="0")  # Tune's state saved at every step
    env["ASYMVLM_FAULT_INJECTION"] = f"epoch=2,action=pause,seconds=600,marker={marker}"

    def one_finished_one_paused() -> bool:
        runs = _trial_runs(output) if marker.exists() else []
        if [r.info.status for r in runs].count("FINISHED") == 1 and len(runs) == 2:
            time.sleep(2)  # the paused trial's checkpoint of epoch 2 in Tune's state
            return True
        return False

    sigkill_when(command, one_finished_one_paused, env=env, seconds=300, every=1)
    assert not os.path.exists(os.path.join(output, "sweep.json"))

    again = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-4000:]
    assert "goes on where it stopped" in again.stderr and not library_lines(again.stderr)
    record = read_record(output)

    client = MlflowClient(tracking.default_tracking_uri(output))
    runs = _trial_runs(output)
    chosen = record.selection["asymvlm-vmf"].lr
    assert sorted(r.data.tags["trial"] for r in runs) == [
        "grid-asymvlm-vmf-lr0.001-seed0",
        "grid-asymvlm-vmf-lr0.01-seed0",
        f"seeds-asymvlm-vmf-lr{chosen!r}-seed1",
    ]
    for run in runs:
        assert run.info.status == "FINISHED"
        assert run.data.tags["mlflow.parentRunId"] == record.parent_run_id
        steps = [m.step for m in client.get_metric_history(run.info.run_id, "train_loss")]
        assert sorted(steps) == [1, 2, 3], (run.data.tags["trial"], steps)
    sweeps = client.search_runs([runs[0].info.experiment_id], "tags.kind = 'sweep'")
    assert [r.info.status for r in sweeps] == ["FINISHED"]
    # Each trial's results are those of its run straight through; the selection is made of them.
    sweep = sweep_config(_sweep_doc(pre_world, output))
    for trial in record.trials:
        straight = train_and_evaluate(sweep.run_spec(trial.method, trial.lr, trial.seed))
        assert {s: trial.outcome[s] for s in ("val", "test")} == json.loads(
            json.dumps({s: straight[s] for s in ("val", "test")})
        )
    assert record.selection == select_lr([t for t in record.trials if t.stage == "grid"])


def test_trials_that_wait_too_long_for_a_node_end_the_sweep_naming_them(
    ray_session, pre_world, tmp_path
) -> None:
    """A trial no node can take (4 CPUs asked on a 2-CPU cluster) waits; after node_wait_s the
    sweep ends with Unfinished (exit code 75), naming it; its MLflow run is KILLED."""
    from asymvlm_ray.tuning.sweep_driver import run_sweep

    doc = _sweep_doc(pre_world, str(tmp_path / "out"), lr=[1e-3], seeds=[0], node_wait_s=3)
    sweep = sweep_config({**doc, "cpus_per_worker": 4})
    with pytest.raises(errors.Unfinished) as caught:
        run_sweep(sweep)
    message = str(caught.value)
    assert "no node could run its trials for 3 s" in message
    assert "asymvlm-vmf lr=0.001 seed=0" in message and "run the same command again" in message
    assert entry.exit_code(caught.value) == errors.EXIT_UNFINISHED == 75
    _, runs = tracking.experiment_runs(sweep.mlflow.tracking_uri, "rs")
    assert {r.data.tags["kind"]: r.info.status for r in runs} == {"sweep": "KILLED"}


def test_a_retried_trial_and_a_reopened_run_log_each_epoch_once(tmp_path) -> None:
    """Tune's retry reports the epochs after the checkpoint again; a rerun reopens the trial's
    run, which has epochs already: MLflow gets each epoch once, the first value kept. A trial
    that errs is a FAILED run with the reason Tune kept."""
    from asymvlm_ray.tuning.trial_log import MlflowTrialLogger

    uri = tracking.default_tracking_uri(str(tmp_path))
    doc = _sweep_doc(str(tmp_path), str(tmp_path / "o"), lr=[0.5])
    sweep = sweep_config({**doc, "mlflow": {"tracking_uri": uri, "experiment": "rs"}})
    parent = tracking.open_run(uri, "rs", "sweep", kind="sweep")
    error = tmp_path / "error.txt"
    error.write_text("Traceback (most recent call last):\n  ...\nRuntimeError: worker died\n")
    member = {"method": "asymvlm-vmf", "lr": 0.5, "seed": 0}
    config = {"stage": "grid", "members": [member]}
    trial = SimpleNamespace(trial_id="t1", config=config, pickled_error_file=None)
    trial.error_file = str(error)
    logger = MlflowTrialLogger(sweep, parent, {"dataset": "d"})
    logger.setup()
    logger.on_trial_start(0, [], trial)
    for epoch in (1, 2, 3, 2, 3, 4):  # killed after 3, retried from the checkpoint of 2
        logger.on_trial_result(0, [], trial, {"epoch": epoch, "lr": 0.1, "train_loss": epoch})
    logger.on_trial_error(0, [], trial)
    logger.on_experiment_end([])  # its writes done, as Tune's end waits for them
    (run_id,) = [r.id for r in logger.runs.values()]
    client = MlflowClient(uri)
    points = sorted((m.step, m.value) for m in client.get_metric_history(run_id, "train_loss"))
    assert points == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 4.0)]
    run = client.get_run(run_id)
    assert run.info.status == "FAILED" and run.data.tags["mlflow.parentRunId"] == parent.id
    assert run.data.tags["failure_reason"] == "RuntimeError: worker died"
    want = {"dataset": "d", "method": "asymvlm-vmf", "lr": "0.5", "seed": "0", "stage": "grid"}
    assert run.data.params == {**want, "optimizer": "adamw"}

    # A rerun (Tune sets the callback up again): the trial reopens its run, logs 5 and 6.
    again = MlflowTrialLogger(sweep, parent, {"dataset": "d"})
    again.setup()
    trial.trial_id = "t9"
    again.on_trial_start(0, [], trial)
    for epoch in (4, 5, 6):
        again.on_trial_result(0, [], trial, {"epoch": epoch, "lr": 0.1, "train_loss": 10.0})
    again.on_experiment_end([])
    assert [r.id for r in again.runs.values()] == [run_id]
    steps = sorted(m.step for m in client.get_metric_history(run_id, "train_loss"))
    assert steps == [1, 2, 3, 4, 5, 6]
    assert client.get_run(run_id).info.status == "RUNNING"
