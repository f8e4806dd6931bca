"""The cluster manifests parse and hold what a submission needs (no cluster needed)."""

from __future__ import annotations

import os
import re

import pytest
import yaml

CLUSTER = os.path.join(os.path.dirname(__file__), "..", "cluster")
SECRET_PATTERN = re.compile(
    r"(AKIA[0-9A-Z]{16}|aws_secret_access_key\s*[:=]\s*[A-Za-z0-9/+]{40})", re.I
)


def _load(name: str) -> dict:
    with open(os.path.join(CLUSTER, name)) as fh:
        return yaml.safe_load(fh)


def _containers(spec: dict) -> list[dict]:
    groups = [spec["headGroupSpec"], *spec["workerGroupSpecs"]]
    return [c for g in groups for c in g["template"]["spec"]["containers"]]


@pytest.mark.parametrize("name", ["raycluster.yaml", "rayjob.yaml"])
def test_kuberay_manifests(name) -> None:
    doc = _load(name)
    assert doc["apiVersion"] == "ray.io/v1" and doc["metadata"]["name"]
    spec = doc["spec"]["rayClusterSpec"] if doc["kind"] == "RayJob" else doc["spec"]
    assert doc["kind"] in ("RayCluster", "RayJob")
    gpu_groups = [g for g in spec["workerGroupSpecs"]
                  if any("nvidia.com/gpu" in c["resources"]["limits"]
                         for c in g["template"]["spec"]["containers"])]  # fmt: skip
    assert gpu_groups, "a GPU worker group"
    for container in _containers(spec):  # credentials and tracking URI come from secrets
        refs = {e["secretRef"]["name"] for e in container.get("envFrom", [])}
        assert {"asymvlm-s3", "asymvlm-mlflow"} <= refs
    if doc["kind"] == "RayJob":
        assert "pipelines/full.py" in doc["spec"]["entrypoint"]


def test_cluster_launcher() -> None:
    doc = _load("cluster-launcher.yaml")
    assert doc["head_node_type"] in doc["available_node_types"]
    workers = [t for n, t in doc["available_node_types"].items() if n != doc["head_node_type"]]
    assert workers and all(t["max_workers"] >= 1 for t in workers)
    assert any("ray start --head" in c for c in doc["head_start_ray_commands"])


def test_no_secrets_in_files() -> None:
    for name in os.listdir(CLUSTER):
        text = open(os.path.join(CLUSTER, name)).read()
        assert not SECRET_PATTERN.search(text), name
