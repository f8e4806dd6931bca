"""Classification sets of the synthetic world (assumption K; layout and roles in
docs/synthetic.md): positives, negatives, zero-shot and far negatives next to a world's tables."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from asymvlm import tables
from asymvlm.data.templates import DUMMY_PROMPTS
from asymvlm.errors import ConfigError
from asymvlm.synthetic.world import SyntheticWorld, WorldConfig, _offset, _unit

#: Prompt templates of a class ensemble (each adds a direction of its own, assumption K).
TEMPLATES = ("a photo of a {}", "a picture of a {}", "an image of the {}", "a drawing of a {}")
_SETS_STREAM = 4
SPLIT = "test"


@dataclass
class ClassificationSpec:
    """Which classification sets to write (:func:`write_classification_sets`)."""

    level: int = 1  # the level whose concepts are the classes
    #: Classes of the positives (fine-tuning domain's concepts at ``level``); None: half of them
    #: (at least 1). The rest are the negatives' concepts.
    n_classes: int | None = None
    positives: int = 1000  # images per set
    negatives: int = 1000  # and as many far negatives
    zeroshot: int = 1000
    templates: tuple[str, ...] = TEMPLATES


def class_name(world: SyntheticWorld, level: int, concept: int) -> str:
    """A concept's name, its tag path as in tag captions: ``"c1 / c7"``."""
    return " / ".join(f"c{c}" for c in world.ancestors(concept, level))


def concept_roots(world: SyntheticWorld, level: int, concepts: np.ndarray) -> np.ndarray:
    """The level-0 ancestor of each level-``level`` concept of ``concepts``."""
    return world.ancestors(np.asarray(concepts), level)[0]


def domain_concepts(world: SyntheticWorld, level: int, domain: int) -> np.ndarray:
    """Ids of the level-``level`` concepts under the level-0 concepts of ``domain``."""
    if not 0 <= level < len(world.concepts):
        raise ConfigError(f"level must be in 0..{len(world.concepts) - 1}, got {level}")
    root = concept_roots(world, level, np.arange(len(world.concepts[level])))
    return np.nonzero(world.root_domain[root] == domain)[0]


def _norms(world: SyntheticWorld, rng: np.random.Generator, n: int) -> np.ndarray:
    cfg = world.config
    return (cfg.norm_mean * np.exp(cfg.norm_log_sd * rng.standard_normal(n))).astype(np.float32)


def _prompts(
    world: SyntheticWorld,
    rng: np.random.Generator,
    concepts: np.ndarray,
    level: int,
    template_dirs: np.ndarray,
    templates: tuple[str, ...],
    domain: int | np.ndarray,
) -> dict[str, list]:
    """Class prompts, concept x template: ``unit(c + caption_noise * unit(tau_t + unit(eps)))``
    through the frozen text encoder of ``domain`` (one for all concepts, or one per concept)."""
    cfg = world.config
    cls = np.repeat(np.arange(len(concepts)), len(templates))
    tmpl = np.tile(np.arange(len(templates)), len(concepts))
    eps = _unit(rng.standard_normal((len(cls), cfg.dim)))
    true = _unit(
        world.concepts[level][concepts[cls]] + cfg.caption_noise * _unit(template_dirs[tmpl] + eps)
    )
    names = [class_name(world, level, int(c)) for c in concepts]
    return {
        "class_index": cls.tolist(),
        "class_name": [names[c] for c in cls],
        "template": [templates[t] for t in tmpl],
        "text": [templates[t].format(names[c]) for c, t in zip(cls, tmpl, strict=True)],
        "embedding": list(world.encode_text(true, domain if np.ndim(domain) == 0 else domain[cls])),
        "norm": list(_norms(world, rng, len(cls))),
    }


def _dummies(world: SyntheticWorld, rng: np.random.Generator) -> dict[str, list]:
    """The dummy prompts: the hierarchy's root with paraphrase noise, shared encoder error only."""
    n = len(DUMMY_PROMPTS)
    true = _offset(rng, np.repeat(world.generic[None], n, axis=0), world.config.caption_noise)
    return {
        "class_index": [-1] * n,
        "class_name": [""] * n,
        "template": [""] * n,
        "text": list(DUMMY_PROMPTS),
        "embedding": list(world.encode_text(true, -1)),
        "norm": list(_norms(world, rng, n)),
    }


def _table(columns: dict[str, list | np.ndarray], dim: int) -> pa.Table:
    """Integer, string and ``norm`` (float32) columns, and the embedding as fixed-size lists."""

    def array(name: str, values: list | np.ndarray) -> pa.Array:
        if name == "embedding":
            flat = pa.array(np.asarray(values, dtype=np.float32).reshape(-1))
            return pa.FixedSizeListArray.from_arrays(flat, dim)
        return pa.array(np.asarray(values, np.float32) if name == "norm" else values)

    return pa.table({k: array(k, v) for k, v in columns.items()})


