"""The model card of an exported adapter: the ``README.md`` a Hugging Face model folder shows,
its metadata block written by ``huggingface_hub``'s :class:`~huggingface_hub.ModelCardData`."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

from asymvlm.methods import METHODS
from asymvlm.results import DIRECTION_MEANINGS, METRIC_MEANINGS

__all__ = ["model_card", "package_version"]

#: Encoder names that are not models (the tables of a synthetic world).
_NO_ENCODER = "synthetic-world"
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
_METRIC = re.compile(r"(?:(val|test)_)?(t2i|i2t)_(\w+)")
_USE = """\
Research on uncertainty in vision-language retrieval: ranking captions by how specific they \
are, flagging queries whose retrieval is likely wrong, abstaining (risk-coverage), \
none-of-the-above decisions. Not for decisions about people.

## Limits

* The adapter only makes sense on embeddings of the exact frozen encoder named above (its \
revision and file hash are recorded); any other encoder gives meaningless numbers.
* The uncertainty ranks captions within the training domain; on other data it is \
uncalibrated and its meaning is not guaranteed.
* Numbers above come from the run's own tables, not from a public benchmark unless those \
tables are one."""


def package_version() -> str:
    """This package's installed version (without importing the package root)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("asymvlm")
    except PackageNotFoundError:  # run from a source tree that is not installed
        return "unknown"


def _is_local(name: str) -> bool:
    return name.startswith(("/", ".", "~")) or os.sep in name and not _HUB_ID.fullmatch(name)


def _label(name: str) -> str:
    """A Hub id or open_clip name as is, a local folder by its last component."""
    return f"{os.path.basename(name.rstrip('/'))} (a local folder)" if _is_local(name) else name


def _metrics_section(metrics: Mapping[str, float], run: Mapping[str, Any] | None) -> list[str]:
    values: dict[tuple[str, tuple[str, str]], float] = {}
    rsum: dict[str, float] = {}
    for name, value in metrics.items():
        split = "validation" if name.startswith("val_") else "test"
        found = _METRIC.fullmatch(name)
        if name.removeprefix("val_").removeprefix("test_") == "rsum":
            rsum[split] = value
        elif found and found.group(3) in METRIC_MEANINGS:
            values[(found.group(3), (split, found.group(2)))] = value
    order = [(s, d) for s in ("test", "validation") for d in ("t2i", "i2t")]
    columns = [c for c in order if any(col == c for _, col in values)]
    if not columns and not rsum:
        return [
            "No evaluation was recorded with this adapter (exported from a checkpoint "
            "folder): run `asymvlm evaluate` on your tables."
        ]
    run = dict(run or {})
    where = f"MLflow run `{run.get('run_id')}`" + (
        f" (experiment `{run['experiment']}`)" if run.get("experiment") else ""
    )
    meanings = "; ".join(f"**{d}**: {m}" for d, m in DIRECTION_MEANINGS.items())
    lines = [
        f"The final numbers of {where}. {meanings}.",
        "",
        "| metric | " + " | ".join(f"{d} ({s})" for s, d in columns) + " |",
        "|---|" + "---|" * len(columns),
    ]
    shown = [k for k in METRIC_MEANINGS if any((k, c) in values for c in columns)]
    for key in shown:
        cells = [f"{values[(key, c)]:.4f}" if (key, c) in values else "–" for c in columns]
        lines.append(f"| {key} | " + " | ".join(cells) + " |")
    if rsum:
        shares = ", ".join(f"{v:.2f} ({s})" for s, v in rsum.items())
        lines += ["", f"RSUM (both directions, %): {shares}."]
    lines += ["", "What the numbers mean:", ""]
    return lines + [f"* `{k}`: {METRIC_MEANINGS[k]}" for k in [*shown, *(["rsum"] * bool(rsum))]]


def model_card(
    config: Mapping[str, Any],
    *,
    metrics: Mapping[str, float] | None = None,
    source: Mapping[str, Any] | None = None,
    repo: str | None = None,
    license: str = "apache-2.0",
) -> str:
    """The ``README.md`` of an exported adapter: the metadata block, then the method, training
    data and protocol, evaluation (``metrics``, the final values of the MLflow run ``source``),
    use (``repo``: the Hub repository it goes to), intended use and limits."""
    from huggingface_hub import ModelCardData

    method = str(config["method"])
    train = dict(config.get("train_config") or {})
    enc = {"model": config.get("embedding_model"), **(config.get("encoder") or {})}
    name = enc["model"] if isinstance(enc["model"], str) and enc["model"] else None
    base = name if name and name != _NO_ENCODER and not _is_local(name) else None
    base = base if base and _HUB_ID.fullmatch(base) else None
    tags = ["asymvlm", "probabilistic-embeddings", "uncertainty", "vision-language"]
    data = ModelCardData(
        library_name="asymvlm", license=license, tags=[*tags, "clip-adapter", method]
    )
    if base:
        data.base_model = base
    cls = METHODS.get(method)
    summary = (cls.__doc__ or "").strip().splitlines()[0] if cls and cls.__doc__ else None
    spread = cls.uncertainty_doc if cls else "see the method"
    calibration = ", ".join(
        f"{k} = {v:.6g}" for k, v in (config.get("input_calibration") or {}).items()
    )
    rows = [
        ("embedding width", config.get("dim")),
        ("frozen encoder", _label(name) if name else None),
        ("encoder revision", enc.get("revision")),
        ("encoder files SHA-256", enc.get("files_sha256")),
        ("tables", config.get("embeddings")),
        ("split", config.get("split")),
        ("protocol", config.get("protocol") or train.get("protocol")),
        ("adapter input", config.get("adapter_input")),
        ("input calibration", calibration or None),
        ("epochs", f"{config.get('epoch')} of {config.get('epochs')}"),
        ("optimiser", train.get("optimizer")),
        ("learning rate", train.get("lr")),
        ("batch size", train.get("batch_size")),
        ("weight decay", train.get("weight_decay")),
        ("adapter width x depth", f"{train.get('hidden_dim')} x {train.get('depth') or 'default'}"),
        ("seed", train.get("seed")),
    ]
    where = f"hf-hub:{repo}" if repo else "FOLDER"
    if name and name != _NO_ENCODER:
        use = f"""asymvlm score-text --checkpoint {where} "a dog" "a golden retriever catching a \
red frisbee"
```

```python
from asymvlm import Scorer

