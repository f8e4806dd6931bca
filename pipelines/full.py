"""The whole pipeline on Ray: prepare -> embed -> sweep -> evaluate -> report.

    python pipelines/full.py                               # configs/demo.yaml: offline demo
    ray job submit --working-dir . -- python pipelines/full.py --config configs/coco.yaml
    python pipelines/full.py --config configs/coco.yaml --stages sweep,evaluate,report \\
        --set sweeps.0.epochs=50

Every stage is resumable: embedding jobs skip finished tables (and finish interrupted ones),
a sweep with a ``sweep.json`` in its folder is done, an evaluation with its result file is
done, and the report is rebuilt from MLflow. ``--stages`` runs a subset. The resolved config
and the git commit are logged to MLflow (a run ``kind=pipeline``), and at the end the script
prints where the report and the MLflow store are, and the ``mlflow ui`` command to open them.

Config keys (see ``configs/*.yaml``): ``name``, ``output``, ``mlflow: {tracking_uri,
experiment}``, ``prepare`` (``tiny_clip``, ``synthetic``, ``hierarcaps_cifar``: offline
stand-ins), ``embed`` (``defaults`` + ``jobs``, the keys of ``pipelines/embed.py``), ``sweeps``
(a list of ``pipelines/sweep.py`` configs with a ``name``; ``mlflow`` and ``output`` are filled
in), ``evaluations`` (a list of ``{kind: zeroshot|nota|hierarcaps|ood, sweep: <name>, ...}``,
see ``asymvlm analyze``), ``report: {output}``. ``${output}`` in any value is the output
folder, ``${VAR}`` an environment variable; other relative paths are relative to the working
directory.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
from typing import Any

import yaml

if __package__ in (None, ""):  # run as a script: make `pipelines` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from asymvlm import config, storage, tracking  # noqa: E402
from asymvlm.errors import ConfigError, guarded  # noqa: E402

STAGES = ("embed", "sweep", "evaluate", "report")
DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                              "configs", "demo.yaml")  # fmt: skip


def _log(msg: str) -> None:
    print(f"[pipeline] {msg}", file=sys.stderr, flush=True)


# -- configuration ------------------------------------------------------------------------------
def load_config(path: str, overrides: list[str] | None = None) -> dict[str, Any]:
    """Read the YAML, apply ``--set`` overrides, expand ``${VAR}`` and validate **everything**
    (every stage, every sweep, every embedding job; :mod:`asymvlm.config`) -- before Ray or any
    stage starts, so a bad value deep in the config fails in seconds.

    ``${output}`` is the output folder; ``ASYMVLM_HIERARCAPS`` defaults to the HierarCaps copy
    found beside the checkout. Returns a plain dict with every default filled."""
    from asymvlm.data.demo_sets import find_hierarcaps
    from pipelines.embed import jobs_from_doc

    found = find_hierarcaps()
    if found:
        os.environ.setdefault("ASYMVLM_HIERARCAPS", found)
    doc = config.apply_overrides(config.load_yaml(path), overrides or [])
    config.check_no_credentials(doc, path)
    name = doc.get("name") or os.path.splitext(os.path.basename(path))[0]
    raw_output = config.expand_env(doc.get("output") or f"runs/{name}", f"{path}: output")
    output = os.path.abspath(raw_output) if "://" not in raw_output else raw_output.rstrip("/")
    doc = config.expand_env(doc, path, extra={"output": output})
    cfg = config.validate(config.PipelineConfig, doc, path).model_dump()
    cfg["name"], cfg["output"] = name, output
    mlflow_cfg = cfg["mlflow"]
    mlflow_cfg["experiment"] = mlflow_cfg.get("experiment") or f"asymvlm-{name}"
    config.check_output_storage(output, mlflow_cfg.get("tracking_uri"), path)
    if storage.is_remote(output):
        for key in ("tiny_clip", "hierarcaps_cifar"):
            where = cfg["prepare"].get(key)
            where = where.get("output") if isinstance(where, dict) else where
            if where and storage.is_remote(where):
                raise ConfigError(f"{path}: prepare.{key} writes local files; give it a local "
                                  f"folder, not {where}")  # fmt: skip
    if not mlflow_cfg.get("tracking_uri"):
        mlflow_cfg["tracking_uri"] = tracking.default_tracking_uri(output)
    # Every sweep and every embedding job, fully resolved, fails here rather than mid-run.
    for sweep in cfg["sweeps"]:
        _sweep_config(cfg, sweep, source=f"{path}: sweeps[{sweep['name']}]")
    jobs_from_doc(cfg["embed"], source=f"{path}: embed")
    check_inputs(cfg, path)
    return cfg


def _produced(cfg: dict[str, Any]) -> list[str]:
    """Local folders that the pipeline's own stages write (prepare, embed)."""
    prep = cfg["prepare"]
    out = [prep.get("tiny_clip")]
    out += [(prep.get("synthetic") or {}).get("output")]
    out += [(prep.get("hierarcaps_cifar") or {}).get("output")]
    defaults = cfg["embed"].get("defaults") or {}
    out += [{**defaults, **job}.get("output") for job in cfg["embed"].get("jobs") or []]
    return [os.path.abspath(p) for p in out if p and "://" not in p]


