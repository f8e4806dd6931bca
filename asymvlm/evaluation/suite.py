"""The paper's evaluations on embedding tables for trained methods (name -> :class:`Method`,
e.g. "asymvlm-vmf/seed1"), each returning plain dicts; named by
:mod:`asymvlm.evaluation.registry`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from asymvlm import tables
from asymvlm.data.perturb import IMAGE_PERTURBATIONS
from asymvlm.evaluation.hierarcaps import hierarchy_analysis
from asymvlm.evaluation.ood import ood_retrieval
from asymvlm.evaluation.zeroshot import (
    ClassPrompts,
    none_of_the_above,
    rejection_baselines,
    zero_shot_accuracy,
)
from asymvlm.methods import Method, build_method
from asymvlm.splits import SplitCache, SplitTensors
from asymvlm.tables import Location

__all__ = [
    "ClassificationSet",
    "SplitLoader",
    "adapter_input",
    "evaluate_hierarcaps",
    "evaluate_none_of_the_above",
    "evaluate_ood",
    "evaluate_zero_shot",
    "hierarchy_analysis",
    "load_classification",
]


class SplitLoader:
    """``loader(location, adapter_input)``: a split on ``device``, read once per (location,
    adapter input)."""

    def __init__(self, device: str | torch.device = "cpu", cache: SplitCache | None = None):
        self.device = torch.device(device)
        self.cache = cache or SplitCache(max_entries=16)

    def __call__(self, where: Location, adapter_input: str = "raw") -> SplitTensors:
        return self.cache.load(where.root, where.split, adapter_input, self.device)


class ClassificationSet:
    """A classification split from the tables: images with labels, class and dummy prompts."""

    def __init__(self, root: str, split: str) -> None:
        self.root, self.split = root, split
        images = tables.read_parts(root, split, tables.IMAGES_DIR)
        prompts = tables.read_parts(root, split, "prompts")
        if images is None or prompts is None or "label" not in images.column_names:
            raise tables.TableError(
                f"{root}/{split}: not a classification split (needs images with 'label' and "
                "prompts/ -- embed CIFAR/STL/ImageNet with `asymvlm embed`)"
            )
        self.image_emb = torch.tensor(tables.column_matrix(images.column("embedding")))
        self.image_norm = (
            torch.as_tensor(np.asarray(images.column("norm").to_pylist(), dtype=np.float32))
            if "norm" in images.column_names
            else None
        )
        self.labels = torch.as_tensor(np.asarray(images.column("label").to_pylist()))
        self.prompt_class = np.asarray(prompts.column("class_index").to_pylist())
        self.prompt_text = prompts.column("text").to_pylist()
        self._unit = tables.column_matrix(prompts.column("embedding"))
        self._norm = np.asarray(prompts.column("norm").to_pylist(), dtype=np.float32)

    def prompt_inputs(self, adapter_input: str) -> torch.Tensor:
        x = self._unit * self._norm[:, None] if adapter_input == "raw" else self._unit
        return torch.as_tensor(x, dtype=torch.float32)

    def class_prompts(self, adapter_input: str) -> ClassPrompts:
        rows = self.prompt_class >= 0
        return ClassPrompts(
            inputs=self.prompt_inputs(adapter_input)[torch.as_tensor(rows)],
            class_index=torch.as_tensor(self.prompt_class[rows]),
            n_classes=int(self.prompt_class.max()) + 1,
        )

    def dummy_inputs(self, adapter_input: str) -> dict[str, torch.Tensor]:
        inputs = self.prompt_inputs(adapter_input)
        return {
            t: inputs[i : i + 1] for i, t in enumerate(self.prompt_text) if self.prompt_class[i] < 0
        }


load_classification = ClassificationSet


def adapter_input(method: Method, default: str = "raw") -> str:
    """What ``method`` reads from the tables (set from its checkpoint when it was loaded)."""
    return getattr(method, "adapter_input", default)


def set_info(root: str) -> dict[str, Any]:
    """A classification set's name, and for a synthetic one its role and ``world`` knobs."""
    info: dict[str, Any] = {"name": root.rstrip("/").rsplit("/", 1)[-1]}
    try:
        extra = tables.read_manifest(root).extra
    except tables.TableError:  # tables written without a manifest: the name only
        return info
    role = (extra.get("classification") or {}).get("role")
    if role:
        info["role"] = role
    if isinstance(extra.get("world"), dict):
        info["world"] = extra["world"]
    return info


