"""Credentials never leave the environment: not into configs, Ray's runtime_env, Tune's files,
MLflow or logs."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile

import pytest

from asymvlm import config
from asymvlm.errors import ConfigError
from pipelines import schema
from tests.helpers import HIERARCAPS, hierarcaps_subset

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAKE = {
    "AWS_ACCESS_KEY_ID": "AKIAFAKEKEYID1234567",
    "AWS_SECRET_ACCESS_KEY": "fakeSecretAccessKeyDoNotLeak0123456789",
    "AWS_SESSION_TOKEN": "fakeSessionTokenDoNotLeak987654321",
    "HF_TOKEN": "hf_fakeHubTokenDoNotLeak55555",
    "MLFLOW_TRACKING_PASSWORD": "fakeMlflowPasswordDoNotLeak777",
}


@pytest.mark.parametrize(
    "name",
    [
        "AWS_SECRET_ACCESS_KEY",
        "HF_TOKEN",
        "MY_API_KEY",
        "DB_PASSWORD",
        "GOOGLE_APPLICATION_CREDENTIALS",
    ],
)
def test_credential_variables_are_not_expanded(name, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(name, "s3cr3t")
    path = tmp_path / "c.yaml"
    path.write_text(f"name: x\nmlflow: {{experiment: '${{{name}}}'}}\n")
    with pytest.raises(ConfigError, match=f"refusing to expand \\${{{name}}}"):
        schema.load_pipeline(str(path))


def test_uris_with_passwords_are_refused_and_redacted(tmp_path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("mlflow: {tracking_uri: 'http://alice:hunter2@mlflow.internal:5000'}\n")
    with pytest.raises(ConfigError) as err:
        schema.load_pipeline(str(path))
    assert "hunter2" not in str(err.value) and "alice:***@" in str(err.value)
    assert "mlflow.tracking_uri" in str(err.value)
    assert config.redact("s3://k:s@h/b and http://u:p@x") == "s3://k:***@h/b and http://u:***@x"
    assert config.redact("http://mlflow.internal:5000/x") == "http://mlflow.internal:5000/x"


def test_plain_variables_expand_and_unset_ones_fail(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("ASYMVLM_TEST_ROOT", str(tmp_path))
    path = tmp_path / "c.yaml"
    path.write_text("name: x\noutput: ${ASYMVLM_TEST_ROOT}/out\nreport: {output: '${output}/r'}\n")
    cfg = schema.load_pipeline(str(path))
    assert cfg.output == str(tmp_path / "out")
    assert cfg.report.output == str(tmp_path / "out" / "r")
    path.write_text("name: x\noutput: ${ASYMVLM_NOT_SET_ANYWHERE}/out\n")
    with pytest.raises(ConfigError, match="ASYMVLM_NOT_SET_ANYWHERE.*is not set"):
        schema.load_pipeline(str(path))


def _grep(root: str, needles: list[str]) -> list[str]:
    """Every file under ``root`` (bytes, binary files and SQLite stores included) that holds
    one of ``needles``."""
    hits = []
    for folder, _, files in os.walk(root):
        for name in files:
            path = os.path.join(folder, name)
            try:
                with open(path, "rb") as fh:
                    data = fh.read()
            except OSError:
                continue
            hits += [f"{path}: {n[:6]}..." for n in needles if n.encode() in data]
    return hits


@pytest.mark.slow
@pytest.mark.skipif(HIERARCAPS is None, reason="real HierarCaps data not found")
def test_no_credential_reaches_outputs_mlflow_tune_or_ray_logs(tmp_path) -> None:
    """A small pipeline (embed with Ray Data, a Tune sweep of Ray Train runs, an evaluation,
    the report) with fake credentials in the environment: none of them may appear in any
    output, the MLflow store and artifacts, Tune's and Train's folders or Ray's session logs."""
    csv, images = hierarcaps_subset(tmp_path / "hc", 8)
    out = tmp_path / "out"
    cfg = tmp_path / "pipeline.yaml"
    cfg.write_text(f"""
name: creds
output: {out}
prepare:
  tiny_clip: "${{output}}/models/tiny-clip"
  synthetic: {{output: "${{output}}/tables/synthetic", dim: 16, train_images: 200,
              val_images: 40, test_images: 40, captions_per_image: 3}}
embed:
  jobs:
    - {{dataset: hierarcaps, annotations: {csv}, images: {images},
       model: "${{output}}/models/tiny-clip", split: test, output: "${{output}}/tables/hc",
       batch_size: 8}}
sweeps:
  - {{name: syn, embeddings: "${{output}}/tables/synthetic", methods: [asymvlm-vmf],
     lr: [1.0e-3], seeds: [0], epochs: 2, batch_size: 64, optimizer: adamw, hidden_dim: 16,
     checkpoint_every: 1}}
evaluations:
  - {{kind: hierarcaps, sweep: syn, data: "${{output}}/tables/synthetic:test"}}
""")
    ray_tmp = tempfile.mkdtemp(prefix="rc", dir="/tmp")  # short: Ray's socket paths
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_ADDRESS")}
    env.update(FAKE, RAY_TMPDIR=ray_tmp, PYTHONPATH=REPO)
    try:
        proc = subprocess.run(
            [sys.executable, os.path.join(REPO, "pipelines", "full.py"), "--config", str(cfg)],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
            cwd=str(tmp_path),
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert (out / "report" / "report.md").exists()
        assert os.path.isdir(os.path.join(out, "sweeps", "syn", "tune"))
        assert any("session" in d for d in os.listdir(os.path.join(ray_tmp, "ray")))
        needles = list(FAKE.values())
        leaks = _grep(str(out), needles) + _grep(ray_tmp, needles)
        leaks += [f"console: {n[:6]}..." for n in needles if n in proc.stdout + proc.stderr]
        assert not leaks, leaks
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)


def test_trial_actors_carry_no_runtime_env(monkeypatch) -> None:
    """Tune copies the driver's AWS credentials (and ``PL_DISABLE_FORK``) into every trainable
    actor's runtime_env, shown in Ray's logs; after :func:`keep_credentials_on_nodes` it copies
    nothing (and the actor can take a prestarted worker)."""
    from ray.tune.execution import class_cache

    from pipelines.session import keep_credentials_on_nodes

    monkeypatch.setattr(class_cache, "DEFAULT_ENV_VARS", {"PL_DISABLE_FORK": "1"})
    monkeypatch.setattr(class_cache, "ENV_VARS_TO_PROPAGATE", class_cache.ENV_VARS_TO_PROPAGATE)
    for name in class_cache.ENV_VARS_TO_PROPAGATE:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-for-trials")

    class Trainable:
        pass

    class Other:
        pass

    before = class_cache._ActorClassCache().get(Trainable)
    assert before._default_options["runtime_env"]["env_vars"] == {
        "PL_DISABLE_FORK": "1",
        "AWS_SECRET_ACCESS_KEY": "not-for-trials",
    }
    keep_credentials_on_nodes()
    after = class_cache._ActorClassCache().get(Other)
    assert not (after._default_options.get("runtime_env") or {}).get("env_vars")
