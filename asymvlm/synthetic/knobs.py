"""The synthetic world's knobs (:class:`WorldConfig`) and named worlds (docs/synthetic.md)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from asymvlm import tables
from asymvlm.errors import ConfigError

#: Knobs left out of the manifest at their defaults (recorded worlds' manifests stay the same).
_LATER_KNOBS = (
    "block_images caption_words filler_words finetune_roots domain_misalignment level_probs "
    "generic_captions"
).split()
#: The COCO-like caption-level mix of levels 0-3 (docs/i2t-analysis.md).
COCO_LEVEL_PROBS: tuple[float, float, float, float] = (0.05, 0.15, 0.30, 0.50)


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
    pre_dim: int | None = None  # width of pre-projection features (None: none); > dim
    pre_noise: float = 0.5  # null-space nuisance of a pre-projection feature, per unit norm
    block_images: int | None = None  # draw each split in blocks (a stream per block)
    caption_words: bool = False  # word count follows the level with noise (assumption W)
    filler_words: float = 1.5  # Poisson mean of a word caption's style words
    finetune_roots: int | None = None  # level-0 concepts of the fine-tuning domain (D)
    domain_misalignment: float = 0.0  # angle (rad) of each domain's own rotation (D)
    level_probs: tuple[float, ...] | None = None  # of caption levels 0..L (None: uniform, C)
    generic_captions: float = 0.0  # share of generic train captions (U; 0: none, G)

    def __post_init__(self) -> None:
        self.branching = tuple(map(int, self.branching))  # type: ignore[assignment]
        self.spread = tuple(map(float, self.spread))  # type: ignore[assignment]
        probs, n_levels = self.level_probs, len(self.branching) + 1
        if probs is not None:
            self.level_probs = probs = tuple(map(float, probs))
        probs_ok = probs is None or (
            all(math.isfinite(p) and p >= 0 for p in probs) and abs(sum(probs) - 1) < 1e-6
        )
        roots, top, pre_dim = self.finetune_roots, self.branching[0], self.pre_dim
        for ok, message in (
            (probs is None or len(probs) == n_levels, f"level_probs needs {n_levels} values"),
            (probs_ok, f"level_probs must be >= 0 and sum to 1, got {probs}"),
            (self.block_images is None or self.block_images >= 1, "block_images must be >= 1"),
            (roots is None or 1 <= roots <= top, f"finetune_roots must be in 1..{top}"),
            (0.0 <= self.generic_captions <= 1.0, "generic_captions must be in [0, 1]"),
            (self.filler_words >= 0, "filler_words must be >= 0"),
            (self.domain_misalignment >= 0, "domain_misalignment must be >= 0"),
            (pre_dim is None or pre_dim > self.dim, f"pre_dim must exceed dim {self.dim}"),
        ):
            if not ok:
                raise ConfigError(message)

    @classmethod
    def preset(
        cls, name: str | None, sizes: Mapping[str, int | None] | None = None, **overrides: Any
    ) -> WorldConfig:
        """A named world (:data:`PRESETS`; None: the default knobs) with images per split
        ``sizes`` (None: the preset's) and the knobs ``overrides``."""
        if name is not None and name not in PRESETS:
            raise ConfigError(f"unknown world preset {name!r}; known: {', '.join(PRESETS)}")
        base = PRESETS[name] if name else cls()
        given = {split: n for split, n in (sizes or {}).items() if n is not None}
        splits = {**overrides.pop("splits", base.splits), **given}
        return replace(base, splits=splits, **overrides)

    @classmethod
    def from_manifest(cls, root: str) -> WorldConfig:
        """The configuration a world's ``manifest.json`` records (key ``world``)."""
        world = tables.read_manifest(root).extra.get("world")
        if not isinstance(world, dict) or set(world) - {f.name for f in fields(cls)}:
            raise tables.TableError(f"{root}: the manifest's 'world' is no synthetic world's")
        return cls(**world)

    def manifest_world(self) -> dict[str, Any]:
        """The ``world`` entry of the manifest (later knobs only when not at their defaults)."""
        world = {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(self).items()}
        if self.pre_dim is None:  # the manifest of a world without them stays as it was
            world = {k: v for k, v in world.items() if k not in ("pre_dim", "pre_noise")}
        defaults = WorldConfig.__dataclass_fields__
        return {k: v for k, v in world.items() if k not in _LATER_KNOBS or v != defaults[k].default}


#: Named worlds: ``demo`` (the offline demo's, d = 32) and ``coco`` (MS-COCO's size at CLIP
#: ViT-B/32's width, written in blocks), both in the forgetting regime F with word captions,
#: the COCO-like level mix, generic training captions and two domains.
GENERIC_CAPTION_SHARE = 0.004  # of the presets' train captions (assumption U)
_REGIME_F = dict(
    caption_words=True,
    finetune_roots=4,
    domain_misalignment=0.5,
    level_probs=COCO_LEVEL_PROBS,
    misalignment=0.0,
    generic_captions=GENERIC_CAPTION_SHARE,
)
PRESETS: dict[str, WorldConfig] = {
    "demo": WorldConfig(
        dim=32,
        captions_per_image=4,
        splits={"train": 1500, "val": 300, "test": 300},
        block_images=512,
        **_REGIME_F,
    ),
    "coco": WorldConfig(
        dim=512,
        captions_per_image=5,
        splits={"train": 118_287, "val": 5000, "test": 5000},
        block_images=2048,
        **_REGIME_F,
    ),
}
