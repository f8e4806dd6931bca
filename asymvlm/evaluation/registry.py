"""One registry of the paper's evaluations for the CLI, the pipeline and the protocol.

Each :class:`Evaluation` names its kind (the config's ``kind``, ``asymvlm analyze <kind>``, the
MLflow tag ``eval-<kind>``), its inputs (config keys and CLI options) and the function computing
it (:mod:`asymvlm.evaluation.suite`); :attr:`Evaluation.spec_model` is its typed spec.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Annotated, Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, create_model

from asymvlm import tables
from asymvlm.config import validate
from asymvlm.errors import ConfigError
from asymvlm.evaluation import suite
from asymvlm.evaluation.retrieval import evaluate_retrieval
from asymvlm.evaluation.suite import SplitLoader
from asymvlm.evaluation.zeroshot import TEMPLATE_AGGREGATIONS
from asymvlm.methods import METHODS, Method
from asymvlm.splits import SplitTensors
from asymvlm.tables import LocationField

__all__ = [
    "EVALUATIONS",
    "Evaluation",
    "EvaluationSpec",
    "Input",
    "SplitLoader",
    "evaluate",
    "evaluate_split",
    "log_evaluation",
    "result_metrics",
    "spec",
    "with_frozen",
]

PositiveInt = Annotated[int, Field(ge=1)]
#: The Python type of each input form in a spec.
_FORMS: dict[str, Any] = {
    "location": LocationField,
    "named": Annotated[dict[str, LocationField], Field(min_length=1)],
    "text": str,
    "count": PositiveInt,
    "aggregation": Literal[TEMPLATE_AGGREGATIONS],  # type: ignore[valid-type]
}


@dataclass(frozen=True)
class Input:
    """One input of an evaluation: a config key and the CLI option ``--<key with dashes>``;
    ``form`` picks its type (:data:`_FORMS`), ``default`` the value of an optional one."""

    key: str
    form: Literal["location", "named", "text", "count", "aggregation"]
    help: str
    required: bool = True
    metavar: str | None = None
    default: Any = None

    @property
    def flag(self) -> str:
        return "--" + {"sets": "set"}.get(self.key, self.key).replace("_", "-")


class EvaluationSpec(BaseModel):
    """The base of every kind's spec (frozen once validated)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


Compute = Callable[[Mapping[str, Method], Any, SplitLoader], dict[str, Any]]


@dataclass(frozen=True)
class Evaluation:
    kind: str
    title: str
    inputs: tuple[Input, ...]
    compute: Compute
    dim_from: str  # the input whose tables give the dimension of a frozen-only evaluation

    @property
    def tag(self) -> str:
        return f"eval-{self.kind}"

    @cached_property
    def spec_model(self) -> type[EvaluationSpec]:
        """The typed spec of this kind: ``kind`` plus one field per input."""
        fields: dict[str, Any] = {
            "kind": (Literal[self.kind], Field(self.kind, description="the evaluation"))  # type: ignore[valid-type]
        }
        for inp in self.inputs:
            tp = _FORMS[inp.form]
            if inp.required:
                fields[inp.key] = (tp, Field(..., description=inp.help))
            else:
                fields[inp.key] = (tp | None, Field(inp.default, description=inp.help))
        name = "".join(part.title() for part in self.kind.split("_")) + "Spec"
        return create_model(name, __base__=EvaluationSpec, **fields)


def _retrieval(methods: Mapping[str, Method], spec: Any, load: SplitLoader) -> dict[str, Any]:
    return {
        name: _retrieval_on_split(m, load(spec.data, suite.adapter_input(m)), spec)
        for name, m in methods.items()
    }


def _retrieval_on_split(
    method: Method, data: SplitTensors, spec: Any, progress: bool = False
) -> dict[str, Any]:
    return evaluate_retrieval(
        method,
        data,
        n_bins=spec.levels,
        chunk_size=spec.chunk_size,
        fold_size=spec.fold_size,
        memory_budget=spec.memory_budget,
        progress=progress,
    )


