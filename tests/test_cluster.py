"""The cluster files (cluster/, constraints.txt, scripts/setup.sh) hold what a run on a cluster
needs, checked without a cluster, Docker or network:

* the KubeRay manifests against the RayCluster/RayJob CRD schemas of KubeRay v1.7.0 (a trimmed
  copy in tests/data/, see ``trim_crd_schemas``), strictly: an unknown or duplicated field is
  an error, as with ``kubectl apply --validate=strict``; plus the rules KubeRay's controller
  checks (names, replicas, rayStartParams) and this project's deployment rules (the project
  image everywhere, GPU tolerations, /dev/shm, autoscaling, secrets through the pod
  environment only, sizes that fit the documented instance types);
* the cluster launcher YAML against the JSON schema shipped in the ``ray`` package and Ray's own
  config preparation, plus the deployment rules (no AMI placeholder, pinned installs, nothing
  written into the environment on ``ray up``);
* the Dockerfile, constraints.txt and scripts/setup.sh agree on the pinned versions.

Each checker returns a list of problems; ``test_checks_catch_broken_manifests`` breaks copies
of the manifests in memory and requires the checkers to notice.

Regenerate the CRD data after a KubeRay upgrade (a checkout at the new tag):
    python tests/test_cluster.py KUBERAY_CHECKOUT [TAG]
"""

from __future__ import annotations

import copy
import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
from collections.abc import Callable
from typing import Any

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLUSTER = os.path.join(ROOT, "cluster")
CRD_DATA = os.path.join(ROOT, "tests", "data", "kuberay-crd-schemas.json")
KUBERAY_MANIFESTS = ("raycluster.yaml", "rayjob.yaml")

PROJECT_IMAGE = "ghcr.io/<org>/asymvlm"  # the placeholder users replace (cluster/README.md)
SECRETS = ("asymvlm-mlflow", "asymvlm-s3")  # MLflow and S3 settings, through envFrom only
# Documented instance types (vCPU, GiB, GPUs) and which one each group is sized for.
INSTANCE_TYPES = {"m6i.2xlarge": (8, 32, 0), "g5.2xlarge": (8, 32, 1)}
GROUP_INSTANCE = {"head": "m6i.2xlarge", "gpu": "g5.2xlarge"}
# KubeRay's defaults for the pods a cluster adds beside the Ray containers.
AUTOSCALER_DEFAULT = {"cpu": 0.5, "memory": 512 * 2**20}
SUBMITTER_DEFAULT = {"cpu": 1.0, "memory": 2**30}
OBJECT_STORE_FRACTION = 0.3  # Ray's default object store size, of the container memory

CREDENTIAL_NAME = re.compile(r"KEY|SECRET|TOKEN|PASSWORD|PASSWD|CREDENTIAL", re.I)
SETTING_NAME = re.compile(r"^(AWS_|MLFLOW_)|" + CREDENTIAL_NAME.pattern, re.I)
SECRET_VALUE = re.compile(
    r"AKIA[0-9A-Z]{16}|ASIA[0-9A-Z]{16}|-----BEGIN [A-Z ]*PRIVATE KEY|gh[pousr]_[A-Za-z0-9]{30,}"
    r"|aws_secret_access_key\s*[:=]\s*[A-Za-z0-9/+]{40}"
    r"|[A-Za-z][A-Za-z0-9+.-]*://[^/@:\s'\"]+:[^/@\s'\"]+@",  # a password inside a URI
    re.I,
)
DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
MAX_NAME = {"RayCluster": 53, "RayJob": 47}  # KubeRay's MaxRayClusterNameLength and -6


# -- loading ------------------------------------------------------------------------------------
class _StrictLoader(yaml.SafeLoader):
    """YAML that refuses duplicated keys (PyYAML keeps the last one silently; the API server's
    strict field validation reports them)."""


def _mapping(loader: _StrictLoader, node: yaml.MappingNode) -> dict:
    seen: set = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate field {key!r}", key_node.start_mark
            )
        seen.add(key)
    return loader.construct_mapping(node, deep=True)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)


def _load(name: str) -> dict:
    with open(os.path.join(CLUSTER, name)) as fh:
        return yaml.load(fh, Loader=_StrictLoader)


def _read(*parts: str) -> str:
    with open(os.path.join(ROOT, *parts)) as fh:
        return fh.read()


def _project_version() -> str:
    return tomllib.loads(_read("pyproject.toml"))["project"]["version"]


def _pins() -> dict[str, str]:
    """constraints.txt as {normalised name: version}."""
    pins = {}
    for line in _read("constraints.txt").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            pins[re.sub(r"[-_.]+", "-", name).lower()] = version
    return pins


def _quantity(value: Any) -> float:
    """A Kubernetes quantity ("500m", "26Gi", 4) as a number (cores or bytes)."""
    text = str(value)
    match = re.fullmatch(r"([0-9.]+(?:[eE][-+]?[0-9]+)?)([KMGTPE]i|[numkMGTPE])?", text)
    if not match:
        raise ValueError(f"not a quantity: {value!r}")
    number, suffix = float(match.group(1)), match.group(2) or ""
    if suffix.endswith("i"):
        return number * 1024 ** ("KMGTPE".index(suffix[0]) + 1)
    scale = {
        "n": 1e-9,
        "u": 1e-6,
        "m": 1e-3,
        "": 1,
        "k": 1e3,
        "M": 1e6,
        "G": 1e9,
        "T": 1e12,
        "P": 1e15,
        "E": 1e18,
    }
    return number * scale[suffix]