def _write_set(
    root: str,
    world: SyntheticWorld,
    role: str,
    concepts: np.ndarray,
    domain: int | np.ndarray,
    n_images: int,
    stream: int,
    shared: tuple[np.ndarray, dict[str, list]],
    spec: ClassificationSpec,
) -> str:
    """One set: ``n_images`` images of objects under ``concepts`` and their class prompts (then
    the dummy prompts), drawn from ``[seed, 4, stream]``."""
    cfg, level = world.config, spec.level
    if n_images < 1:
        raise ConfigError(f"{role}: needs at least one image, got {n_images}")
    rng = np.random.default_rng([cfg.seed, _SETS_STREAM, stream])
    ancestor = world.ancestors(np.arange(len(world.concepts[-1])))[level]
    leaves = np.nonzero(np.isin(ancestor, concepts))[0]
    leaf = leaves[rng.integers(0, len(leaves), n_images)]
    _, images = world.draw_views(rng, leaf)
    template_dirs, dummies = shared
    prompts = _prompts(world, rng, concepts, level, template_dirs, spec.templates, domain)
    image_cols = {
        "image_id": [f"{role}-img{i:06d}" for i in range(n_images)],
        "embedding": images,
        "label": np.searchsorted(concepts, ancestor[leaf]).astype(np.int64),
    }
    if cfg.pre_dim is not None:
        image_cols["norm"] = _norms(world, rng, n_images)
    classification = {"role": role, "level": level, "domain": np.asarray(domain).tolist()}
    manifest = {
        "dim": cfg.dim,
        "model": "synthetic-world",
        "dtype": "float32",
        "description": f"asymvlm.synthetic classification set ({role})",
        "world": cfg.manifest_world(),
        "classification": {**classification, "concepts": concepts.tolist()},
    }
    tables.write_manifest(root, manifest)
    tables.write_part(root, SPLIT, tables.IMAGES_DIR, "part-00000", _table(image_cols, cfg.dim))
    rows = {k: prompts[k] + dummies[k] for k in prompts}
    tables.write_part(root, SPLIT, "prompts", "part-00000", _table(rows, cfg.dim))
    return root


def _sets(world: SyntheticWorld, spec: ClassificationSpec):
    """``{role: (concepts, domain, images, stream)}`` of the sets this world and spec have, and
    what they share (template directions and dummy rows)."""
    level, home = spec.level, domain_concepts(world, spec.level, 0)
    n_classes = spec.n_classes if spec.n_classes is not None else max(1, len(home) // 2)
    if not 1 <= n_classes < len(home):
        raise ConfigError(
            f"n_classes must be in 1..{len(home) - 1} (the fine-tuning domain has {len(home)} "
            f"level-{spec.level} concepts; the rest are the negatives'), got {n_classes}"
        )
    rng = np.random.default_rng([world.config.seed, _SETS_STREAM, 0])
    template_dirs = _unit(rng.standard_normal((len(spec.templates), world.config.dim)))
    shared = (template_dirs, _dummies(world, rng))
    chosen = np.sort(rng.permutation(home)[:n_classes])
    sets = {
        "positives": (chosen, 0, spec.positives, 1),
        "negatives": (np.setdiff1d(home, chosen), 0, spec.negatives, 2),
    }
    away = domain_concepts(world, level, 1)
    if len(away):
        sets["zeroshot"] = (away, 1, spec.zeroshot, 3)
    roots = concept_roots(world, level, np.arange(len(world.concepts[level])))
    far = np.flatnonzero(~np.isin(roots, roots[chosen]))  # under roots that hold no positive
    if len(far):
        sets["far-negatives"] = (far, world.root_domain[roots[far]], spec.negatives, 4)
    return sets, shared


def classification_roles(config: WorldConfig, spec: ClassificationSpec) -> tuple[str, ...]:
    """The roles of the sets :func:`write_classification_sets` writes (``positives``,
    ``negatives``, then ``zeroshot`` and ``far-negatives`` where the world has such concepts)."""
    return tuple(_sets(SyntheticWorld(config), spec)[0])


def write_classification_sets(
    root: str, config: WorldConfig | None = None, spec: ClassificationSpec | None = None
) -> dict[str, str]:
    """Write the classification sets next to the world's tables at ``root`` (``ROOT-<role>``,
    split ``test``; ``config``: default the world of ``ROOT/manifest.json``); role -> root."""
    world = SyntheticWorld(config or WorldConfig.from_manifest(root))
    spec = spec or ClassificationSpec()
    sets, shared = _sets(world, spec)
    base = root.rstrip("/")
    return {
        role: _write_set(f"{base}-{role}", world, role, *args, shared, spec)
        for role, args in sets.items()
    }
