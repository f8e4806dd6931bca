"""Classification sets of the synthetic world (assumption K of :mod:`asymvlm.synthetic`), in the
table format ``asymvlm embed`` writes for CIFAR-like sets and
:class:`asymvlm.evaluation.suite.ClassificationSet` reads::

    ROOT/manifest.json            dim, model, world (the world's knobs), classification (below)
    ROOT/test/images/*.parquet    image_id, embedding, label (0..n_classes-1)
                                  [, norm: when the world has pre-projection image norms]
    ROOT/test/prompts/*.parquet   class_index (-1: a dummy prompt), class_name, template, text,
                                  embedding, norm

:func:`write_classification_sets` writes, next to a world's retrieval tables ``R``:

* ``R-positives``: images of ``n_classes`` concepts of one level of the fine-tuning domain, with
  their prompts (the CIFAR-10 analogue of Table 2);
* ``R-negatives``: images of the other concepts of that level and domain, with their own prompts
  (the CIFAR-100 analogue: none of the positives' classes);
* ``R-zeroshot`` (a world with two domains, assumption D): every concept of that level in the
  zero-shot domain (the analogue of Table 3's sets a COCO-fine-tuned model is tested on);
* ``R-far-negatives`` (when there are such concepts): images of the concepts of that level under
  the level-0 concepts that hold no positive class, of either domain -- negatives unrelated to
  every positive class, as most of CIFAR-100's classes are to CIFAR-10's. The ``negatives``
  above are mostly *siblings* of the positives (other children of the same level-0 concepts),
  which is the harder test of none-of-the-above (Table 2 reports both).

Every set's prompts end with the dummy prompts (assumption G), as ``asymvlm embed`` writes them.
All draws come from generators of their own (``[seed, 4, ...]``), so writing sets changes no
retrieval table; template directions, dummy prompts and the choice of classes are shared by the
sets of one world.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from asymvlm import tables
from asymvlm.synthetic.world import SyntheticWorld, WorldConfig, _offset, _unit

__all__ = [
    "DUMMY_PROMPTS",
    "TEMPLATES",
    "ClassificationSpec",
    "classification_roles",
    "concept_roots",
    "far_concepts",
    "write_classification_sets",
]

#: The most general captions (assumption G); the same texts as ``asymvlm embed`` uses.
DUMMY_PROMPTS: tuple[str, ...] = ("a photo", "a photo of an object", "a photo of something")
#: Prompt templates of a class ensemble (each adds a direction of its own, assumption K).
TEMPLATES: tuple[str, ...] = (
    "a photo of a {}",
    "a picture of a {}",
    "an image of the {}",
    "a drawing of a {}",
)
_SETS_STREAM = 4
SPLIT = "test"


@dataclass
class ClassificationSpec:
    """Which classification sets to write (:func:`write_classification_sets`)."""

    level: int = 1  # the level whose concepts are the classes
    #: Classes of the positives set (of the fine-tuning domain's concepts at ``level``); None:
    #: half of them (rounded down, at least 1). The rest are the negatives' concepts.
    n_classes: int | None = None
    positives: int = 1000  # images per set
    negatives: int = 1000  # and as many far negatives
    zeroshot: int = 1000
    templates: tuple[str, ...] = TEMPLATES


def class_name(world: SyntheticWorld, level: int, concept: int) -> str:
    """A concept's name, its tag path as in tag captions: ``"c1 / c7"``."""
    path = [concept]
    for lv in range(level, 0, -1):
        path.append(int(world.parents[lv][path[-1]]))
    return " / ".join(f"c{c}" for c in path[::-1])


def domain_concepts(world: SyntheticWorld, level: int, domain: int) -> np.ndarray:
    """Ids of the level-``level`` concepts under the level-0 concepts of ``domain``."""
    if not 0 <= level < len(world.concepts):
        raise ValueError(f"level must be in 0..{len(world.concepts) - 1}, got {level}")
    root = concept_roots(world, level, np.arange(len(world.concepts[level])))
    return np.nonzero(world.root_domain[root] == domain)[0]


def concept_roots(world: SyntheticWorld, level: int, concepts: np.ndarray) -> np.ndarray:
    """The level-0 ancestor of each level-``level`` concept of ``concepts``."""
    root = np.asarray(concepts)
    for lv in range(level, 0, -1):
        root = world.parents[lv][root]
    return root


def far_concepts(world: SyntheticWorld, level: int, positives: np.ndarray) -> np.ndarray:
    """Ids of the level-``level`` concepts under the level-0 concepts that hold none of
    ``positives`` (the far negatives' classes)."""
    every = np.arange(len(world.concepts[level]))
    taken = np.unique(concept_roots(world, level, positives))
    return every[~np.isin(concept_roots(world, level, every), taken)]