# -- a structural validator for the CRDs' openAPIV3Schema -----------------------------------
# The top-level metadata of a custom resource is a plain ObjectMeta, which the CRD leaves to
# the API server ("type: object"); these are its fields that a manifest may set.
OBJECT_META = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "generateName": {"type": "string"},
        "namespace": {"type": "string"},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
    },
}
_TYPES: dict[str, Callable[[Any], bool]] = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
}


def schema_problems(value: Any, schema: dict, defs: dict, path: str = "") -> list[str]:
    """What the API server would refuse in ``value`` under ``schema`` with strict field
    validation: unknown fields, wrong types, missing required fields, enum and pattern
    violations. ``{"$ref": NAME}`` points into ``defs``. (CEL rules are not evaluated.)"""
    if "$ref" in schema:
        return schema_problems(value, defs[schema["$ref"]], defs, path)
    where = path or "<root>"
    if value is None:
        return [] if schema.get("nullable") else [f"{where}: null is not allowed"]
    if schema.get("x-kubernetes-preserve-unknown-fields") and "type" not in schema:
        return []
    if schema.get("x-kubernetes-int-or-string"):
        if not (_TYPES["integer"](value) or _TYPES["string"](value)):
            return [f"{where}: expected an integer or a string, got {type(value).__name__}"]
    elif "anyOf" in schema:
        if not any(not schema_problems(value, s, defs, path) for s in schema["anyOf"]):
            return [f"{where}: {value!r} matches none of the allowed forms"]
    kind = schema.get("type")
    if kind and not _TYPES[kind](value):
        return [f"{where}: expected {kind}, got {type(value).__name__} ({value!r})"]
    problems = []
    if "enum" in schema and value not in schema["enum"]:
        problems.append(f"{where}: {value!r} is not one of {schema['enum']}")
    if isinstance(value, str):
        if "pattern" in schema and not re.search(schema["pattern"], value):
            problems.append(f"{where}: {value!r} does not match {schema['pattern']}")
        if len(value) < schema.get("minLength", 0) or len(value) > schema.get("maxLength", 1e9):
            problems.append(f"{where}: length of {value!r} out of bounds")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if value < schema.get("minimum", -float("inf")) or value > schema.get("maximum", 1e300):
            problems.append(f"{where}: {value} out of bounds")
    if isinstance(value, list):
        if len(value) < schema.get("minItems", 0) or len(value) > schema.get("maxItems", 1e9):
            problems.append(f"{where}: {len(value)} items out of bounds")
        for i, item in enumerate(value):
            problems += schema_problems(item, schema.get("items", {}), defs, f"{path}[{i}]")
    if isinstance(value, dict):
        props = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        for key in schema.get("required", []):
            if key not in value:
                problems.append(f"{path + '.' if path else ''}{key}: required field is missing")
        for key, item in value.items():
            sub = f"{path}.{key}" if path else str(key)
            if key in props:
                problems += schema_problems(item, props[key], defs, sub)
            elif isinstance(extra, dict):
                problems += schema_problems(item, extra, defs, sub)
            elif extra is True or schema.get("x-kubernetes-preserve-unknown-fields"):
                continue
            else:
                problems.append(f'unknown field "{sub}"')
    return problems


def _crds() -> dict:
    with open(CRD_DATA) as fh:
        return json.load(fh)


# -- KubeRay manifests --------------------------------------------------------------------------
def _cluster_spec(doc: dict) -> dict:
    return doc["spec"]["rayClusterSpec"] if doc["kind"] == "RayJob" else doc["spec"]


def _groups(spec: dict) -> list[tuple[str, dict]]:
    return [("head", spec["headGroupSpec"])] + [
        (g.get("groupName", f"workerGroupSpecs[{i}]"), g)
        for i, g in enumerate(spec.get("workerGroupSpecs") or [])
    ]


def _pod(group: dict) -> dict:
    return (group.get("template") or {}).get("spec") or {}


def _gpus(container: dict) -> float:
    limits = (container.get("resources") or {}).get("limits") or {}
    return float(_quantity(limits.get("nvidia.com/gpu", 0)))


def kuberay_schema_problems(doc: dict) -> list[str]:
    crds = _crds()
    if doc.get("apiVersion") != "ray.io/v1" or doc.get("kind") not in ("RayCluster", "RayJob"):
        return [
            f"apiVersion/kind: expected ray.io/v1 RayCluster or RayJob, got "
            f"{doc.get('apiVersion')} {doc.get('kind')}"
        ]
    schema = copy.deepcopy(crds[doc["kind"]])
    schema["properties"]["metadata"] = OBJECT_META
    return schema_problems(doc, schema, crds["definitions"])


