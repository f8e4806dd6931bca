"""One validated configuration for every entry point.

``asymvlm train/evaluate``, ``pipelines/train.py``, ``pipelines/sweep.py``, ``pipelines/embed.py``
and ``pipelines/full.py`` read their settings through the pydantic models here (and the two
pydantic dataclasses they embed: :class:`asymvlm.training.TrainConfig` and
:class:`asymvlm.data.embed.EmbedConfig`):

* unknown keys are errors with a "did you mean" suggestion (``hiden_dim`` -> ``hidden_dim``);
* types and ranges are checked (epochs >= 1, lr > 0 and finite, known methods ...);
* one override syntax, ``--set key.sub=value`` (YAML-typed values, list indices:
  ``sweeps.0.epochs=5``), :func:`apply_overrides`;
* ``${VAR}`` expands from the environment, but never a credential-looking variable (a name
  containing KEY, SECRET, TOKEN, PASSWORD or CREDENTIAL): credentials reach the code through the
  environment's own chain (node environment, instance roles, Kubernetes secrets), never through
  a config that is logged; URIs with ``user:password@`` are refused likewise
  (:func:`check_no_credentials`), and :func:`redact` hides them wherever a URI from the
  environment is printed.

Every problem becomes a :class:`~asymvlm.errors.ConfigError` whose one-line message names the
file and the key path (:func:`validation_message`).
"""

from __future__ import annotations

import copy
import difflib
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import fields, is_dataclass
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from asymvlm.errors import ConfigError
from asymvlm.methods import check_method_name
from asymvlm.training import TrainConfig

__all__ = [
    "EVALUATION_KINDS",
    "PipelineConfig",
    "SweepConfig",
    "apply_overrides",
    "check_no_credentials",
    "expand_env",
    "load_yaml",
    "redact",
    "validate",
    "validation_message",
]

# -- credentials --------------------------------------------------------------------------------
_CREDENTIAL_NAME = re.compile(r"KEY|SECRET|TOKEN|PASSWORD|PASSWD|CREDENTIAL", re.IGNORECASE)
_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)")
_URI_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^/@:\s]*):(?P<pw>[^/@\s]*)@")


def redact(text: str) -> str:
    """``scheme://user:password@host`` -> ``scheme://user:***@host`` (anything else unchanged)."""
    return _URI_USERINFO.sub(lambda m: f"{m['scheme']}{m['user']}:***@", text)


def check_no_credentials(value: Any, where: str = "config") -> None:
    """Refuse a URI with an embedded password anywhere in a (parsed) config."""
    for path, item in _walk(value, where):
        if isinstance(item, str) and _URI_USERINFO.search(item):
            raise ConfigError(
                f"{path}: {redact(item)!r} carries a password in the URI; give credentials "
                "through the environment instead (MLFLOW_TRACKING_USERNAME/PASSWORD, AWS_* or "
                "an instance role, a Kubernetes secret) so they never reach logs or MLflow"
            )


#: Data sets a pipeline item may declare with ``requires: [name]``: without them the item is
#: left out (the demo's HierarCaps part, when there is neither a copy nor network).
OPTIONAL_DATA = ("hierarcaps",)


def required_data(doc: Mapping[str, Any]) -> set[str]:
    """The optional data sets that items of a pipeline document declare in ``requires``."""
    return {name for _, item in _requiring_items(doc) for name in item.get("requires") or []}


def _requiring_items(doc: Mapping[str, Any]):
    """``(label, item)`` for every prepare entry, embedding job, sweep and evaluation."""
    for key, item in (doc.get("prepare") or {}).items():
        if isinstance(item, dict):
            yield f"prepare.{key}", item
    for i, job in enumerate((doc.get("embed") or {}).get("jobs") or []):
        if isinstance(job, dict):
            yield f"embed.jobs[{i}]", job
    for section in ("sweeps", "evaluations"):
        for i, item in enumerate(doc.get(section) or []):
            if isinstance(item, dict):
                yield f"{section}[{item.get('name') or i}]", item


