"""One registry of the paper's evaluations, for ``asymvlm analyze`` and the pipeline alike.

Each :class:`Evaluation` names its kind (the config's ``kind``, the CLI's ``asymvlm analyze
<kind>`` and the MLflow tag ``kind=eval-<kind>``), its inputs (config keys, which are also the
CLI options) and the function that computes it from trained methods and embedding tables
(:mod:`asymvlm.evaluation.suite`). :func:`log_evaluation` puts a result into MLflow: its numbers
as metrics, ``results.json`` beside them, nested under the pipeline run when there is one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from asymvlm.errors import ConfigError
from asymvlm.methods import METHODS, Method

__all__ = [
    "EVALUATIONS",
    "Evaluation",
    "Input",
    "evaluate",
    "log_evaluation",
    "result_metrics",
    "with_frozen",
]

Location = tuple[str, str]


@dataclass(frozen=True)
class Input:
    """One input of an evaluation: a config key, and the CLI option ``--<key with dashes>``.

    ``location``: ``ROOT:SPLIT`` of embedding tables; ``named``: ``NAME=ROOT:SPLIT``, repeated
    (a mapping in the config); ``text``: a plain string.
    """

    key: str
    form: Literal["location", "named", "text"]
    help: str
    required: bool = True
    metavar: str | None = None

    @property
    def flag(self) -> str:
        return "--" + {"sets": "set"}.get(self.key, self.key).replace("_", "-")


@dataclass(frozen=True)
class Evaluation:
    kind: str
    title: str
    inputs: tuple[Input, ...]
    compute: Callable[[Mapping[str, Method], dict[str, Any]], dict[str, Any]]
    # The location whose tables give the embedding dimension of a frozen-only evaluation.
    dim_from: str

    @property
    def tag(self) -> str:
        return f"eval-{self.kind}"


def location(value: Any, where: str) -> Location:
    """``"ROOT:SPLIT"`` -> ``(ROOT, SPLIT)`` (URIs keep their ``://``)."""
    text = str(value or "")
    root, _, split = text.rpartition(":")
    if not root or not split or root.endswith(":/") or "/" in split:
        raise ConfigError(f"{where}: expected ROOT:SPLIT, got {text!r}")
    return root, split


def _parsed(ev: Evaluation, spec: Mapping[str, Any]) -> dict[str, Any]:
    """The spec with locations as (root, split) tuples; a missing required input is an error."""
    out = dict(spec)
    for inp in ev.inputs:
        value = spec.get(inp.key)
        if value in (None, {}, []):
            if inp.required:
                raise ConfigError(f"{ev.kind}: {inp.flag} ({inp.key}) is required")
            continue
        if inp.form == "location":
            out[inp.key] = location(value, f"{ev.kind}: {inp.flag}")
        elif inp.form == "named":
            out[inp.key] = {name: location(where, f"{ev.kind}: {inp.flag} {name}")
                            for name, where in dict(value).items()}  # fmt: skip
    return out


def _zero_shot(methods, spec):
    from asymvlm.evaluation import suite

    return suite.evaluate_zero_shot(methods, spec["sets"], spec.get("template_aggregation"))


def _nota(methods, spec):
    from asymvlm.evaluation import suite

    return suite.evaluate_none_of_the_above(methods, spec["positives"], spec["negatives"],
                                            spec.get("far_negatives"),
                                            spec.get("template_aggregation"))  # fmt: skip


def _hierarcaps(methods, spec):
    from asymvlm.evaluation import suite

    return suite.evaluate_hierarcaps(methods, *spec["data"])


def _ood(methods, spec):
    from asymvlm.evaluation import suite

    return suite.evaluate_ood(methods, spec["data"], spec["perturbed"])


#: How a likelihood method combines the log-likelihoods of a class's prompts (the paper leaves
#: it open; :data:`asymvlm.evaluation.zeroshot.TEMPLATE_AGGREGATIONS`).
_AGGREGATION = Input("template_aggregation", "text", "how a likelihood method combines a "
                     "class's prompts: mean (of the log-likelihoods; default) or logmeanexp "
                     "(log of the mean likelihood)", False, metavar="mean|logmeanexp")  # fmt: skip

EVALUATIONS: dict[str, Evaluation] = {
    ev.kind: ev
    for ev in (
        Evaluation(
            "zeroshot", "zero-shot accuracy after fine-tuning (Table 3)",
            (Input("sets", "named", "an evaluation set (repeat)", metavar="NAME=ROOT:SPLIT"),
             Input("fine_tuned_on", "text", "the training data set's name (report)", False),
             Input("embedding_model", "text", "the frozen model's name (report)", False),
             _AGGREGATION),
            _zero_shot, "sets",
        ),
        Evaluation(
            "nota", "none-of-the-above prompts (Table 2)",
            (Input("positives", "location", "CIFAR-10-like set whose classes are prompted"),
             Input("negatives", "location", "CIFAR-100-like set of unprompted classes"),
             Input("far_negatives", "location", "images of concepts unrelated to every "
                   "positive class (the synthetic world's far negatives)", False),
             _AGGREGATION),
            _nota, "positives",
        ),
        Evaluation(
            "hierarcaps", "uncertainty along caption hierarchies (Fig. 5)",
            (Input("data", "location", "tables with caption levels (HierarCaps, synthetic)"),),
            _hierarcaps, "data",
        ),
        Evaluation(
            "ood", "retrieval under perturbed images and captions (beyond the paper)",
            (Input("data", "location", "the clean tables"),
             Input("perturbed", "named", "a perturbed copy of the data (repeat)",
                   metavar="KIND:SEVERITY=ROOT:SPLIT")),
            _ood, "data",
        ),
    )
}  # fmt: skip


def _dimension(ev: Evaluation, spec: Mapping[str, Any]) -> int:
    from asymvlm import tables

    where = spec[ev.dim_from]
    root = next(iter(where.values()))[0] if isinstance(where, dict) else where[0]
    return int(tables.read_manifest(root).dim)


def with_frozen(
    kind: str, methods: Mapping[str, Method], spec: Mapping[str, Any], dim: int | None = None
) -> dict[str, Method]:
    """``methods`` plus the frozen model (``clip``: cosine scores, no uncertainty)."""
    ev = EVALUATIONS[kind]
    if dim is None:
        dim = next(iter(methods.values())).dim if methods else _dimension(ev, _parsed(ev, spec))
    frozen = METHODS["clip"](dim=dim)
    frozen.adapter_input = "unit"
    return {**methods, "clip": frozen}


def evaluate(kind: str, methods: Mapping[str, Method], spec: Mapping[str, Any]) -> dict[str, Any]:
    """Run evaluation ``kind`` for ``methods`` on the inputs in ``spec`` (config keys; locations
    as ``ROOT:SPLIT`` strings or tuples)."""
    if kind not in EVALUATIONS:
        raise ConfigError(f"unknown evaluation {kind!r}; choose from {sorted(EVALUATIONS)}")
    if not methods:
        raise ConfigError(f"{kind}: no adapters to evaluate (give a sweep or checkpoints, or "
                          "the frozen model)")  # fmt: skip
    ev = EVALUATIONS[kind]
    return ev.compute(methods, _parsed(ev, spec))


def result_metrics(result: Any, prefix: str = "") -> dict[str, float]:
    """Every finite number of a result as an MLflow metric named by its path
    (``asymvlm-vmf/seed0/spearman_level_uncertainty``); lists (curves) stay in the JSON."""
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
    with tracking.run(tracking_uri, experiment, name or f"eval {kind}", kind=ev.tag,
                      parent=parent, params={"kind": kind, **(params or {})},
                      description=description) as run:  # fmt: skip
        run.log_metrics(result_metrics(result))
        run.log_json("results.json", result)
        for path in (figures or {}).values():
            run.log_artifact(path)
    return run.id
