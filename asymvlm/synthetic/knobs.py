"""The knobs of the synthetic world (:class:`WorldConfig`) and its named worlds (:data:`PRESETS`);
the assumptions they control are lettered in docs/synthetic.md."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from asymvlm import tables
from asymvlm.errors import ConfigError

__all__ = ["COCO_LEVEL_PROBS", "GENERIC_CAPTION_SHARE", "PRESETS", "WorldConfig"]

#: Knobs left out of the manifest at their defaults (recorded worlds' manifests stay the same).
_LATER_KNOBS = ("block_images", "caption_words", "filler_words", "finetune_roots")
_LATER_KNOBS += ("domain_misalignment", "level_probs", "generic_captions")
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
    #: Width of the pre-projection features (None: no pre-projection columns); > dim.
    pre_dim: int | None = None
    pre_noise: float = 0.5  # null-space nuisance of a pre-projection feature, per unit norm
    #: Draw each split in blocks of this many images (a stream per block: another world).
    block_images: int | None = None
    #: Captions with words whose count follows the level with noise (assumption W).
    caption_words: bool = False
    filler_words: float = 1.5  # Poisson mean of a word caption's style words
    #: Level-0 concepts whose objects the retrieval splits show (the fine-tuning domain); the
    #: others form the zero-shot domain (assumption D). None: every concept, one domain.
    finetune_roots: int | None = None
    #: Angle (rad) of each domain's own text-encoder rotation, after the shared one (D).
    domain_misalignment: float = 0.0
    #: Probability of each caption level 0..L (most general .. the object itself); None: every
    #: level equally likely (assumption C). :data:`COCO_LEVEL_PROBS` is the COCO-like mix.
    level_probs: tuple[float, ...] | None = None
    #: Fraction of the ``train`` split's captions that are generic ("a picture": the
    #: hierarchy's root, assumption U); 0: none, as assumption G has it.
    generic_captions: float = 0.0

    def __post_init__(self) -> None:
        self.branching = tuple(int(b) for b in self.branching)  # type: ignore[assignment]
        self.spread = tuple(float(s) for s in self.spread)  # type: ignore[assignment]
        n_levels = len(self.branching) + 1
        if self.level_probs is not None:
            self.level_probs = probs = tuple(float(p) for p in self.level_probs)
            if len(probs) != n_levels:
                raise ConfigError(
                    f"level_probs needs {n_levels} probabilities (levels 0..{n_levels - 1}), "
                    f"got {len(probs)}"
                )
            if not all(math.isfinite(p) and p >= 0 for p in probs) or abs(sum(probs) - 1) > 1e-6:
                raise ConfigError(f"level_probs must be >= 0 and sum to 1, got {list(probs)}")
        checks = {
            "block_images must be >= 1": self.block_images is None or self.block_images >= 1,
            f"finetune_roots must be in 1..{self.branching[0]}": self.finetune_roots is None
            or 1 <= self.finetune_roots <= self.branching[0],
            "generic_captions must be in [0, 1]": 0.0 <= self.generic_captions <= 1.0,
            "filler_words must be >= 0": self.filler_words >= 0,
            "domain_misalignment must be >= 0": self.domain_misalignment >= 0,
            f"pre_dim must exceed dim {self.dim}": self.pre_dim is None or self.pre_dim > self.dim,
        }
        for message, ok in checks.items():
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
        if not isinstance(world, dict):
            raise tables.TableError(f"{root}: manifest has no 'world' (not a synthetic world)")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(world) - known)
        if unknown:
            raise tables.TableError(f"{root}: unknown world keys {unknown}")
        return cls(**world)

    def manifest_world(self) -> dict[str, Any]:
        """The ``world`` entry of the manifest (later knobs only when not at their defaults)."""
        world = {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(self).items()}
        if self.pre_dim is None:  # the manifest of a world without them stays as it was
            world = {k: v for k, v in world.items() if k not in ("pre_dim", "pre_noise")}
        defaults = WorldConfig.__dataclass_fields__
        return {k: v for k, v in world.items() if k not in _LATER_KNOBS or v != defaults[k].default}


#: The share of generic training captions of the presets (assumption U, docs/synthetic.md).
GENERIC_CAPTION_SHARE = 0.004

#: Named worlds: ``demo`` (the offline demo's, d = 32) and ``coco`` (MS-COCO's size at CLIP
#: ViT-B/32's width, written in blocks), both in the forgetting regime F with word captions,
#: the COCO-like level mix, generic training captions and two domains.
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