def drop_unavailable(
    doc: dict[str, Any], available: Mapping[str, bool], source: str
) -> tuple[dict[str, Any], list[str]]:
    """``doc`` without the items whose ``requires`` names a data set that is not available (and
    without evaluations of a sweep so dropped), the ``requires`` keys removed; plus the labels
    of what was left out. An unknown name in ``requires`` is a :class:`ConfigError`."""
    doc = copy.deepcopy(doc)
    dropped: list[str] = []
    gone: list[int] = []
    for label, item in list(_requiring_items(doc)):
        needs = item.get("requires") or []
        if not isinstance(needs, list) or any(n not in OPTIONAL_DATA for n in needs):
            raise ConfigError(f"{source}: {label}.requires: expected a list of "
                              f"{list(OPTIONAL_DATA)}, got {needs!r}")  # fmt: skip
        if any(not available.get(n, True) for n in needs):
            dropped.append(label)
            gone.append(id(item))
    names = {s.get("name") for s in doc.get("sweeps") or [] if id(s) in gone}
    for i, ev in enumerate(doc.get("evaluations") or []):
        if isinstance(ev, dict) and ev.get("sweep") in names and id(ev) not in gone:
            dropped.append(f"evaluations[{i}]")
            gone.append(id(ev))
    prepare = doc.get("prepare") or {}
    for key in [k for k, v in prepare.items() if id(v) in gone]:
        del prepare[key]
    if isinstance(doc.get("embed"), dict) and doc["embed"].get("jobs"):
        doc["embed"]["jobs"] = [j for j in doc["embed"]["jobs"] if id(j) not in gone]
    for section in ("sweeps", "evaluations"):
        if doc.get(section):
            doc[section] = [x for x in doc[section] if id(x) not in gone]
    for _, item in _requiring_items(doc):
        item.pop("requires", None)
    return doc, dropped


def expand_env(value: Any, where: str = "config", extra: Mapping[str, str] | None = None) -> Any:
    """Expand ``${VAR}`` / ``$VAR`` in every string of ``value`` from ``extra`` then the
    environment. Credential-looking names are refused; an unset variable is an error."""
    extra = dict(extra or {})

    def one(text: str, path: str) -> str:
        def sub(match: re.Match[str]) -> str:
            name = match.group(1) or match.group(2)
            if name in extra:
                return extra[name]
            if _CREDENTIAL_NAME.search(name):
                raise ConfigError(
                    f"{path}: refusing to expand ${{{name}}}: it looks like a credential, and "
                    "configs are logged (MLflow, Tune, Ray). Leave credentials in the "
                    "environment; the libraries read them from there"
                )
            if name not in os.environ:
                raise ConfigError(f"{path}: ${{{name}}} is not set in the environment")
            return os.environ[name]

        return _ENV_REF.sub(sub, text)

    def walk(item: Any, path: str) -> Any:
        if isinstance(item, str):
            return one(item, path)
        if isinstance(item, list):
            return [walk(v, f"{path}[{i}]") for i, v in enumerate(item)]
        if isinstance(item, dict):
            return {k: walk(v, _child(path, k, where)) for k, v in item.items()}
        return item

    return walk(value, where)


def _child(path: str, key: Any, root: str) -> str:
    """``root: key`` at the top, ``path.key`` below."""
    return f"{root}: {key}" if path == root else f"{path}.{key}"


def _walk(value: Any, path: str, root: str | None = None) -> Iterable[tuple[str, Any]]:
    root = path if root is None else root
    yield path, value
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _walk(v, _child(path, k, root), root)
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            yield from _walk(v, f"{path}[{i}]", root)


# -- overrides and files ----------------------------------------------------------------------
class _Loader(yaml.SafeLoader):
    """YAML 1.1 with YAML 1.2 floats: ``1e-3`` is a number (PyYAML reads it as a string)."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
    |\.[0-9_]+(?:[eE][-+][0-9]+)?
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""", re.X),
    list("-+0123456789."),
)


def parse_yaml(text: str) -> Any:
    """``yaml.safe_load`` with YAML 1.2 floats (see :class:`_Loader`)."""
    return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass


