"""A toy world with known, asymmetric uncertainty (Sec. 3), written as embedding tables; its
assumptions are lettered in docs/synthetic.md (the code refers to the letters)."""

from asymvlm.synthetic.classification_sets import (
    DUMMY_PROMPTS,
    ClassificationSpec,
    classification_roles,
    write_classification_sets,
)
from asymvlm.synthetic.command_line import main
from asymvlm.synthetic.knobs import COCO_LEVEL_PROBS, PRESETS, WorldConfig
from asymvlm.synthetic.world import SyntheticWorld, write_world

__all__ = [
    "COCO_LEVEL_PROBS",
    "DUMMY_PROMPTS",
    "PRESETS",
    "ClassificationSpec",
    "SyntheticWorld",
    "WorldConfig",
    "classification_roles",
    "main",
    "write_classification_sets",
    "write_world",
]
