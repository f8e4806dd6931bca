"""The storage layer: local paths and object-store URIs, retried through a flaky store."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import numpy as np
import pyarrow.fs as pafs
import pytest

from asymvlm import storage, tables, tracking
from asymvlm.errors import ConfigError
from asymvlm.synthetic import write_world
from asymvlm_ray import schema
from tests.faults import FlakyProxy
from tests.helpers import small_world_config


@pytest.fixture
def flaky(bucket, s3_server, monkeypatch):
    """moto behind a proxy that fails requests on demand; the clients talk to the proxy."""
    import s3fs

    with FlakyProxy(s3_server, seed=1) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
        s3fs.S3FileSystem.clear_instance_cache()
        yield proxy
    s3fs.S3FileSystem.clear_instance_cache()


def test_local_paths_and_uris(tmp_path) -> None:
    assert storage.uri_join("s3://b/run/", "sweeps", "a") == "s3://b/run/sweeps/a"
    assert storage.is_remote("s3://b/x") and not storage.is_remote("file:///tmp/x")
    assert storage.ray_storage(str(tmp_path / "ray")) == (str(tmp_path / "ray"), None)
    target = storage.uri_join(str(tmp_path), "sub", "a.txt")
    assert not storage.exists(target)
    storage.write_text(target, "héllo")
    assert storage.exists(target) and storage.read_text(target) == "héllo"
    assert storage.uri_of(pafs.LocalFileSystem(), target) == target


def test_s3_files_and_a_record_rewritten_while_it_is_read(bucket) -> None:
    """A JSON record rewritten by another process reads as the old or the new content."""
    path, fs = storage.ray_storage("s3://bucket/run/ray")  # the endpoint: AWS_ENDPOINT_URL
    assert path == "bucket/run/ray" and fs.get_file_info("bucket").type == pafs.FileType.Directory
    assert storage.uri_of(fs, path) == "s3://bucket/run/ray"
    storage.write_json("s3://bucket/run", "rec.json", {"n": 0, "pad": "x" * 4096})
    stop, seen = threading.Event(), set()

    def rewrite() -> None:
        n = 0
        while not stop.is_set():
            n += 1
            storage.write_json("s3://bucket/run", "rec.json", {"n": n, "pad": "x" * 4096})

    writer = threading.Thread(target=rewrite)
    writer.start()
    try:
        for _ in range(20):
            seen.add(storage.read_json("s3://bucket/run", "rec.json")["n"])
    finally:
        stop.set()
        writer.join()
    assert len(seen) > 1  # the reads really overlapped the rewrites
    assert storage.read_json("s3://bucket/run", "missing.json") is None
    with pytest.raises(FileNotFoundError):
        storage.read_text("s3://bucket/run/missing.json")


@pytest.mark.slow
def test_tables_records_and_checkpoints_survive_a_third_of_the_requests_failing(
    flaky, bucket
) -> None:
    """Tables, records and Ray checkpoints through the retries; no temporary object left."""
    flaky.fail(share=0.3, seconds=600)
    root = write_world("s3://bucket/world", small_world_config(dim=8, splits={"train": 60}))
    storage.write_json(root, "records/one.json", {"epoch": 3})
    assert storage.read_json(root, "records/one.json") == {"epoch": 3}
    split = tables.read_split(root, "train")
    assert split.n_images == 60 and np.isfinite(split.image_embeddings).all()
    path, fs = storage.ray_storage("s3://bucket/ray")
    payload = bytes(range(256)) * 64
    for k in range(4):
        with fs.open_output_stream(f"{path}/checkpoint_{k:06d}/model.pt") as out:
            out.write(payload)
    for k in range(4):
        with fs.open_input_stream(f"{path}/checkpoint_{k:06d}/model.pt") as fh:
            assert fh.read() == payload
    assert flaky.counts["failed"] > 10 and flaky.counts["503"] and flaky.counts["drop"]
    flaky.fail(share=0.0, seconds=0)
    bucket.invalidate_cache()
    assert not [k for k in bucket.find("bucket") if ".tmp-" in k]


def test_a_request_that_keeps_failing_names_its_uri(flaky, bucket, monkeypatch) -> None:
    monkeypatch.setenv("ASYMVLM_STORAGE_ATTEMPTS", "many")
    with pytest.raises(storage.StorageError, match="ASYMVLM_STORAGE_ATTEMPTS"):
        storage.attempts()
    monkeypatch.setenv("ASYMVLM_STORAGE_ATTEMPTS", "2")
    flaky.fail(share=1.0, seconds=600)
    with pytest.raises(storage.StorageError) as caught:
        storage.write_text("s3://bucket/run/sweep.json", "{}")
    assert str(caught.value).startswith("s3://bucket/run/sweep.json: ")
    assert "after 2 attempts" in str(caught.value)
    flaky.fail(share=0.0, seconds=0)
    bucket.invalidate_cache()
    assert not [k for k in bucket.find("bucket") if k.startswith("bucket/run")]


def test_a_bucket_without_credentials_is_one_line_naming_it(tmp_path, monkeypatch) -> None:
    """botocore's NoCredentialsError (not an OSError) reaches the user as the storage layer's
    one-line error naming the URI and what to set, from the CLI too (exit 2, no traceback)."""
    import s3fs

    for key in [k for k in os.environ if k.startswith("AWS_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # no instance to ask either
    s3fs.S3FileSystem.clear_instance_cache()
    with pytest.raises(storage.StorageError) as caught:
        storage.read_json("s3://bucket/run", "tune/settings.json")
    assert str(caught.value).startswith("s3://bucket/run/tune/settings.json: Unable to locate")
    assert "AWS_ACCESS_KEY_ID" in str(caught.value)
    s3fs.S3FileSystem.clear_instance_cache()
    command = ["-m", "asymvlm.cli", "train", "--embeddings", "s3://bucket/tables", "--split"]
    command += ["train", "--method", "asymvlm-vmf", "--output", str(tmp_path / "ckpt")]
    done = subprocess.run([sys.executable, *command], capture_output=True, text=True)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "Unable to locate credentials" in done.stderr


def test_an_object_store_output_needs_a_tracking_server_and_shared_storage(
    tmp_path, monkeypatch
) -> None:
    import ray

    path, server = tmp_path / "c.yaml", "mlflow: {tracking_uri: 'http://m:5000'}\n"
    path.write_text("name: x\noutput: s3://bucket/run\n")
    with pytest.raises(ConfigError, match="set mlflow.tracking_uri to a tracking server"):
        schema.load_pipeline(str(path))
    path.write_text(f"output: s3://bucket/run\n{server}prepare: {{tiny_clip: '${{output}}/m'}}\n")
    with pytest.raises(ConfigError, match="prepare.tiny_clip writes local files"):
        schema.load_pipeline(str(path))
    path.write_text(f"output: s3://bucket/run\n{server}storage: {{shared_filesystem: false}}\n")
    cfg = schema.load_pipeline(str(path))
    assert cfg.output == "s3://bucket/run" and cfg.report.output is None
    two = [{"Alive": True, "NodeID": "a"}, {"Alive": True, "NodeID": "b"}]
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(ray, "nodes", lambda: two)
    with pytest.raises(ConfigError, match="2 nodes: shared storage is needed"):
        schema.check_shared_output(str(tmp_path), shared_filesystem=False)
    schema.check_shared_output(str(tmp_path), shared_filesystem=True)  # declared shared
    schema.check_shared_output("s3://bucket/run", shared_filesystem=False)  # an object store
    monkeypatch.setattr(ray, "nodes", lambda: two[:1])
    schema.check_shared_output(str(tmp_path), shared_filesystem=False)  # one node


@pytest.mark.slow
def test_a_sweep_writes_everything_to_the_bucket(ray_on_s3_nodes, bucket, tmp_path) -> None:
    """Tune state, checkpoints, the sweep record and the logged adapter all in the bucket."""
    import mlflow
    import pandas as pd

    from asymvlm_ray.schema import sweep_config
    from asymvlm_ray.tuning.sweep_driver import run_sweep

    world = write_world("s3://bucket/tables", small_world_config())
    uri = "sqlite:///" + str(tmp_path / "mlflow.db")
    space = {"methods": ["asymvlm-vmf"], "lr": [1e-3], "seeds": [0], "epochs": 2}
    train = {"batch_size": 128, "optimizer": "adamw", "hidden_dim": 16, "checkpoint_every": 1}
    where = {"output": "s3://bucket/run/sweep", "mlflow": {"tracking_uri": uri}}
    out = run_sweep(sweep_config({"embeddings": world, **space, **train, **where}))
    assert set(os.listdir(tmp_path)) <= {"mlartifacts", "mlflow.db"}  # MLflow only
    keys = bucket.find("bucket/run/sweep")
    assert {"bucket/run/sweep/sweep.json", "bucket/run/sweep/summary.md"} <= set(keys)
    # the trial's checkpoints (it trained in place: Tune's checkpoints, beside its state)
    trials = [k for k in keys if k.startswith("bucket/run/sweep/tune/trials/")]
    assert any(k.endswith("trainer.pt") for k in trials)
    record = storage.read_json("s3://bucket/run/sweep", "sweep.json")
    assert record["parent_run_id"] == out.parent_run_id
    (child,) = tracking.child_runs(uri, out.parent_run_id)
    model = mlflow.pyfunc.load_model(tracking.download(f"runs:/{child.info.run_id}/adapter", uri))
    pred = model.predict(pd.DataFrame({"embedding": [[1.0] + [0.0] * 15], "norm": [8.0]}))
    assert pred["kappa"].iloc[0] > 0 and pred["uncertainty"].iloc[0] > 0


def test_an_adapter_on_s3_loads_whatever_tracking_store_is_set(bucket, tmp_path, monkeypatch):
    """An object-store adapter folder reads no MLflow store; a store set for a block is unset
    after it (MLflow mirrors it in $MLFLOW_TRACKING_URI, which later reads would follow)."""
    from asymvlm.evaluation.adapters import checkpoint_adapters
    from tests.helpers import save_adapter

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    with tracking.global_tracking_uri(f"sqlite:///{tmp_path}/mlflow.db"):
        pass
    assert "MLFLOW_TRACKING_URI" not in os.environ
    save_adapter(tmp_path / "a")
    uri = storage.upload_dir(str(tmp_path / "a"), "s3://bucket/run/adapters/symvlm/seed0")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/absent/mlflow.db")
    assert list(checkpoint_adapters([uri])) == ["symvlm/seed0"]
