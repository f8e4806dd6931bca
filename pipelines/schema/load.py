"""Reading a config file into its typed object, once, before Ray or any stage starts."""

from __future__ import annotations

import logging
import os
from typing import Any

from asymvlm import config, storage
from asymvlm.data.embed import EmbedConfig
from asymvlm.errors import ConfigError
from asymvlm.tables import Location
from pipelines.schema.pipeline import (
    EmbedSection,
    PipelineConfig,
    drop_unavailable,
    required_data,
)
from pipelines.schema.serve import ServeConfig
from pipelines.schema.sweep import SweepConfig

__all__ = [
    "check_inputs",
    "load_embed_jobs",
    "load_pipeline",
    "load_serve",
    "load_sweep",
    "sweep_config",
]

logger = logging.getLogger("pipelines.full")


def _document(path: str, overrides: list[str] | None) -> dict[str, Any]:
    doc = config.apply_overrides(config.load_yaml(path), overrides or [])
    config.check_no_credentials(doc, path)
    return doc


def sweep_config(doc: dict[str, Any], source: str = "<sweep>") -> Any:
    """A sweep document validated and resolved (:class:`SweepConfig`): unknown keys, types and
    ranges are one :class:`~asymvlm.errors.ConfigError` line naming ``source`` and the key."""
    config.check_no_credentials(doc, source)
    return config.validate(SweepConfig, config.expand_env(doc, source), source)


def load_sweep(path: str, overrides: list[str] | None = None) -> Any:
    """A sweep file (``tune_spaces/*.yaml``) with ``--set`` overrides, validated and resolved
    (:class:`SweepConfig`)."""
    return sweep_config(_document(path, overrides), path)


def load_embed_jobs(path: str, overrides: list[str] | None = None) -> list[EmbedConfig]:
    """The embedding jobs of ``path``: one job at the top level, or ``defaults`` + ``jobs``;
    every job validated before any starts."""
    doc = config.expand_env(_document(path, overrides), path)
    if "jobs" in doc or "defaults" in doc:
        return config.validate(EmbedSection, doc, path).jobs
    return [config.validate(EmbedConfig, doc, path)] if doc else []


def load_serve(path: str | None, overrides: list[str], checkpoint: str | None) -> ServeConfig:
    """Serve's settings: a YAML of :class:`ServeConfig` keys (optional), ``--set`` overrides and
    ``--checkpoint``."""
    doc: dict[str, Any] = config.load_yaml(path) if path else {}
    doc = config.apply_overrides(doc, overrides)
    if checkpoint:
        doc["checkpoint"] = checkpoint
    return config.validate(ServeConfig, doc, path or "serve options")


def load_pipeline(path: str, overrides: list[str] | None = None) -> PipelineConfig:
    """The whole pipeline (:class:`PipelineConfig`) validated and resolved, every input path
    checked, before Ray or any stage starts; ``${output}`` in any value is the output folder.
    Items with ``requires: [hierarcaps]`` are left out (one line says so) when
    :func:`~asymvlm.data.hierarcaps_fetch.locate_hierarcaps` finds no HierarCaps."""
    doc = _document(path, overrides)
    available = {}
    if "hierarcaps" in required_data(doc):
        from asymvlm.data.hierarcaps_fetch import locate_hierarcaps

        found = locate_hierarcaps()
        if found:
            os.environ["ASYMVLM_HIERARCAPS"] = found
        available["hierarcaps"] = found is not None
    doc, dropped = drop_unavailable(doc, available, path)
    if dropped:
        logger.warning(
            "without HierarCaps, these parts of %s are left out: %s", path, ", ".join(dropped)
        )
    name = doc.get("name") or os.path.splitext(os.path.basename(path))[0]
    raw_output = config.expand_env(doc.get("output") or f"runs/{name}", f"{path}: output")
    output = storage.absolute(raw_output)
    doc = config.expand_env(doc, path, extra={"output": output})
    cfg = config.validate(PipelineConfig, {**doc, "name": name, "output": output}, path)
    check_inputs(cfg, path)
    return cfg


def _produced(cfg: PipelineConfig) -> list[str]:
    """Local folders that the pipeline's own stages write (prepare, embed)."""
    prep = cfg.prepare
    out = [prep.tiny_clip]
    if prep.synthetic:
        out += [prep.synthetic.output, *prep.synthetic.class_set_roots().values()]
    out += [prep.hierarcaps_cifar.output if prep.hierarcaps_cifar else None]
    out += [job.output for job in cfg.embed.jobs]
    return [os.path.abspath(p) for p in out if p and not storage.is_remote(p)]


def check_inputs(cfg: PipelineConfig, source: str) -> None:
    """Every local input path exists or is written by an earlier stage of this pipeline; every
    embedding model that is not a local folder can be had (a Hub id or an open_clip name)."""
    from asymvlm.data.embed import check_model
    from asymvlm.data.encoder import local_source

    made = _produced(cfg)

    def produced(path: str) -> bool:
        return any(path == m or path.startswith(m + os.sep) for m in made)

    def check(value: str | None, key: str) -> None:
        if not value or "://" in value:
            return
        path = os.path.abspath(value)
        if os.path.exists(path) or produced(path):
            return
        raise ConfigError(
            f"{source}: {key}: {value} does not exist, and no stage of this pipeline writes it"
        )

    if cfg.prepare.hierarcaps_cifar:
        check(cfg.prepare.hierarcaps_cifar.hierarcaps, "prepare.hierarcaps_cifar.hierarcaps")
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
            locations = value.values() if isinstance(value, dict) else [value]
            for where in locations:
                if isinstance(where, Location):
                    check(where.root, f"evaluations[{i}] ({ev.kind})")
