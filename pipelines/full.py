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
stand-ins; ``synthetic: {output, preset: demo|coco, <sizes and world knobs overriding the
preset>, classes: true|{...}}`` also writes the world's classification sets
``<output>-positives``, ``-negatives`` and, with two domains, ``-zeroshot``), ``embed``
(``defaults`` + ``jobs``, the keys of ``pipelines/embed.py``), ``sweeps`` (a list of
``pipelines/sweep.py`` configs with a ``name``; ``mlflow`` and ``output`` are filled in),
``evaluations`` (a list of ``{kind: zeroshot|nota|hierarcaps|ood, sweep: <name>, ...}``, see
``asymvlm analyze``), ``report: {output}``. ``${output}`` in any value is the output folder,
``${VAR}`` an environment variable; other relative paths are relative to the working
directory.
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import os
import sys
import time
from typing import Any

import yaml

if __package__ in (None, ""):  # run as a script: make `pipelines` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from asymvlm import config, logs, storage, tracking  # noqa: E402
from asymvlm.errors import ConfigError, guarded  # noqa: E402

STAGES = ("embed", "sweep", "evaluate", "report")
DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                              "configs", "demo.yaml")  # fmt: skip


logger = logging.getLogger("pipelines.full")


# -- configuration ------------------------------------------------------------------------------
def load_config(path: str, overrides: list[str] | None = None) -> dict[str, Any]:
    """Read the YAML, apply ``--set`` overrides, expand ``${VAR}`` and validate **everything**
    (every stage, every sweep, every embedding job; :mod:`asymvlm.config`) -- before Ray or any
    stage starts, so a bad value deep in the config fails in seconds.

    ``${output}`` is the output folder. Items with ``requires: [hierarcaps]`` get the HierarCaps
    test set from ``$ASYMVLM_HIERARCAPS``, a copy beside the checkout, the download cache, or a
    download from its public sources (:func:`asymvlm.data.hierarcaps_fetch.locate_hierarcaps`);
    without any of these they are left out, with one line saying so. Returns a plain dict with
    every default filled."""
    from pipelines.embed import jobs_from_doc

    doc = config.apply_overrides(config.load_yaml(path), overrides or [])
    config.check_no_credentials(doc, path)
    available = {}
    if "hierarcaps" in config.required_data(doc):
        from asymvlm.data.hierarcaps_fetch import locate_hierarcaps

        found = locate_hierarcaps()
        if found:
            os.environ["ASYMVLM_HIERARCAPS"] = found
        available["hierarcaps"] = found is not None
    doc, dropped = config.drop_unavailable(doc, available, path)
    if dropped:
        logger.warning("without HierarCaps, these parts of %s are left out: %s", path,
                       ", ".join(dropped))  # fmt: skip
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
    if prep.get("synthetic"):
        syn = config.SyntheticPrepare.model_validate(prep["synthetic"])
        out += [syn.output, *syn.class_set_roots().values()]
    out += [(prep.get("hierarcaps_cifar") or {}).get("output")]
    defaults = cfg["embed"].get("defaults") or {}
    out += [{**defaults, **job}.get("output") for job in cfg["embed"].get("jobs") or []]
    return [os.path.abspath(p) for p in out if p and "://" not in p]


def check_inputs(cfg: dict[str, Any], source: str) -> None:
    """Every local input path exists, or is written by an earlier stage of this pipeline; every
    embedding model that is not a local folder can be had (:func:`asymvlm.data.embed.\
check_model`)."""
    from asymvlm.data.embed import check_model

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
                try:  # a hub id (org/name) or an open_clip name, not a path
                    check_model(value)
                except ConfigError as err:
                    raise ConfigError(f"{source}: embed.jobs[{i}].{err}") from None
                continue
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

            logger.info("prepare: a tiny random CLIP (not meaningful science) -> %s", path)
            save_tiny_clip(path)
    if prep.get("synthetic"):
        prepare_synthetic(config.SyntheticPrepare.model_validate(prep["synthetic"]))
    if prep.get("hierarcaps_cifar"):
        hc = prep["hierarcaps_cifar"]
        out = os.path.abspath(hc["output"])
        if not os.path.exists(os.path.join(out, "cifar100")):
            from asymvlm.data.demo_sets import write_hierarcaps_cifar

            logger.info("prepare: CIFAR-format stand-ins from HierarCaps images -> %s", out)
            write_hierarcaps_cifar(hc["hierarcaps"], out, int(hc.get("n_classes", 5)))


