"""Zero-shot prompt templates per data set, as CLIP's evaluation uses them.

A class c is described by one prompt per template, ``template.format(c)``; the embed stage
writes one prompt row per class x template (:mod:`asymvlm.data.sources`, ``prompts/``) and the
zero-shot evaluation ensembles a class's prompts (:mod:`asymvlm.evaluation.zeroshot`).

* :func:`templates_for` -- the templates of a data set: CIFAR-10 and CIFAR-100 18, STL-10 2,
  ImageNet 80; any other data set gets :data:`GENERIC_TEMPLATES`.
* :func:`imagenet_class_names` -- CLIP's curated ImageNet class names for ILSVRC-2012 synset
  folders (:data:`~asymvlm.data.templates.imagenet.IMAGENET_CLASSES`). The CIFAR and STL-10
  readers' own class names already are CLIP's (CIFAR-100's with "_" read as a space).

Sources of the lists (public prompt data, both MIT License):

* OpenAI CLIP, github.com/openai/CLIP: ``data/prompts.md`` (CIFAR-10, CIFAR-100, STL-10) and
  ``notebooks/Prompt_Engineering_for_ImageNet.ipynb`` (ImageNet); Copyright (c) 2021 OpenAI,
  MIT License.
* LAION-AI CLIP_benchmark, github.com/LAION-AI/CLIP_benchmark:
  ``clip_benchmark/datasets/en_zeroshot_classification_templates.json`` (keys ``cifar10``,
  ``cifar100``, ``stl10``, ``imagenet1k``: the same lists, ``{c}`` for ``{}``); Copyright (c)
  2022 Mehdi Cherti, MIT License.
"""

from __future__ import annotations

from collections.abc import Sequence

from asymvlm.data.templates.imagenet import IMAGENET_CLASSES

__all__ = [
    "CIFAR_TEMPLATES",
    "GENERIC_TEMPLATES",
    "IMAGENET_CLASSES",
    "IMAGENET_TEMPLATES",
    "STL10_TEMPLATES",
    "TEMPLATES",
    "imagenet_class_names",
    "templates_for",
]

#: The fallback for data sets without their own list (five of CLIP's ImageNet templates).
GENERIC_TEMPLATES: tuple[str, ...] = (
    "a photo of a {}.",
    "a blurry photo of a {}.",
    "a photo of the large {}.",
    "a photo of the small {}.",
    "itap of a {}.",
)

#: CIFAR-10 and CIFAR-100 (CLIP ``data/prompts.md``; CLIP_benchmark ``cifar10``/``cifar100``).
CIFAR_TEMPLATES: tuple[str, ...] = (
    "a photo of a {}.",
    "a blurry photo of a {}.",
    "a black and white photo of a {}.",
    "a low contrast photo of a {}.",
    "a high contrast photo of a {}.",
    "a bad photo of a {}.",
    "a good photo of a {}.",
    "a photo of a small {}.",
    "a photo of a big {}.",
    "a photo of the {}.",
    "a blurry photo of the {}.",
    "a black and white photo of the {}.",
    "a low contrast photo of the {}.",
    "a high contrast photo of the {}.",
    "a bad photo of the {}.",
    "a good photo of the {}.",
    "a photo of the small {}.",
    "a photo of the big {}.",
)

#: STL-10 (CLIP ``data/prompts.md``; CLIP_benchmark ``stl10``).
STL10_TEMPLATES: tuple[str, ...] = (
    "a photo of a {}.",
    "a photo of the {}.",
)

#: ImageNet: the 80 templates of CLIP's ImageNet notebook (CLIP_benchmark ``imagenet1k``).
IMAGENET_TEMPLATES: tuple[str, ...] = (
    "a bad photo of a {}.",
    "a photo of many {}.",
    "a sculpture of a {}.",
    "a photo of the hard to see {}.",
    "a low resolution photo of the {}.",
    "a rendering of a {}.",
    "graffiti of a {}.",
    "a bad photo of the {}.",
    "a cropped photo of the {}.",
    "a tattoo of a {}.",
    "the embroidered {}.",
    "a photo of a hard to see {}.",
    "a bright photo of a {}.",
    "a photo of a clean {}.",
    "a photo of a dirty {}.",
    "a dark photo of the {}.",
    "a drawing of a {}.",
    "a photo of my {}.",
    "the plastic {}.",
    "a photo of the cool {}.",
    "a close-up photo of a {}.",
    "a black and white photo of the {}.",
    "a painting of the {}.",
    "a painting of a {}.",
    "a pixelated photo of the {}.",
    "a sculpture of the {}.",
    "a bright photo of the {}.",
    "a cropped photo of a {}.",
    "a plastic {}.",
    "a photo of the dirty {}.",
    "a jpeg corrupted photo of a {}.",
    "a blurry photo of the {}.",
    "a photo of the {}.",
    "a good photo of the {}.",
    "a rendering of the {}.",
    "a {} in a video game.",
    "a photo of one {}.",
    "a doodle of a {}.",
    "a close-up photo of the {}.",
    "a photo of a {}.",
    "the origami {}.",
    "the {} in a video game.",
    "a sketch of a {}.",
    "a doodle of the {}.",
    "a origami {}.",
    "a low resolution photo of a {}.",
    "the toy {}.",
    "a rendition of the {}.",
    "a photo of the clean {}.",
    "a photo of a large {}.",
    "a rendition of a {}.",
    "a photo of a nice {}.",
    "a photo of a weird {}.",
    "a blurry photo of a {}.",
    "a cartoon {}.",
    "art of a {}.",
    "a sketch of the {}.",
    "a embroidered {}.",
    "a pixelated photo of a {}.",
    "itap of the {}.",
    "a jpeg corrupted photo of the {}.",
    "a good photo of a {}.",
    "a plushie {}.",
    "a photo of the nice {}.",
    "a photo of the small {}.",
    "a photo of the weird {}.",
    "the cartoon {}.",
    "art of the {}.",
    "a drawing of the {}.",
    "a photo of the large {}.",
    "a black and white photo of a {}.",
    "the plushie {}.",
    "a dark photo of a {}.",
    "itap of a {}.",
    "graffiti of the {}.",
    "a toy {}.",
    "itap of my {}.",
    "a photo of a cool {}.",
    "a photo of a small {}.",
    "a tattoo of the {}.",
)

#: Data set (a reader name, :data:`asymvlm.data.sources.READERS`) -> its templates.
TEMPLATES: dict[str, tuple[str, ...]] = {
    "cifar10": CIFAR_TEMPLATES,
    "cifar100": CIFAR_TEMPLATES,
    "stl10": STL10_TEMPLATES,
    "imagenet": IMAGENET_TEMPLATES,
}
_ALIASES = {"imagenet1k": "imagenet", "imagenet-1k": "imagenet"}  # CLIP_benchmark's names


def templates_for(dataset: str) -> tuple[str, ...]:
    """The zero-shot templates of ``dataset`` (case-insensitive; CLIP_benchmark's
    ``imagenet1k`` is ``imagenet``), else :data:`GENERIC_TEMPLATES`."""
    key = dataset.lower()
    return TEMPLATES.get(_ALIASES.get(key, key), GENERIC_TEMPLATES)


def imagenet_class_names(folders: Sequence[str]) -> list[str] | None:
    """CLIP's class name for every class folder when each is an ILSVRC-2012 synset id
    (``n01440764`` -> "tench"), else None (a folder of another data set)."""
    if not folders or any(f not in IMAGENET_CLASSES for f in folders):
        return None
    return [IMAGENET_CLASSES[f] for f in folders]
