"""Credentials never leave the environment: not into configs or Ray's runtime_env (outputs,
MLflow and logs: tests/test_mlflow_story.py)."""

from __future__ import annotations

import pytest

from asymvlm import config
from asymvlm.errors import ConfigError
from pipelines import schema


@pytest.mark.parametrize("name", ["AWS_SECRET_ACCESS_KEY", "HF_TOKEN", "DB_PASSWORD"])
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


def test_trial_actors_carry_no_runtime_env(monkeypatch) -> None:
    """Tune copies the driver's AWS credentials (and ``PL_DISABLE_FORK``) into every trainable
    actor's runtime_env, shown in Ray's logs; after :func:`keep_credentials_on_nodes` nothing."""
    from ray.tune.execution import class_cache

    from pipelines.session import keep_credentials_on_nodes

    monkeypatch.setattr(class_cache, "DEFAULT_ENV_VARS", {"PL_DISABLE_FORK": "1"})
    monkeypatch.setattr(class_cache, "ENV_VARS_TO_PROPAGATE", {"AWS_SECRET_ACCESS_KEY"})
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-for-trials")
    before = class_cache._ActorClassCache().get(type("Trainable", (), {}))
    env = {"PL_DISABLE_FORK": "1", "AWS_SECRET_ACCESS_KEY": "not-for-trials"}
    assert before._default_options["runtime_env"]["env_vars"] == env
    keep_credentials_on_nodes()
    after = class_cache._ActorClassCache().get(type("Other", (), {}))
    assert not (after._default_options.get("runtime_env") or {}).get("env_vars")
