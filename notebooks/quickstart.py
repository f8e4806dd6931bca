# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # AsymVLM in ten minutes: uncertainty of captions on a synthetic world
#
# A frozen vision-language model (CLIP, SigLIP) gives every caption one point on the unit sphere.
# **AsymVLM** (Ju et al., NeurIPS 2025) trains a small adapter that turns the caption into a
# *distribution* on the sphere, a von Mises-Fisher vMF(μ, κ): its concentration κ says how
# specific the caption is, and 1/κ is its **uncertainty** -- "an animal" matches many images,
# "a golden retriever catching a red frisbee" few.
#
# This notebook runs offline on a laptop CPU in a few minutes, on a **synthetic world** whose
# uncertainty is known: captions describe their image's object at an abstraction level 0
# (most general) to 3 (the object itself), and the frozen text encoder is misaligned by a
# rotation that the adapter has to undo. We
#
# 1. write the world's embedding tables,
# 2. train AsymVLM on them,
# 3. look at the uncertainty per caption level and the binned recall curve,
# 4. export the adapter and score captions with the `Scorer`,
# 5. make a none-of-the-above decision and draw a risk-coverage curve,
# 6. and see how to point the same code at real tables and at a Ray cluster.
#
# Everything here is the package's public API; the same functions run inside the Ray pipeline.

# %%
import os
import tempfile
import time

import matplotlib.pyplot as plt
import numpy as np
import torch

torch.manual_seed(0)
torch.set_num_threads(min(2, os.cpu_count() or 1))
START = time.perf_counter()
OUT = os.environ.get("QUICKSTART_OUTPUT") or tempfile.mkdtemp(prefix="asymvlm-quickstart-")
FIGURES = os.environ.get("QUICKSTART_FIGURES") or os.path.join(OUT, "figures")
os.makedirs(FIGURES, exist_ok=True)


def save(fig, name: str) -> None:
    """Show a figure and keep it as a PNG (the docs show these)."""
    fig.savefig(os.path.join(FIGURES, name), dpi=110, bbox_inches="tight")
    plt.show()


print("outputs in", OUT)

# %% [markdown]
# ## 1. A world with known uncertainty
#
# `write_world` writes embedding tables in the same format `asymvlm embed` writes for real data
# sets: `ROOT/<split>/images/*.parquet` and `ROOT/<split>/texts/*.parquet` (unit embeddings,
# the raw norm of the text projection, and here each caption's `level`). The preset `demo` is
# the world of `make demo`: 32 dimensions, 4 captions per image with a COCO-like mix of levels.
# The classification sets beside it (images of 8 classes, images of 8 other concepts, class
# prompts and the dummy prompts "a photo", ...) are what the none-of-the-above decision uses.

# %%
from asymvlm.synthetic import WorldConfig, write_classification_sets, write_world

world_config = WorldConfig.preset("demo", splits={"train": 1500, "val": 300, "test": 300})
world = write_world(os.path.join(OUT, "world"), world_config)
sets = write_classification_sets(world, world_config)
print(world)
print({role: os.path.basename(root) for role, root in sets.items()})

# %% [markdown]
# ## 2. Train AsymVLM
#
# `asymvlm.train` is what `asymvlm train` runs: it reads the split, trains with the
# settings of a `TrainConfig` (the paper's defaults are SGD, 200 epochs, batch 2048 -- here a
# short AdamW run that fits a CPU) and writes a checkpoint folder. The frozen model (`clip`) is
# the reference: it trains nothing.

# %%
from asymvlm import TrainConfig, train

settings = dict(epochs=15, lr=2e-3, optimizer="adamw", batch_size=256, hidden_dim=128, seed=0)
checkpoints, models = {}, {}
for name in ("clip", "asymvlm-vmf"):
    checkpoints[name] = os.path.join(OUT, "checkpoints", name)
    models[name], history = train(
        world,
        "train",
        TrainConfig(method=name, **settings),
        output=checkpoints[name],
        overwrite=True,
        progress=False,
    )
    if history:
        first, last = history[0]["train_loss"], history[-1]["train_loss"]
        print(f"{name}: train loss {first:.3f} -> {last:.3f} over {len(history)} epochs")
print(sorted(os.listdir(checkpoints["asymvlm-vmf"])))