_AGGREGATION = Input(
    "template_aggregation",
    "aggregation",
    "how a likelihood method combines a class's prompts: mean (of the log-likelihoods; "
    "default) or logmeanexp (log of the mean likelihood)",
    False,
    metavar="mean|logmeanexp",
    default="mean",
)

EVALUATIONS: dict[str, Evaluation] = {
    ev.kind: ev
    for ev in (
        Evaluation(
            "retrieval",
            "cross-modal retrieval with uncertainty (Table 1, Fig. 3)",
            (
                Input("data", "location", "the tables to retrieve in"),
                Input("levels", "count", "uncertainty bins", False, default=10),
                Input(
                    "fold_size",
                    "count",
                    "also average the metrics over folds of N consecutive "
                    "images and their captions (1000 on the COCO 5K test split: COCO 1K)",
                    False,
                    metavar="N",
                ),
                Input(
                    "chunk_size",
                    "count",
                    "captions scored at once (default: as many as --memory-budget allows)",
                    False,
                ),
                Input(
                    "memory_budget",
                    "count",
                    "working memory of one chunk of scores (default 512 MiB)",
                    False,
                    metavar="BYTES",
                ),
            ),
            _retrieval,
            "data",
        ),
        Evaluation(
            "zeroshot",
            "zero-shot accuracy after fine-tuning (Table 3)",
            (
                Input("sets", "named", "an evaluation set (repeat)", metavar="NAME=ROOT:SPLIT"),
                Input("fine_tuned_on", "text", "the training data set's name (report)", False),
                Input("embedding_model", "text", "the frozen model's name (report)", False),
                _AGGREGATION,
            ),
            lambda methods, spec, load: suite.evaluate_zero_shot(
                methods, spec.sets, spec.template_aggregation
            ),
            "sets",
        ),
        Evaluation(
            "nota",
            "none-of-the-above prompts (Table 2)",
            (
                Input("positives", "location", "CIFAR-10-like set whose classes are prompted"),
                Input("negatives", "location", "CIFAR-100-like set of unprompted classes"),
                Input(
                    "far_negatives",
                    "location",
                    "images of concepts unrelated to every "
                    "positive class (the synthetic world's far negatives)",
                    False,
                ),
                _AGGREGATION,
            ),
            lambda methods, spec, load: suite.evaluate_none_of_the_above(
                methods,
                spec.positives,
                spec.negatives,
                spec.far_negatives,
                spec.template_aggregation,
            ),
            "positives",
        ),
        Evaluation(
            "hierarcaps",
            "uncertainty along caption hierarchies (Fig. 5)",
            (Input("data", "location", "tables with caption levels (HierarCaps, synthetic)"),),
            lambda methods, spec, load: suite.evaluate_hierarcaps(methods, spec.data, load),
            "data",
        ),
        Evaluation(
            "ood",
            "retrieval under perturbed images and captions (beyond the paper)",
            (
                Input("data", "location", "the clean tables"),
                Input(
                    "perturbed",
                    "named",
                    "a perturbed copy of the data (repeat)",
                    metavar="KIND:SEVERITY=ROOT:SPLIT",
                ),
            ),
            lambda methods, spec, load: suite.evaluate_ood(
                methods, spec.data, spec.perturbed, load
            ),
            "data",
        ),
    )
}


def spec(
    kind: str, values: Mapping[str, Any], source: str | None = None, flags: bool = False
) -> EvaluationSpec:
    """The typed spec of evaluation ``kind`` from config keys; a problem is a
    :class:`ConfigError` naming ``source`` and the key (``flags``: spelt as CLI flags)."""
    if kind not in EVALUATIONS:
        raise ConfigError(f"unknown evaluation {kind!r}; choose from {sorted(EVALUATIONS)}")
    ev = EVALUATIONS[kind]
    given = {k: v for k, v in values.items() if k != "kind" and v not in (None, {}, [])}
    return validate(
        ev.spec_model, {"kind": kind, **given}, source or f"asymvlm analyze {kind}", flags=flags
    )


