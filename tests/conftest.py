"""Shared fixtures: small synthetic worlds written as embedding tables."""

from __future__ import annotations

import os

import pytest
import torch

from asymvlm.synthetic import write_world
from tests.helpers import free_port, small_world_config


def pytest_configure(config) -> None:
    """Under pytest-xdist each worker (and every process it starts) computes on one thread."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        torch.set_num_threads(1)


#: The two longest modules (the two-node harness, ~6 min; the benchmarks' smoke runs, ~5 min):
#: run first, one per worker, while the other modules fill in around them (the Makefile's
#: ``--dist loadfile --no-loadscope-reorder`` hands modules out in this order).
LONGEST_FIRST = ("tests/test_multinode.py", "tests/test_benchmarks.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The modules of :data:`LONGEST_FIRST` first, the others in collection order."""

    def rank(item: pytest.Item) -> int:
        path = item.nodeid.split("::")[0]
        return LONGEST_FIRST.index(path) if path in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: each module's tests keep their order


@pytest.fixture(scope="session")
def small_world(tmp_path_factory) -> str:
    """Root of a tiny synthetic embedding table (train/val/test)."""
    root = tmp_path_factory.mktemp("world") / "tables"
    return write_world(str(root), small_world_config())


@pytest.fixture(scope="session")
def pre_world(tmp_path_factory) -> str:
    """A small world (400 / 80 / 80 images) with pre-projection features and image norms: every
    method trains on it, bayesvlm too."""
    root = tmp_path_factory.mktemp("pre-world") / "tables"
    cfg = small_world_config(pre_dim=24, splits={"train": 400, "val": 80, "test": 80})
    return write_world(str(root), cfg)


@pytest.fixture
def one_thread():
    """Tiny models run fastest single-threaded; restore the setting afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def add_method(monkeypatch):
    """``add_method(name, cls)``: ``cls`` in the method registry as ``name`` for one test."""
    from asymvlm.methods import METHODS

    def add(name: str, cls: type) -> None:
        len(METHODS)  # the installed plugins discovered first
        monkeypatch.setattr(cls, "name", name, raising=False)
        monkeypatch.setitem(METHODS._classes, name, cls)

    return add


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray cluster per test session: 2 CPUs, no dashboard; a new one, whatever cluster
    Ray's temp folder names."""
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, ignore_reinit_error=True)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def _moto_endpoint():
    """One local S3-compatible server (moto's server mode) on 127.0.0.1 per test process."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def s3_server(_moto_endpoint, monkeypatch):
    """The local S3 server, emptied, with its endpoint and test credentials in the environment."""
    import urllib.request

    import s3fs

    reset = urllib.request.Request(f"{_moto_endpoint}/moto-api/reset", method="POST")
    urllib.request.urlopen(reset).close()
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(key, "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL", _moto_endpoint)
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    s3fs.S3FileSystem.clear_instance_cache()
    yield _moto_endpoint
    s3fs.S3FileSystem.clear_instance_cache()


@pytest.fixture
def bucket(s3_server):
    """An s3fs filesystem on the local S3 server, with an empty ``bucket``."""
    import s3fs

    fs = s3fs.S3FileSystem(endpoint_url=s3_server, skip_instance_cache=True)
    fs.mkdir("bucket")
    return fs


@pytest.fixture
def ray_on_s3_nodes(ray_session, s3_server):
    """Ray restarted with the S3 settings in the environment: workers read credentials there."""
    ray_session.shutdown()
    ray_session.init(num_cpus=2, include_dashboard=False)
    yield s3_server
    ray_session.shutdown()
    ray_session.init(num_cpus=2, include_dashboard=False)


@pytest.fixture
def hierarcaps_standin(tmp_path, monkeypatch) -> None:
    """A stand-in HierarCaps folder: the whole demo config validates without the real data."""
    hierarcaps = tmp_path / "hierarcaps-standin"
    (hierarcaps / "images").mkdir(parents=True)
    (hierarcaps / "hierarcaps_test.csv").write_text("")
    monkeypatch.setenv("ASYMVLM_HIERARCAPS", str(hierarcaps))


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """An empty Hugging Face cache and an unreachable Hub; ``hub_cache(repo, *files)`` fills the
    cache as a download would."""
    from huggingface_hub import constants

    root = tmp_path / "hf-cache"
    url = f"http://127.0.0.1:{free_port()}/{{repo_id}}/resolve/{{revision}}/{{filename}}"
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(root))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", url)

    def add(repo: str, *files: str) -> None:
        folder = root / ("models--" + repo.replace("/", "--"))
        commit = "0" * 40
        (folder / "refs").mkdir(parents=True, exist_ok=True)
        (folder / "refs" / "main").write_text(commit)
        snapshot = folder / "snapshots" / commit
        snapshot.mkdir(parents=True, exist_ok=True)
        for name in files:
            (snapshot / name).write_text("{}")

    return add
