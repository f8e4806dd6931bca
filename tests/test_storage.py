"""The storage layer: local paths and object-store URIs resolved in one place, and pipelines whose
every output (Tune state, Train checkpoints, sweep records, evaluations, report) goes there."""

from __future__ import annotations

import json
import os

import pyarrow.fs as pafs
import pytest

from asymvlm import storage, tracking
from asymvlm.errors import ConfigError
from asymvlm.synthetic import write_world
from pipelines import schema
from tests.conftest import small_world_config


def test_local_paths_and_uris(tmp_path) -> None:
    assert storage.uri_join("s3://b/run/", "sweeps", "a") == "s3://b/run/sweeps/a"
    assert storage.uri_join(str(tmp_path), "x", "y.json") == str(tmp_path / "x" / "y.json")
    assert storage.is_remote("s3://b/x") and storage.is_remote("gs://b/x")
    assert not storage.is_remote("file:///tmp/x") and not storage.is_remote("runs/x")
    path, fs = storage.ray_storage(str(tmp_path / "ray"))
    assert (path, fs) == (str(tmp_path / "ray"), None)
    target = storage.uri_join(str(tmp_path), "sub", "a.txt")
    assert not storage.exists(target)
    storage.write_text(target, "héllo")
    assert storage.exists(target) and storage.read_text(target) == "héllo"
    assert storage.uri_of(pafs.LocalFileSystem(), target) == target


def test_s3_with_a_custom_endpoint(s3_server, tmp_path) -> None:
    import s3fs

    s3fs.S3FileSystem(client_kwargs={"endpoint_url": s3_server}).mkdir("bucket")
    path, fs = storage.ray_storage("s3://bucket/run/ray")  # the endpoint: AWS_ENDPOINT_URL
    assert path == "bucket/run/ray" and fs.get_file_info("bucket").type == pafs.FileType.Directory
    storage.write_text("s3://bucket/run/sweep.json", json.dumps({"a": 1}))
    assert json.loads(storage.read_text("s3://bucket/run/sweep.json")) == {"a": 1}
    local = tmp_path / "report"
    (local / "figs").mkdir(parents=True)
    (local / "report.md").write_text("# r")
    (local / "figs" / "f.png").write_bytes(b"\x89PNG")
    storage.upload_dir(str(local), "s3://bucket/run/report")
    assert storage.read_text("s3://bucket/run/report/report.md") == "# r"
    assert storage.exists("s3://bucket/run/report/figs/f.png")
    s3fs_fs, s3_path = storage.filesystem("s3://bucket/run/sweep.json")
    assert storage.uri_of(s3fs_fs, s3_path) == "s3://bucket/run/sweep.json"


def test_a_record_rewritten_while_it_is_read_reads_whole(s3_server) -> None:
    """Another process rewriting a JSON record (a renewed lease, sweep.json) never makes a
    concurrent read fail: it sees the old or the new content."""
    import threading

    import s3fs

    s3fs.S3FileSystem(client_kwargs={"endpoint_url": s3_server}).mkdir("bucket")
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
            json.loads(storage.read_text("s3://bucket/run/rec.json"))
    finally:
        stop.set()
        writer.join()
    assert len(seen) > 1  # the reads really overlapped the rewrites
    assert storage.read_json("s3://bucket/run", "missing.json") is None
    with pytest.raises(FileNotFoundError):
        storage.read_text("s3://bucket/run/missing.json")


def test_object_store_output_needs_a_tracking_server(tmp_path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("name: x\noutput: s3://bucket/run\n")
    with pytest.raises(ConfigError, match="set mlflow.tracking_uri to a tracking server"):
        schema.load_pipeline(str(path))
    path.write_text(
        "name: x\noutput: s3://bucket/run\nmlflow: {tracking_uri: 'http://m:5000'}\n"
        "prepare: {tiny_clip: '${output}/models/tiny'}\n"
    )
    with pytest.raises(ConfigError, match="prepare.tiny_clip writes local files"):
        schema.load_pipeline(str(path))
    path.write_text(
        "name: x\noutput: s3://bucket/run\nmlflow: {tracking_uri: 'http://m:5000'}\n"
        "storage: {shared_filesystem: false}\n"
    )
    cfg = schema.load_pipeline(str(path))
    assert cfg.output == "s3://bucket/run" and cfg.report.output is None


def test_a_local_output_on_several_nodes_is_refused(monkeypatch, tmp_path) -> None:
    import ray

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
def test_a_sweep_writes_everything_to_the_bucket(ray_on_s3_nodes, tmp_path) -> None:
    """Tune state, trial checkpoints, the sweep record and summary land in the bucket; the
    adapter logged to MLflow is read back from the checkpoint in the bucket (not a local path).
    """
    import mlflow
    import pandas as pd
    import s3fs

    from pipelines.schema import sweep_config as resolve_config
    from pipelines.tuning.sweep import run_sweep

    fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": ray_on_s3_nodes})
    fs.mkdir("bucket")
    world = write_world("s3://bucket/tables", small_world_config())
    uri = "sqlite:///" + str(tmp_path / "mlflow.db")
    cfg = resolve_config(
        {
            "embeddings": world,
            "methods": ["asymvlm-vmf"],
            "lr": [1e-3],
            "seeds": [0],
            "epochs": 2,
            "batch_size": 128,
            "optimizer": "adamw",
            "hidden_dim": 16,
            "checkpoint_every": 1,
            "output": "s3://bucket/run/sweep",
            "mlflow": {"tracking_uri": uri, "experiment": "s3"},
        }
    )
    before = set(os.listdir(tmp_path))
    out = run_sweep(cfg)
    assert set(os.listdir(tmp_path)) - before <= {"mlartifacts", "mlflow.db"}  # MLflow only
    keys = fs.find("bucket/run/sweep")
    assert "bucket/run/sweep/sweep.json" in keys and "bucket/run/sweep/summary.md" in keys
    assert any(k.startswith("bucket/run/sweep/tune/trials/") for k in keys)  # Tune state
    # the trial's checkpoints (it trained in place: Tune's checkpoints, beside its state)
    assert any("/checkpoint_" in k and k.endswith("trainer.pt") for k in keys)
    record = json.loads(storage.read_text("s3://bucket/run/sweep/sweep.json"))
    assert record["parent_run_id"] == out["parent_run_id"]
    (child,) = tracking.child_runs(uri, out["parent_run_id"])
    model = mlflow.pyfunc.load_model(tracking.download(f"runs:/{child.info.run_id}/adapter", uri))
    pred = model.predict(pd.DataFrame({"embedding": [[1.0] + [0.0] * 15], "norm": [8.0]}))
    assert pred["kappa"].iloc[0] > 0 and pred["uncertainty"].iloc[0] > 0
