"""An object store that stumbles (503 SlowDown, dropped connections): every storage request is
retried with backoff and jitter, a request that fails for good names its URI, and nothing
half-written ever looks complete. The faults come from a proxy on 127.0.0.1 in front of moto
(:mod:`tests.faults`)."""

from __future__ import annotations

import numpy as np
import pytest

from asymvlm import storage, tables
from asymvlm.synthetic import write_world
from tests.conftest import small_world_config
from tests.faults import FlakyProxy


@pytest.fixture
def flaky_s3(s3_server, monkeypatch):
    """moto behind a proxy that fails requests on demand; the clients talk to the proxy."""
    import s3fs

    s3fs.S3FileSystem(endpoint_url=s3_server).mkdir("bucket")
    with FlakyProxy(s3_server, seed=1) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
        s3fs.S3FileSystem.clear_instance_cache()
        yield proxy
    s3fs.S3FileSystem.clear_instance_cache()


def _keys(endpoint: str) -> list[str]:
    import s3fs

    return s3fs.S3FileSystem(endpoint_url=endpoint, skip_instance_cache=True).find("bucket")


@pytest.mark.slow
def test_tables_and_records_survive_a_third_of_the_requests_failing(flaky_s3, s3_server) -> None:
    flaky_s3.fail(share=0.3, seconds=600)
    world = small_world_config(dim=8, splits={"train": 60, "test": 20})
    root = write_world("s3://bucket/world", world)
    storage.write_json(root, "records/one.json", {"epoch": 3})
    storage.write_text(f"{root}/records/two.txt", "done\n")
    assert storage.read_json(root, "records/one.json") == {"epoch": 3}
    assert storage.read_text(f"{root}/records/two.txt") == "done\n"
    split = tables.read_split(root, "train")
    assert split.n_images == 60 and np.isfinite(split.image_embeddings).all()
    counts = dict(flaky_s3.counts)
    assert counts["failed"] > 10 and counts["503"] > 0 and counts["drop"] > 0, counts
    # nothing half-written: no temporary object is left, every record reads whole
    flaky_s3.fail(share=0.0, seconds=0)
    keys = _keys(s3_server)
    assert not [k for k in keys if ".tmp-" in k], keys
    assert tables.read_split(root, "test").n_images == 20


def test_ray_checkpoints_are_written_through_the_retries(flaky_s3, s3_server) -> None:
    """Ray Train and Tune write checkpoints and their state through ``ray_storage``'s
    filesystem, the project's one stack with its retries."""
    path, fs = storage.ray_storage("s3://bucket/ray")
    assert path == "bucket/ray"
    flaky_s3.fail(share=0.3, seconds=600)
    payload = bytes(range(256)) * 64
    for k in range(8):
        with fs.open_output_stream(f"{path}/checkpoint_{k:06d}/model.pt") as out:
            out.write(payload)
    for k in range(8):
        with fs.open_input_stream(f"{path}/checkpoint_{k:06d}/model.pt") as fh:
            assert fh.read() == payload
    assert flaky_s3.counts["failed"] > 0


def test_a_request_that_keeps_failing_names_its_uri(flaky_s3, s3_server, monkeypatch) -> None:
    monkeypatch.setenv("ASYMVLM_STORAGE_ATTEMPTS", "many")
    with pytest.raises(storage.StorageError, match="ASYMVLM_STORAGE_ATTEMPTS"):
        storage.attempts()
    monkeypatch.setenv("ASYMVLM_STORAGE_ATTEMPTS", "2")
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()
    flaky_s3.fail(share=1.0, seconds=600)
    with pytest.raises(storage.StorageError) as caught:
        storage.write_text("s3://bucket/run/sweep.json", "{}")
    message = str(caught.value)
    assert message.startswith("s3://bucket/run/sweep.json: ") and "after 2 attempts" in message
    flaky_s3.fail(share=0.0, seconds=0)
    assert not [k for k in _keys(s3_server) if k.startswith("bucket/run")]  # nothing half there