def kuberay_controller_problems(doc: dict) -> list[str]:
    """What KubeRay's controller refuses (ray-operator/controllers/ray/utils/validation.go)."""
    problems = []
    name = (doc.get("metadata") or {}).get("name", "")
    if not DNS1035.match(name) or len(name) > MAX_NAME[doc["kind"]]:
        problems.append(
            f"metadata.name {name!r}: a DNS-1035 label of at most "
            f"{MAX_NAME[doc['kind']]} characters"
        )
    spec = _cluster_spec(doc)
    autoscaling = bool(spec.get("enableInTreeAutoscaling"))
    for group_name, group in _groups(spec):
        containers = _pod(group).get("containers") or []
        if not containers:
            problems.append(f"{group_name}: at least one container")
        params = group.get("rayStartParams") or {}
        if "labels" in params:
            problems.append(f"{group_name}: rayStartParams['labels'] is not supported")
        if group.get("resources") and {"num-cpus", "num-gpus", "memory", "resources"} & set(params):
            problems.append(f"{group_name}: resources both in rayStartParams and resources")
        if group_name == "head":
            continue
        low, high = group.get("minReplicas"), group.get("maxReplicas")
        if not autoscaling and (low is None or high is None):
            problems.append(f"{group_name}: minReplicas and maxReplicas without autoscaling")
        if low is not None and high is not None and low > high:
            problems.append(f"{group_name}: minReplicas {low} > maxReplicas {high}")
        replicas = group.get("replicas")
        if (
            replicas is not None
            and low is not None
            and high is not None
            and not low <= replicas <= high
        ):
            problems.append(f"{group_name}: replicas {replicas} outside [{low}, {high}]")
    if doc["kind"] == "RayJob":
        job = doc["spec"]
        if job.get("ttlSecondsAfterFinished") and not job.get("shutdownAfterJobFinishes"):
            problems.append("ttlSecondsAfterFinished needs shutdownAfterJobFinishes: true")
        try:
            yaml.safe_load(job.get("runtimeEnvYAML") or "")
        except yaml.YAMLError as exc:
            problems.append(f"runtimeEnvYAML is not YAML: {exc}")
    return problems


def _env_problems(where: str, container: dict) -> list[str]:
    problems = []
    refs = {(e.get("secretRef") or {}).get("name") for e in container.get("envFrom") or []}
    missing = [s for s in SECRETS if s not in refs]
    if missing:
        problems.append(f"{where}: envFrom secretRef {missing} (MLflow/S3 settings)")
    for var in container.get("env") or []:
        if SETTING_NAME.search(var.get("name", "")) and "value" in var:
            problems.append(
                f"{where}: env {var['name']} has a literal value; use "
                "valueFrom.secretKeyRef or envFrom"
            )
    return problems


def _fit_problems(group_name: str, pod: dict, extra: list[dict]) -> list[str]:
    """The group's pod (plus pods KubeRay puts beside it) fits its instance type, with room
    for the kubelet's reservation and the system daemon sets."""
    instance = GROUP_INSTANCE.get(group_name)
    if instance is None:
        return [f"{group_name}: no documented instance type (GROUP_INSTANCE)"]
    vcpu, gib, gpus = INSTANCE_TYPES[instance]
    cpu_room, mem_room = vcpu - max(0.5, 0.06 * vcpu), gib * 2**30 * 0.9 - 2**30
    cpu = mem = gpu = 0.0
    problems = []
    for c in pod["containers"]:
        requests = (c.get("resources") or {}).get("requests") or {}
        limits = (c.get("resources") or {}).get("limits") or {}
        if "cpu" not in requests or "memory" not in requests:
            problems.append(f"{group_name}/{c['name']}: cpu and memory requests")
            continue
        if str(requests.get("nvidia.com/gpu", limits.get("nvidia.com/gpu", 0))) != str(
            limits.get("nvidia.com/gpu", 0)
        ):
            problems.append(f"{group_name}/{c['name']}: nvidia.com/gpu requests != limits")
        cpu += _quantity(requests["cpu"])
        mem += _quantity(requests["memory"])
        gpu += _gpus(c)
    for e in extra:
        cpu, mem = cpu + e["cpu"], mem + e["memory"]
    if cpu > cpu_room or mem > mem_room or gpu > gpus:
        problems.append(
            f"{group_name}: requests {cpu:g} CPU / {mem / 2**30:.1f} GiB / {gpu:g} GPU do not fit "
            f"{instance} ({vcpu} vCPU, {gib} GiB, {gpus} GPU) with headroom "
            f"({cpu_room:g} CPU / {mem_room / 2**30:.1f} GiB)"
        )
    return problems