def _dimension(ev: Evaluation, parsed: EvaluationSpec) -> int:
    where = getattr(parsed, ev.dim_from)
    root = next(iter(where.values())).root if isinstance(where, dict) else where.root
    return int(tables.read_manifest(root).dim)


def with_frozen(
    methods: Mapping[str, Method], parsed: EvaluationSpec, dim: int | None = None
) -> dict[str, Method]:
    """``methods`` plus the frozen model (``clip``: cosine scores, no uncertainty)."""
    ev = EVALUATIONS[parsed.kind]  # type: ignore[attr-defined]
    if dim is None:
        dim = next(iter(methods.values())).dim if methods else _dimension(ev, parsed)
    frozen = METHODS["clip"](dim=dim)
    frozen.adapter_input = "unit"
    return {**methods, "clip": frozen}


def evaluate(
    parsed: EvaluationSpec, methods: Mapping[str, Method], *, device: str | torch.device = "cpu"
) -> dict[str, Any]:
    """Run the evaluation ``parsed`` (:func:`spec`) for ``methods``, splits read onto
    ``device``."""
    ev = EVALUATIONS[parsed.kind]  # type: ignore[attr-defined]
    if not methods:
        raise ConfigError(
            f"{ev.kind}: no adapters to evaluate (give a sweep or checkpoints, or the frozen model)"
        )
    return ev.compute(methods, parsed, SplitLoader(device))


def evaluate_split(
    parsed: EvaluationSpec | str, method: Method, data: SplitTensors, *, progress: bool = False
) -> dict[str, Any]:
    """The retrieval evaluation ``parsed`` (a spec, or "retrieval" at its defaults) of
    ``method`` on a split already in memory instead of the location the spec names."""
    if isinstance(parsed, str):
        ev = EVALUATIONS[parsed]
        values = {inp.key: inp.default for inp in ev.inputs if not inp.required}
        parsed = ev.spec_model.model_construct(kind=parsed, **values)
    return _retrieval_on_split(method, data, parsed, progress)


def result_metrics(result: Any, prefix: str = "") -> dict[str, float]:
    """Every finite number of a result as an MLflow metric named by its path; lists stay in the
    JSON."""
    out: dict[str, float] = {}
    if isinstance(result, Mapping):
        for key, value in result.items():
            name = _metric_key(f"{prefix}/{key}" if prefix else str(key))
            out.update(result_metrics(value, name))
    elif isinstance(result, int | float) and not isinstance(result, bool):
        if math.isfinite(result):
            out[prefix] = float(result)
    return out


def _metric_key(name: str) -> str:
    """MLflow metric names: alphanumerics, ``_ - . / :`` and spaces."""
    return "".join(c if c.isalnum() or c in "_-./: " else "_" for c in name)[:250]


def log_evaluation(
    tracking_uri: str,
    experiment: str,
    kind: str,
    result: Mapping[str, Any],
    *,
    params: Mapping[str, Any] | None = None,
    parent: str | None = None,
    name: str | None = None,
    figures: Mapping[str, str] | None = None,
) -> str:
    """One MLflow run ``kind=eval-<kind>``: the numbers as metrics, ``results.json``, figures."""
    from asymvlm import tracking

    ev = EVALUATIONS[kind]
    description = ev.title[0].upper() + ev.title[1:]
    with tracking.run(
        tracking_uri,
        experiment,
        name or f"eval {kind}",
        kind=ev.tag,
        parent=parent,
        params={"kind": kind, **(params or {})},
        description=description,
    ) as run:
        run.log_metrics(result_metrics(result))
        run.log_json("results.json", result)
        for path in (figures or {}).values():
            run.log_artifact(path)
    return run.id
