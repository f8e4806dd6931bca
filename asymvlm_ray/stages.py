"""The whole pipeline's stages on Ray (:func:`run_pipeline`), each resumable: finished tables,
sweeps (``sweep.json``) and evaluations (their result file) are skipped."""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from dataclasses import asdict
from typing import Any

import yaml

from asymvlm import storage, tracking
from asymvlm.errors import ConfigError
from asymvlm.evaluation import registry
from asymvlm.indexing.settings import IndexSettings
from asymvlm_ray.embedding import run_embed
from asymvlm_ray.schema import PipelineConfig, check_shared_output
from asymvlm_ray.session import RaySession
from asymvlm_ray.tuning.sweep_driver import SWEEP_RECORD, check_rerun, read_record, run_sweep

STAGES = ("embed", "sweep", "index", "evaluate", "report")

logger = logging.getLogger(__name__)


def check_reruns(cfg: PipelineConfig) -> None:
    """Refuse an output whose parts were made with other settings, naming them (before Ray
    starts): the synthetic world's knobs, each sweep's settings (:func:`check_rerun`)."""
    syn = cfg.prepare.synthetic
    if syn and storage.exists(storage.uri_join(syn.output, "manifest.json")):
        from asymvlm.synthetic import WorldConfig

        then, now = asdict(WorldConfig.from_manifest(syn.output)), asdict(syn.world_config())
        if diffs := [
            f"{k} {then[k]!r} (then) vs {v!r} (now)" for k, v in now.items() if then[k] != v
        ]:
            raise ConfigError(
                f"prepare.synthetic: {syn.output} holds a world made with other knobs: "
                f"{'; '.join(diffs)}. Run with those to go on, or give these another output "
                f"folder (or delete {syn.output})"
            )
    for sweep in cfg.sweeps:
        check_rerun(sweep)


def stage_prepare(cfg: PipelineConfig) -> None:
    """Offline stand-ins: a tiny random CLIP, the synthetic world, CIFAR-format sets."""
    prep = cfg.prepare
    if prep.tiny_clip and not os.path.exists(os.path.join(prep.tiny_clip, "config.json")):
        from asymvlm.data.tiny import save_tiny_clip

        logger.info("prepare: a tiny random CLIP (not meaningful science) -> %s", prep.tiny_clip)
        save_tiny_clip(prep.tiny_clip)
    if syn := prep.synthetic:  # the world and its classification sets, each unless written
        from asymvlm.synthetic import write_classification_sets, write_world

        def missing(root: str) -> bool:
            return not storage.exists(storage.uri_join(storage.absolute(root), "manifest.json"))

        world = syn.world_config()
        if missing(syn.output):
            logger.info("prepare: the synthetic world (preset %s) -> %s", syn.preset, syn.output)
            write_world(syn.output, world)
        roots = syn.class_set_roots()
        if any(missing(root) for root in roots.values()):
            logger.info("prepare: the synthetic classification sets %s", ", ".join(roots.values()))
            write_classification_sets(syn.output, world, syn.classification_spec())
    hc = prep.hierarcaps_cifar
    if hc and not os.path.exists(os.path.join(hc.output, "cifar100")):
        from asymvlm.data.demo_sets import write_hierarcaps_cifar

        logger.info("prepare: CIFAR-format stand-ins from HierarCaps images -> %s", hc.output)
        write_hierarcaps_cifar(hc.hierarcaps, hc.output, hc.n_classes)


def stage_sweep(cfg: PipelineConfig, parent: str | None = None) -> None:
    """Every sweep not done already (its ``sweep.json``), its MLflow run under ``parent``."""
    for sweep in cfg.sweeps:
        check_rerun(sweep)  # a finished sweep with other settings is refused, not skipped
        if storage.exists(storage.uri_join(sweep.output, SWEEP_RECORD)):
            logger.info("sweep %s: done already", sweep.name)
            continue
        sizes = len(sweep.methods), len(sweep.lr), len(sweep.seeds)
        logger.info("sweep %s: %d methods x %d lrs x %d seeds", sweep.name, *sizes)
        out = run_sweep(sweep, parent=parent)
        logger.info("sweep %s: done, %d trial(s) failed", sweep.name, len(out.failed))


def stage_index(cfg: PipelineConfig, parent: str | None = None) -> None:
    """Every search index not built already (its ``manifest.json``): a sweep's adapter over a
    split of tables (docs/search.md), its MLflow run under ``parent``."""
    from asymvlm.indexing import build_index
    from asymvlm.indexing.build import log_build
    from asymvlm_ray.index_build import encoded_on_ray

    for item in cfg.indexes:
        if storage.exists(storage.uri_join(item.output, "manifest.json")):
            logger.info("index %s: done already", item.name)
            continue
        adapter = read_record(cfg.sweep(item.sweep).output).adapters[item.method][str(item.seed)]
        settings = IndexSettings.model_validate(
            item.model_dump(include=set(IndexSettings.model_fields))
        )
        uri, experiment = cfg.mlflow.tracking_uri, cfg.mlflow.experiment
        with tracking.run(
            uri, experiment, f"index {item.name}", kind="index", parent=parent
        ) as run:
            where = (item.data.root, item.data.split, adapter, item.output)
            manifest = build_index(*where, settings, encoded=encoded_on_ray)
            log_build(run, item.output, manifest)
        logger.info(
            "index %s: %d images, %d captions -> %s; search it: python pipelines/search.py "
            "--index %s, then open http://127.0.0.1:8000/",
            item.name,
            manifest.images,
            manifest.captions,
            item.output,
            item.output,
        )