def check_inputs(cfg: dict[str, Any], source: str) -> None:
    """Every local input path exists, or is written by an earlier stage of this pipeline."""
    made = _produced(cfg)

    def check(value: str | None, key: str) -> None:
        if not value or "://" in value:
            return
        path = os.path.abspath(value)
        if os.path.exists(path) or any(path == m or path.startswith(m + os.sep) for m in made):
            return
        raise ConfigError(f"{source}: {key}: {value} does not exist, and no stage of this "
                          "pipeline writes it")  # fmt: skip

    hc = cfg["prepare"].get("hierarcaps_cifar") or {}
    check(hc.get("hierarcaps"), "prepare.hierarcaps_cifar.hierarcaps")
    defaults = cfg["embed"].get("defaults") or {}
    for i, job in enumerate(cfg["embed"].get("jobs") or []):
        merged = {**defaults, **job}
        for key in ("annotations", "images", "id_list", "model"):
            value = merged.get(key)
            if key == "model" and value and not os.path.exists(value) and "/" in value \
                    and not value.startswith((".", "/", "~")):  # fmt: skip
                continue  # a hub id (org/name), not a path
            check(value, f"embed.jobs[{i}].{key}")
    for sweep in cfg["sweeps"]:
        for key in ("embeddings", "test_embeddings"):
            check(sweep.get(key), f"sweeps[{sweep['name']}].{key}")
    for i, ev in enumerate(cfg["evaluations"]):
        locations = [ev.get("data"), ev.get("positives"), ev.get("negatives")]
        locations += list((ev.get("sets") or {}).values())
        locations += list((ev.get("perturbed") or {}).values())
        for where in locations:
            if where:
                check(str(where).rpartition(":")[0], f"evaluations[{i}] ({ev['kind']})")


# -- stages -------------------------------------------------------------------------------------
def stage_prepare(cfg: dict[str, Any]) -> None:
    """Offline stand-ins: a tiny random CLIP, the synthetic world, CIFAR-format sets."""
    prep = cfg.get("prepare") or {}
    if prep.get("tiny_clip"):
        path = os.path.abspath(prep["tiny_clip"])
        if not os.path.exists(os.path.join(path, "config.json")):
            from asymvlm.data.tiny import save_tiny_clip

            _log(f"writing a tiny random CLIP (not meaningful science) to {path}")
            save_tiny_clip(path)
    if prep.get("synthetic"):
        syn = dict(prep["synthetic"])
        root = syn.pop("output")
        root = root if storage.is_remote(root) else os.path.abspath(root)
        if not storage.exists(storage.uri_join(root, "manifest.json")):
            from asymvlm.synthetic import WorldConfig, write_world

            splits = {"train": syn.pop("train_images", 8000), "val": syn.pop("val_images", 1000),
                      "test": syn.pop("test_images", 1000)}  # fmt: skip
            _log(f"writing the synthetic world to {root}")
            write_world(root, WorldConfig(splits=splits, **syn))
    if prep.get("hierarcaps_cifar"):
        hc = prep["hierarcaps_cifar"]
        out = os.path.abspath(hc["output"])
        if not os.path.exists(os.path.join(out, "cifar100")):
            from asymvlm.data.demo_sets import write_hierarcaps_cifar

            _log(f"building CIFAR-format stand-ins from HierarCaps images in {out}")
            write_hierarcaps_cifar(hc["hierarcaps"], out, int(hc.get("n_classes", 5)))


