"""A config file read into its typed object, once, before Ray or any stage starts."""

from __future__ import annotations

import copy
import functools
import logging
import os
from typing import Any

from asymvlm import config, storage
from asymvlm.data.embed import EmbedConfig
from asymvlm.errors import ConfigError
from asymvlm.tables import Location
from pipelines.schema.pipeline import EmbedSection, PipelineConfig
from pipelines.schema.serve import ServeConfig
from pipelines.schema.sweep import SweepConfig

logger = logging.getLogger("pipelines.full")

#: Data sets a pipeline item may declare with ``requires: [name]``: without them the item is
#: left out (the demo's HierarCaps part, when there is neither a copy nor network).
OPTIONAL_DATA = ("hierarcaps",)


def _document(path: str, overrides: list[str] | None) -> dict[str, Any]:
    doc = config.apply_overrides(config.load_yaml(path), overrides or [])
    config.check_no_credentials(doc, path)
    return doc


def sweep_config(doc: dict[str, Any], source: str = "<sweep>") -> SweepConfig:
    """A sweep document validated and resolved (:class:`SweepConfig`)."""
    config.check_no_credentials(doc, source)
    return config.validate(SweepConfig, config.expand_env(doc, source), source)


def load_sweep(path: str, overrides: list[str] | None = None) -> SweepConfig:
    """A sweep file (``tune_spaces/*.yaml``) with ``--set`` overrides, validated."""
    return sweep_config(_document(path, overrides), path)


def load_embed_jobs(path: str, overrides: list[str] | None = None) -> list[EmbedConfig]:
    """The embedding jobs of ``path``: one job at the top level, or ``defaults`` + ``jobs``."""
    doc = config.expand_env(_document(path, overrides), path)
    if "jobs" in doc or "defaults" in doc:
        return config.validate(EmbedSection, doc, path).jobs
    return [config.validate(EmbedConfig, doc, path)] if doc else []


def load_serve(path: str | None, overrides: list[str], checkpoint: str | None) -> ServeConfig:
    """Serve's settings: an optional YAML, ``--set`` overrides and ``--checkpoint``."""
    doc = config.apply_overrides(config.load_yaml(path) if path else {}, overrides)
    if checkpoint:
        doc["checkpoint"] = checkpoint
    return config.validate(ServeConfig, doc, path or "serve options")


def _hierarcaps_found(_: str) -> bool:
    from asymvlm.data.hierarcaps_fetch import locate_hierarcaps

    found = locate_hierarcaps()
    if found:
        os.environ["ASYMVLM_HIERARCAPS"] = found
    return found is not None


def drop_unavailable(doc: dict[str, Any], source: str) -> tuple[dict[str, Any], list[str]]:
    """``doc`` without the items whose ``requires`` is not available; the labels left out."""
    doc, dropped, gone = copy.deepcopy(doc), list[str](), set[str]()
    available = functools.cache(_hierarcaps_found)  # asked once per load, if at all

    def keep(label: str, item: Any) -> bool:
        if not isinstance(item, dict):
            return True
        needs = item.pop("requires", None) or []
        if not isinstance(needs, list) or any(n not in OPTIONAL_DATA for n in needs):
            raise ConfigError(
                f"{source}: {label}.requires: expected a list of {[*OPTIONAL_DATA]}, got {needs!r}"
            )
        if all(available(n) for n in needs) and item.get("sweep") not in gone:
            return True
        dropped.append(label)
        gone.add(item.get("name") or label)
        return False

    prepare = doc.get("prepare") or {}
    for key in [k for k, item in prepare.items() if not keep(f"prepare.{k}", item)]:
        del prepare[key]
    lists = [("sweeps", doc), ("evaluations", doc), ("jobs", doc.get("embed"))]
    for key, parent in lists:
        if isinstance(parent, dict) and isinstance(parent.get(key), list):
            label = "embed.jobs" if key == "jobs" else key
            parent[key] = [
                x
                for i, x in enumerate(parent[key])
                if keep(f"{label}[{x.get('name', i) if isinstance(x, dict) else i}]", x)
            ]
    return doc, dropped


def load_pipeline(path: str, overrides: list[str] | None = None) -> PipelineConfig:
    """The whole pipeline validated, every input path checked, before Ray starts."""
    doc, dropped = drop_unavailable(_document(path, overrides), path)
    if dropped:
        logger.warning(
            "without HierarCaps, these parts of %s are left out: %s", path, ", ".join(dropped)
        )
    name = doc.get("name") or os.path.splitext(os.path.basename(path))[0]
    output = storage.absolute(config.expand_env(doc.get("output") or f"runs/{name}", path))
    doc = config.expand_env(doc, path, extra={"output": output})
    cfg = config.validate(PipelineConfig, {**doc, "name": name, "output": output}, path)
    check_inputs(cfg, path)
    return cfg


def check_inputs(cfg: PipelineConfig, source: str) -> None:
    """Every local input exists or is written by a stage; every non-local model can be had."""
    from asymvlm.data.embed import check_model
    from asymvlm.data.encoder import local_source

    prep = cfg.prepare
    made = [prep.tiny_clip, *(job.output for job in cfg.embed.jobs)]
    if prep.synthetic:
        made += [prep.synthetic.output, *prep.synthetic.class_set_roots().values()]
    made += [prep.hierarcaps_cifar.output] if prep.hierarcaps_cifar else []
    made = [os.path.abspath(p) for p in made if p and not storage.is_remote(p)]

    def produced(path: str) -> bool:
        return any(path == m or path.startswith(m + os.sep) for m in made)

    def check(value: str | None, key: str) -> None:
        if value and "://" not in value:
            path = os.path.abspath(value)
            if not os.path.exists(path) and not produced(path):
                raise ConfigError(
                    f"{source}: {key}: {value} does not exist, and no stage of this pipeline "
                    "writes it"
                )

    if prep.hierarcaps_cifar:
        check(prep.hierarcaps_cifar.hierarcaps, "prepare.hierarcaps_cifar.hierarcaps")
    for i, job in enumerate(cfg.embed.jobs):
        for key in ("annotations", "images", "id_list"):
            check(getattr(job, key), f"embed.jobs[{i}].{key}")
        local = local_source(job.model)
        if local is not None:
            check(local, f"embed.jobs[{i}].model")
        elif not produced(os.path.abspath(job.model)):
            try:  # a hub id or an open_clip pretrained tag / hf-hub repo: can it be had?
                check_model(job.model)
            except ConfigError as err:
                raise ConfigError(f"{source}: embed.jobs[{i}].{err}") from None
    for sweep in cfg.sweeps:
        for key in ("embeddings", "test_embeddings"):
            check(getattr(sweep, key), f"sweeps[{sweep.name}].{key}")
    for i, ev in enumerate(cfg.evaluations):
        for value in dict(ev).values():
            for where in value.values() if isinstance(value, dict) else [value]:
                if isinstance(where, Location):
                    check(where.root, f"evaluations[{i}] ({ev.kind})")


def check_shared_output(output: str, shared_filesystem: bool) -> None:
    """On a cluster of several nodes, a local ``output`` must be declared shared (Ray is up)."""
    import ray

    if storage.is_remote(output) or shared_filesystem or not ray.is_initialized():
        return
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    if len(nodes) > 1:
        raise ConfigError(
            f"output {output} is a local path, but this Ray cluster has {len(nodes)} nodes: "
            "shared storage is needed. Use an object store (--output s3://bucket/run) or a "
            "mount every node shares, declared with storage.shared_filesystem=true"
        )
