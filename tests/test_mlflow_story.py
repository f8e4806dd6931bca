"""A small pipeline run as users run it (``python pipelines/full.py``) with fake credentials set
and a dead cluster's address left in Ray's temp folder: its whole story in MLflow (shape,
statuses, tags, live curves), and the credentials in no config, runtime_env, output, MLflow
store or log it left."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from importlib.metadata import version

import pytest
import torch

from asymvlm import config, tracking
from asymvlm.errors import ConfigError
from asymvlm.tables import read_split
from asymvlm_ray import schema
from tests.helpers import REPO, dead_cluster_ray_tmpdir, library_lines

EPOCHS = 2
FAKE = {
    "AWS_ACCESS_KEY_ID": "AKIAFAKEKEYID1234567",
    "AWS_SECRET_ACCESS_KEY": "fakeSecretAccessKeyDoNotLeak0123456789",
    "AWS_SESSION_TOKEN": "fakeSessionTokenDoNotLeak987654321",
    "HF_TOKEN": "hf_fakeHubTokenDoNotLeak55555",
    "MLFLOW_TRACKING_PASSWORD": "fakeMlflowPasswordDoNotLeak777",
}

CONFIG = f"""
name: story
mlflow: {{experiment: story}}
prepare:
  synthetic: {{output: "${{output}}/tables/synthetic", dim: 16, train_images: 240, val_images: 60,
              test_images: 60, captions_per_image: 3}}
sweeps:
  - {{name: tiny, note: "a two-lr sweep", embeddings: "${{output}}/tables/synthetic",
     methods: [asymvlm-vmf], lr: [1.0e-3, 4.0e-3], seeds: [0, 1], epochs: {EPOCHS},
     batch_size: 64, optimizer: adamw, hidden_dim: 16}}
evaluations:
  - {{kind: hierarcaps, sweep: tiny, data: "${{output}}/tables/synthetic:test"}}