scorer = Scorer.from_pretrained("{where}")
scorer.caption_uncertainty(["a dog"])  # kappa, uncertainty, mu"""
    else:
        use = f"asymvlm evaluate --checkpoint {where} --embeddings TABLES --split test --output \
metrics.json"
    limits = ""
    if name == _NO_ENCODER:
        limits = """
* Trained on a **synthetic world** (toy embeddings with known uncertainty): for learning and \
testing the method, not for real images or text."""
    elif name and not base:
        limits = f"""
* The encoder is a local folder (`{_label(name)}`, its path in `config.json`): on another \
machine give its copy with `--encoder` (`encoder=`); a copy with other files is refused."""
    table = "\n".join(f"| {k} | `{v}` |" for k, v in rows if v not in (None, "", "None of None"))
    evaluation = "\n".join(_metrics_section(metrics or {}, source))
    return f"""---
{data.to_yaml()}
---

# {method} adapter{f" for {_label(name)}" if name else ""}

A probabilistic adapter for a frozen vision-language model, exported by the `asymvlm` package \
{package_version()} (AsymVLM, Ju et al., NeurIPS 2025, and its baselines): it turns a caption's \
embedding into a distribution whose spread is the caption's uncertainty.

## Method

`{method}`: {summary or "(not a registered method here)"}

Its uncertainty (higher = more uncertain): {spread}.

## Training data and protocol

Trained on cached embeddings of a frozen vision-language model; only the adapter is here, the \
encoder is referenced, not copied.

| setting | value |
|---|---|
{table}

## Evaluation

{evaluation}

## How to use

```bash
pip install asymvlm

{use}
```

Publish a folder with `hf upload ORG/REPO FOLDER` (the folder holds no pickle).

## Intended use

{_USE}{limits}
"""