# -- evaluations --------------------------------------------------------------------------------
def evaluate_zero_shot(
    methods: Mapping[str, Method],
    sets: Mapping[str, Location],
    template_aggregation: str | None = "mean",
) -> dict[str, dict[str, float]]:
    """Table 3: method -> evaluation set -> zero-shot accuracy."""
    how = template_aggregation or "mean"
    loaded = {name: load_classification(*where) for name, where in sets.items()}
    return {
        name: {
            s: zero_shot_accuracy(
                m,
                m.image_rows(data.image_emb, data.image_norm),
                data.labels,
                data.class_prompts(adapter_input(m)),
                aggregation=how,
            )
            for s, data in loaded.items()
        }
        for name, m in methods.items()
    }


def evaluate_none_of_the_above(
    methods: Mapping[str, Method],
    positives: Location,
    negatives: Location,
    far_negatives: Location | None = None,
    template_aggregation: str | None = "mean",
) -> dict[str, Any]:
    """Table 2: per dummy prompt and method :func:`none_of_the_above`, the frozen model's
    :func:`rejection_baselines` and the ``settings`` (aggregation, sets)."""
    how = template_aggregation or "mean"
    pos, neg = load_classification(*positives), load_classification(*negatives)
    far = load_classification(*far_negatives) if far_negatives else None
    settings: dict[str, Any] = {
        "template_aggregation": how,
        "positives": set_info(pos.root),
        "negatives": set_info(neg.root),
    }
    if far is not None:
        settings["far_negatives"] = set_info(far.root)
    out: dict[str, Any] = {"dummy": {}, "rejection": {}, "settings": settings}
    for name, m in methods.items():
        ai = adapter_input(m)
        prompts = pos.class_prompts(ai)
        far_rows = None if far is None else m.image_rows(far.image_emb, far.image_norm)
        each = none_of_the_above(
            m,
            m.image_rows(pos.image_emb, pos.image_norm),
            pos.labels,
            m.image_rows(neg.image_emb, neg.image_norm),
            prompts,
            pos.dummy_inputs(ai),
            far_negatives=far_rows,
            aggregation=how,
        )
        for text, cell in each.items():
            out["dummy"].setdefault(text, {})[name] = cell
    frozen = build_method("clip", pos.image_emb.shape[1])
    out["rejection"] = rejection_baselines(
        frozen,
        pos.image_emb,
        pos.labels,
        neg.image_emb,
        pos.class_prompts("unit"),
        far_negatives=None if far is None else far.image_emb,
    )
    return out


def evaluate_hierarcaps(
    methods: Mapping[str, Method], where: Location, load: SplitLoader | None = None
) -> dict[str, Any]:
    """Fig. 5: :func:`hierarchy_analysis` per method."""
    load = load or SplitLoader()
    return {
        name: hierarchy_analysis(m, load(where, adapter_input(m))) for name, m in methods.items()
    }


def evaluate_ood(
    methods: Mapping[str, Method],
    clean: Location,
    perturbed: Mapping[str, Location],
    load: SplitLoader | None = None,
) -> dict[str, Any]:
    """Retrieval under perturbation: ``perturbed`` maps "kind:severity" to a perturbed copy."""
    load, out = load or SplitLoader(), {}
    for name, m in methods.items():
        ai = adapter_input(m)
        base = load(clean, ai)
        per: dict[str, Any] = {}
        for spec, where in perturbed.items():
            other = load(where, ai)
            image_kind = spec.split(":")[0] in IMAGE_PERTURBATIONS
            res = ood_retrieval(
                m,
                base,
                image_ood=other if image_kind else None,
                text_ood=None if image_kind else other,
            )
            case = "image_ood" if image_kind else "text_ood"
            per[spec] = {
                "clean_t2i_recall_at_1": res["cases"]["clean"]["t2i"]["recall@1"],
                "clean_i2t_recall_at_1": res["cases"]["clean"]["i2t"]["recall@1"],
                "t2i_recall_at_1": res["cases"][case]["t2i"]["recall@1"],
                "i2t_recall_at_1": res["cases"][case]["i2t"]["recall@1"],
                **res[f"mmi_{case}"],
                "uncertainty_auroc": res.get("uncertainty_auroc"),
            }
        out[name] = per
    return out
