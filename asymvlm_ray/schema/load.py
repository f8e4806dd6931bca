"""A config file read into its typed object, once, before Ray or any stage starts."""

from __future__ import annotations

import copy
import functools
import logging
import os
import types
from typing import Annotated, Any, Union, get_args, get_origin

from asymvlm import config, storage
from asymvlm.checkpoints import is_model_uri
from asymvlm.curation import CurateConfig
from asymvlm.embedding.embed_config import EmbedConfig
from asymvlm.embedding.encoders.names import looks_like_path
from asymvlm.errors import ConfigError
from asymvlm.tables import Location, parse_location
from asymvlm_ray.schema.pipeline_config import EmbedSection, PipelineConfig
from asymvlm_ray.schema.serve_config import SearchConfig, ServeConfig
from asymvlm_ray.schema.sweep_settings import RuntimeEnv, SweepConfig

logger = logging.getLogger(__name__)

#: Data sets a pipeline item may declare with ``requires: [name]``: without them the item is
#: left out (the demo's HierarCaps part, when there is neither a copy nor network).
OPTIONAL_DATA = ("hierarcaps",)


#: Plain-string keys holding a local path, or a name or a folder (a folder or a local wheel when
#: one is there or it reads as a path); an embedding section's ``defaults`` holds a job's keys.
_UNTYPED_PATHS = {EmbedConfig: ("output", "annotations", "images", "id_list")}
_NAME_OR_FOLDER = {
    EmbedConfig: ("model",),
    ServeConfig: ("checkpoint", "encoder"),
    SearchConfig: ("index", "encoder"),
    RuntimeEnv: ("pip",),
}
_KEYS_OF = {(EmbedSection, "defaults"): EmbedConfig}


def _under(folder: str, value: Any, name_or_folder: bool = False) -> Any:
    """A relative local path ``value`` (or each of a list) joined to ``folder``; anything else as
    it is (URIs, model names, absolute paths, ``${VAR}`` values left to ``expand_env``)."""
    if isinstance(value, list):
        return [_under(folder, v, name_or_folder) for v in value]
    if not isinstance(value, str) or not value or value.startswith(("$", "~")):
        return value
    if os.path.isabs(value) or storage.is_remote(value) or is_model_uri(value):
        return value
    joined = os.path.normpath(os.path.join(folder, value))
    if name_or_folder and not (looks_like_path(value) or os.path.exists(joined)):
        return value  # a model name
    return joined


def _from_file(value: Any, schema: Any, folder: str) -> Any:
    """``value`` as a config file in ``folder`` wrote it for ``schema``, its relative local paths
    (the values of a ``storage.absolute`` field, a ``ROOT:SPLIT`` root, the keys above) made
    relative to ``folder``."""
    origin, args = get_origin(schema), get_args(schema)
    if origin is Annotated:
        if any(getattr(m, "func", None) is storage.absolute for m in args[1:]):
            return _under(folder, value)
        if args[0] is Location and isinstance(value, str):
            try:
                root, split = parse_location(value)
            except ValueError:  # said when the config is validated
                return value
            return f"{_under(folder, root)}:{split}"
        tag = next((m.discriminator for m in args[1:] if getattr(m, "discriminator", None)), None)
        if tag and isinstance(value, dict):  # the member of a tagged union named by the value
            kinds = get_args(args[0])
            member = [
                k for k in kinds if value.get(tag) in get_args(k.model_fields[tag].annotation)
            ]
            return _from_file(value, member[0], folder) if member else value
        return _from_file(value, args[0], folder)
    if origin in (Union, types.UnionType):
        for member in args:
            value = _from_file(value, member, folder)
        return value
    if origin in (list, tuple) and isinstance(value, list):
        return [_from_file(v, args[0], folder) for v in value]
    if origin is dict and isinstance(value, dict) and len(args) == 2:
        return {k: _from_file(v, args[1], folder) for k, v in value.items()}
    fields = getattr(schema, "__pydantic_fields__", None)
    if not fields or not isinstance(value, dict):
        return value
    out = dict(value)
    for key, item in value.items():
        if (schema, key) in _KEYS_OF:
            out[key] = _from_file(item, _KEYS_OF[schema, key], folder)
        elif key in _UNTYPED_PATHS.get(schema, ()) or key in _NAME_OR_FOLDER.get(schema, ()):
            out[key] = _under(folder, item, key in _NAME_OR_FOLDER.get(schema, ()))
        elif key in fields:
            out[key] = _from_file(item, fields[key].rebuild_annotation(), folder)
    return out