def stage_embed(cfg: dict[str, Any]) -> None:
    from asymvlm.data.embed import run_embed
    from pipelines.embed import jobs_from_doc

    doc = cfg.get("embed") or {}
    for job in jobs_from_doc(doc, source="embed"):
        _log(f"embed: {job.dataset}/{job.split} -> {job.output}")
        run_embed(job)


def _sweep_config(
    cfg: dict[str, Any], sweep: dict[str, Any], source: str | None = None
) -> dict[str, Any]:
    """A sweep section resolved as ``pipelines/sweep.py`` would: the pipeline's MLflow store,
    output under ``<output>/sweeps/<name>`` unless the section names one."""
    from pipelines.sweep import resolve_config

    doc = copy.deepcopy(sweep)
    doc["mlflow"] = dict(cfg["mlflow"])
    doc["storage"] = dict(cfg["storage"])
    doc["output"] = doc.get("output") or storage.uri_join(cfg["output"], "sweeps", sweep["name"])
    return resolve_config(doc, source=source or f"sweeps[{sweep['name']}]")


def stage_sweep(cfg: dict[str, Any]) -> None:
    from pipelines.sweep import SWEEP_RECORD, run_sweep

    for sweep in cfg.get("sweeps", []):
        scfg = _sweep_config(cfg, sweep)
        if storage.exists(storage.uri_join(scfg["output"], SWEEP_RECORD)):
            _log(f"sweep {sweep['name']}: done already ({scfg['output']}/{SWEEP_RECORD})")
            continue
        _log(f"sweep {sweep['name']}: {len(scfg['methods'])} methods x {len(scfg['lr'])} lrs, "
             f"seeds {scfg['seeds']}")  # fmt: skip
        run_sweep(scfg)


def _location(value: str) -> tuple[str, str]:
    root, _, split = str(value).rpartition(":")
    if not root:
        raise ValueError(f"expected ROOT:SPLIT, got {value!r}")
    return os.path.abspath(root) if "://" not in root else root, split


def stage_evaluate(cfg: dict[str, Any]) -> None:
    from asymvlm.evaluation import suite
    from asymvlm.methods import METHODS
    from pipelines.sweep import SWEEP_RECORD

    uri, experiment = cfg["mlflow"]["tracking_uri"], cfg["mlflow"]["experiment"]
    folder = storage.uri_join(cfg["output"], "evaluations")
    for i, ev in enumerate(cfg.get("evaluations", [])):
        marker = storage.uri_join(folder, f"{i:02d}-{ev['kind']}.json")
        if storage.exists(marker):
            _log(f"evaluation {i} ({ev['kind']}): done already")
            continue
        methods: dict[str, Any] = {}
        if ev.get("sweep"):
            scfg = _sweep_config(cfg, next(s for s in cfg["sweeps"] if s["name"] == ev["sweep"]))
            record = storage.read_text(storage.uri_join(scfg["output"], SWEEP_RECORD))
            parent = json.loads(record)["parent_run_id"]
            methods.update(suite.adapters_from_sweep(uri, parent))
        if ev.get("frozen"):
            dim = next(iter(methods.values())).dim if methods else int(ev["dim"])
            frozen = METHODS["clip"](dim=dim)
            frozen.adapter_input = "unit"
            methods["clip"] = frozen
        kind = ev["kind"]
        _log(f"evaluation {i}: {kind} ({len(methods)} models)")
        params = {"kind": kind, "sweep": ev.get("sweep", ""), "note": ev.get("note", "")}
        if kind == "zeroshot":
            sets = {name: _location(where) for name, where in ev["sets"].items()}
            result = suite.evaluate_zero_shot(methods, sets)
            params["fine_tuned_on"] = ev.get("fine_tuned_on", ev.get("sweep", "?"))
            params["embedding_model"] = ev.get("embedding_model", "")
        elif kind == "nota":
            result = suite.evaluate_none_of_the_above(
                methods, _location(ev["positives"]), _location(ev["negatives"]))  # fmt: skip
        elif kind == "hierarcaps":
            result = suite.evaluate_hierarcaps(methods, *_location(ev["data"]))
        else:
            perturbed = {spec: _location(where) for spec, where in ev["perturbed"].items()}
            result = suite.evaluate_ood(methods, _location(ev["data"]), perturbed)
        name = {"zeroshot": "zero_shot", "nota": "none_of_the_above"}.get(kind, kind)
        suite.log_evaluation(uri, experiment, name, result, params=params)
        storage.write_text(marker, json.dumps(result, indent=2, default=float))


