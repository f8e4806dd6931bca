"""The synthetic world's generative process (random streams: docs/synthetic.md)."""

from __future__ import annotations

import copy
import itertools
import math
from collections.abc import Iterator
from typing import Any

import numpy as np

from asymvlm import tables
from asymvlm.synthetic.caption_texts import FILLERS, GENERIC_TEXTS, OPENERS, caption_texts
from asymvlm.synthetic.knobs import WorldConfig

#: Images per part file when writing.
DEFAULT_SHARD_IMAGES = 16384
#: Images per window of a draw (the memory a split's draw holds at once).
WINDOW_IMAGES = 2048
#: Second entry of a split's generators, ``default_rng([split_seed, TAG, *block])``, by role.
_TAGS = {"pre": 1, "block": 2, "words": 3, "generic": 6}
_DOMAIN_STREAM = 5
#: The split whose captions may be generic (assumption U), and their ``level``.
GENERIC_SPLIT, GENERIC_LEVEL = "train", -1


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _toward(centers: np.ndarray, scale: float, noise: np.ndarray) -> np.ndarray:
    """Points around ``centers`` at angle ~atan(scale): ``unit(c + scale * unit(noise))``."""
    return _unit(centers + scale * _unit(noise))


def _offset(rng: np.random.Generator, centers: np.ndarray, scale: float) -> np.ndarray:
    return _toward(centers, scale, rng.standard_normal(centers.shape))


