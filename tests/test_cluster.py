"""The cluster files hold what a run on a cluster needs, checked without a cluster or network:
the KubeRay manifests against KubeRay v1.7.0's RayCluster/RayJob CRD schemas (tests/data/,
strict like ``kubectl apply --validate=strict``), the launcher YAML against Ray's own schema and
config preparation (as ``ray up``), and the pins of the image, the manifests and the set-up."""

from __future__ import annotations

import copy
import json
import os
import re
import shlex
import subprocess
import tomllib
from typing import Any
from unittest import mock

import jsonschema
import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROJECT_IMAGE = "ghcr.io/<org>/asymvlm"  # the placeholder users replace (cluster/README.md)
SECRET_VALUE = re.compile(
    r"AKIA[0-9A-Z]{16}|-----BEGIN [A-Z ]*PRIVATE KEY|gh[pousr]_[A-Za-z0-9]{30,}"
    r"|[A-Za-z][A-Za-z0-9+.-]*://[^/@:\s'\"]+:[^/@\s'\"]+@"  # a password inside a URI
    r"|RAY_AUTH_TOKEN[=:]\s*[^$\s]",  # a Ray token's value (not one read from a Secret or file)
)


def _read(*parts: str) -> str:
    with open(os.path.join(ROOT, *parts)) as fh:
        return fh.read()


def _load(name: str) -> dict:
    return yaml.safe_load(_read("cluster", name))


def _pins() -> dict[str, str]:
    """constraints.txt as {normalised name: version}."""
    lines = [ln.split("#", 1)[0].strip() for ln in _read("constraints.txt").splitlines()]
    pairs = [ln.partition("==")[::2] for ln in lines if ln]
    return {re.sub(r"[-_.]+", "-", name).lower(): version for name, version in pairs}


def _strict(node: Any) -> Any:
    """A CRD's openAPIV3Schema as JSON schema: unknown fields refused, int-or-string typed."""
    if isinstance(node, list):
        return [_strict(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _strict(v) for k, v in node.items() if not k.startswith("x-kubernetes")}
    if "$ref" in out:
        out["$ref"] = "#/definitions/" + out["$ref"]
    if node.get("x-kubernetes-int-or-string"):
        out["type"] = ["integer", "string"]
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    if "properties" in out:
        out["properties"] = {k: _strict(v) for k, v in node["properties"].items()}
        if not node.get("x-kubernetes-preserve-unknown-fields"):
            out.setdefault("additionalProperties", False)
    return out


def kuberay_errors(doc: dict) -> list[str]:
    crds = json.loads(_read("tests", "data", "kuberay-crd-schemas.json"))
    schema = _strict(crds[doc["kind"]])
    schema["definitions"] = _strict(crds["definitions"])
    schema["properties"]["metadata"] = {"properties": {"name": {"type": "string"}}}
    validator = jsonschema.Draft7Validator(schema)
    return [f"{'.'.join(map(str, e.path))}: {e.message}" for e in validator.iter_errors(doc)]


def launcher_errors(doc: dict) -> list[str]:
    """Ray's launcher schema, then its config preparation, as ``ray up`` does."""
    import ray.autoscaler
    from ray.autoscaler._private.util import prepare_config, validate_config

    schema = json.loads(_read(os.path.dirname(ray.autoscaler.__file__), "ray-schema.json"))
    errors = [e.message for e in jsonschema.Draft7Validator(schema).iter_errors(doc)]
    if not errors:
        validate_config(prepare_config(copy.deepcopy(doc)))
    return errors


@pytest.mark.parametrize("name", ["raycluster.yaml", "rayjob.yaml"])
def test_kuberay_manifest(name: str) -> None:
    doc = _load(name)
    assert kuberay_errors(doc) == []
    spec = doc["spec"].get("rayClusterSpec", doc["spec"])
    assert spec["rayVersion"] == _pins()["ray"]
    version = tomllib.loads(_read("pyproject.toml"))["project"]["version"]
    groups = [(spec["headGroupSpec"], "cpu")] + [(g, "gpu") for g in spec["workerGroupSpecs"]]
    for group, variant in groups:
        ray_container = group["template"]["spec"]["containers"][0]
        assert ray_container["image"] == f"{PROJECT_IMAGE}:{version}-{variant}"
        secrets = {e["secretRef"]["name"] for e in ray_container["envFrom"]}
        assert secrets == {"asymvlm-mlflow", "asymvlm-s3"}  # settings only from secrets
        # The operator's token on every Ray container: nothing of theirs may override it.
        assert not [e for e in ray_container.get("env", []) if e["name"].startswith("RAY_AUTH")]
    assert spec["authOptions"] == {"mode": "token"}
    head = spec["headGroupSpec"]  # reached inside the Kubernetes cluster: the GCS and the Jobs API
    ports = head["template"]["spec"]["containers"][0]["ports"]
    assert head["serviceType"] == "ClusterIP"
    assert [p["containerPort"] for p in ports] == [6379, 8265]
    head["rayStartParams"]["num-cpus"] = 0  # a wrong type
    head["rayStartParam"] = {}  # an unknown field
    spec["authOptions"]["mode"] = "Token"  # not one of KubeRay's modes
    assert len(kuberay_errors(doc)) == 3


def test_rayjob_runs_the_cluster_of_raycluster() -> None:
    assert _load("rayjob.yaml")["spec"]["rayClusterSpec"] == _load("raycluster.yaml")["spec"]


def test_rayjob_entrypoint_resolves_on_the_head(monkeypatch, hub_cache) -> None:
    """The entrypoint as it runs: KubeRay's submitter passes it through a shell without the
    secrets, ``ray job submit`` joins the words with shlex.join, and the head's shell (with
    the secrets) runs it: the pipeline gets the bucket and the secret's tracking URI."""
    from pipelines import full

    entrypoint = _load("rayjob.yaml")["spec"]["entrypoint"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "AWS_"))}

    def words(command: str, env: dict) -> list[str]:
        printf = ["sh", "-c", "printf '%s\\0' " + command]
        done = subprocess.run(printf, env=env, check=True, capture_output=True, text=True)
        return done.stdout[:-1].split("\0")

    tracking_uri = "https://mlflow.example.com"
    argv = words(shlex.join(words(entrypoint, env)), {**env, "MLFLOW_TRACKING_URI": tracking_uri})
    assert argv[:2] == ["python", "pipelines/full.py"]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", tracking_uri)
    monkeypatch.chdir(ROOT)  # the image's working directory is the project
    for repo in ("openai/clip-vit-base-patch32", "google/siglip-base-patch16-224"):
        hub_cache(repo, "config.json")  # the head has them (or the Hub)
    capture = mock.Mock(side_effect=KeyboardInterrupt)  # stops it at its first look at the bucket
    monkeypatch.setattr(full, "check_reruns", capture)
    assert full.main(argv[2:]) == 130
    cfg = capture.call_args.args[0]
    assert cfg.mlflow.tracking_uri == tracking_uri and cfg.output.startswith("s3://")