def _document(path: str, overrides: list[str] | None, schema: Any) -> dict[str, Any]:
    """The config file ``path`` (its relative paths relative to its folder), then ``--set``
    overrides (their relative paths relative to the working directory, as on the command line)."""
    folder = os.path.dirname(os.path.abspath(path))
    doc = config.apply_overrides(
        _from_file(config.load_yaml(path), schema, folder), overrides or []
    )
    config.check_no_credentials(doc, path)
    return doc


def sweep_config(doc: dict[str, Any], source: str = "<sweep>") -> SweepConfig:
    """A sweep document validated and resolved (:class:`SweepConfig`)."""
    config.check_no_credentials(doc, source)
    return config.validate(SweepConfig, config.expand_env(doc, source), source)


def load_sweep(path: str, overrides: list[str] | None = None) -> SweepConfig:
    """A sweep file (``tune_spaces/*.yaml``) with ``--set`` overrides, validated."""
    return sweep_config(_document(path, overrides, SweepConfig), path)


def load_embed_jobs(path: str, overrides: list[str] | None = None) -> list[EmbedConfig]:
    """The embedding jobs of ``path``: one job at the top level, or ``defaults`` + ``jobs``."""
    raw = config.load_yaml(path)
    schema = EmbedSection if "jobs" in raw or "defaults" in raw else EmbedConfig
    doc = config.expand_env(_document(path, overrides, schema), path)
    if schema is EmbedSection:
        return config.validate(EmbedSection, doc, path).jobs
    return [config.validate(EmbedConfig, doc, path)] if doc else []


def load_curate(path: str, overrides: list[str] | None = None) -> CurateConfig:
    """A curation job (:class:`CurateConfig` keys at the top level), validated before it starts."""
    doc = config.expand_env(_document(path, overrides, CurateConfig), path)
    return config.validate(CurateConfig, doc, path)


def load_serve(path: str | None, overrides: list[str], checkpoint: str | None) -> ServeConfig:
    """Serve's settings: an optional YAML, ``--set`` overrides and ``--checkpoint``."""
    doc = _document(path, overrides, ServeConfig) if path else config.apply_overrides({}, overrides)
    if checkpoint:
        doc["checkpoint"] = checkpoint
    return config.validate(ServeConfig, doc, path or "serve options")


def load_search(path: str | None, overrides: list[str], index: str | None) -> SearchConfig:
    """The search app's settings: an optional YAML, ``--set`` overrides and ``--index``."""
    doc = (
        _document(path, overrides, SearchConfig) if path else config.apply_overrides({}, overrides)
    )
    if index:
        doc["index"] = index
    return config.validate(SearchConfig, doc, path or "search options")


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
    lists = [("sweeps", doc), ("evaluations", doc), ("indexes", doc), ("jobs", doc.get("embed"))]
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
    doc, dropped = drop_unavailable(_document(path, overrides, PipelineConfig), path)
    if dropped:
        left_out = ", ".join(dropped)
        logger.warning("without HierarCaps, these parts of %s are left out: %s", path, left_out)
    name = doc.get("name") or os.path.splitext(os.path.basename(path))[0]
    output = storage.absolute(config.expand_env(doc.get("output") or f"runs/{name}", path))
    doc = config.expand_env(doc, path, extra={"output": output})
    cfg = config.validate(PipelineConfig, {**doc, "name": name, "output": output}, path)
    check_inputs(cfg, path)
    return cfg


def check_inputs(cfg: PipelineConfig, source: str) -> None:
    """Every local input exists or is written by a stage; every non-local model can be had."""
    from asymvlm.embedding.embed_config import check_model
    from asymvlm.embedding.encoders import local_source

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
