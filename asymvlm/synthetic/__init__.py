"""A toy world with known, asymmetric uncertainty (Sec. 3), written as embedding tables.

Its assumptions are lettered in docs/synthetic.md (the code refers to the letters); presets
``demo`` and ``coco`` in :data:`PRESETS`.
"""

from asymvlm.synthetic.classes import (
    DUMMY_PROMPTS,
    TEMPLATES,
    ClassificationSpec,
    classification_roles,
    write_classification_sets,
)
from asymvlm.synthetic.cli import main
from asymvlm.synthetic.world import (
    COCO_LEVEL_PROBS,
    DEFAULT_SHARD_IMAGES,
    GENERIC_CAPTION_SHARE,
    PRESETS,
    SyntheticWorld,
    WorldConfig,
    write_world,
)

__all__ = [
    "COCO_LEVEL_PROBS",
    "DEFAULT_SHARD_IMAGES",
    "DUMMY_PROMPTS",
    "GENERIC_CAPTION_SHARE",
    "PRESETS",
    "TEMPLATES",
    "ClassificationSpec",
    "classification_roles",
    "SyntheticWorld",
    "WorldConfig",
    "main",
    "write_classification_sets",
    "write_world",
]
