"""The paper's evaluations on embedding tables for trained methods (name -> :class:`Method`,
e.g. "asymvlm-vmf/seed1"), each returning plain dicts; named by :mod:`.registry`."""

from __future__ import annotations

from collections.abc import Callable, Mapping
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
    "load_classification",
    "split_loader",
]

#: ``load(location, adapter_input)``: a split in memory.
SplitLoader = Callable[[Location, str], SplitTensors]


def split_loader(device: str | torch.device = "cpu") -> SplitLoader:
    """A :data:`SplitLoader` onto ``device`` that reads each (location, adapter input) once."""
    cache = SplitCache(max_entries=16)
    return lambda where, adapter_input="raw": cache.load(
        where.root, where.split, adapter_input, torch.device(device)
    )


class ClassificationSet:
    """A classification split from the tables: images with labels, class and dummy prompts."""

    def __init__(self, root: str, split: str) -> None:
        self.root, self.split = root, split
        images = tables.read_parts(root, split, tables.IMAGES_DIR)
        prompts = tables.read_parts(root, split, "prompts")
        if images is None or prompts is None or "label" not in images.column_names:
            if images is None:  # a bad root or split: said as every command says it
                tables.check_split(root, split)
            raise tables.TableError(
                f"{root}/{split}: not a classification split (needs images with 'label' and "
                "prompts/ -- embed CIFAR/STL/ImageNet with `asymvlm embed`)"
            )
        self.image_emb = torch.tensor(tables.column_matrix(images.column("embedding")))
        norm = images.column("norm") if "norm" in images.column_names else None
        self.image_norm = None if norm is None else torch.as_tensor(np.asarray(norm, np.float32))
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

    def images_for(self, method: Method) -> torch.Tensor:
        return method.image_rows(self.image_emb, self.image_norm)

    def info(self) -> dict[str, Any]:
        """The set's name, and for a synthetic one its role and ``world`` knobs."""
        out: dict[str, Any] = {"name": self.root.rstrip("/").rsplit("/", 1)[-1]}
        try:
            extra = tables.read_manifest(self.root).extra
        except tables.TableError:  # tables written without a manifest: the name only
            return out
        if role := (extra.get("classification") or {}).get("role"):
            out["role"] = role
        if isinstance(extra.get("world"), dict):
            out["world"] = extra["world"]
        return out


load_classification = ClassificationSet


def adapter_input(method: Method) -> str:
    """What ``method`` reads from the tables (set from its checkpoint when it was loaded)."""
    return getattr(method, "adapter_input", "raw")


def evaluate_zero_shot(
    methods: Mapping[str, Method], sets: Mapping[str, Location], how: str | None = "mean"
) -> dict[str, dict[str, float]]:
    """Table 3: method -> evaluation set -> zero-shot accuracy."""
    loaded = {name: ClassificationSet(*where) for name, where in sets.items()}
    return {
        name: {
            s: zero_shot_accuracy(
                m, data.images_for(m), data.labels, data.class_prompts(adapter_input(m)), how
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
    how: str | None = "mean",
) -> dict[str, Any]:
    """Table 2: per dummy prompt and method :func:`none_of_the_above`, the frozen model's
    :func:`rejection_baselines` and the ``settings`` (aggregation, sets)."""
    how = how or "mean"
    pos, neg = ClassificationSet(*positives), ClassificationSet(*negatives)
    far = ClassificationSet(*far_negatives) if far_negatives else None
    settings = {"template_aggregation": how, "positives": pos.info(), "negatives": neg.info()}
    if far is not None:
        settings["far_negatives"] = far.info()
    out: dict[str, Any] = {"dummy": {}, "rejection": {}, "settings": settings}
    for name, m in methods.items():
        each = none_of_the_above(
            m,
            pos.images_for(m),
            pos.labels,
            neg.images_for(m),
            pos.class_prompts(adapter_input(m)),
            pos.dummy_inputs(adapter_input(m)),
            far_negatives=None if far is None else far.images_for(m),
            aggregation=how,
        )
        for text, cell in each.items():
            out["dummy"].setdefault(text, {})[name] = cell
    out["rejection"] = rejection_baselines(
        build_method("clip", pos.image_emb.shape[1]),
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
    load = load or split_loader()
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
    load = load or split_loader()
    return {
        name: {
            spec: ood_retrieval(
                m,
                load(clean, adapter_input(m)),
                load(where, adapter_input(m)),
                image=spec.split(":")[0] in IMAGE_PERTURBATIONS,
            )
            for spec, where in perturbed.items()
        }
        for name, m in methods.items()
    }