# ----------------------------------------------------------------------
def apply_overrides(doc: dict[str, Any], items: Iterable[str]) -> dict[str, Any]:
    """Apply ``key.sub=value`` overrides in place (YAML-typed values; integers index lists:
    ``sweeps.0.epochs=5``). The one ``--set`` syntax of every entry point."""
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set expects key=value, got {item!r}")
        try:
            value = parse_yaml(raw)
        except yaml.YAMLError as exc:
            raise ConfigError(f"--set {item!r}: the value is not valid YAML ({exc})") from None
        parts = key.strip().split(".")
        target: Any = doc
        for depth, part in enumerate(parts):
            last = depth == len(parts) - 1
            shown = ".".join(parts[: depth + 1])
            if isinstance(target, list):
                if not part.lstrip("-").isdigit():
                    raise ConfigError(f"--set {key}: {shown} indexes a list; use a number")
                index = int(part)
                if not -len(target) <= index < len(target):
                    raise ConfigError(
                        f"--set {key}: index {index} is out of range ({len(target)} entries)"
                    )
                if last:
                    target[index] = value
                else:
                    target = target[index]
            elif isinstance(target, dict):
                if last:
                    target[part] = value
                else:
                    if target.get(part) is None:
                        target[part] = {}
                    target = target[part]
            else:
                raise ConfigError(f"--set {key}: {'.'.join(parts[:depth])} is not a mapping")
    return doc


def load_yaml(path: str) -> dict[str, Any]:
    """A YAML mapping from ``path``; unreadable files and bad YAML are ConfigErrors."""
    try:
        with open(path, encoding="utf-8") as fh:
            doc = parse_yaml(fh.read())
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the config ({exc.strerror or exc})") from None
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: not valid YAML ({_one_line(str(exc))})") from None
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level, got {type(doc).__name__}")
    return doc


def _one_line(text: str) -> str:
    return " ".join(text.split())


# -- error messages -----------------------------------------------------------------------------
def _loc_text(loc: Iterable[Any]) -> str:
    out = ""
    previous: Any = None
    for part in loc:
        tag = isinstance(previous, int) and part in EVALUATION_KINDS  # a union's tag
        previous = part
        if tag:
            continue
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def _field_names(tp: Any) -> list[str]:
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return list(tp.model_fields)
    if is_dataclass(tp):
        return [f.name for f in fields(tp)]
    return []


def _unwrap(tp: Any) -> list[Any]:
    """The model/dataclass types reachable through Optional/Union/list/dict/Annotated."""
    origin = get_origin(tp)
    if origin is Annotated:
        return _unwrap(get_args(tp)[0])
    if origin in (Union, UnionType, list, tuple, dict):  # X | Y has origin UnionType
        return [t for arg in get_args(tp) for t in _unwrap(arg)]
    return [tp] if _field_names(tp) else []


def _siblings(root: Any, loc: tuple[Any, ...]) -> list[str]:
    """The valid key names next to the bad one at ``loc`` (walking the schema)."""
    current = [root]
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        nxt: list[Any] = []
        for model in current:
            if isinstance(model, type) and issubclass(model, BaseModel):
                info = model.model_fields.get(part)
                if info is not None:
                    nxt += _unwrap(info.annotation)
            elif is_dataclass(model):
                for f in fields(model):
                    if f.name == part:
                        nxt += _unwrap(f.type if not isinstance(f.type, str) else Any)
            # discriminated unions: the tag is part of loc (e.g. 'hierarcaps'); keep going
            if not nxt and isinstance(part, str):
                for t in _unwrap(model):
                    tag = getattr(t, "model_fields", {}).get("kind")
                    if tag is not None and part in get_args(tag.annotation):
                        nxt.append(t)
        current = nxt or current
    names: list[str] = []
    for model in current:
        names += _field_names(model)
    return names