# %% [markdown]
# ## 3. Uncertainty per caption level, and the binned recall curve
#
# The test split's captions have never been seen in training. AsymVLM's κ should grow with
# the level (detailed captions are specific), so 1/κ falls.

# %%
from asymvlm import evaluate
from asymvlm.splits import load_split

test = load_split(world, "test")
level = test.split.extra_text_columns["level"]
with torch.no_grad():
    uncertainty = models["asymvlm-vmf"].text_uncertainty(test.text_emb).numpy()

fig, ax = plt.subplots(figsize=(5, 3.2))
levels = sorted(set(level.tolist()))
ax.boxplot([uncertainty[level == k] for k in levels], showfliers=False)
ax.set_xticks(range(1, len(levels) + 1), [str(k) for k in levels])
ax.set_xlabel("caption level (0 = most general, 3 = the object)")
ax.set_ylabel("uncertainty 1/κ")
ax.set_title("AsymVLM-vMF: uncertainty per caption level")
save(fig, "uncertainty_by_level.png")
for k in levels:
    print(f"level {k}: median 1/κ = {np.median(uncertainty[level == k]):.4f}")

# %% [markdown]
# The paper's Fig. 3: sort the test captions by their uncertainty into 10 equal bins and
# measure text-to-image Recall@1 in each. If the uncertainty means something, recall falls from
# the most certain bin to the least certain one -- Spearman S near -1. `asymvlm.evaluate` is
# what `asymvlm evaluate` runs (on a checkpoint folder or model URI); beside S it reports the
# failure-prediction numbers (AUROC, AUPR and FPR@95TPR of the uncertainty as a detector of
# top-1 errors) and the risk-coverage curve.

# %%
results = {name: evaluate(checkpoints[name], world, "test", device="cpu") for name in models}
vmf = results["asymvlm-vmf"]["t2i"]
print(f"t2i R@1 {vmf['recall@1']:.3f}  (frozen: {results['clip']['t2i']['recall@1']:.3f})")
print(
    f"S {vmf['spearman']:+.2f}  AUROC {vmf['auroc']:.3f}  AUPR {vmf['aupr']:.3f}  "
    f"FPR@95TPR {vmf['fpr@95tpr']:.3f}"
)

fig, ax = plt.subplots(figsize=(5, 3.2))
curve = vmf["binned_recall@1"]
ax.plot(range(1, len(curve) + 1), curve, marker="o", label="AsymVLM-vMF")
ax.axhline(results["clip"]["t2i"]["recall@1"], ls="--", c="gray", label="frozen (overall)")
ax.set_xlabel("uncertainty bin (1 = most certain)")
ax.set_ylabel("t2i Recall@1")
ax.set_title(f"Binned Recall@1 (S = {vmf['spearman']:+.2f})")
ax.legend()
save(fig, "binned_recall.png")

# %% [markdown]
# ## 4. Export the adapter and score captions with the `Scorer`
#
# `asymvlm export` (here `export_adapter`) writes the Hugging Face layout: `model.safetensors`
# (no pickle), `config.json` (method, protocol, encoder, input calibration)
# and a `README.md` model card. `hf upload ORG/REPO FOLDER` publishes it, and
# `Scorer.from_pretrained("hf-hub:ORG/REPO")` loads it back anywhere.
#
# A real adapter embeds new captions with the frozen encoder its tables were made with (the
# checkpoint names it). The synthetic world has no text encoder, so a `TableEncoder` looks the
# captions up in the world's test split instead -- captions the adapter has never seen.

# %%
from asymvlm.checkpoints import export_adapter
from asymvlm.scoring import Scorer, TableEncoder

folder = os.path.join(OUT, "exported", "asymvlm-vmf")
export_adapter(checkpoints["asymvlm-vmf"], folder, overwrite=True)
print(sorted(os.listdir(folder)))
print(open(os.path.join(folder, "README.md")).read()[:400], "...")

scorer = Scorer.from_pretrained(folder, encoder=TableEncoder(world, ["test"]), device="cpu")
texts = list(test.split.texts)
picked = [texts[int(np.flatnonzero(level == k)[0])] for k in levels]
for row in scorer.caption_uncertainty(picked).records():
    print(f"κ = {row['kappa']:8.2f}   1/κ = {row['uncertainty']:.4f}   {row['text']}")

