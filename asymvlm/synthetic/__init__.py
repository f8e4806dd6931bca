"""A toy world with known, asymmetric uncertainty, written as embedding tables.

The world follows Sec. 3 of the paper, whose spaces it makes explicit: objects ``O``, their
representation ``psi(O)`` on S^{d-1}, images ``I``, texts ``T``, the one-to-many maps
``Phi_T`` (text -> the objects it describes) and ``Phi_I`` (object -> its images), and a frozen
VLM whose encoders approximate ``f_T ~ psi o Phi_T`` and ``f_I ~ psi o Phi_I^{-1}``. Each
assumption below is named by a letter; the code refers to the letters.

H (hierarchy of types). A concept hierarchy lives on S^{d-1}: a few abstract concepts (level 0),
each with children (level 1), grandchildren (level 2). A child lies near its parent
(``spread``). A concept is a *type* in the paper's sense: ``Phi_T("c")`` is every object under
it.

O (tokens). Every object (token) lies near one leaf (level-2) concept (``object_spread``);
``psi(o)`` is that point.

I (images). Every image shows exactly one object (``Phi_I^{-1}(i) = o``, the paper's ✕
assumption), seen with a little view noise (``image_noise``); images are one-to-one with objects.
The frozen image encoder is ``psi o Phi_I^{-1}`` up to that noise: images carry no abstraction.

C (captions). A caption describes its image's object at an abstraction level drawn uniformly
(or with the probabilities ``level_probs``; the presets use the COCO-like mix
``COCO_LEVEL_PROBS`` = 0.05 / 0.15 / 0.30 / 0.50, mostly detailed captions, so that few images
lack a detailed caption of their own, as in COCO): levels 0-2 point at the object's ancestor
concept, level 3 at the object itself, each with a little paraphrase noise (``caption_noise``).
So an abstract caption's ``Phi_T`` holds many objects (high aleatoric uncertainty in text ->
image), a detailed one few; an image has ``captions_per_image`` captions (the image -> text
one-to-many of linguistic diversity). Levels are stored like HierarCaps (column ``level``: 0 =
most general, 3 = most detailed).

E (the frozen text encoder's error). The frozen "VLM" is imperfect the way a frozen model is on
a new domain: its text encoder is misaligned with its image encoder by a fixed rotation
(``misalignment``), which an adapter can learn to undo, and it reports a raw text-projection
norm (column ``norm``) that carries no information.

F (the forgetting regime, ``misalignment = 0``; the presets). Without the shared rotation the
frozen encoder's only error is each domain's own rotation (D): it is well aligned on the
zero-shot domain (the frozen model's zero-shot accuracy there is about 0.96 in the demo's
world), and nothing an adapter learns on the fine-tuning domain carries over to it, so
fine-tuning can only lose zero-shot accuracy -- the situation of the paper's Table 3, where CLIP
zero-shot is strong and every fine-tuned model is below it. The world encodes **no mechanism**
by which one adapter forgets less than another: a probabilistic adapter and Determ. FT move the
mean embedding alike, so a gap between them (the paper's claim) is an outcome to be measured,
not one built in. With ``misalignment > 0`` (the default 1.0) fine-tuning learns the shared
rotation and helps every method on the zero-shot domain.

P (pre-projection features, ``pre_dim``). What ``asymvlm embed --pre-projection`` writes for a
real CLIP (for BayesVLM, :mod:`asymvlm.methods.bayesvlm`): each modality's encoder ends in a
random linear projection ``W`` [dim, pre_dim] with orthonormal rows, and an item's
pre-projection feature is ``phi = W^T (norm * embedding) + n``, where ``n`` is an isotropic
nuisance in the null space of ``W`` (scale ``pre_noise`` relative to the raw norm), so that
``W phi`` is exactly the raw projection ``norm * embedding``. Images get a raw norm too
(uninformative, like the captions').

W (caption words, ``caption_words``). A caption names the concept path down to its level, one
word per level, and the object by its own name at the object level ("a dog" / "a golden
retriever" / "the neighbour's golden retriever"); besides, it carries style words -- an opening
phrase of 1-4 words and Poisson(``filler_words``) adjectives -- whose number does not depend on
the level and which do not narrow ``Phi_T`` (nor move the embedding). So the word count grows
with the level but is not a function of it: Spearman(words, uncertainty) is below
Spearman(level, uncertainty) for an estimator that tracks the level. Off by default: today's
tag captions ("a photo of c1 / c7") have a word count that is a function of the level.

G (the most general texts). "a photo", "a photo of an object", "a photo of something" describe
every object: ``Phi_T(t) = O``. Their meaning is the hierarchy's root, the direction of the
level-0 concepts' mean (``SyntheticWorld.generic``), with paraphrase noise; the encoder makes
only its shared error on them (they belong to no domain, D). They serve as the dummy prompts of
the none-of-the-above evaluation (Table 2). By default they are not among the fine-tuning
captions (U relaxes this).

U (generic captions in training, ``generic_captions = p``; relaxes G). A fraction p of the
``train`` split's captions are generic: each caption is, with probability p, replaced by a text
like "a picture" or "an image of things" (:data:`~asymvlm.synthetic.captions.GENERIC_TEXTS`,
other words than the dummy prompts) whose meaning is the hierarchy's root with paraphrase noise
and which gets the shared encoder error only, as G's texts; it stays paired with its image
(``Phi_T`` of a generic text is every object, so it describes any image) and has ``level`` -1.
Why it matters: without generic captions the dummy prompts lie outside the training texts'
support (their nearest training caption is at cosine ~0.67, a class prompt's at ~0.99) and a
ReLU adapter extrapolates kappa there, roughly in proportion to the input's reach, so "a photo"
gets the *highest* kappa of all texts and none-of-the-above cannot work; with real CLIP the
generic prompts sit near the text-embedding mean, inside the caption distribution. In InfoNCE's
image -> text term a generic text seen in training learns a score of about ln p(z) (the image
marginal), which turns the dummy prompt into a likelihood-ratio test: the mechanism the paper's
Table 2 relies on. The presets' p = 0.004 was fixed before any outcome was measured, from the
real HierarCaps test split (the hierarchies whose levels C models): of its 4,000 caption texts
(1,000 hierarchies x 4 levels), 16 (0.4 %) are generic -- after dropping a leading article,
one of object(s), thing(s), something, anything, everything, item(s), entity, entities,
physical entity, stuff, scene, image, photo, picture, view (8 "object", 3 "scene", 3 "stuff",
1 "view", 1 "photo"); its machine-generated expanded set gives 0.48 % (454 of 93,916). A lower
reading, weighting HierarCaps' 1.6 % generic level-0 texts by the COCO-like share of level-0
captions (5 %), gives 0.0008, and COCO's own captions (HierarCaps' level 3) hold none;
``benchmarks/generic_captions.py`` measures p in {0, 0.005, 0.01, 0.02, 0.05} (docs/
synthetic-world.md).

K (classification). The classes of a classification set are concepts of one level; an image of
a class is an object under that concept, seen as in I; a class prompt is the text naming the
concept (the concept plus paraphrase noise, as C) under a template, and a template adds a
direction of its own shared by every class ("a photo of a {}" vs "a drawing of a {}"), so that a
prompt ensemble averages template noise out. Positives are images of the chosen classes,
negatives images of the other concepts of the same level and domain (mostly siblings of the
positives), far negatives images of the concepts under level-0 concepts that hold no positive
class -- each disjoint from the positives, like CIFAR-100 against CIFAR-10
(:mod:`asymvlm.synthetic.classes`).

D (domains, ``finetune_roots``, ``domain_misalignment``). The level-0 concepts are split into a
fine-tuning domain (the first ``finetune_roots``; the retrieval splits show only its objects,
the analogue of COCO) and a zero-shot domain (the rest; the analogue of the classification sets
a fine-tuned model is tested on in Table 3). The text encoder's error on a text of domain ``k``
is the shared rotation E after a rotation of its own, ``R_shared R_k`` (each ``R_k`` turning
every vector by ``domain_misalignment`` in d/2 random planes; generic texts get ``R_shared``
only). An adapter fitted on the fine-tuning domain can learn the shared part, which helps the
zero-shot domain, and that domain's own part, which does not -- so fine-tuning may help or
hurt zero-shot accuracy elsewhere; nothing in the world decides which.

Random streams and memory are described in :mod:`asymvlm.synthetic.world`: every feature added
after the first worlds draws from a generator of its own, so a world of today's knobs is
bit-identical to what it was; the writer streams a world a piece at a time (a block of
``block_images``, or a window of the one-piece draw), so its memory does not grow with the
world's size (presets ``demo`` and ``coco``: :data:`PRESETS`).
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