def prepare_synthetic(syn: config.SyntheticPrepare) -> None:
    """The synthetic world (its preset, with the section's knobs) and, with ``classes``, its
    classification sets next to it; each skipped when its manifest is there already."""
    from asymvlm.synthetic import write_classification_sets, write_world

    root = syn.output if storage.is_remote(syn.output) else os.path.abspath(syn.output)
    world = syn.world_config()
    if not storage.exists(storage.uri_join(root, "manifest.json")):
        preset = f" (preset {syn.preset})" if syn.preset else ""
        logger.info("prepare: the synthetic world%s -> %s", preset, root)
        write_world(root, world)
    roots = syn.class_set_roots()
    absolute = [r if storage.is_remote(r) else os.path.abspath(r) for r in roots.values()]
    if roots and not all(storage.exists(storage.uri_join(r, "manifest.json")) for r in absolute):
        logger.info("prepare: the synthetic classification sets (%s) -> %s-*", ", ".join(roots),
                    root)  # fmt: skip
        write_classification_sets(root, world, syn.classification_spec())


def stage_embed(cfg: dict[str, Any]) -> None:
    from pipelines.embed import jobs_from_doc
    from pipelines.embedding import run_embed

    doc = cfg.get("embed") or {}
    for job in jobs_from_doc(doc, source="embed"):
        logger.info("embed: %s/%s -> %s", job.dataset, job.split, job.output)
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


def stage_sweep(cfg: dict[str, Any], parent: str | None = None) -> None:
    from pipelines.sweep import SWEEP_RECORD, run_sweep

    for sweep in cfg.get("sweeps", []):
        scfg = _sweep_config(cfg, sweep)
        if storage.exists(storage.uri_join(scfg["output"], SWEEP_RECORD)):
            logger.info("sweep %s: done already", sweep["name"])
            continue
        t0 = time.perf_counter()
        logger.info("sweep %s: %d methods x %d lrs x %d seeds", sweep["name"],
                    len(scfg["methods"]), len(scfg["lr"]), len(scfg["seeds"]))  # fmt: skip
        out = run_sweep(scfg, parent=parent)
        failed = f", {len(out['failed'])} trial(s) failed" if out["failed"] else ""
        logger.info("sweep %s: done in %.0f s%s", sweep["name"], time.perf_counter() - t0, failed)


def stage_evaluate(cfg: dict[str, Any], parent: str | None = None) -> None:
    """Every evaluation of the config, through the one registry
    (:mod:`asymvlm.evaluation.registry`), logged as a run nested under ``parent``; a marker file
    per finished one."""
    from asymvlm.evaluation import registry
    from pipelines.sweep import SWEEP_RECORD

    uri, experiment = cfg["mlflow"]["tracking_uri"], cfg["mlflow"]["experiment"]
    folder = storage.uri_join(cfg["output"], "evaluations")
    for i, ev in enumerate(cfg.get("evaluations", [])):
        kind = ev["kind"]
        label = f"{kind} ({ev['sweep']})" if ev.get("sweep") else kind
        marker = storage.uri_join(folder, f"{i:02d}-{kind}.json")
        if storage.exists(marker):
            logger.info("evaluation %s: done already", label)
            continue
        t0 = time.perf_counter()
        methods: dict[str, Any] = {}
        if ev.get("sweep"):
            scfg = _sweep_config(cfg, next(s for s in cfg["sweeps"] if s["name"] == ev["sweep"]))
            record = json.loads(storage.read_text(storage.uri_join(scfg["output"], SWEEP_RECORD)))
            methods.update(tracking.load_sweep_adapters(uri, record["parent_run_id"]))
        if ev.get("frozen"):
            methods = registry.with_frozen(kind, methods, ev, dim=ev.get("dim"))
        result = registry.evaluate(kind, methods, ev)
        params = {"sweep": ev.get("sweep") or "", "note": ev.get("note") or "",
                  "models": len(methods)}  # fmt: skip
        params.update({k: ev[k] for k in ("fine_tuned_on", "embedding_model", "positives",
                                          "negatives") if ev.get(k)})  # fmt: skip
        if kind == "zeroshot":
            params.setdefault("fine_tuned_on", ev.get("sweep") or "?")
        registry.log_evaluation(uri, experiment, kind, result, params=params, parent=parent,
                                name=f"eval {label}")  # fmt: skip
        storage.write_text(marker, json.dumps(result, indent=2, default=float))
        logger.info("evaluation %s: %d models, %.0f s", label, len(methods),
                    time.perf_counter() - t0)  # fmt: skip