def _leaf_ancestor(world: SyntheticWorld, level: int) -> np.ndarray:
    """The level-``level`` ancestor of every leaf concept."""
    return world.ancestors(np.arange(len(world.concepts[-1])))[level]


def _prompt_rows(
    world: SyntheticWorld,
    rng: np.random.Generator,
    concepts: np.ndarray,
    level: int,
    template_dirs: np.ndarray,
    templates: tuple[str, ...],
    domain: int | np.ndarray,
) -> dict[str, list]:
    """Class prompts: concept x template, ``true = unit(c + caption_noise * unit(tau_t +
    unit(eps)))``, encoded by the frozen text encoder of ``domain`` (one for all concepts, or
    one per concept)."""
    cfg = world.config
    cls = np.repeat(np.arange(len(concepts)), len(templates))
    tmpl = np.tile(np.arange(len(templates)), len(concepts))
    eps = _unit(rng.standard_normal((len(cls), cfg.dim)))
    direction = _unit(template_dirs[tmpl] + eps)
    true = _unit(world.concepts[level][concepts[cls]] + cfg.caption_noise * direction)
    names = [class_name(world, level, int(c)) for c in concepts]
    return {
        "class_index": cls.tolist(),
        "class_name": [names[c] for c in cls],
        "template": [templates[t] for t in tmpl],
        "text": [templates[t].format(names[c]) for c, t in zip(cls, tmpl, strict=True)],
        "embedding": list(world.encode_text(true, _per_row(domain, cls))),
        "norm": (cfg.norm_mean * np.exp(cfg.norm_log_sd * rng.standard_normal(len(cls)))).tolist(),
    }


def _per_row(domain: int | np.ndarray, cls: np.ndarray) -> int | np.ndarray:
    """One domain for every prompt (as given), or each prompt's concept's."""
    return domain if np.ndim(domain) == 0 else np.asarray(domain)[cls]


def _dummy_rows(world: SyntheticWorld, rng: np.random.Generator) -> dict[str, list]:
    """The dummy prompts: the hierarchy's root with paraphrase noise, shared encoder error only."""
    cfg = world.config
    n = len(DUMMY_PROMPTS)
    true = _offset(rng, np.repeat(world.generic[None], n, axis=0), cfg.caption_noise)
    return {
        "class_index": [-1] * n,
        "class_name": [""] * n,
        "template": [""] * n,
        "text": list(DUMMY_PROMPTS),
        "embedding": list(world.encode_text(true, -1)),
        "norm": (cfg.norm_mean * np.exp(cfg.norm_log_sd * rng.standard_normal(n))).tolist(),
    }


def _prompts_table(rows: list[dict[str, list]], dim: int) -> pa.Table:
    merged = {k: [x for r in rows for x in r[k]] for k in rows[0]}
    emb = np.asarray(merged.pop("embedding"), dtype=np.float32).reshape(-1, dim)
    return pa.table(
        {
            "class_index": pa.array(merged["class_index"], pa.int64()),
            "class_name": pa.array(merged["class_name"], pa.string()),
            "template": pa.array(merged["template"], pa.string()),
            "text": pa.array(merged["text"], pa.string()),
            "embedding": pa.FixedSizeListArray.from_arrays(pa.array(emb.reshape(-1)), dim),
            "norm": pa.array(np.asarray(merged["norm"], dtype=np.float32), pa.float32()),
        }
    )


