"""Caption texts of the synthetic world: today's tag captions and captions with words.

The ``text`` column is what :func:`asymvlm.evaluation.hierarcaps.hierarchy_analysis` counts
words in. Tag captions (``"a photo of c1 / c7"``, the default) have a word count that is a
function of the level, so Spearman(words, uncertainty) equals Spearman(level, uncertainty).
Word captions (``WorldConfig.caption_words``) follow the package docstring's assumption W: a
caption names the concept path down to its level, one word per level, and carries style words
(an opening phrase, adjectives) whose number does not depend on the level and which do not
narrow the set of objects the caption describes.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "FILLERS",
    "GENERIC_TEXTS",
    "OPENERS",
    "compose_word_texts",
    "tag_texts",
    "word_texts",
]

#: Opening phrases of a word caption (1 to 4 words), equally likely.
OPENERS: tuple[str, ...] = (
    "a",
    "a photo of",
    "there is a",
    "this picture shows a",
    "an image of a",
)
#: Texts of the generic training captions (assumption U of :mod:`asymvlm.synthetic`): they
#: describe every object, like the dummy prompts, but are other words than those.
GENERIC_TEXTS: tuple[str, ...] = (
    "a picture",
    "an image",
    "a picture of something",
    "an image of things",
    "a view of a scene",
)
#: Style words: adjectives the world treats as not narrowing a caption's objects.
FILLERS: tuple[str, ...] = (
    "small",
    "nice",
    "old",
    "little",
    "big",
    "some",
    "very",
    "bright",
    "dark",
    "pretty",
)


def tag_texts(
    path: list[np.ndarray], cap_image: np.ndarray, levels: np.ndarray, start: int
) -> list[str]:
    """Today's captions: ``"a photo of c3 / c17"``; the object level adds ``"object <i>"``.

    ``path[k][i]`` is the level-k concept of image ``i`` (0-based in this chunk, ``start + i`` in
    the split); ``cap_image`` and ``levels`` give each caption's image and level.
    """
    n_concept_levels = len(path)
    names = []
    for i, level in zip(cap_image, levels, strict=True):
        tags = [f"c{path[k][i]}" for k in range(min(level + 1, n_concept_levels))]
        if level == n_concept_levels:
            tags.append(f"object {start + i}")
        names.append("a photo of " + " / ".join(tags))
    return names


def word_texts(
    rng: np.random.Generator,
    path: list[np.ndarray],
    cap_image: np.ndarray,
    levels: np.ndarray,
    start: int,
    filler_words: float,
) -> list[str]:
    """Word captions: an opener, Poisson(``filler_words``) style words, then one name per level
    of the concept path (``c<id>``) and, at the object level, the object's name (``o<i>``).

    Word count = opener (1-4) + fillers + level + 1: it grows with the level, with noise that
    is independent of it. The draws (in this order, from ``rng``): the openers, the filler
    counts, the fillers (:func:`compose_word_texts` builds the captions from them).
    """
    n = len(levels)
    opener = rng.integers(0, len(OPENERS), n)
    n_fill = rng.poisson(filler_words, n)
    fill = rng.integers(0, len(FILLERS), int(n_fill.sum()))
    return compose_word_texts(opener, n_fill, fill, path, cap_image, levels, start)


def compose_word_texts(
    opener: np.ndarray,
    n_fill: np.ndarray,
    fill: np.ndarray,
    path: list[np.ndarray],
    cap_image: np.ndarray,
    levels: np.ndarray,
    start: int,
) -> list[str]:
    """The word captions of :func:`word_texts` from its draws: ``opener`` (index into
    :data:`OPENERS`) and ``n_fill`` per caption, ``fill`` (indices into :data:`FILLERS`, the
    captions' fillers one after the other)."""
    n_concept_levels = len(path)
    ends = np.cumsum(n_fill)
    out = []
    for c, (i, level) in enumerate(zip(cap_image, levels, strict=True)):
        words = OPENERS[opener[c]].split()
        words += [FILLERS[w] for w in fill[ends[c] - n_fill[c] : ends[c]]]
        words += [f"c{path[k][i]}" for k in range(min(level + 1, n_concept_levels))]
        if level == n_concept_levels:
            words.append(f"o{start + i}")
        out.append(" ".join(words))
    return out
