"""One registry of the paper's evaluations for the CLI, the pipeline and the protocol: a kind
(the config's ``kind``, ``asymvlm analyze <kind>``, the MLflow tag ``eval-<kind>``) names its
typed spec (:mod:`.specs`) and the function computing it (:mod:`asymvlm.evaluation.suite`).
One evaluation's result is logged by :func:`log_evaluation` and read back, for the report, as
an :class:`EvaluationResult`.

To add an evaluation kind: its spec in :mod:`.specs` (and ``SPECS``: the CLI's flags, the
pipeline's config), its computation in :mod:`.suite`, an :class:`EvaluationKind` in
:data:`EVALUATIONS` here, and its section of the report in
:mod:`asymvlm.report.evaluation_sections` (placed by :mod:`asymvlm.report.document`)."""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from asymvlm import tables
from asymvlm.errors import ConfigError
from asymvlm.evaluation import suite
from asymvlm.evaluation.retrieval import evaluate_retrieval
from asymvlm.evaluation.specs import (
    EvaluationSpec,
    HierarcapsSpec,
    NotaSpec,
    OodSpec,
    RetrievalSpec,
    ZeroshotSpec,
)
from asymvlm.methods import METHODS, Method
from asymvlm.splits import SplitTensors
from asymvlm.tables import Location

#: The methods an evaluation takes, by name (``method/seed<k>``).
Methods = Mapping[str, Method]
Compute = Callable[[Methods, Any, suite.SplitLoader], dict[str, Any]]
#: ``(metric path, value)`` of the numbers of a result that matter, adapters named ``m/seed<k>``.
Headline = Callable[[Mapping[str, Any]], Iterable[tuple[str, Any]]]
RETRIEVAL_HEADLINE = ("recall@1", "recall@5", "recall@10", "spearman", "r2", "auroc")
HIERARCAPS_HEADLINE = ("spearman_level_uncertainty", "spearman_words_uncertainty")
NOTA_HEADLINE = ("pos_acc", "neg_acc", "far_neg_acc")
OOD_HEADLINE = ("t2i_recall_at_1", "i2t_recall_at_1", "t2i_mmi", "i2t_mmi", "uncertainty_auroc")


class EvaluationKind(NamedTuple):
    """One kind: its typed spec (its ``title`` says what it is), the function computing it and its
    result's headline numbers."""

    spec_model: type[EvaluationSpec]
    compute: Compute
    headline: Headline


def _retrieval_on_split(
    method: Method, data: SplitTensors, spec: Any, progress: bool = False
) -> dict[str, Any]:
    options = spec.model_dump(include={"chunk_size", "fold_size", "memory_budget"})
    return evaluate_retrieval(method, data, n_bins=spec.levels, progress=progress, **options)


def _retrieval(methods: Methods, spec: RetrievalSpec, load: suite.SplitLoader) -> dict[str, Any]:
    return {
        name: _retrieval_on_split(m, load(spec.data, suite.adapter_input(m)), spec)
        for name, m in methods.items()
    }


def _retrieval_headline(result: Mapping[str, Any]) -> Iterable[tuple[str, Any]]:
    for name, per_direction in result.items():
        for direction in ("t2i", "i2t"):
            for key in RETRIEVAL_HEADLINE:
                yield f"{name}/{direction}_{key}", per_direction[direction].get(key)


def _zeroshot(methods: Methods, spec: ZeroshotSpec, load: suite.SplitLoader) -> dict[str, Any]:
    return suite.evaluate_zero_shot(methods, spec.sets, spec.template_aggregation)


def _zeroshot_headline(result: Mapping[str, Any]) -> Iterable[tuple[str, Any]]:
    for name, per_set in result.items():
        for set_name, accuracy in per_set.items():
            yield f"{name}/{set_name}", accuracy


def _nota(methods: Methods, spec: NotaSpec, load: suite.SplitLoader) -> dict[str, Any]:
    return suite.evaluate_none_of_the_above(
        methods, spec.positives, spec.negatives, spec.far_negatives, spec.template_aggregation
    )


def _nota_headline(result: Mapping[str, Any]) -> Iterable[tuple[str, Any]]:
    for per_method in result["dummy"].values():  # over the dummy prompts too
        for name, cell in per_method.items():
            for key in NOTA_HEADLINE:
                yield f"{name}/{key}", cell.get(key)
    for rule, cell in result.get("rejection", {}).items():
        for key in NOTA_HEADLINE:
            yield f"{rule}-based/{key}", cell.get(key)


def _hierarcaps(methods: Methods, spec: HierarcapsSpec, load: suite.SplitLoader) -> dict[str, Any]:
    return suite.evaluate_hierarcaps(methods, spec.data, load)


def _hierarcaps_headline(result: Mapping[str, Any]) -> Iterable[tuple[str, Any]]:
    for name, per_method in result.items():
        for key in HIERARCAPS_HEADLINE:
            yield f"{name}/{key}", per_method.get(key)


def _ood(methods: Methods, spec: OodSpec, load: suite.SplitLoader) -> dict[str, Any]:
    return suite.evaluate_ood(methods, spec.data, spec.perturbed, load)


def _ood_headline(result: Mapping[str, Any]) -> Iterable[tuple[str, Any]]:
    for name, per_perturbation in result.items():
        for perturbation, cell in per_perturbation.items():
            for key in OOD_HEADLINE:
                yield f"{name}/{perturbation}/{key}", cell.get(key)