def kuberay_deployment_problems(doc: dict) -> list[str]:
    """This project's rules for its KubeRay manifests."""
    problems = []
    spec = _cluster_spec(doc)
    version = _project_version()
    ray_pin = _pins().get("ray")
    if spec.get("rayVersion") != ray_pin:
        problems.append(f"rayVersion {spec.get('rayVersion')!r} != ray pin {ray_pin!r}")
    autoscaler = spec.get("autoscalerOptions") or {}
    if autoscaler.get("image", PROJECT_IMAGE).split(":")[0] != PROJECT_IMAGE:
        problems.append("autoscalerOptions.image: the project image")
    scaling = [g for n, g in _groups(spec)[1:] if g.get("minReplicas", 0) < g.get("maxReplicas", 0)]
    if scaling and spec.get("enableInTreeAutoscaling") is not True:
        problems.append("minReplicas < maxReplicas needs enableInTreeAutoscaling: true")
    for group_name, group in _groups(spec):
        pod = _pod(group)
        containers = pod.get("containers") or []
        if not containers:
            continue
        ray_container = containers[0]  # KubeRay's RayContainerIndex
        where = f"{group_name}/{ray_container.get('name')}"
        gpu = any(_gpus(c) > 0 for c in containers)
        for c in containers + (pod.get("initContainers") or []):
            image = c.get("image", "")
            if image.split(":")[0] != PROJECT_IMAGE:
                problems.append(
                    f"{group_name}/{c.get('name')}: image {image!r} is not {PROJECT_IMAGE}"
                )
        expected = f"{PROJECT_IMAGE}:{version}-{'gpu' if gpu else 'cpu'}"
        if ray_container.get("image") != expected:
            problems.append(f"{where}: image {ray_container.get('image')!r}, expected {expected!r}")
        if gpu and not any(
            t.get("key") == "nvidia.com/gpu"
            and t.get("effect", "NoSchedule") == "NoSchedule"
            and t.get("operator", "Equal") in ("Exists", "Equal")
            for t in pod.get("tolerations") or []
        ):
            problems.append(f"{group_name}: GPU pods need a nvidia.com/gpu NoSchedule toleration")
        mounts = {
            m.get("mountPath"): m.get("name") for m in ray_container.get("volumeMounts") or []
        }
        volumes = {v.get("name"): v for v in pod.get("volumes") or []}
        shm = volumes.get(mounts.get("/dev/shm"), {}).get("emptyDir")
        if not shm or shm.get("medium") != "Memory":
            problems.append(f"{where}: /dev/shm needs an emptyDir volume with medium Memory")
        else:
            memory = _quantity(
                ((ray_container.get("resources") or {}).get("limits") or {}).get("memory", 0)
            )
            size = _quantity(shm.get("sizeLimit", memory))
            if not OBJECT_STORE_FRACTION * memory <= size <= memory:
                problems.append(
                    f"{where}: /dev/shm sizeLimit {shm.get('sizeLimit')} should hold "
                    "the object store and stay within the memory limit"
                )
        problems += _env_problems(where, ray_container)
        extra = []
        if group_name == "head":
            if spec.get("enableInTreeAutoscaling"):
                requests = (autoscaler.get("resources") or {}).get("requests") or {}
                extra.append(
                    {
                        k: _quantity(requests[k]) if k in requests else v
                        for k, v in AUTOSCALER_DEFAULT.items()
                    }
                )
            if doc["kind"] == "RayJob":
                extra.append(SUBMITTER_DEFAULT)
        problems += _fit_problems(group_name, pod, extra)
    if doc["kind"] == "RayJob":
        problems += rayjob_problems(doc)
    for path, text in _strings(doc):
        if SECRET_VALUE.search(text):
            problems.append(f"{path}: looks like a credential")
    return problems


def rayjob_problems(doc: dict) -> list[str]:
    job = doc["spec"]
    problems = []
    args = shlex.split(job.get("entrypoint", ""))
    if args[:2] != ["python", "pipelines/full.py"]:
        problems.append(f"entrypoint: expected `python pipelines/full.py ...`, got {args[:2]}")
    pairs = zip(args, args[1:], strict=False)
    options = {flag: value for flag, value in pairs if flag.startswith("--")}
    config = options.get("--config", "")
    if not config or not os.path.isfile(os.path.join(ROOT, config)):
        problems.append(f"entrypoint: --config {config!r} is not a file of the repository")
    if not options.get("--output", "").startswith("s3://"):
        problems.append("entrypoint: --output on the bucket (s3://...), shared by every node")
    if "mlflow.tracking_uri=${MLFLOW_TRACKING_URI}" not in args:
        problems.append(
            "entrypoint: --set 'mlflow.tracking_uri=${MLFLOW_TRACKING_URI}' (the "
            "URI from the asymvlm-mlflow secret, single-quoted)"
        )
    runtime_env = yaml.safe_load(job.get("runtimeEnvYAML") or "") or {}
    if not isinstance(runtime_env, dict):
        return problems + ["runtimeEnvYAML: a mapping"]
    for key in ("pip", "uv", "conda", "py_modules", "working_dir"):
        if key in runtime_env:
            problems.append(f"runtimeEnvYAML.{key}: the code and its packages come from the image")
    for key in ("pip", "uv"):
        packages = runtime_env.get(key) or []
        packages = packages.get("packages", []) if isinstance(packages, dict) else packages
        if any(str(p).startswith(("-e", "--editable")) for p in packages):
            problems.append(
                f"runtimeEnvYAML.{key}: an editable install (-e) runs outside the working dir"
            )
    for name in runtime_env.get("env_vars") or {}:
        if SETTING_NAME.search(name):
            problems.append(
                f"runtimeEnvYAML.env_vars.{name}: credentials and MLflow/S3 "
                "settings go through the pod environment (secrets), never "
                "runtime_env (shown in the dashboard and logs)"
            )
    return problems


def _strings(value: Any, path: str = "") -> list[tuple[str, str]]:
    if isinstance(value, str):
        return [(path, value)]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in _strings(v, f"{path}.{k}" if path else k)]
    if isinstance(value, list):
        return [s for i, v in enumerate(value) for s in _strings(v, f"{path}[{i}]")]
    return []


def kuberay_problems(doc: dict) -> list[str]:
    problems = kuberay_schema_problems(doc)
    if problems:  # the other checks assume the structure
        return problems
    return kuberay_controller_problems(doc) + kuberay_deployment_problems(doc)


@pytest.mark.parametrize("name", KUBERAY_MANIFESTS)
def test_kuberay_manifest(name) -> None:
    assert kuberay_problems(_load(name)) == []


def test_rayjob_runs_the_cluster_of_raycluster() -> None:
    assert _load("rayjob.yaml")["spec"]["rayClusterSpec"] == _load("raycluster.yaml")["spec"], (
        "cluster/rayjob.yaml's rayClusterSpec and cluster/raycluster.yaml's spec differ: keep "
        "them equal (one cluster, documented once)"
    )