def validation_message(
    err: ValidationError, source: str, schema: Any = None, flags: bool = False, limit: int = 3
) -> str:
    """One line per problem (at most ``limit``): ``source: key.path: what is wrong``.

    ``flags=True`` spells keys as command-line flags (``--hidden-dim``)."""
    lines = []
    errors = err.errors()
    for e in errors[:limit]:
        loc = tuple(e["loc"])
        key = loc[-1] if loc else ""
        shown = _loc_text(loc)
        if flags and isinstance(key, str):
            shown = "--" + key.replace("_", "-")
        if e["type"] in ("extra_forbidden", "unexpected_keyword_argument"):
            names = _siblings(schema, loc) if schema is not None else []
            hint = difflib.get_close_matches(str(key), names, n=1, cutoff=0.6)
            suggestion = f" (did you mean {hint[0]!r}?)" if hint else ""
            lines.append(f"{shown}: unknown key{suggestion}")
        elif e["type"] == "missing":
            lines.append(f"{shown}: required key is missing")
        elif e["type"] in ("union_tag_invalid", "union_tag_not_found"):
            tags = e.get("ctx", {}).get("expected_tags", "")
            given = e.get("ctx", {}).get("tag")
            lines.append(f"{shown}.kind = {given!r}: must be one of {tags}")
        else:
            msg = e["msg"].removeprefix("Value error, ")
            given = e.get("input")
            if isinstance(given, str | int | float | bool) or given is None:
                lines.append(f"{shown} = {given!r}: {msg}")
            else:
                lines.append(f"{shown}: {msg}")
    more = f" (and {len(errors) - limit} more)" if len(errors) > limit else ""
    return f"{source}: " + "; ".join(lines) + more


def check_output_storage(output: str, tracking_uri: str | None, source: str) -> None:
    """An object-store output needs a tracking server: MLflow's SQLite store is a local file."""
    from asymvlm.storage import is_remote

    if is_remote(output) and not tracking_uri:
        raise ConfigError(
            f"{source}: output {output} is on an object store, where MLflow's default SQLite "
            "store cannot live: set mlflow.tracking_uri to a tracking server (http(s)://...; "
            "its artifacts may go to the same bucket)"
        )


def check_shared_output(output: str, shared_filesystem: bool) -> None:
    """On a Ray cluster of more than one node, a local ``output`` must be declared shared: Ray
    Train uploads checkpoints from whichever node reports them, and every stage reads back what
    another node wrote. Call after Ray is up, before any work."""
    import ray

    from asymvlm.storage import is_remote

    if is_remote(output) or shared_filesystem or not ray.is_initialized():
        return
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    if len(nodes) > 1:
        raise ConfigError(
            f"output {output} is a local path, but this Ray cluster has {len(nodes)} nodes: "
            "shared storage is needed. Use an object store (--output s3://bucket/run) or a "
            "mount every node shares, declared with storage.shared_filesystem=true"
        )


def validate(model: Any, data: Any, source: str, flags: bool = False) -> Any:
    """``model(**data)`` (a pydantic model or dataclass), errors as one ConfigError line."""
    try:
        if isinstance(model, type) and issubclass(model, BaseModel):
            return model.model_validate(data)
        if not isinstance(data, dict):
            raise ConfigError(f"{source}: expected a mapping, got {type(data).__name__}")
        return model(**data)
    except ValidationError as err:
        raise ConfigError(validation_message(err, source, model, flags=flags)) from None


# -- shared field types -------------------------------------------------------------------------
MethodName = Annotated[str, AfterValidator(check_method_name)]
PositiveInt = Annotated[int, Field(ge=1)]
Fraction = Annotated[float, Field(gt=0, lt=1, allow_inf_nan=False)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=True)


class StorageSettings(_Strict):
    """Where ``output`` lives: a local folder (one node), an object-store URI, or a mount that
    every node shares (NFS, EFS ...), which must be declared with ``shared_filesystem: true``."""

    shared_filesystem: bool = False


class MlflowSettings(_Strict):
    """Where runs are tracked: default a SQLite store beside the outputs."""

    tracking_uri: str | None = None
    experiment: str | None = None


# -- the sweep ----------------------------------------------------------------------------------
_SWEPT = ("method", "lr", "seed", "method_kwargs")
_TRAIN_FIELDS = {
    name: (info.annotation, info)
    for name, info in TrainConfig.__pydantic_fields__.items()
    if name not in _SWEPT
}


