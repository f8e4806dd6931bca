"""Zero-shot prompt templates per data set and CLIP's ImageNet class names.

Data (MIT License): OpenAI CLIP's ``data/prompts.md`` and ImageNet prompt-engineering notebook,
Copyright (c) 2021 OpenAI; the same lists as LAION-AI CLIP_benchmark's
``en_zeroshot_classification_templates.json`` and ``en_classnames.json``, Copyright (c) 2022
Mehdi Cherti. ``templates.json``: data set -> templates ("generic" for any other data set);
``imagenet_classes.txt``: "<synset id> <class name>" in class-index order (sorted synsets)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from importlib.resources import files

_DATA = files(__name__)
_LISTS: dict[str, list[str]] = json.loads(_DATA.joinpath("templates.json").read_text("utf-8"))
#: The none-of-the-above prompts (Table 2; the most general captions, assumption G).
DUMMY_PROMPTS = ("a photo", "a photo of an object", "a photo of something")
#: The fallback for data sets without their own list (five of CLIP's ImageNet templates).
GENERIC_TEMPLATES: tuple[str, ...] = tuple(_LISTS.pop("generic"))
#: Data set (a reader name) -> its templates.
TEMPLATES: dict[str, tuple[str, ...]] = {k: tuple(v) for k, v in _LISTS.items()}
#: ILSVRC-2012 synset id (the class folder) -> CLIP's curated class name, in class-index order.
IMAGENET_CLASSES: dict[str, str] = dict(
    line.split(" ", 1)
    for line in _DATA.joinpath("imagenet_classes.txt").read_text("utf-8").splitlines()
)


def templates_for(dataset: str) -> tuple[str, ...]:
    """The templates of ``dataset`` (case-insensitive, CLIP_benchmark's names too), else generic."""
    key = dataset.lower()
    key = "imagenet" if key in ("imagenet1k", "imagenet-1k") else key
    return TEMPLATES.get(key, GENERIC_TEMPLATES)


def imagenet_class_names(folders: Sequence[str]) -> list[str] | None:
    """CLIP's class name per folder when every folder is an ILSVRC-2012 synset id, else None."""
    if not folders or any(f not in IMAGENET_CLASSES for f in folders):
        return None
    return [IMAGENET_CLASSES[f] for f in folders]