def _fork(rng: np.random.Generator, rows: int, width: int) -> np.random.Generator:
    """A generator giving the next ``rows`` x ``width`` standard normals of ``rng``, in row
    chunks of any size (numpy draws the same normals at once or in consecutive calls);
    ``rng`` is moved past them by drawing them once in chunks."""
    fork = copy.deepcopy(rng)
    chunk = np.empty((max(1, min(rows, 2**16 // width)), width))
    for done in range(0, rows, len(chunk)):
        rng.standard_normal(out=chunk[: rows - done])
    return fork


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


def concat_splits(chunks: list[Any]) -> Any:
    """One split dict from consecutive chunks (dicts, arrays and lists joined key by key)."""
    first = chunks[0]
    if isinstance(first, dict):
        return {key: concat_splits([c[key] for c in chunks]) for key in first}
    return np.concatenate(chunks) if isinstance(first, np.ndarray) else [*itertools.chain(*chunks)]


class SyntheticWorld:
    """The generative process; ``write(root)`` stores every split as an embedding table."""

    def __init__(self, config: WorldConfig | None = None) -> None:
        self.config = cfg = config or WorldConfig()
        rng = np.random.default_rng(cfg.seed)
        # per level: the concepts [n_concepts, dim] and each one's parent in the level above
        self.concepts = [_unit(rng.standard_normal((cfg.branching[0], cfg.dim)))]
        self.parents = [np.zeros(cfg.branching[0], dtype=np.int64)]
        self.n_levels = len(cfg.branching) + 1  # of captions: the concepts' and the objects'
        for level in range(1, len(cfg.branching)):
            parent = np.repeat(np.arange(len(self.concepts[-1])), cfg.branching[level])
            self.concepts.append(_offset(rng, self.concepts[-1][parent], cfg.spread[level]))
            self.parents.append(parent)
        self.text_rotation = _rotation(rng, cfg.dim, cfg.misalignment)
        seeds = rng.integers(0, 2**31, len(cfg.splits)).tolist()
        self._split_seeds = dict(zip(cfg.splits, seeds, strict=True))
        pre_rng = np.random.default_rng([cfg.seed, 1])  # not the world's stream
        sides = ("image", "text") if cfg.pre_dim is not None else ()  # pre-projection features
        self.projections = {s: _orthonormal_rows(pre_rng, cfg.dim, cfg.pre_dim) for s in sides}
        # G: the most general text's meaning is the level-0 concepts' mean direction (the root)
        self.generic = _unit(self.concepts[0].mean(axis=0))
        # D: domains of the level-0 concepts and their text-encoder errors
        self.root_domain = np.zeros(cfg.branching[0], dtype=np.int64)
        if cfg.finetune_roots is not None:
            self.root_domain[cfg.finetune_roots :] = 1
        self.domain_rotations: list[np.ndarray] = []
        if cfg.domain_misalignment > 0:
            dom_rng = np.random.default_rng([cfg.seed, _DOMAIN_STREAM])
            self.domain_rotations = [
                _rotation(dom_rng, cfg.dim, cfg.domain_misalignment) for _ in range(2)
            ]

    def ancestors(self, ids: np.ndarray, level: int = -1) -> list[np.ndarray]:
        """Concept ids at levels 0..``level`` of level-``level`` concept ids (default: leaves)."""
        path = [ids]
        for lv in range(level % len(self.concepts), 0, -1):
            path.append(self.parents[lv][path[-1]])
        return path[::-1]

    def text_map(self, domain: int) -> np.ndarray:
        """The frozen text encoder's error on texts of ``domain`` (-1: generic texts, of no
        domain): the shared rotation, then (if any) the domain's own."""
        if not self.domain_rotations or domain < 0:
            return self.text_rotation
        return self.text_rotation @ self.domain_rotations[domain]

    def encode_text(self, true_text: np.ndarray, domain: np.ndarray | int) -> np.ndarray:
        """The frozen text encoder: unit rows of ``text_map(domain) @ true`` (a domain per row)."""
        if not self.domain_rotations:
            return _unit(true_text @ self.text_rotation.T)
        domain = np.broadcast_to(np.asarray(domain), (len(true_text),))
        out = np.empty_like(true_text)
        for d in np.unique(domain):
            rows = domain == d
            out[rows] = _unit(true_text[rows] @ self.text_map(int(d)).T)
        return out

    def draw_views(
        self, rng: np.random.Generator, leaves: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Objects around their leaf concepts, and one image (view) of each."""
        cfg = self.config
        objects = _offset(rng, self.concepts[-1][leaves], cfg.object_spread)
        return objects, _offset(rng, objects, cfg.image_noise)

    def _draw(self, name: str, start: int, n_images: int, block: tuple[int, ...]) -> Iterator[dict]:
        """Images ``start .. start+n_images`` of a split and their captions from the split's (or
        block ``block[0]``'s) streams, window by window (docs/synthetic.md, "Random streams")."""
        seed, cfg = self._split_seeds[name], self.config
        rng = {
            role: np.random.default_rng([seed, _TAGS[role], *block])
            for role in ("words", "generic", "pre")
        }
        main = np.random.default_rng([seed, _TAGS["block"], *block] if block else seed)
        n_cap, dim = cfg.captions_per_image, cfg.dim
        n_captions = n_images * n_cap
        leaf_root = self.ancestors(np.arange(len(self.concepts[-1])))[0]
        pool = np.nonzero(self.root_domain[leaf_root] == 0)[0]  # the fine-tuning domain's leaves
        leaves = pool[main.integers(0, len(pool), n_images)]
        objects, views = _fork(main, n_images, dim), _fork(main, n_images, dim)
        if cfg.level_probs is None:
            levels = main.integers(0, self.n_levels, n_captions)
        else:
            levels = main.choice(self.n_levels, n_captions, p=np.asarray(cfg.level_probs))
        paraphrases = _fork(main, n_captions, dim)
        norms = cfg.norm_mean * np.exp(cfg.norm_log_sd * main.standard_normal(n_captions))
        generic = None
        if name == GENERIC_SPLIT and cfg.generic_captions > 0:  # U: the root, paraphrased
            choice = rng["generic"].integers(0, len(GENERIC_TEXTS), n_captions)
            generic = rng["generic"].random(n_captions) < cfg.generic_captions
        if cfg.caption_words:
            opener = rng["words"].integers(0, len(OPENERS), n_captions)
            n_fill = rng["words"].poisson(cfg.filler_words, n_captions)
            fill = rng["words"].integers(0, len(FILLERS), int(n_fill.sum()))
            fill_ends = np.concatenate([[0], np.cumsum(n_fill)])
        if self.projections:  # image norms, image noise, then the text noise from rng["pre"]
            pre_norms = rng["pre"].standard_normal(n_images)
            pre_images = _fork(rng["pre"], n_images, cfg.pre_dim)
        path = self.ancestors(leaves)

        for lo in range(0, max(n_images, 1), WINDOW_IMAGES):  # an empty split: one empty piece
            hi = min(lo + WINDOW_IMAGES, n_images)
            c0, c1 = lo * n_cap, hi * n_cap  # the window's captions
            here = [p[lo:hi] for p in path]
            object_at = _offset(objects, self.concepts[-1][leaves[lo:hi]], cfg.object_spread)
            images = _offset(views, object_at, cfg.image_noise)
            cap_image = np.repeat(np.arange(hi - lo), n_cap)
            window_levels = levels[c0:c1]
            targets = np.empty((len(cap_image), dim))
            for level in range(self.n_levels):
                rows = window_levels == level
                if level < len(self.concepts):
                    targets[rows] = self.concepts[level][here[level][cap_image[rows]]]
                else:
                    targets[rows] = object_at[cap_image[rows]]
            true_text = _offset(paraphrases, targets, cfg.caption_noise)
            del targets
            domain = self.root_domain[here[0]][cap_image]
            if generic is not None:
                mask = generic[c0:c1]
                noise = rng["generic"].standard_normal((int(mask.sum()), dim))
                roots = np.broadcast_to(self.generic, noise.shape)
                true_text[mask] = _toward(roots, cfg.caption_noise, noise)
                domain = np.where(mask, -1, domain)  # generic texts: the shared error only (D)
            text = self.encode_text(true_text, domain)  # the frozen text encoder's error
            del true_text

            image_ids = [f"{name}-img{start + i:06d}" for i in range(lo, hi)]
            caption_ids = [f"{image_ids[i]}-c{j}" for i in range(hi - lo) for j in range(n_cap)]
            window_words = None
            if cfg.caption_words:
                window_words = (opener[c0:c1], n_fill[c0:c1], fill[fill_ends[c0] : fill_ends[c1]])
            names = caption_texts(here, cap_image, window_levels, start + lo, window_words)
            if generic is not None:
                for row in np.flatnonzero(mask):
                    names[row] = GENERIC_TEXTS[choice[c0 + row]]
                window_levels = np.where(mask, GENERIC_LEVEL, window_levels)
            out = {
                "image_ids": image_ids,
                "image_embeddings": images.astype(np.float32),
                "caption_ids": caption_ids,
                "caption_image_ids": [image_ids[i] for i in cap_image],
                "texts": names,
                "text_embeddings": text.astype(np.float32),
                "text_norms": norms[c0:c1].astype(np.float32),
                "extra_text_columns": {"level": window_levels.astype(np.int64)},
            }
            if self.projections:
                out.update(self._pre_projection(out, pre_norms[lo:hi], pre_images, rng["pre"]))
            yield out

    def _blocks(self, n_images: int) -> list[tuple[int, int, tuple[int, ...]]]:
        """``(start, images, block)`` of each draw of a split: the whole, or its blocks."""
        size = self.config.block_images
        if size is None:
            return [(0, n_images, ())]
        starts = range(0, n_images, size)
        return [(start, min(size, n_images - start), (b,)) for b, start in enumerate(starts)]

    def sample_split(self, name: str, n_images: int) -> dict:
        """Draw images, objects and captions for one split (deterministic per split name)."""
        draws = self._blocks(n_images)
        return concat_splits([piece for draw in draws for piece in self._draw(name, *draw)])

    def _pre_projection(
        self,
        split: dict,
        normal_norms: np.ndarray,
        image_noise: np.random.Generator,
        text_noise: np.random.Generator,
    ) -> dict[str, np.ndarray]:
        """Image norms and the pre-projection features of a piece (assumption P)."""
        cfg = self.config
        image_emb = split["image_embeddings"].astype(np.float64)
        image_norms = cfg.norm_mean * np.exp(cfg.norm_log_sd * normal_norms)
        out: dict[str, np.ndarray] = {"image_norms": image_norms.astype(np.float32)}
        for kind, emb, norms, rng in (
            ("image", image_emb, image_norms, image_noise),
            ("text", split["text_embeddings"].astype(np.float64), split["text_norms"], text_noise),
        ):
            w = self.projections[kind]
            noise = rng.standard_normal((len(emb), cfg.pre_dim))
            noise -= (noise @ w.T) @ w  # into the null space of W
            noise *= cfg.pre_noise / np.sqrt(cfg.pre_dim - cfg.dim)
            phi = (norms[:, None] * emb) @ w + norms[:, None] * noise
            out[f"{kind}_features_pre"] = phi.astype(np.float32)
        return out

    def write(self, root: str, shard_images: int = DEFAULT_SHARD_IMAGES) -> str:
        """Write ``ROOT/manifest.json`` and every split, a window per row group and whole blocks
        of about ``shard_images`` images per part file (an unblocked split: one part)."""
        cfg = self.config
        manifest = {
            "dim": cfg.dim,
            "model": "synthetic-world",
            "dtype": "float32",
            "description": "asymvlm.synthetic toy world (known asymmetric uncertainty)",
            "world": cfg.manifest_world(),
        }
        if self.projections:
            manifest["pre_dim"] = {"image": cfg.pre_dim, "text": cfg.pre_dim}
        tables.write_manifest(root, manifest)
        if self.projections:
            tables.write_projection(root, **self.projections)
        for name, n_images in cfg.splits.items():
            per_part = max(1, shard_images // (cfg.block_images or max(n_images, 1)))
            blocks = enumerate(self._blocks(n_images))
            for k, run in itertools.groupby(blocks, key=lambda block: block[0] // per_part):
                pieces = (piece for _, draw in run for piece in self._draw(name, *draw))
                tables.write_split_pieces(root, name, pieces, part=f"part-{k:05d}")
        return root


def write_world(
    root: str, config: WorldConfig | None = None, shard_images: int = DEFAULT_SHARD_IMAGES
) -> str:
    """Build the world from ``config`` and write it under ``root``."""
    return SyntheticWorld(config).write(root, shard_images)