def test_the_launcher_the_image_and_the_setup_install_the_pins() -> None:
    doc, ray_pin = _load("cluster-launcher.yaml"), _pins()["ray"]
    assert launcher_errors(doc) == []
    assert launcher_errors({**doc, "setup_command": []})  # an unknown key is refused
    assert doc["docker"]["head_image"] == f"rayproject/ray:{ray_pin}-py311"
    assert doc["docker"]["image"] == f"rayproject/ray:{ray_pin}-py311-gpu"
    installs = [c for c in doc["setup_commands"] if "pip install" in c]
    assert installs and all("constraints.txt" in c and " -e " not in c for c in installs)
    docker = _read("cluster", "Dockerfile")
    assert f"ARG RAY_IMAGE=rayproject/ray:{ray_pin}-py311-gpu\n" in docker
    assert "pip install --no-cache-dir -c constraints.txt ." in docker
    wheel = tomllib.loads(_read("pyproject.toml"))["tool"]["setuptools"]["packages"]["find"]
    for package in {name.split(".")[0] for name in wheel["include"]}:  # the image installs all
        assert f"COPY --chown=ray:users {package} ./{package}\n" in docker, package
    setup = [ln for ln in _read("scripts", "setup.sh").splitlines() if "pip install" in ln]
    assert setup and all("pip install -c constraints.txt" in ln for ln in setup), setup


def test_the_launcher_starts_every_node_with_the_token_from_a_file() -> None:
    """As tests/multinode/cluster.sh starts its nodes: RAY_AUTH_MODE=token and the token in a file
    (its folder shipped by file_mounts) named by RAY_AUTH_TOKEN_PATH, in every container; the
    dashboard on the head's loopback (`ray dashboard` forwards it over SSH)."""
    doc = _load("cluster-launcher.yaml")
    options = [o.split(maxsplit=1) for o in doc["docker"]["run_options"]]
    env = dict(value.split("=", 1) for flag, value in options if flag == "--env")
    assert env["RAY_AUTH_MODE"] == "token"
    folder, name = os.path.split(env["RAY_AUTH_TOKEN_PATH"])
    assert doc["file_mounts"][folder] == "~/.ray/asymvlm" and name == "auth_token"
    commands = doc["head_start_ray_commands"] + doc["worker_start_ray_commands"]
    assert not [c for c in commands if "RAY_AUTH" in c]  # set for the container, not per command
    (head,) = [c for c in doc["head_start_ray_commands"] if "ray start" in c]
    assert "--dashboard-host=127.0.0.1" in head.split()


def test_constraints_pin_every_dependency() -> None:
    from packaging.requirements import Requirement

    pins = _pins()
    project = tomllib.loads(_read("pyproject.toml"))["project"]
    extras = [r for rs in project["optional-dependencies"].values() for r in rs]
    for text in project["dependencies"] + [r for r in extras if not r.startswith("asymvlm[")]:
        req = Requirement(text)
        name = re.sub(r"[-_.]+", "-", req.name).lower()
        assert name in pins, f"{req.name} (pyproject.toml) is not pinned in constraints.txt"
        assert req.specifier.contains(pins[name], prereleases=True), f"{name}=={pins[name]}"


def test_no_secrets_in_files() -> None:
    paths = [os.path.join("cluster", n) for n in os.listdir(os.path.join(ROOT, "cluster"))]
    others = ["constraints.txt", os.path.join("scripts", "setup.sh")]
    for path in paths + others + [os.path.join("tests", "multinode", "cluster.sh")]:
        assert not SECRET_VALUE.search(_read(path)), path