"""


def _grep(root: str, needles: list[str]) -> list[str]:
    """Every file under ``root`` (binary files and SQLite stores included) holding a needle."""
    hits = []
    for folder, _, files in os.walk(root):
        for path in (os.path.join(folder, name) for name in files):
            try:
                with open(path, "rb") as fh:
                    data = fh.read()
            except OSError:  # sockets
                continue
            hits += [f"{path}: {n[:6]}..." for n in needles if n.encode() in data]
    return hits


@pytest.fixture(scope="module")
def story(tmp_path_factory):
    folder = tmp_path_factory.mktemp("story")
    path = folder / "story.yaml"
    path.write_text(CONFIG)
    output = folder / "out"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_ADDRESS")}
    with dead_cluster_ray_tmpdir() as ray_tmp:
        env.update(FAKE, RAY_TMPDIR=ray_tmp)
        command = [sys.executable, "pipelines/full.py", "--config", str(path), "--output"]
        done = subprocess.run(
            [*command, str(output)], cwd=REPO, env=env, capture_output=True, text=True, timeout=900
        )
        assert done.returncode == 0, done.stderr[-4000:]
        assert any("session" in d for d in os.listdir(os.path.join(ray_tmp, "ray")))
        needles = list(FAKE.values())
        leaks = _grep(str(output), needles) + _grep(ray_tmp, needles)
        leaks += [f"console: {n[:6]}..." for n in needles if n in done.stdout + done.stderr]
    from mlflow import MlflowClient

    uri = tracking.default_tracking_uri(str(output))
    client, (_, runs) = MlflowClient(uri), tracking.experiment_runs(uri, "story")
    return {"client": client, "runs": runs, "stderr": done.stderr, "output": output, "leaks": leaks}


def _kind(runs, kind):
    return [r for r in runs if r.data.tags.get("kind") == kind]


@pytest.mark.slow
def test_the_pipeline_run_is_the_root_of_everything(story) -> None:
    """Every run FINISHED, with MLflow's standard tags, nested under the pipeline's run."""
    runs, commit = story["runs"], tracking.git_commit()
    for run in runs:
        tags = run.data.tags
        assert run.info.status == "FINISHED", (run.info.run_name, run.info.status)
        assert tags["mlflow.source.git.commit"] == commit and tags["mlflow.user"]
        assert tags["mlflow.source.name"] == "pipelines/full.py"
    (root,) = _kind(runs, "pipeline")
    assert "mlflow.parentRunId" not in root.data.tags
    assert root.data.tags["mlflow.note.content"].startswith("The story pipeline")
    (sweep,) = _kind(runs, "sweep")
    assert sweep.data.tags["mlflow.note.content"] == "a two-lr sweep"
    # grid: 2 lrs (seed 0); seeds: seed 1 at the chosen lr (seed 0 there is the grid's trial)
    trials = _kind(runs, "trial")
    assert len(trials) == 3 and sum(t.data.tags.get("seed_stage") == "true" for t in trials) == 2
    (evaluation,) = _kind(runs, "eval-hierarcaps")
    (report,) = _kind(runs, "report")
    parents = {r.info.run_id: r.data.tags.get("mlflow.parentRunId") for r in runs}
    assert {parents[r.info.run_id] for r in (sweep, evaluation, report)} == {root.info.run_id}
    assert {parents[t.info.run_id] for t in trials} == {sweep.info.run_id}
    assert evaluation.info.run_name == "eval hierarcaps (tiny)"
    metrics = evaluation.data.metrics
    headline = {f"asymvlm-vmf/spearman_{k}_uncertainty" for k in ("level", "words")}
    assert "asymvlm-vmf/spearman_level_uncertainty" in set(metrics) <= headline, sorted(metrics)
    adapter = story["output"] / "sweeps" / "tiny" / "adapters" / "asymvlm-vmf" / "seed1"
    meta = json.loads((adapter / "config.json").read_text())  # provenance, from a Ray worker
    train = read_split(str(story["output"] / "tables" / "synthetic"), "train")
    assert meta["tables_fingerprint"] == train.fingerprint and meta["git_commit"] == commit
    versions = (meta["torch_version"], meta["asymvlm_version"])
    assert versions == (torch.__version__, version("asymvlm"))
    names = {a.path for a in story["client"].list_artifacts(report.info.run_id)}
    assert {"report.md", "report.html"} <= names
    html = open(story["output"] / "report" / "report.html").read()
    assert "data:image/png;base64," in html and "<table>" in html


@pytest.mark.slow
def test_trials_are_live_runs_with_per_epoch_curves(story) -> None:
    client = story["client"]
    for trial in _kind(story["runs"], "trial"):
        history = sorted(
            client.get_metric_history(trial.info.run_id, "train_loss"), key=lambda m: m.step
        )
        assert [m.step for m in history] == list(range(1, EPOCHS + 1))
        stamps = [m.timestamp for m in history]
        assert len(set(stamps)) == EPOCHS and stamps == sorted(stamps)  # logged as they happened
        # the run existed before its first epoch ended and ended after its last
        assert trial.info.start_time < stamps[0] and trial.info.end_time >= stamps[-1]
        assert {"val_mean_recall_at_1", "t2i_recall_at_1"} <= set(trial.data.metrics)


@pytest.mark.slow
def test_the_console_is_short_and_no_credential_reaches_outputs_mlflow_or_logs(story) -> None:
    assert not story["leaks"], story["leaks"]
    text = story["stderr"]
    lines = text.splitlines()
    assert len(lines) <= 40 and not [ln for ln in lines if "arning" in ln], text
    assert not library_lines(text), text  # Ray's, Tune's and MLflow's lines go to the log file
    assert text.count("trial asymvlm-vmf") == 3  # one line per finished trial
    assert f"asymvlm ui {story['output']}" in text
    assert os.path.isfile(os.path.join(story["output"], "logs", "pipeline.log"))


@pytest.mark.slow
def test_a_copied_store_keeps_its_artifacts(story, tmp_path) -> None:
    """The local store and its mlartifacts, moved elsewhere, still open."""
    for name in ("mlflow.db", "mlartifacts"):
        shutil.move(story["output"] / name, tmp_path / name)
    uri = tracking.default_tracking_uri(str(tmp_path))
    assert tracking.relocate_local_store(uri) > 0
    (report,) = _kind(tracking.experiment_runs(uri, "story")[1], "report")
    local = tracking.download(f"runs:/{report.info.run_id}/report.md", uri)
    assert open(local).read().startswith("# AsymVLM report")
    assert tracking.relocate_local_store(uri) == 0  # once is enough


def test_configs_expand_plain_variables_only_and_refuse_passwords(tmp_path, monkeypatch) -> None:
    path, secrets = tmp_path / "c.yaml", ("AWS_SECRET_ACCESS_KEY", "HF_TOKEN", "DB_PASSWORD")
    monkeypatch.setenv("ASYMVLM_TEST_ROOT", str(tmp_path))
    path.write_text("name: x\noutput: ${ASYMVLM_TEST_ROOT}/out\nreport: {output: '${output}/r'}\n")
    cfg = schema.load_pipeline(str(path))
    assert (cfg.output, cfg.report.output) == (str(tmp_path / "out"), str(tmp_path / "out/r"))
    refused = {
        "output: ${ASYMVLM_NOT_SET_ANYWHERE}/out": "ASYMVLM_NOT_SET_ANYWHERE.*is not set",
        "mlflow: {tracking_uri: 'http://alice:hunter2@m:5000'}": (
            r"(?=.*mlflow\.tracking_uri)(?=.*alice:\*\*\*@)"
        ),
        **{
            f"mlflow: {{experiment: '${{{n}}}'}}": f"refusing to expand \\${{{n}}}" for n in secrets
        },
    }
    for name in secrets:
        monkeypatch.setenv(name, "s3cr3t")
    for text, message in refused.items():
        path.write_text(f"name: x\n{text}\n")
        with pytest.raises(ConfigError, match=message) as err:
            schema.load_pipeline(str(path))
        assert "hunter2" not in str(err.value) and "s3cr3t" not in str(err.value)
    assert config.redact("s3://k:s@h/b and http://u:p@x") == "s3://k:***@h/b and http://u:***@x"
    assert config.redact("http://mlflow.internal:5000/x") == "http://mlflow.internal:5000/x"


def test_trial_actors_carry_no_runtime_env(monkeypatch) -> None:
    """Tune copies the driver's AWS credentials (and ``PL_DISABLE_FORK``) into every trainable
    actor's runtime_env, shown in Ray's logs; after :func:`keep_credentials_on_nodes` nothing."""
    from ray.tune.execution import class_cache

    from asymvlm_ray.session import keep_credentials_on_nodes

    monkeypatch.setattr(class_cache, "DEFAULT_ENV_VARS", {"PL_DISABLE_FORK": "1"})
    monkeypatch.setattr(class_cache, "ENV_VARS_TO_PROPAGATE", {"AWS_SECRET_ACCESS_KEY"})
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-for-trials")
    before = class_cache._ActorClassCache().get(type("Trainable", (), {}))
    env = {"PL_DISABLE_FORK": "1", "AWS_SECRET_ACCESS_KEY": "not-for-trials"}
    assert before._default_options["runtime_env"]["env_vars"] == env
    keep_credentials_on_nodes()
    after = class_cache._ActorClassCache().get(type("Other", (), {}))
    assert not (after._default_options.get("runtime_env") or {}).get("env_vars")


def test_a_new_local_store_is_a_copy_of_an_empty_one(tmp_path, monkeypatch) -> None:
    """A new SQLite store starts as a copy of the empty store this MLflow made once in the
    cache (not its schema migrations again), and holds what a store MLflow made holds."""
    import sqlite3

    from mlflow import MlflowClient

    monkeypatch.setenv("ASYMVLM_CACHE", str(tmp_path / "cache"))
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        uri = tracking.default_tracking_uri(str(tmp_path / name))
        with tracking.run(uri, "e", "r", kind="trial", params={"lr": 0.1}) as run:
            run.log_metrics({"loss": 1.0}, step=1)
    (empty,) = (tmp_path / "cache").glob("mlflow-*-empty.db")
    with sqlite3.connect(empty) as db:
        assert db.execute("SELECT count(*) FROM experiments").fetchone() == (0,)
    client = MlflowClient(uri)
    assert sorted(e.name for e in client.search_experiments()) == ["Default", "e"]
    (got,) = client.search_runs([client.get_experiment_by_name("e").experiment_id])
    assert got.data.params == {"lr": "0.1"} and got.data.metrics == {"loss": 1.0}
    assert got.info.status == "FINISHED"
