"""The numbers of Ju et al., NeurIPS 2025 (CLIP ViT-B/32), printed beside ours in reports, under
this project's names: Table 1 (means of 5 runs), Table 2 (none-of-the-above, CIFAR-10 positives
/ CIFAR-100 negatives), Table 3 (zero-shot accuracy after fine-tuning)."""

from __future__ import annotations

#: Table 1: dataset -> method -> metric -> value (t2i/i2t Recall@1, R², Spearman S).
_T1 = {
    "coco": {
        "pfe": (0.500, 0.558, -0.722, 0.304, 0.946, -0.988),
        "pcmepp": (0.500, 0.931, -0.996, 0.304, 0.948, -0.990),
        "probvlm": (0.480, 0.951, -0.981, 0.293, 0.979, -1.000),
        "prolip": (0.500, 0.808, -0.908, 0.304, 0.876, -0.985),
        "asymvlm-vmf": (0.561, 0.948, -0.988, 0.392, 0.984, -1.000),
        "asymvlm-ps": (0.558, 0.937, -0.984, 0.390, 0.989, -1.000),
    },
    "flickr30k": {
        "pfe": (0.680, 0.675, -0.832, 0.451, 0.955, -0.998),
        "pcmepp": (0.679, 0.455, -0.178, 0.451, 0.900, -0.918),
        "probvlm": (0.646, 0.826, -0.914, 0.422, 0.964, -0.985),
        "prolip": (0.678, 0.829, -0.954, 0.450, 0.928, -0.978),
        "asymvlm-vmf": (0.688, 0.860, -0.976, 0.504, 0.960, -0.995),
        "asymvlm-ps": (0.688, 0.854, -0.947, 0.498, 0.946, -0.993),
    },
    "cc200k": {
        "pfe": (0.352, 0.857, -0.521, 0.336, 0.988, -0.595),
        "pcmepp": (0.352, 0.198, -0.148, 0.336, 0.779, -0.887),
        "probvlm": (0.316, 0.772, -0.837, 0.302, 0.775, -0.965),
        "prolip": (0.351, 0.968, -0.990, 0.335, 0.992, -1.000),
        "asymvlm-vmf": (0.395, 0.990, -1.000, 0.383, 0.991, -0.998),
        "asymvlm-ps": (0.393, 0.992, -1.000, 0.380, 0.993, -1.000),
    },
}
_T1_COLUMNS = [f"{d}_{m}" for d in ("t2i", "i2t") for m in ("recall_at_1", "r2", "spearman")]
TABLE1: dict[str, dict[str, dict[str, float]]] = {
    dataset: {m: dict(zip(_T1_COLUMNS, v, strict=True)) for m, v in rows.items()}
    for dataset, rows in _T1.items()
}

#: Table 2: dummy prompt -> method -> (positive accuracy, negative accuracy).
_T2_METHODS = ("clip", "determ-ft", "asymvlm-ps", "asymvlm-vmf")
TABLE2: dict[str, dict[str, tuple[float, float]]] = {
    dummy: dict(zip(_T2_METHODS, cells, strict=True))
    for dummy, cells in {
        "a photo": ((0.888, 0.009), (0.769, 0.115), (0.845, 0.547), (0.857, 0.587)),
        "a photo of an object": ((0.888, 0.009), (0.778, 0.037), (0.849, 0.609), (0.858, 0.557)),
        "a photo of something": ((0.888, 0.009), (0.769, 0.125), (0.843, 0.595), (0.857, 0.585)),
    }.items()
}
TABLE2["(none)"] = {"margin": (0.584, 0.579), "threshold": (0.646, 0.560)}

#: Table 3: fine-tuning data set -> method -> evaluation set -> zero-shot accuracy.
_T3_SETS = ("cifar10", "cifar100", "stl10", "imagenet")
_T3 = {
    "coco": {
        "determ-ft": (0.684, 0.300, 0.829, 0.395),
        "asymvlm-ps": (0.847, 0.470, 0.952, 0.502),
        "asymvlm-vmf": (0.837, 0.477, 0.940, 0.507),
    },
    "flickr30k": {
        "determ-ft": (0.688, 0.342, 0.874, 0.369),
        "asymvlm-ps": (0.791, 0.413, 0.920, 0.451),
        "asymvlm-vmf": (0.792, 0.422, 0.918, 0.464),
    },
    "cc200k": {
        "determ-ft": (0.779, 0.411, 0.922, 0.450),
        "asymvlm-ps": (0.861, 0.542, 0.968, 0.520),
        "asymvlm-vmf": (0.866, 0.542, 0.967, 0.527),
    },
    "none": {"clip": (0.888, 0.642, 0.974, 0.632)},
}
TABLE3: dict[str, dict[str, dict[str, float]]] = {
    ft: {m: dict(zip(_T3_SETS, v, strict=True)) for m, v in rows.items()}
    for ft, rows in _T3.items()
}


def matches_paper(model: str | None, dataset: str | None) -> bool:
    """True when our set-up is the paper's (CLIP ViT-B/32 on one of its data sets)."""
    return (
        bool(model)
        and model.rstrip("/").endswith("clip-vit-base-patch32")
        and (dataset in TABLE1 or dataset in TABLE3)
    )