def stage_report(cfg: dict[str, Any]) -> str:
    from asymvlm.report import build_report

    out = (cfg.get("report") or {}).get("output") or storage.uri_join(cfg["output"], "report")
    if not storage.is_remote(out):
        return build_report(cfg["mlflow"]["tracking_uri"], cfg["mlflow"]["experiment"],
                            os.path.abspath(out))  # fmt: skip
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:  # built here, then uploaded as a whole
        local = build_report(cfg["mlflow"]["tracking_uri"], cfg["mlflow"]["experiment"], tmp)
        storage.upload_dir(tmp, out)
    return storage.uri_join(out, os.path.basename(local))


def _log_pipeline_run(cfg: dict[str, Any], stages: list[str]) -> None:
    import tempfile

    from mlflow import MlflowClient

    uri = cfg["mlflow"]["tracking_uri"]
    client = MlflowClient(uri)
    exp_id = tracking.experiment_id(client, cfg["mlflow"]["experiment"], uri)
    run = client.create_run(exp_id, run_name=f"pipeline {cfg['name']}", tags={"kind": "pipeline"})
    client.log_param(run.info.run_id, "git_commit", tracking.git_commit())
    client.log_param(run.info.run_id, "stages", ",".join(stages))
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "resolved_config.yaml")
        with open(path, "w") as fh:
            yaml.safe_dump(cfg, fh, sort_keys=False)
        client.log_artifact(run.info.run_id, path)
    client.set_terminated(run.info.run_id)


def run_pipeline(cfg: dict[str, Any], stages: list[str]) -> dict[str, Any]:
    from pipelines.ray_session import init_ray

    t0 = time.perf_counter()
    if not storage.is_remote(cfg["output"]):
        os.makedirs(cfg["output"], exist_ok=True)
    init_ray()  # joins $RAY_ADDRESS or starts a local Ray; credentials stay on the nodes
    config.check_shared_output(cfg["output"], cfg["storage"]["shared_filesystem"])
    _log_pipeline_run(cfg, stages)
    out: dict[str, Any] = {"output": cfg["output"], "tracking_uri": cfg["mlflow"]["tracking_uri"]}
    if "embed" in stages:
        stage_prepare(cfg)
        stage_embed(cfg)
    if "sweep" in stages:
        stage_sweep(cfg)
    if "evaluate" in stages:
        stage_evaluate(cfg)
    if "report" in stages:
        out["report"] = stage_report(cfg)
    out["seconds"] = round(time.perf_counter() - t0, 1)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=DEFAULT_CONFIG, help="YAML (default: the demo)")
    parser.add_argument("--stages", default=",".join(STAGES),
                        help=f"comma-separated subset of {','.join(STAGES)}")  # fmt: skip
    parser.add_argument("--output", default=None, help="override the config's output folder")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a key (YAML value; dots and list indices: "
                             "sweeps.0.epochs=5)")  # fmt: skip
    args = parser.parse_args(argv)

    def run() -> int:
        stages = [s.strip() for s in args.stages.split(",") if s.strip()]
        unknown = [s for s in stages if s not in STAGES]
        if unknown:
            raise ConfigError(f"--stages: unknown stages {unknown}; choose from {list(STAGES)}")
        overrides = list(args.set) + ([f"output={args.output}"] if args.output else [])
        cfg = load_config(args.config, overrides)  # everything validated before Ray starts
        out = run_pipeline(cfg, stages)
        print(json.dumps({**out, "tracking_uri": config.redact(out["tracking_uri"])}, indent=2))
        uri = config.redact(cfg["mlflow"]["tracking_uri"])
        _log(f"finished in {out['seconds']:.0f} s")
        if out.get("report"):
            _log(f"report: {out['report']}")
        _log(f"MLflow store: {uri} (experiment {cfg['mlflow']['experiment']!r})")
        _log(f"open it with: mlflow ui --backend-store-uri {uri}")
        return 0

    return guarded(run)


if __name__ == "__main__":
    raise SystemExit(main())
