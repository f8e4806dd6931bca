"""A toy world with known, asymmetric uncertainty, written as an embedding table.

The world follows Sec. 3 of the paper. A concept hierarchy lives on S^{d-1}: a few abstract
concepts (level 0), each with children (level 1), grandchildren (level 2); every image shows
one specific *object*, a point near a level-2 concept, seen with a little view noise (images:
one-to-one with objects). A caption describes its image's object at a random abstraction level:
level 0-2 captions point at the object's ancestor concept, level 3 captions at the object
itself -- so an abstract caption matches many images (high aleatoric uncertainty), a detailed one
few. Levels are stored like HierarCaps (0 = most general, 3 = most detailed).

The frozen "VLM" is imperfect in the way a frozen model is on a new domain: its text encoder
is misaligned with its image encoder by a fixed rotation, which an adapter can learn to undo,
and it reports a raw text-projection norm (column ``norm``) that carries no information.

With ``pre_dim`` set, the world also has what ``asymvlm embed --pre-projection`` writes for a
real CLIP (for BayesVLM, :mod:`asymvlm.methods.bayesvlm`): each modality's encoder ends in a
random linear projection ``W`` [dim, pre_dim] with orthonormal rows, and an item's
pre-projection feature is ``phi = W^T (norm * embedding) + n``, where ``n`` is an isotropic
nuisance in the null space of ``W`` (scale ``pre_noise`` relative to the raw norm), so that
``W phi`` is exactly the raw projection ``norm * embedding``. Images get a raw norm too
(uninformative, like the captions'). These draws come from generators of their own: every
other output is bit-identical with and without ``pre_dim``.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import asdict, dataclass, field

import numpy as np

from asymvlm import tables


@dataclass
class WorldConfig:
    """Knobs of the toy world (defaults: a small world that trains in seconds on a CPU)."""

    dim: int = 64
    branching: tuple[int, int, int] = (6, 4, 4)  # concepts per parent at levels 0, 1, 2
    spread: tuple[float, float, float] = (1.0, 0.7, 0.5)  # child offset scale at levels 0..2
    object_spread: float = 0.45  # object around its level-2 concept
    image_noise: float = 0.08  # view noise of the image encoder
    caption_noise: float = 0.12  # paraphrase noise of a caption
    misalignment: float = 1.0  # rotation angle (rad) of the text encoder, in dim/2 planes
    norm_mean: float = 8.0  # raw text-projection norm (uninformative, log-normal)
    norm_log_sd: float = 0.1
    captions_per_image: int = 5
    splits: dict[str, int] = field(
        default_factory=lambda: {"train": 8000, "val": 1000, "test": 1000}
    )
    seed: int = 0
    #: Width of the pre-projection features (None: no pre-projection columns); > dim.
    pre_dim: int | None = None
    pre_noise: float = 0.5  # null-space nuisance of a pre-projection feature, per unit norm


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _offset(rng: np.random.Generator, centers: np.ndarray, scale: float) -> np.ndarray:
    """Points around ``centers`` at angle ~atan(scale): normalise(c + scale * random unit)."""
    return _unit(centers + scale * _unit(rng.standard_normal(centers.shape)))


def _orthonormal_rows(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    """[rows, cols] with orthonormal rows (rows <= cols), uniformly distributed."""
    q, r = np.linalg.qr(rng.standard_normal((cols, rows)))
    return (q * np.sign(np.diag(r))).T


def _rotation(rng: np.random.Generator, dim: int, angle: float) -> np.ndarray:
    """An orthogonal map rotating every vector by ``angle`` in dim/2 random orthogonal planes."""
    basis, _ = np.linalg.qr(rng.standard_normal((dim, dim)))
    block = np.eye(dim)
    c, s = math.cos(angle), math.sin(angle)
    for i in range(0, dim - 1, 2):
        block[i : i + 2, i : i + 2] = [[c, -s], [s, c]]
    return basis @ block @ basis.T


class SyntheticWorld:
    """The generative process; ``write(root)`` stores every split as an embedding table."""

    def __init__(self, config: WorldConfig | None = None) -> None:
        self.config = cfg = config or WorldConfig()
        rng = np.random.default_rng(cfg.seed)
        self.concepts: list[np.ndarray] = []  # per level: [n_concepts, dim]
        self.parents: list[np.ndarray] = []  # per level: parent index in the level above
        centers = _unit(rng.standard_normal((cfg.branching[0], cfg.dim)))
        self.concepts.append(centers)
        self.parents.append(np.zeros(cfg.branching[0], dtype=np.int64))
        for level in range(1, len(cfg.branching)):
            parent = np.repeat(np.arange(len(self.concepts[-1])), cfg.branching[level])
            self.concepts.append(_offset(rng, self.concepts[-1][parent], cfg.spread[level]))
            self.parents.append(parent)
        self.text_rotation = _rotation(rng, cfg.dim, cfg.misalignment)
        self._split_seeds = {
            name: int(s)
            for name, s in zip(cfg.splits, rng.integers(0, 2**31, len(cfg.splits)), strict=True)
        }
        self.projections: dict[str, np.ndarray] = {}
        if cfg.pre_dim is not None:
            if cfg.pre_dim <= cfg.dim:
                raise ValueError(f"pre_dim must exceed dim {cfg.dim}, got {cfg.pre_dim}")
            pre_rng = np.random.default_rng([cfg.seed, 1])  # not the world's stream
            self.projections = {
                kind: _orthonormal_rows(pre_rng, cfg.dim, cfg.pre_dim) for kind in ("image", "text")
            }

    @property
    def n_levels(self) -> int:
        return len(self.config.branching) + 1

    def ancestors(self, leaf: np.ndarray) -> list[np.ndarray]:
        """Concept index at every concept level (0..L-1) for level-(L-1) concept ids."""
        path = [leaf]
        for level in range(len(self.concepts) - 1, 0, -1):
            path.append(self.parents[level][path[-1]])
        return path[::-1]

    def sample_split(self, name: str, n_images: int) -> dict:
        """Draw images, objects and captions for one split (deterministic per split name)."""
        cfg = self.config
        rng = np.random.default_rng(self._split_seeds[name])
        leaves = rng.integers(0, len(self.concepts[-1]), n_images)
        objects = _offset(rng, self.concepts[-1][leaves], cfg.object_spread)
        images = _offset(rng, objects, cfg.image_noise)
        path = self.ancestors(leaves)

        n_cap = cfg.captions_per_image
        cap_image = np.repeat(np.arange(n_images), n_cap)
        levels = rng.integers(0, self.n_levels, n_images * n_cap)
        targets = np.empty((len(cap_image), cfg.dim))
        for level in range(self.n_levels):
            rows = levels == level
            if level < len(self.concepts):
                targets[rows] = self.concepts[level][path[level][cap_image[rows]]]
            else:
                targets[rows] = objects[cap_image[rows]]
        true_text = _offset(rng, targets, cfg.caption_noise)
        text = _unit(true_text @ self.text_rotation.T)  # the frozen text encoder's error
        norms = cfg.norm_mean * np.exp(cfg.norm_log_sd * rng.standard_normal(len(text)))

        image_ids = [f"{name}-img{i:06d}" for i in range(n_images)]
        caption_ids = [f"{image_ids[i]}-c{j}" for i in range(n_images) for j in range(n_cap)]
        names = []
        for i, level in zip(cap_image, levels, strict=True):
            tags = [f"c{path[k][i]}" for k in range(min(level + 1, len(self.concepts)))]
            if level == len(self.concepts):
                tags.append(f"object {i}")
            names.append("a photo of " + " / ".join(tags))
        out = {
            "image_ids": image_ids,
            "image_embeddings": images.astype(np.float32),
            "caption_ids": caption_ids,
            "caption_image_ids": [image_ids[i] for i in cap_image],
            "texts": names,
            "text_embeddings": text.astype(np.float32),
            "text_norms": norms.astype(np.float32),
            "extra_text_columns": {"level": levels.astype(np.int64)},
        }
        if self.projections:
            out.update(self._pre_projection(name, out))
        return out

    def _pre_projection(self, name: str, split: dict) -> dict[str, np.ndarray]:
        """Image norms and the pre-projection features of a split (module docstring), drawn
        from a generator of their own so the rest of the split does not change."""
        cfg = self.config
        rng = np.random.default_rng([self._split_seeds[name], 1])
        image_emb = split["image_embeddings"].astype(np.float64)
        image_norms = cfg.norm_mean * np.exp(cfg.norm_log_sd * rng.standard_normal(len(image_emb)))
        out: dict[str, np.ndarray] = {"image_norms": image_norms.astype(np.float32)}
        for kind, emb, norms in (
            ("image", image_emb, image_norms),
            ("text", split["text_embeddings"].astype(np.float64), split["text_norms"]),
        ):
            w = self.projections[kind]
            noise = rng.standard_normal((len(emb), cfg.pre_dim))
            noise -= (noise @ w.T) @ w  # into the null space of W
            noise *= cfg.pre_noise / np.sqrt(cfg.pre_dim - cfg.dim)
            phi = (norms[:, None] * emb) @ w + norms[:, None] * noise
            out[f"{kind}_features_pre"] = phi.astype(np.float32)
        return out

    def write(self, root: str) -> str:
        """Write ``ROOT/manifest.json`` and every split; returns ``root``."""
        cfg = self.config
        world = {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(cfg).items()}
        if cfg.pre_dim is None:  # the manifest of a world without them stays as it was
            world = {k: v for k, v in world.items() if k not in ("pre_dim", "pre_noise")}
        manifest = {
            "dim": cfg.dim,
            "model": "synthetic-world",
            "dtype": "float32",
            "description": "asymvlm.synthetic toy world (known asymmetric uncertainty)",
            "world": world,
        }
        if self.projections:
            manifest["pre_dim"] = {"image": cfg.pre_dim, "text": cfg.pre_dim}
        tables.write_manifest(root, manifest)
        if self.projections:
            tables.write_projection(root, **self.projections)
        for name, n_images in cfg.splits.items():
            tables.write_split(root, name, **self.sample_split(name, n_images))
        return root


def write_world(root: str, config: WorldConfig | None = None) -> str:
    """Build the world from ``config`` and write it under ``root``."""
    return SyntheticWorld(config).write(root)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Write the synthetic world's embedding tables.")
    parser.add_argument("--output", required=True, help="table root (local path or s3://)")
    parser.add_argument("--dim", type=int, default=WorldConfig.dim)
    parser.add_argument("--seed", type=int, default=WorldConfig.seed)
    parser.add_argument("--train-images", type=int, default=8000)
    parser.add_argument("--test-images", type=int, default=1000)
    parser.add_argument(
        "--pre-dim",
        type=int,
        default=None,
        help="also write pre-projection features of this width (> --dim) and projection.npz, "
        "as `asymvlm embed --pre-projection` does (for bayesvlm)",
    )
    args = parser.parse_args(argv)
    cfg = WorldConfig(
        dim=args.dim,
        seed=args.seed,
        splits={"train": args.train_images, "val": args.test_images, "test": args.test_images},
        pre_dim=args.pre_dim,
    )
    write_world(args.output, cfg)
    print(f"wrote synthetic world to {args.output}")


if __name__ == "__main__":
    main()