class _SweepBase(_Strict):
    name: str | None = None
    note: str | None = None
    embeddings: str
    methods: Annotated[list[MethodName], Field(min_length=1)]
    lr: Annotated[list[Annotated[float, Field(gt=0, allow_inf_nan=False)]], Field(min_length=1)]
    seeds: Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]
    num_workers: PositiveInt = 1
    mlflow: MlflowSettings = Field(default_factory=MlflowSettings)
    output: str | None = None
    storage: StorageSettings = Field(default_factory=StorageSettings)
    train_split: str = "train"
    val_split: str | None = "val"
    test_split: str | None = "test"
    test_embeddings: str | None = None
    val_fraction: Fraction | None = None
    checkpoint_every: PositiveInt = 5
    max_failures: Annotated[int, Field(ge=0)] = 1
    cpus_per_worker: Annotated[float, Field(gt=0, allow_inf_nan=False)] = 1.0
    gpus_per_worker: Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)] = 1.0
    method_kwargs: dict[MethodName, dict[str, Any]] = Field(default_factory=dict)
    #: ``auto``: a one-worker trial runs the protocol inside the Tune trial itself (no
    #: TorchTrainer start-up); ``num_workers > 1`` drives a TorchTrainer (DDP).
    #: ``torch_trainer``: every trial through a TorchTrainer (as earlier versions did; to compare).
    trial_runner: Literal["auto", "torch_trainer"] = "auto"
    #: Train up to this many trials of one method and stage (other lr and/or seed) in one
    #: process as one batched model (:mod:`asymvlm.training.packed`); each keeps its own
    #: optimiser, schedule, metrics and MLflow run. One-worker trials only; a pack that fails
    #: (e.g. its process dies) is retried from its start.
    pack: PositiveInt = 1

    @model_validator(mode="after")
    def _consistent(self) -> _SweepBase:
        for field_name in ("lr", "seeds", "methods"):
            values = getattr(self, field_name)
            if len(set(values)) != len(values):
                raise ValueError(f"{field_name} has duplicates: {values}")
        if self.pack > 1 and (self.num_workers > 1 or self.trial_runner != "auto"):
            raise ValueError("pack > 1 packs one-worker trials: it needs num_workers: 1 and "
                             "trial_runner: auto")  # fmt: skip
        extra = sorted(set(self.method_kwargs) - set(self.methods))
        if extra:
            raise ValueError(f"method_kwargs names methods that are not swept: {extra}")
        # Every (method, lr, seed) must make a valid TrainConfig (e.g. no lr=inf).
        train = {k: getattr(self, k) for k in _TRAIN_FIELDS}
        for method in self.methods:
            TrainConfig(**train, method=method, lr=self.lr[0], seed=self.seeds[0],
                        method_kwargs=self.method_kwargs.get(method, {}))  # fmt: skip
        return self


def _sweep_model() -> type[BaseModel]:
    from pydantic import create_model

    return create_model(  # the TrainConfig fields, with TrainConfig's types and defaults
        "SweepConfig", __base__=_SweepBase, **_TRAIN_FIELDS
    )


SweepConfig = _sweep_model()
SweepConfig.__doc__ = """A two-stage Tune sweep (``pipelines/sweep.py``, ``tune_spaces/*.yaml``):
``methods x lr`` with the first seed, the best lr per method on validation, then every seed.
Every :class:`~asymvlm.training.TrainConfig` field except method/lr/seed is a key too."""


# -- the whole pipeline -------------------------------------------------------------------------
EVALUATION_KINDS = ("zeroshot", "nota", "hierarcaps", "ood")
def _location(value: str) -> str:
    root, _, split = value.rpartition(":")
    if not root or not split or "/" in split or root.endswith(":/"):
        raise ValueError("expected ROOT:SPLIT (a table root and a split name)")
    return value


Location = Annotated[str, AfterValidator(_location)]


class _EvaluationBase(_Strict):
    sweep: str | None = None
    frozen: bool = False
    dim: PositiveInt | None = None
    note: str | None = None


class HierarCapsEvaluation(_EvaluationBase):
    kind: Literal["hierarcaps"]
    data: Location


class ZeroShotEvaluation(_EvaluationBase):
    kind: Literal["zeroshot"]
    sets: Annotated[dict[str, Location], Field(min_length=1)]
    fine_tuned_on: str | None = None
    embedding_model: str | None = None
    template_aggregation: Literal["mean", "logmeanexp"] = "mean"