def stage_evaluate(cfg: PipelineConfig, parent: str | None = None) -> None:
    """Every evaluation on the sweeps' seed adapters: an MLflow run under ``parent``, a marker."""
    from asymvlm.evaluation.adapters import checkpoint_adapters

    folder = storage.uri_join(cfg.output, "evaluations")
    for i, ev in enumerate(cfg.evaluations):
        label = f"{ev.kind} ({ev.sweep})" if ev.sweep else ev.kind
        marker = storage.uri_join(folder, f"{i:02d}-{ev.kind}.json")
        if storage.exists(marker):
            logger.info("evaluation %s: done already", label)
            continue
        t0 = time.perf_counter()
        methods: dict[str, Any] = {}
        if ev.sweep:
            copies = read_record(cfg.sweep(ev.sweep).output).adapters
            methods = checkpoint_adapters(
                seeds[s] for _, seeds in sorted(copies.items()) for s in sorted(seeds, key=int)
            )
        if ev.frozen:
            methods = registry.with_frozen(methods, ev, dim=ev.dim)
        result = registry.evaluate(ev, methods)
        named = {"fine_tuned_on", "embedding_model", "positives", "negatives"}
        params = {"sweep": ev.sweep or "", "note": ev.note or "", "models": len(methods)}
        params |= {k: v for k, v in ev.model_dump(mode="json", include=named).items() if v}
        if ev.kind == "zeroshot":
            params.setdefault("fine_tuned_on", ev.sweep or "?")
        uri, experiment = cfg.mlflow.tracking_uri, cfg.mlflow.experiment
        registry.log_evaluation(
            uri, experiment, ev.kind, result, params=params, parent=parent, name=f"eval {label}"
        )
        storage.write_text(marker, json.dumps(result, indent=2, default=float))
        seconds = time.perf_counter() - t0
        logger.info("evaluation %s: %d models, %.0f s", label, len(methods), seconds)


def stage_report(cfg: PipelineConfig, parent: str | None = None) -> str:
    """The report of the pipeline's MLflow runs, in its output folder; where it is."""
    from asymvlm.report.document import build_report

    uri, experiment = cfg.mlflow.tracking_uri, cfg.mlflow.experiment
    out = cfg.report.output or storage.uri_join(cfg.output, "report")
    if not storage.is_remote(out):
        return build_report(uri, experiment, os.path.abspath(out), parent=parent)
    with tempfile.TemporaryDirectory() as tmp:  # built here, then uploaded as a whole
        local = build_report(uri, experiment, tmp, parent=parent)
        storage.upload_dir(tmp, out)
    return storage.uri_join(out, os.path.basename(local))


def final_tables(cfg: PipelineConfig) -> None:
    """Every sweep's mean ± std table (its summary.md), on the console."""
    for sweep in cfg.sweeps:
        where = storage.uri_join(sweep.output, "summary.md")
        if storage.exists(where):
            logger.info("\nsweep %s\n%s", sweep.name, storage.read_text(where).strip())


def run_pipeline(cfg: PipelineConfig, stages: list[str], session: RaySession) -> dict[str, Any]:
    """The stages in order under one root MLflow run; Ray asked of the entry point's ``session``."""
    t0 = time.perf_counter()
    if not storage.is_remote(cfg.output):
        os.makedirs(cfg.output, exist_ok=True)
    session.require()
    check_shared_output(cfg.output, cfg.storage.shared_filesystem)
    uri = cfg.mlflow.tracking_uri
    params = {"stages": ",".join(stages), "output": cfg.output}
    about = f"The {cfg.name} pipeline: {' -> '.join(stages)}"
    name = f"pipeline {cfg.name}"
    with tracking.run(
        uri, cfg.mlflow.experiment, name, kind="pipeline", params=params, description=about
    ) as root:
        resolved = yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
        root.log_text("resolved_config.yaml", resolved)
        out: dict[str, Any] = {"output": cfg.output, "tracking_uri": uri, "run_id": root.id}
        if "embed" in stages:
            stage_prepare(cfg)
            for job in cfg.embed.jobs:
                logger.info("embed: %s/%s -> %s", job.dataset, job.split, job.output)
                run_embed(job, session)
        if "sweep" in stages:
            stage_sweep(cfg, parent=root.id)
        if "index" in stages:
            stage_index(cfg, parent=root.id)
        if "evaluate" in stages:
            stage_evaluate(cfg, parent=root.id)
        if "report" in stages:
            out["report"] = stage_report(cfg, parent=root.id)
        out["seconds"] = round(time.perf_counter() - t0, 1)
        root.log_metrics({"seconds": out["seconds"]})
    return out