EVALUATIONS: dict[str, EvaluationKind] = {
    "retrieval": EvaluationKind(RetrievalSpec, _retrieval, _retrieval_headline),
    "zeroshot": EvaluationKind(ZeroshotSpec, _zeroshot, _zeroshot_headline),
    "nota": EvaluationKind(NotaSpec, _nota, _nota_headline),
    "hierarcaps": EvaluationKind(HierarcapsSpec, _hierarcaps, _hierarcaps_headline),
    "ood": EvaluationKind(OodSpec, _ood, _ood_headline),
}


def with_frozen(
    methods: Methods, parsed: EvaluationSpec, dim: int | None = None
) -> dict[str, Method]:
    """``methods`` plus the frozen model (``clip``: cosine scores, no uncertainty); its width
    that of the methods, else ``dim``, else that of the spec's first tables."""
    if dim is None and methods:
        dim = next(iter(methods.values())).dim
    if dim is None:
        first = next(v for v in dict(parsed).values() if isinstance(v, Location | dict))
        where = next(iter(first.values())) if isinstance(first, dict) else first
        dim = int(tables.check_split(where.root, where.split).dim)
    frozen = METHODS["clip"](dim=dim)
    frozen.adapter_input = "unit"
    return {**methods, "clip": frozen}


def evaluate(parsed: EvaluationSpec, methods: Methods) -> dict[str, Any]:
    """Run the evaluation ``parsed`` (:func:`~.specs.spec`) for ``methods``, on the CPU."""
    kind = parsed.kind  # type: ignore[attr-defined]
    if not methods:
        raise ConfigError(
            f"{kind}: no adapters to evaluate (give a sweep or checkpoints, or the frozen model)"
        )
    return EVALUATIONS[kind].compute(methods, parsed, suite.split_loader())


def evaluate_split(
    parsed: EvaluationSpec | str, method: Method, data: SplitTensors, *, progress: bool = False
) -> dict[str, Any]:
    """The retrieval evaluation ``parsed`` (a spec, or "retrieval" at its defaults) of
    ``method`` on a split already in memory instead of the location the spec names."""
    if isinstance(parsed, str):
        parsed = EVALUATIONS[parsed].spec_model.model_construct()
    return _retrieval_on_split(method, data, parsed, progress)


def headline_metrics(kind: str, result: Mapping[str, Any]) -> dict[str, float]:
    """The numbers of a ``kind`` result that matter, as MLflow metrics: per method (the mean
    over its seeds), direction and set; the rest stays in ``results.json`` (docs/metrics.md)."""
    values: dict[str, list[float]] = defaultdict(list)
    for path, value in EVALUATIONS[kind].headline(result):
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            name = re.sub(r"/seed\d+(?=/)", "", path).replace("@", "_at_")
            values[re.sub(r"[^\w\-./: ]", "_", name)[:250]].append(float(value))
    return {name: sum(v) / len(v) for name, v in values.items()}


def log_evaluation(
    tracking_uri: str,
    experiment: str,
    kind: str,
    result: Mapping[str, Any],
    *,
    params: Mapping[str, Any] | None = None,
    parent: str | None = None,
    name: str | None = None,
) -> str:
    """One MLflow run ``kind=eval-<kind>``: the :func:`headline_metrics` and every number in
    ``results.json``; the report reads it back (:func:`logged_evaluations`)."""
    from asymvlm import tracking

    title = EVALUATIONS[kind].spec_model.title
    with tracking.run(
        tracking_uri,
        experiment,
        name or f"eval {kind}",
        kind=f"eval-{kind}",
        parent=parent,
        params={"kind": kind, **(params or {})},
        description=title[0].upper() + title[1:],
    ) as run:
        run.log_metrics(headline_metrics(kind, result))
        run.log_json("results.json", result)
    return run.id


@dataclass(frozen=True)
class EvaluationResult:
    """One evaluation's result as its MLflow run holds it: the numbers :func:`evaluate` returned
    (``results.json``; adapters named ``method/seed<k>``), the params naming what it evaluated."""

    kind: str
    numbers: dict[str, Any]
    sweep: str = ""  # the sweep whose adapters were evaluated
    note: str = ""
    fine_tuned_on: str = "?"  # zeroshot: the adapters' training data
    embedding_model: str = ""
    template_aggregation: str = "mean"

    @property
    def plumbing_only(self) -> bool:
        """A run checking the wiring only (its note says so): shown, never judged."""
        return "plumbing only" in self.note.lower()


_LOGGED_FIELDS = ("sweep", "note", "fine_tuned_on", "embedding_model", "template_aggregation")


def logged_evaluations(tracking_uri: str, runs: Iterable[Any]) -> dict[str, list[EvaluationResult]]:
    """The finished evaluation runs among ``runs`` (MLflow's), per kind in their order."""
    from asymvlm import tracking

    out: dict[str, list[EvaluationResult]] = defaultdict(list)
    for run in runs:
        tag = run.data.tags.get("kind", "")
        if tag.startswith("eval-") and run.info.status == "FINISHED":
            kind = tag.removeprefix("eval-")
            numbers = tracking.json_artifact(tracking_uri, run.info.run_id, "results.json")
            logged = {k: v for k, v in run.data.params.items() if k in _LOGGED_FIELDS and v}
            out[kind].append(EvaluationResult(kind, numbers, **logged))
    return out