class NoneOfTheAboveEvaluation(_EvaluationBase):
    kind: Literal["nota"]
    positives: Location
    negatives: Location
    far_negatives: Location | None = None
    template_aggregation: Literal["mean", "logmeanexp"] = "mean"


class OodEvaluation(_EvaluationBase):
    kind: Literal["ood"]
    data: Location
    perturbed: Annotated[dict[str, Location], Field(min_length=1)]


Evaluation = Annotated[
    HierarCapsEvaluation | ZeroShotEvaluation | NoneOfTheAboveEvaluation | OodEvaluation,
    Field(discriminator="kind"),
]


class SyntheticClasses(_Strict):
    """``prepare.synthetic.classes``: the classification sets written next to the world
    (:class:`asymvlm.synthetic.ClassificationSpec`): ``ROOT-positives``, ``ROOT-negatives`` and,
    for a world with two domains, ``ROOT-zeroshot`` (split ``test``)."""

    level: Annotated[int, Field(ge=0)] = 1
    n_classes: PositiveInt | None = None
    positives: PositiveInt = 1000
    negatives: PositiveInt = 1000
    zeroshot: PositiveInt = 1000
    templates: Annotated[list[str], Field(min_length=1)] | None = None


#: The sets :func:`asymvlm.synthetic.write_classification_sets` writes, by role.
CLASS_SET_ROLES = ("positives", "negatives", "zeroshot")


class SyntheticPrepare(_Strict):
    """``prepare.synthetic``: the synthetic world's output and its WorldConfig knobs.

    ``preset`` names a world (:data:`asymvlm.synthetic.PRESETS`); the sizes and knobs given
    beside it override the preset's. Without a preset the sizes default to 8000/1000/1000
    images and the knobs to :class:`~asymvlm.synthetic.WorldConfig`'s. ``classes`` (``true``
    or the keys of :class:`SyntheticClasses`) also writes the classification sets."""

    model_config = ConfigDict(extra="allow")
    output: str
    preset: Literal["demo", "coco"] | None = None
    train_images: PositiveInt | None = None
    val_images: Annotated[int, Field(ge=0)] | None = None
    test_images: Annotated[int, Field(ge=0)] | None = None
    classes: SyntheticClasses | None = None

    @field_validator("classes", mode="before")
    @classmethod
    def _classes_flag(cls, value: Any) -> Any:
        """``classes: true`` is every default of :class:`SyntheticClasses`; ``false``: none."""
        if value is True:
            return {}
        return None if value is False else value

    @model_validator(mode="after")
    def _world_keys(self) -> SyntheticPrepare:
        from asymvlm.synthetic import WorldConfig

        known = [f.name for f in fields(WorldConfig) if f.name != "splits"]
        for key in self.model_extra or {}:
            if key not in known:
                hint = difflib.get_close_matches(key, known + list(type(self).model_fields), 1)
                tip = f" (did you mean {hint[0]!r}?)" if hint else ""
                raise ValueError(f"unknown key {key!r}{tip}")
        self.world_config()  # every knob's value is checked here, not when the stage runs
        return self

    def world_config(self) -> Any:
        """The :class:`~asymvlm.synthetic.WorldConfig` this section describes."""
        from dataclasses import replace

        from asymvlm.synthetic import PRESETS, WorldConfig

        base = PRESETS[self.preset] if self.preset else WorldConfig()
        splits = dict(base.splits) if self.preset else {"train": 8000, "val": 1000, "test": 1000}
        for split in ("train", "val", "test"):
            given = getattr(self, f"{split}_images")
            if given is not None:
                splits[split] = given
        try:
            return replace(base, splits=splits, **(self.model_extra or {}))
        except (TypeError, ValueError) as err:  # a knob's value out of range or of a bad type
            raise ValueError(f"world knobs: {err}") from None

    def classification_spec(self) -> Any:
        """The :class:`~asymvlm.synthetic.ClassificationSpec` of ``classes`` (None: no sets)."""
        if self.classes is None:
            return None
        from asymvlm.synthetic import ClassificationSpec

        keys = self.classes.model_dump(exclude_none=True)
        if "templates" in keys:
            keys["templates"] = tuple(keys["templates"])
        return ClassificationSpec(**keys)

    def class_set_roots(self) -> dict[str, str]:
        """Role -> table root of the classification sets this section writes (``{}``: none);
        the zero-shot set only for a world with two domains."""
        if self.classes is None:
            return {}
        world = self.world_config()
        two_domains = world.finetune_roots is not None and world.finetune_roots < world.branching[0]
        roles = CLASS_SET_ROLES if two_domains else CLASS_SET_ROLES[:2]
        base = self.output.rstrip("/")
        return {role: f"{base}-{role}" for role in roles}