def test_rayjob_entrypoint_resolves_on_the_head(monkeypatch, hub_cache) -> None:
    """The entrypoint as it really runs: KubeRay's submitter pod passes it through a shell
    without the secrets, `ray job submit` joins the words with shlex.join, and Ray's job
    supervisor runs that through a shell on the head, whose environment holds the secrets.
    The pipeline must get the bucket as output and the tracking URI of the secret."""
    from pipelines import full

    entrypoint = _load("rayjob.yaml")["spec"]["entrypoint"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "AWS_"))}
    printf = "printf '%s\\0' "
    submitter = subprocess.run(
        ["bash", "-c", printf + entrypoint], env=env, check=True, capture_output=True, text=True
    ).stdout.split("\0")[:-1]
    head_env = {**env, "MLFLOW_TRACKING_URI": "https://mlflow.example.com"}
    argv = subprocess.run(
        ["sh", "-c", printf + shlex.join(submitter)],
        env=head_env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split("\0")[:-1]
    assert argv[:2] == ["python", "pipelines/full.py"]

    class Resolved(Exception):
        pass

    def capture(cfg, stages, session):
        raise Resolved(cfg)

    monkeypatch.setenv("MLFLOW_TRACKING_URI", head_env["MLFLOW_TRACKING_URI"])
    monkeypatch.chdir(ROOT)  # the image's working directory is the project
    for repo in ("openai/clip-vit-base-patch32", "google/siglip-base-patch16-224"):
        hub_cache(repo, "config.json")  # the head has them (or the Hub)
    monkeypatch.setattr(full, "run_pipeline", capture)
    with pytest.raises(Resolved) as caught:
        full.main(argv[2:])
    cfg = caught.value.args[0]
    assert cfg.mlflow.tracking_uri == "https://mlflow.example.com"
    assert cfg.output.startswith("s3://")


# -- cluster launcher -----------------------------------------------------------------------
def launcher_schema_problems(doc: dict) -> list[str]:
    """The JSON schema shipped in the ray package, then Ray's own preparation of the config
    (defaults filled, node types checked), as `ray up` does before it launches anything."""
    import jsonschema
    import ray.autoscaler
    from ray.autoscaler._private.util import prepare_config, validate_config

    with open(os.path.join(os.path.dirname(ray.autoscaler.__file__), "ray-schema.json")) as fh:
        schema = json.load(fh)
    validator = jsonschema.validators.validator_for(schema)(schema)  # draft-07
    problems = [
        f"{'.'.join(map(str, e.path)) or '<root>'}: {e.message}" for e in validator.iter_errors(doc)
    ]
    if not problems:
        try:
            validate_config(prepare_config(copy.deepcopy(doc)))
        except Exception as exc:  # noqa: BLE001 - any refusal is the finding
            problems.append(f"ray's prepare/validate_config: {exc}")
    return problems


def launcher_deployment_problems(doc: dict) -> list[str]:
    from ray.autoscaler._private.util import prepare_config

    problems = []
    ray_pin = _pins().get("ray")
    head = doc["head_node_type"]
    for name, node_type in doc["available_node_types"].items():
        config = node_type.get("node_config") or {}
        if "ImageId" in config:
            problems.append(
                f"{name}: no ImageId (Ray's default AMI for the region; a "
                "placeholder fails on ray up)"
            )
        instance = config.get("InstanceType")
        if instance not in INSTANCE_TYPES:
            problems.append(f"{name}: InstanceType {instance!r} is not documented here")
            continue
        gpus = INSTANCE_TYPES[instance][2]
        if name == head and (gpus or node_type.get("resources", {}).get("CPU") != 0):
            problems.append(f"{name}: the head is a CPU instance with resources {{CPU: 0}}")
        if name != head and not gpus:
            problems.append(f"{name}: a worker type without GPU")
        if name != head and node_type.get("max_workers", 0) < 1:
            problems.append(f"{name}: max_workers >= 1")
    docker = doc.get("docker") or {}
    images = {
        "image": docker.get("image"),
        "head_image": docker.get("head_image", docker.get("image")),
    }
    for key, image in images.items():
        allowed = (f"rayproject/ray:{ray_pin}-py311", f"rayproject/ray:{ray_pin}-py311-gpu")
        if image not in allowed and (image or "").split(":")[0] != PROJECT_IMAGE:
            problems.append(f"docker.{key}: {image!r} is neither {allowed} nor the project image")
    if not str(docker.get("head_image", "")).endswith(("py311", "-cpu")):
        problems.append("docker.head_image: the CPU image for the CPU head")
    mounts = doc.get("file_mounts") or {}
    checkout = next((remote for remote, local in mounts.items() if local in (".", "./")), None)
    if checkout is None:
        problems.append("file_mounts: the checkout (REMOTE: .)")
    prepared = prepare_config(copy.deepcopy(doc))  # what `ray up` runs, defaults included
    for key in ("setup_commands", "head_setup_commands", "worker_setup_commands"):
        commands = prepared.get(key) or []
        if checkout and not any(
            f"-c {checkout}/constraints.txt" in c and checkout in c for c in commands
        ):
            problems.append(f"{key}: install the project with -c {checkout}/constraints.txt")
        for command in commands:
            for install in re.split(r"&&|\|\||;", command):
                if "pip install" not in install:
                    continue
                if re.search(r"\s(-e|--editable)\s", f" {install} "):
                    problems.append(f"{key}: {install.strip()!r} is an editable install")
                pinned = "-c " in install or "constraints.txt" in install
                if not pinned:
                    problems.append(f"{key}: {install.strip()!r} is not pinned by constraints.txt")
    for key in (
        "initialization_commands",
        "setup_commands",
        "head_setup_commands",
        "worker_setup_commands",
        "head_start_ray_commands",
        "worker_start_ray_commands",
    ):
        for command in doc.get(key) or []:
            if re.search(r"(export\s+|\b)(MLFLOW|AWS)_\w+=|>>\s*~?/?\S*(bashrc|profile)", command):
                problems.append(f"{key}: {command!r} writes settings into the environment")
    if not any("ray start --head" in c for c in doc.get("head_start_ray_commands") or []):
        problems.append("head_start_ray_commands: ray start --head")
    if checkout and not all(
        f"cd {checkout}" in c for c in doc["head_start_ray_commands"] if "ray start" in c
    ):
        problems.append(
            "head_start_ray_commands: start Ray in the checkout, so that jobs find "
            "pipelines/ and configs/"
        )
    for path, text in _strings(doc):
        if SECRET_VALUE.search(text):
            problems.append(f"{path}: looks like a credential")
    return problems


def launcher_problems(doc: dict) -> list[str]:
    problems = launcher_schema_problems(doc)
    return problems or launcher_deployment_problems(doc)


def test_cluster_launcher() -> None:
    assert launcher_problems(_load("cluster-launcher.yaml")) == []


# -- the image, the pins, the set-up ----------------------------------------------------------
def test_dockerfile() -> None:
    text = _read("cluster", "Dockerfile")
    ray_pin = _pins()["ray"]
    python = tomllib.loads(_read("pyproject.toml"))["project"]["requires-python"]
    assert re.search(rf"^ARG RAY_IMAGE=rayproject/ray:{re.escape(ray_pin)}-py311-gpu$", text, re.M)
    assert re.search(r"^FROM \$\{RAY_IMAGE\}$", text, re.M)
    assert python == ">=3.11", "the image's py311 tag follows requires-python"
    assert f"rayproject/ray:{ray_pin}-py311 " in text, "the CPU (head) variant is documented"
    assert "pip install --no-cache-dir -c constraints.txt ." in text
    assert not re.search(r"pip install[^\n]*\s(-e|--editable)\s", text)
    assert re.search(r"^WORKDIR /home/ray/asymvlm$", text, re.M)
    for folder in ("asymvlm", "pipelines", "configs"):
        assert re.search(rf"^COPY .*\b{folder} \./{folder}$", text, re.M), folder
    assert not SECRET_VALUE.search(text)


def test_constraints_pin_every_dependency() -> None:
    from packaging.requirements import Requirement

    lines = [ln.split("#", 1)[0].strip() for ln in _read("constraints.txt").splitlines()]
    lines = [ln for ln in lines if ln]
    bad = [ln for ln in lines if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*==[^\s+@;]+", ln)]
    assert not bad, f"only NAME==VERSION lines (no -e, paths, URLs or local labels): {bad}"
    pins = _pins()
    assert len(pins) == len(lines), "a package is pinned twice"
    assert "asymvlm" not in pins, "the project itself is not a constraint"
    project = tomllib.loads(_read("pyproject.toml"))["project"]
    wanted = project["dependencies"] + [
        r for rs in project["optional-dependencies"].values() for r in rs
    ]
    for text in wanted:
        req = Requirement(text)
        name = re.sub(r"[-_.]+", "-", req.name).lower()
        assert name in pins, f"{req.name} (pyproject.toml) is not pinned in constraints.txt"
        assert req.specifier.contains(pins[name], prereleases=True), (
            f"{req.name}=={pins[name]} does not satisfy {text!r} of pyproject.toml"
        )


def test_setup_installs_with_constraints() -> None:
    code = [ln for ln in _read("scripts", "setup.sh").splitlines() if not ln.startswith("#")]
    installs = [ln for ln in code if "pip install" in ln]
    assert installs and all("pip install -c constraints.txt" in ln for ln in installs), installs
    # torch's version comes from constraints.txt, not from the script
    assert any("pip_install torch" in ln for ln in code)
    assert not any(re.search(r"torch==[0-9]", ln) for ln in code)


def test_no_secrets_in_files() -> None:
    files = [os.path.join(CLUSTER, n) for n in os.listdir(CLUSTER)]
    files += [os.path.join(ROOT, "constraints.txt"), os.path.join(ROOT, "scripts", "setup.sh")]
    for path in files:
        with open(path) as fh:
            assert not SECRET_VALUE.search(fh.read()), path


def test_readme_walks_through_the_deployment() -> None:
    text = _read("cluster", "README.md")
    steps = (
        "docker build -f cluster/Dockerfile",
        "--build-arg RAY_IMAGE=",
        "docker push",
        "kubectl create secret generic asymvlm-mlflow",
        "kubectl create secret generic asymvlm-s3",
        "kubectl apply -f cluster/rayjob.yaml",
        "ray up",
        "ray dashboard cluster/cluster-launcher.yaml",
        "ray job submit",
        "--output s3://",
        "shared_filesystem",
    )
    for needle in steps:
        assert needle in text, needle


# -- the checks catch what they are for ------------------------------------------------------
def _spec(doc: dict) -> dict:
    return _cluster_spec(doc)


def _gpu_pod(doc: dict) -> dict:
    return _spec(doc)["workerGroupSpecs"][0]["template"]["spec"]


BREAKAGES: dict[str, tuple[Callable[[dict], Any], str]] = {
    "unknown field": (
        lambda d: _spec(d)["headGroupSpec"].update(rayStartParam={}),
        'unknown field "',
    ),
    "unknown container field": (
        lambda d: _gpu_pod(d)["containers"][0].update(imagePolicy="x"),
        'unknown field "',
    ),
    "wrong type": (
        lambda d: _spec(d)["headGroupSpec"]["rayStartParams"].update({"num-cpus": 0}),
        "expected string",
    ),
    "bad quantity": (
        lambda d: _gpu_pod(d)["containers"][0]["resources"]["limits"].update(memory="26 GB"),
        "does not match",
    ),
    "no toleration": (lambda d: _gpu_pod(d).pop("tolerations"), "toleration"),
    "no /dev/shm": (lambda d: _gpu_pod(d).pop("volumes"), "/dev/shm"),
    "shm on disk": (lambda d: _gpu_pod(d)["volumes"][0]["emptyDir"].pop("medium"), "/dev/shm"),
    "no autoscaling": (
        lambda d: _spec(d).pop("enableInTreeAutoscaling"),
        "enableInTreeAutoscaling",
    ),
    "rayproject image": (
        lambda d: _gpu_pod(d)["containers"][0].update(image="rayproject/ray:2.60.0-py311-gpu"),
        "image",
    ),
    "too big": (
        lambda d: _gpu_pod(d)["containers"][0]["resources"]["requests"].update(memory="48Gi"),
        "do not fit",
    ),
    "no secret": (lambda d: _gpu_pod(d)["containers"][0].pop("envFrom"), "envFrom"),
    "literal credential": (
        lambda d: _gpu_pod(d)["containers"][0].update(
            env=[{"name": "AWS_SECRET_ACCESS_KEY", "value": "x"}]
        ),
        "literal value",
    ),
    "access key": (
        lambda d: _spec(d)["headGroupSpec"]["template"].update(
            metadata={"annotations": {"k": "AKIA" + "ABCDEFGHIJKLMNOP"}}
        ),
        "credential",
    ),
    "min > max": (lambda d: _spec(d)["workerGroupSpecs"][0].update(minReplicas=9), "minReplicas"),
}
JOB_BREAKAGES: dict[str, tuple[Callable[[dict], Any], str]] = {
    "pip -e": (lambda d: d["spec"].update(runtimeEnvYAML='pip: ["-e ."]\n'), "editable"),
    "working_dir": (
        lambda d: d["spec"].update(runtimeEnvYAML="working_dir: s3://b/c.zip\n"),
        "from the image",
    ),
    "credentials in runtime_env": (
        lambda d: d["spec"].update(
            runtimeEnvYAML="env_vars: {AWS_ACCESS_KEY_ID: x, MLFLOW_TRACKING_URI: y}\n"
        ),
        "never runtime_env",
    ),
    "other entrypoint": (
        lambda d: d["spec"].update(entrypoint="python -m asymvlm.demo"),
        "pipelines/full.py",
    ),
    "local output": (
        lambda d: d["spec"].update(entrypoint=d["spec"]["entrypoint"].replace("s3://", "/tmp/")),
        "--output",
    ),
    "literal tracking uri": (
        lambda d: d["spec"].update(
            entrypoint=d["spec"]["entrypoint"].replace(
                "${MLFLOW_TRACKING_URI}", "http://mlflow:5000"
            )
        ),
        "tracking_uri",
    ),
}
LAUNCHER_BREAKAGES: dict[str, tuple[Callable[[dict], Any], str]] = {
    "unknown key": (lambda d: d.update(setup_command=[]), "Additional properties"),
    "AMI placeholder": (
        lambda d: d["available_node_types"]["gpu_worker"]["node_config"].update(
            ImageId="ami-0123456789abcdef0"
        ),
        "ImageId",
    ),
    "empty env on ray up": (
        lambda d: d.update(
            initialization_commands=[
                'echo "export MLFLOW_TRACKING_URI=${MLFLOW_TRACKING_URI}" >> ~/.bashrc'
            ]
        ),
        "environment",
    ),
    "unpinned install": (lambda d: d["setup_commands"].append("pip install boto3"), "not pinned"),
    "editable install": (
        lambda d: d["setup_commands"].__setitem__(
            -1, "pip install -c /home/ray/asymvlm/constraints.txt -e /home/ray/asymvlm"
        ),
        "editable",
    ),
    "default head commands": (lambda d: d.pop("head_setup_commands"), "not pinned"),
    "GPU head": (
        lambda d: d["available_node_types"]["head"]["node_config"].update(
            InstanceType="g5.2xlarge"
        ),
        "CPU instance",
    ),
}


@pytest.mark.parametrize(
    ("name", "breakage"),
    [(name, b) for name in KUBERAY_MANIFESTS for b in sorted(BREAKAGES)]
    + [("rayjob.yaml", b) for b in sorted(JOB_BREAKAGES)],
)
def test_checks_catch_broken_manifests(name, breakage) -> None:
    doc = _load(name)
    breaks, expected = {**BREAKAGES, **JOB_BREAKAGES}[breakage]
    breaks(doc)
    problems = kuberay_problems(doc)
    assert any(expected in p for p in problems), problems


@pytest.mark.parametrize("breakage", sorted(LAUNCHER_BREAKAGES))
def test_checks_catch_a_broken_launcher(breakage) -> None:
    doc = _load("cluster-launcher.yaml")
    breaks, expected = LAUNCHER_BREAKAGES[breakage]
    breaks(doc)
    problems = launcher_problems(doc)
    assert any(expected in p for p in problems), problems


def test_strict_yaml_refuses_duplicate_fields() -> None:
    with pytest.raises(yaml.constructor.ConstructorError, match="duplicate field"):
        yaml.load("a: 1\nb: 2\na: 3\n", Loader=_StrictLoader)


# -- regenerating the CRD data -------------------------------------------------------------
KEEP = {
    "type",
    "properties",
    "required",
    "items",
    "additionalProperties",
    "enum",
    "format",
    "anyOf",
    "pattern",
    "nullable",
    "minimum",
    "maximum",
    "minItems",
    "maxItems",
    "minLength",
    "maxLength",
    "x-kubernetes-int-or-string",
    "x-kubernetes-preserve-unknown-fields",
    "x-kubernetes-embedded-resource",
}


def trim_crd_schemas(raycluster_crd: str, rayjob_crd: str, source: dict) -> dict:
    """The v1 openAPIV3Schema of the two CRDs without descriptions, defaults, status, list/map
    markers and CEL rules; the pod template, the container and the RayCluster spec (repeated
    verbatim in the CRDs) stored once under definitions and referenced as {"$ref": NAME}."""

    def schema(path: str) -> dict:
        with open(path) as fh:
            crd = yaml.load(fh, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
        version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
        return version["schema"]["openAPIV3Schema"]

    def trim(node: Any) -> Any:
        if isinstance(node, list):
            return [trim(n) for n in node]
        if not isinstance(node, dict):
            return node
        return {
            k: ({p: trim(s) for p, s in v.items()} if k == "properties" else trim(v))
            for k, v in node.items()
            if k in KEEP
        }

    cluster, job = trim(schema(raycluster_crd)), trim(schema(rayjob_crd))
    for doc in (cluster, job):
        doc["properties"].pop("status", None)
    cluster_spec = cluster["properties"]["spec"]
    job_spec = job["properties"]["spec"]["properties"]
    head, workers = (cluster_spec["properties"][k] for k in ("headGroupSpec", "workerGroupSpecs"))
    template = head["properties"]["template"]
    pod = template["properties"]["spec"]["properties"]
    container = pod["containers"]["items"]
    assert job_spec["rayClusterSpec"] == cluster_spec, "RayJob's rayClusterSpec differs"
    assert (
        workers["items"]["properties"]["template"] == template == job_spec["submitterPodTemplate"]
    ), "the pod templates differ"
    assert pod["initContainers"]["items"] == container, "containers and initContainers differ"
    pod["containers"]["items"] = pod["initContainers"]["items"] = {"$ref": "Container"}
    head["properties"]["template"] = workers["items"]["properties"]["template"] = {
        "$ref": "PodTemplateSpec"
    }
    job_spec["submitterPodTemplate"] = {"$ref": "PodTemplateSpec"}
    job_spec["rayClusterSpec"] = cluster["properties"]["spec"] = {"$ref": "RayClusterSpec"}
    return {
        "$comment": [
            f"Derived from KubeRay {source['tag']} (https://github.com/ray-project/kuberay, "
            f"commit {source['commit']}): the v1 openAPIV3Schema of "
            "ray-operator/config/crd/bases/ray.io_rayclusters.yaml and ray.io_rayjobs.yaml.",
            "Copyright the KubeRay authors. Licensed under the Apache License, Version 2.0 "
            '(http://www.apache.org/licenses/LICENSE-2.0); distributed on an "AS IS" BASIS, '
            "WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.",
            "Modified by the AsymVLM project: descriptions, defaults, status, list/map-type "
            "markers and CEL validation rules removed; the pod template, the container and "
            "the RayCluster spec, repeated verbatim in the CRDs, stored once under "
            'definitions and referenced as {"$ref": NAME}.',
            "Generated by tests/test_cluster.py (trim_crd_schemas); used by its tests only.",
        ],
        "source": source,
        "definitions": {
            "Container": container,
            "PodTemplateSpec": template,
            "RayClusterSpec": cluster_spec,
        },
        "RayCluster": cluster,
        "RayJob": job,
    }


def _write_crd_data(data: dict, path: str) -> None:
    """One line per definition/kind: small, and a KubeRay upgrade shows which part changed."""
    compact = {"sort_keys": True, "separators": (",", ":")}
    lines = [
        "{",
        f' "$comment": {json.dumps(data["$comment"], indent=2)},',
        f' "source": {json.dumps(data["source"], sort_keys=True)},',
        ' "definitions": {',
    ]
    names = sorted(data["definitions"])
    lines += [
        f'  "{n}": {json.dumps(data["definitions"][n], **compact)}'
        + ("," if n != names[-1] else "")
        for n in names
    ]
    lines += [
        " },",
        f' "RayCluster": {json.dumps(data["RayCluster"], **compact)},',
        f' "RayJob": {json.dumps(data["RayJob"], **compact)}',
        "}",
    ]
    with open(path, "w") as fh:
        fh.write("\n".join(lines) + "\n")
    with open(path) as fh:
        assert json.load(fh) == json.loads(json.dumps(data))


if __name__ == "__main__":
    checkout, tag = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "v1.7.0"
    commit = subprocess.run(
        ["git", "-C", checkout, "rev-parse", f"{tag}^{{commit}}"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    bases = os.path.join(checkout, "ray-operator", "config", "crd", "bases")
    _write_crd_data(
        trim_crd_schemas(
            os.path.join(bases, "ray.io_rayclusters.yaml"),
            os.path.join(bases, "ray.io_rayjobs.yaml"),
            {"repository": "https://github.com/ray-project/kuberay", "tag": tag, "commit": commit},
        ),
        CRD_DATA,
    )
    print(f"wrote {CRD_DATA}")
