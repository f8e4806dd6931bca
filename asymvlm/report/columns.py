"""What each table of the report shows: its columns, a metric's logged name -> heading (Table 1
also scale and digits), and the captions naming the set-ups. Add a metric to the report here,
once the evaluation logs it (retrieval: named and explained in :mod:`asymvlm.metrics.glossary`)."""

from __future__ import annotations

#: Table 1 cells per direction: (MLflow name without the direction, heading, scale, digits).
TABLE1 = [
    ("recall_at_1", "R@1 (%)", 100.0, 2),
    ("spearman", "S", 1.0, 2),
    ("r2", "R²", 1.0, 2),
    ("auroc", "AUROC", 1.0, 3),
    ("aupr", "AUPR", 1.0, 3),
    ("fpr_at_95tpr", "FPR@95", 1.0, 3),
    ("aurc", "AURC", 1.0, 3),
    ("ece", "ECE", 1.0, 3),
]
TABLE1_BOTH_WAYS = [("rsum", "RSUM", 1.0, 2)]  # after the directions' cells
#: Beside the paper's Table 1 rows, as the paper prints them.
PAPER_TABLE1 = [
    ("recall_at_1", "R@1 (%)", 100, 1),
    ("spearman", "S", 1, 3),
    ("r2", "R²", 1, 3),
]
#: How the names of an uncertainty's numbers and curves end (``t2i_spearman``, ``i2t_e_aurc``):
#: blank for a method declaring no uncertainty.
UNCERTAINTY_METRICS = tuple(
    "spearman r2 auroc aupr fpr_at_95tpr aurc binned_recall@1 risk_coverage".split()
)
PROTOCOL_LABELS = {
    "official": "Protocol: official (the authors' code)",
    "improved": "Protocol: improved (this project's defaults; see README 'Protocols')",
}
#: Table 2 (none-of-the-above); with far negatives the negatives are the sibling ones.
TABLE2 = {"pos_acc": "pos. acc.", "neg_acc": "neg. acc."}
TABLE2_FAR = {**TABLE2, "neg_acc": "sibling neg. rejected", "far_neg_acc": "far neg. rejected"}
TABLE2_SETS = ("CIFAR-10", "CIFAR-100", None)  # the sets' names where a run logs none
#: (Table 3: a column per evaluation set of the run.) The HierarCaps and OOD tables:
HIERARCAPS = {
    "spearman_level_uncertainty": "S(level, uncertainty)",
    "spearman_words_uncertainty": "S(words, uncertainty)",
    "monotone_fraction": "monotone hierarchies",
}
OOD = {
    "t2i_recall_at_1": "t2i R@1",
    "i2t_recall_at_1": "i2t R@1",
    "t2i_mmi": "t2i MMI",
    "i2t_mmi": "i2t MMI",
    "uncertainty_auroc": "unc. AUROC",
}
#: What the paper's Table 2 / Table 3 numbers were measured on, for their column headings.
PAPER_TABLE2_SETUP = "CLIP ViT-B/32 on real data: CIFAR-10 positives, CIFAR-100 negatives"
PAPER_TABLE3_SETUP = (
    "CLIP ViT-B/32 fine-tuned on COCO, real data: CIFAR-10 / CIFAR-100 / STL-10 / ImageNet"
)