# %% [markdown]
# ## 5. None of the above, and abstaining
#
# **None-of-the-above** (the paper's Table 2): classify images of the classification sets by
# their best-scoring class prompt, with the dummy prompt "a photo" as one more class. A text
# that describes everything is very uncertain, so the paper expects an image of a concept that
# none of the classes names (a *negative*) to match "a photo" better than any class -- and be
# rejected -- while images of the classes (*positives*) keep their class. Whether an adapter
# does so depends on what it learnt about such generic texts: compare the two shares.

# %%
from asymvlm.evaluation.suite import load_classification
from asymvlm.evaluation.zeroshot import ClassPrompts, class_scores

model = models["asymvlm-vmf"]
positives = load_classification(sets["positives"], "test")
negatives = load_classification(sets["negatives"], "test")
prompts = positives.class_prompts("raw")
dummy_text, dummy = next(iter(positives.dummy_inputs("raw").items()))
with_dummy = ClassPrompts(
    inputs=torch.cat([prompts.inputs, dummy]),
    class_index=torch.cat([prompts.class_index, torch.tensor([prompts.n_classes])]),
    n_classes=prompts.n_classes + 1,
)
for label, data in (("positive", positives), ("negative", negatives)):
    images = model.image_rows(data.image_emb, data.image_norm)
    decision = class_scores(model, images, with_dummy).argmax(1)
    rejected = (decision == prompts.n_classes).float().mean()
    print(f"{label} images: {rejected:.1%} rejected as '{dummy_text}'")
    for i in range(3):
        chosen = int(decision[i])
        answer = "none of the above" if chosen == prompts.n_classes else f"class {chosen}"
        truth = f"class {int(data.labels[i])}" if label == "positive" else "no class of the set"
        print(f"   image {i}: {answer:18s} (it shows {truth})")

# %% [markdown]
# **Abstaining** (selective retrieval): answer only the most certain share of the queries. The
# risk-coverage curve is the error rate among the kept queries; a useful uncertainty makes it
# rise from left to right, and its area (AURC) small.

# %%
fig, ax = plt.subplots(figsize=(5, 3.2))
for direction in ("t2i", "i2t"):
    rc = vmf if direction == "t2i" else results["asymvlm-vmf"]["i2t"]
    points = rc["risk_coverage"]
    ax.plot(
        points["coverage"], points["risk"], marker=".", label=f"{direction} (AURC {rc['aurc']:.3f})"
    )
ax.set_xlabel("coverage (share of queries answered)")
ax.set_ylabel("risk (top-1 error rate)")
ax.set_title("Risk-coverage, AsymVLM-vMF")
ax.legend()
save(fig, "risk_coverage.png")

# %% [markdown]
# ## 6. The same code on real data, and on a cluster
#
# **Real tables.** Embed a data set with a frozen CLIP (Ray Data; a local Ray starts by itself)
# and give its root wherever `world` was used above:
#
# ```bash
# asymvlm embed --dataset coco --annotations captions_val2017.json --images val2017/ \
#     --model openai/clip-vit-base-patch32 --split test --output tables/coco
# asymvlm train --embeddings tables/coco --split train --method asymvlm-vmf --output ckpt/
# asymvlm evaluate --embeddings tables/coco --split test --checkpoint ckpt/ --output m.json
# asymvlm export --checkpoint ckpt/ --output exported/ && hf upload ORG/REPO exported/
# ```
#
# An adapter of real tables knows its encoder: `Scorer.from_pretrained("hf-hub:ORG/REPO")`
# embeds new captions (and images) itself -- no `TableEncoder` needed.
#
# **A cluster.** The whole pipeline (embedding, the two-stage Tune sweep over methods, lrs and
# seeds, the evaluations, the report, all tracked in MLflow) is one Ray job:
#
# ```bash
# ray job submit --working-dir . -- python pipelines/full.py --config configs/coco.yaml \
#     --output s3://my-bucket/asymvlm/coco --set mlflow.tracking_uri=https://mlflow.example.com
# ```
#
# The documentation site's *Cluster deployment* page walks through the image, KubeRay and the
# cluster launcher; its *Configuration reference* lists every key.

# %%
print(f"notebook ran in {time.perf_counter() - START:.0f} s; figures in {FIGURES}")
