"""Shared fixtures: small synthetic worlds written as embedding tables."""

from __future__ import annotations

import pytest
import torch

from asymvlm.synthetic import WorldConfig, write_world


def small_world_config(**overrides) -> WorldConfig:
    """A world small enough for unit tests (seconds on a CPU)."""
    base = dict(dim=16, splits={"train": 300, "val": 60, "test": 60}, captions_per_image=3)
    base.update(overrides)
    return WorldConfig(**base)


@pytest.fixture
def world_config():
    """Factory for small world configurations: ``world_config(seed=1)``."""
    return small_world_config


@pytest.fixture(scope="session")
def small_world(tmp_path_factory) -> str:
    """Root of a tiny synthetic embedding table (train/val/test)."""
    root = tmp_path_factory.mktemp("world") / "tables"
    return write_world(str(root), small_world_config())


@pytest.fixture
def one_thread():
    """Tiny models run fastest single-threaded; restore the setting afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray cluster per test session: 2 CPUs, no dashboard."""
    import ray

    ray.init(num_cpus=2, include_dashboard=False, ignore_reinit_error=True)
    yield ray
    ray.shutdown()