def _write_set(
    root: str,
    world: SyntheticWorld,
    role: str,
    concepts: np.ndarray,
    level: int,
    domain: int | np.ndarray,
    n_images: int,
    shared: dict,
    stream: int,
    spec: ClassificationSpec,
) -> str:
    cfg = world.config
    if n_images < 1:
        raise ValueError(f"{role}: needs at least one image, got {n_images}")
    rng = np.random.default_rng([cfg.seed, _SETS_STREAM, stream])
    ancestor = _leaf_ancestor(world, level)
    leaves = np.nonzero(np.isin(ancestor, concepts))[0]
    leaf = leaves[rng.integers(0, len(leaves), n_images)]
    _, images = world.draw_views(rng, leaf)
    labels = np.searchsorted(concepts, ancestor[leaf])  # concepts are sorted
    prompts = _prompt_rows(
        world, rng, concepts, level, shared["template_dirs"], spec.templates, domain
    )
    image_cols = {
        "image_id": pa.array([f"{role}-img{i:06d}" for i in range(n_images)], pa.string()),
        "embedding": pa.FixedSizeListArray.from_arrays(
            pa.array(images.astype(np.float32).reshape(-1)), cfg.dim
        ),
        "label": pa.array(labels.astype(np.int64), pa.int64()),
    }
    if cfg.pre_dim is not None:
        norms = cfg.norm_mean * np.exp(cfg.norm_log_sd * rng.standard_normal(n_images))
        image_cols["norm"] = pa.array(norms.astype(np.float32), pa.float32())
    tables.write_manifest(
        root,
        {
            "dim": cfg.dim,
            "model": "synthetic-world",
            "dtype": "float32",
            "description": f"asymvlm.synthetic classification set ({role})",
            "world": cfg.manifest_world(),
            "classification": {
                "role": role,
                "level": level,
                "domain": np.asarray(domain).tolist(),
                "concepts": concepts.tolist(),
            },
        },
    )
    tables.write_part(root, SPLIT, tables.IMAGES_DIR, "part-00000", pa.table(image_cols))
    tables.write_part(
        root, SPLIT, "prompts", "part-00000", _prompts_table([prompts, shared["dummy"]], cfg.dim)
    )
    return root


def _selection(
    world: SyntheticWorld, spec: ClassificationSpec
) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """``(the fine-tuning domain's concepts of the level, the positive classes among them,
    what every set shares: template directions and dummy rows)``."""
    level, config = spec.level, world.config
    home = domain_concepts(world, level, 0)
    n_classes = spec.n_classes if spec.n_classes is not None else max(1, len(home) // 2)
    if not 1 <= n_classes < len(home):
        raise ValueError(
            f"n_classes must be in 1..{len(home) - 1} (the fine-tuning domain has {len(home)} "
            f"level-{level} concepts; the rest are the negatives'), got {n_classes}"
        )
    shared_rng = np.random.default_rng([config.seed, _SETS_STREAM, 0])
    template_dirs = _unit(shared_rng.standard_normal((len(spec.templates), config.dim)))
    shared = {"template_dirs": template_dirs, "dummy": _dummy_rows(world, shared_rng)}
    return home, np.sort(shared_rng.permutation(home)[:n_classes]), shared


def classification_roles(config: WorldConfig, spec: ClassificationSpec) -> tuple[str, ...]:
    """The sets :func:`write_classification_sets` writes for this world and spec, by role
    (``positives``, ``negatives``, then ``zeroshot`` and ``far-negatives`` where the world has
    such concepts), without writing anything."""
    world = SyntheticWorld(config)
    _, chosen, _ = _selection(world, spec)
    roles = ["positives", "negatives"]
    if len(domain_concepts(world, spec.level, 1)):
        roles.append("zeroshot")
    if len(far_concepts(world, spec.level, chosen)):
        roles.append("far-negatives")
    return tuple(roles)


def write_classification_sets(
    root: str, config: WorldConfig | None = None, spec: ClassificationSpec | None = None
) -> dict[str, str]:
    """Write the positives, negatives, (two domains) zero-shot and (where there are such
    concepts) far-negatives sets next to the world's tables at ``root`` (module docstring);
    returns role -> table root (split ``test``).

    ``config`` defaults to the world recorded in ``ROOT/manifest.json``.
    """
    config = config or WorldConfig.from_manifest(root)
    spec = spec or ClassificationSpec()
    world = SyntheticWorld(config)
    level = spec.level
    home, chosen, shared = _selection(world, spec)
    others = np.setdiff1d(home, chosen)
    base = root.rstrip("/")
    out = {
        "positives": _write_set(
            f"{base}-positives",
            world,
            "positives",
            chosen,
            level,
            0,
            spec.positives,
            shared,
            1,
            spec,
        ),
        "negatives": _write_set(
            f"{base}-negatives",
            world,
            "negatives",
            others,
            level,
            0,
            spec.negatives,
            shared,
            2,
            spec,
        ),
    }
    away = domain_concepts(world, level, 1)
    if len(away):
        out["zeroshot"] = _write_set(
            f"{base}-zeroshot", world, "zeroshot", away, level, 1, spec.zeroshot, shared, 3, spec
        )
    far = far_concepts(world, level, chosen)
    if len(far):
        far_domain = world.root_domain[concept_roots(world, level, far)]
        out["far-negatives"] = _write_set(
            f"{base}-far-negatives",
            world,
            "far-negatives",
            far,
            level,
            far_domain,
            spec.negatives,
            shared,
            4,
            spec,
        )
    return out