class HierarCapsCifarPrepare(_Strict):
    hierarcaps: str
    output: str
    n_classes: Annotated[int, Field(ge=2)] = 5


class PrepareConfig(_Strict):
    """Offline stand-ins written before the embedding stage."""

    tiny_clip: str | None = None
    synthetic: SyntheticPrepare | None = None
    hierarcaps_cifar: HierarCapsCifarPrepare | None = None


class EmbedSection(_Strict):
    """``embed``: ``defaults`` + ``jobs`` (each job an :class:`EmbedConfig` once merged)."""

    defaults: dict[str, Any] = Field(default_factory=dict)
    jobs: list[dict[str, Any]] = Field(default_factory=list)


class ReportConfig(_Strict):
    output: str | None = None


class ServeConfig(_Strict):
    """``pipelines/serve.py``: a scorer (:class:`asymvlm.Scorer`) behind Ray Serve."""

    checkpoint: str  # a checkpoint folder or an MLflow model URI (runs:/..., models:/...)
    encoder: str | None = None  # instead of the encoder the checkpoint names
    tracking_uri: str | None = None  # the MLflow store of a runs:/ or models:/ URI
    device: str = "auto"
    name: str = "asymvlm-scorer"
    host: str = "127.0.0.1"
    port: Annotated[int, Field(ge=1, le=65535)] = 8000
    route_prefix: str = "/"
    replicas: PositiveInt = 1
    cpus_per_replica: Annotated[float, Field(gt=0)] = 1.0
    gpus_per_replica: Annotated[float, Field(ge=0)] = 0.0
    #: Dynamic batching: requests that arrive within ``batch_wait_timeout_s`` of each other are
    #: embedded together, up to ``max_batch_size`` requests (``batching: false``: one by one).
    batching: bool = True
    max_batch_size: PositiveInt = 32
    batch_wait_timeout_s: Annotated[float, Field(ge=0)] = 0.01
    encode_batch_size: PositiveInt = 256
    max_caption_chars: PositiveInt = 1000
    max_captions: PositiveInt = 1024  # per request
    max_images: PositiveInt = 64  # per request


class PipelineConfig(_Strict):
    """``pipelines/full.py``: prepare -> embed -> sweep -> evaluate -> report."""

    name: str | None = None
    output: str | None = None
    storage: StorageSettings = Field(default_factory=StorageSettings)
    mlflow: MlflowSettings = Field(default_factory=MlflowSettings)
    prepare: PrepareConfig = Field(default_factory=PrepareConfig)
    embed: EmbedSection = Field(default_factory=EmbedSection)
    sweeps: list[SweepConfig] = Field(default_factory=list)  # type: ignore[valid-type]
    evaluations: list[Evaluation] = Field(default_factory=list)
    report: ReportConfig = Field(default_factory=ReportConfig)

    @model_validator(mode="after")
    def _references(self) -> PipelineConfig:
        names = [s.name for s in self.sweeps]
        for i, name in enumerate(names):
            if not name:
                raise ValueError(f"sweeps[{i}] needs a name")
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"every sweep needs a unique name; repeated: {dupes}")
        for i, ev in enumerate(self.evaluations):
            if ev.sweep and ev.sweep not in names:
                raise ValueError(f"evaluations[{i}] names unknown sweep {ev.sweep!r}")
            if ev.frozen and not ev.sweep and ev.dim is None:
                raise ValueError(f"evaluations[{i}]: a frozen-only evaluation needs dim")
        return self