def stage_report(cfg: dict[str, Any], parent: str | None = None) -> str:
    from asymvlm.report import build_report

    uri, experiment = cfg["mlflow"]["tracking_uri"], cfg["mlflow"]["experiment"]
    out = (cfg.get("report") or {}).get("output") or storage.uri_join(cfg["output"], "report")
    if not storage.is_remote(out):
        return build_report(uri, experiment, os.path.abspath(out), parent=parent)
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:  # built here, then uploaded as a whole
        local = build_report(uri, experiment, tmp, parent=parent)
        storage.upload_dir(tmp, out)
    return storage.uri_join(out, os.path.basename(local))


def _final_tables(cfg: dict[str, Any]) -> None:
    """Every sweep's mean ± std table (its summary.md), on the console."""
    for sweep in cfg.get("sweeps", []):
        where = storage.uri_join(_sweep_config(cfg, sweep)["output"], "summary.md")
        if storage.exists(where):
            logger.info("\nsweep %s\n%s", sweep["name"], storage.read_text(where).strip())


def run_pipeline(cfg: dict[str, Any], stages: list[str]) -> dict[str, Any]:
    """The stages in order under one MLflow run, the root: sweeps, their trials, evaluations
    and the report are nested under it."""
    from pipelines.ray_session import init_ray

    t0 = time.perf_counter()
    if not storage.is_remote(cfg["output"]):
        os.makedirs(cfg["output"], exist_ok=True)
    init_ray()  # joins $RAY_ADDRESS or starts a local Ray; credentials stay on the nodes
    config.check_shared_output(cfg["output"], cfg["storage"]["shared_filesystem"])
    uri = cfg["mlflow"]["tracking_uri"]
    out: dict[str, Any] = {"output": cfg["output"], "tracking_uri": uri}
    about = f"The {cfg['name']} pipeline: {' -> '.join(stages)}"
    params = {"stages": ",".join(stages), "output": cfg["output"]}
    with tracking.run(uri, cfg["mlflow"]["experiment"], f"pipeline {cfg['name']}",
                      kind="pipeline", params=params, description=about) as root:  # fmt: skip
        root.log_text("resolved_config.yaml", yaml.safe_dump(cfg, sort_keys=False))
        out["run_id"] = root.id
        if "embed" in stages:
            stage_prepare(cfg)
            stage_embed(cfg)
        if "sweep" in stages:
            stage_sweep(cfg, parent=root.id)
        if "evaluate" in stages:
            stage_evaluate(cfg, parent=root.id)
        if "report" in stages:
            out["report"] = stage_report(cfg, parent=root.id)
        out["seconds"] = round(time.perf_counter() - t0, 1)
        root.log_metrics({"seconds": out["seconds"]})
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
    parser.add_argument("--verbose", action="store_true",
                        help="show everything on the console: Ray, Tune, Train, MLflow and the "
                             "workers' output (default: this project's lines; the rest goes "
                             "to OUTPUT/logs/pipeline.log at WARNING)")  # fmt: skip
    args = parser.parse_args(argv)
    logs.configure(verbose=args.verbose)

    def run() -> int:
        stages = [s.strip() for s in args.stages.split(",") if s.strip()]
        unknown = [s for s in stages if s not in STAGES]
        if unknown:
            raise ConfigError(f"--stages: unknown stages {unknown}; choose from {list(STAGES)}")
        overrides = list(args.set) + ([f"output={args.output}"] if args.output else [])
        cfg = load_config(args.config, overrides)  # everything validated before Ray starts
        log_file = logs.log_file_for(cfg["output"], "pipeline")
        logs.configure(verbose=args.verbose, log_file=log_file)
        logger.info("pipeline %s: stages %s -> %s", cfg["name"], ",".join(stages), cfg["output"])
        out = run_pipeline(cfg, stages)
        _final_tables(cfg)
        uri = config.redact(cfg["mlflow"]["tracking_uri"])
        logger.info("finished in %.0f s", out["seconds"])
        if out.get("report"):
            logger.info("report:   %s (and report.html)", out["report"])
        logger.info("MLflow:   %s, experiment %r, pipeline run %s", uri,
                    cfg["mlflow"]["experiment"], out["run_id"])  # fmt: skip
        if uri.startswith("sqlite:///"):
            logger.info("open it:  asymvlm ui %s", cfg["output"])
        logger.info("log file: %s", log_file)
        print(json.dumps({**out, "tracking_uri": uri}))
        return 0

    return guarded(run)


if __name__ == "__main__":
    raise SystemExit(main())
