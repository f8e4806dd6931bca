"""The model card of an exported adapter: the ``README.md`` a Hugging Face model folder shows.

:func:`model_card` writes it from the folder's ``config.json`` (method, width, protocol, the
training settings, the encoder) and, when the adapter came from an MLflow run, that run's final
metrics with what each means (:data:`asymvlm.results.METRIC_MEANINGS`). It opens with the
metadata block the Hub reads (YAML front matter: ``library_name``, ``license``, ``tags``,
``base_model`` when the encoder is a Hub model) and holds the method, the training data and
protocol, the evaluation numbers, how to load it, the intended use and the limits.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

import yaml

from asymvlm.methods import METHODS
from asymvlm.results import DIRECTION_MEANINGS, METRIC_MEANINGS

__all__ = ["card_metadata", "model_card", "package_version"]

#: Encoder names that are not models (the tables of a synthetic world).
_NO_ENCODER = frozenset({"synthetic-world"})
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
_METRIC = re.compile(r"(?:(val|test)_)?(t2i|i2t)_(\w+)")


def package_version() -> str:
    """This package's installed version (``asymvlm.__version__`` without importing the package
    root, which reaches the layers above)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("asymvlm")
    except PackageNotFoundError:  # run from a source tree that is not installed
        return "unknown"


def _encoder(config: Mapping[str, Any]) -> dict[str, Any]:
    recorded = dict(config.get("encoder") or {})
    recorded.setdefault("model", config.get("embedding_model"))
    return recorded


def _encoder_label(name: Any) -> str | None:
    """How the card names the encoder: a Hub id or open_clip name as is, a local folder by its
    last component (no path of the machine it was trained on)."""
    if not isinstance(name, str) or not name:
        return None
    if name.startswith(("/", ".", "~")) or os.sep in name and not _HUB_ID.fullmatch(name):
        return f"{os.path.basename(name.rstrip('/'))} (a local folder)"
    return name


def _hub_model(name: Any) -> str | None:
    """The Hub id of a transformers encoder name (None for local folders and open_clip)."""
    if not isinstance(name, str) or name in _NO_ENCODER or name.startswith(("/", ".", "~")):
        return None
    return name if _HUB_ID.fullmatch(name) else None


def card_metadata(config: Mapping[str, Any], license: str = "apache-2.0") -> dict[str, Any]:
    """The card's metadata block (what the Hub reads from the YAML front matter)."""
    method = str(config["method"])
    tags = [
        "asymvlm",
        "probabilistic-embeddings",
        "uncertainty",
        "vision-language",
        "clip-adapter",
        method,
    ]
    meta: dict[str, Any] = {"library_name": "asymvlm", "license": license, "tags": tags}
    base = _hub_model(_encoder(config).get("model"))
    if base:
        meta["base_model"] = base
    return meta


def _method_section(method: str) -> list[str]:
    cls = METHODS.get(method)
    doc = (cls.__doc__ or "").strip().splitlines() if cls else []
    first = doc[0].strip() if doc else "(not a registered method here)"
    unc = cls.uncertainty_doc if cls else "see the method"
    return [
        "## Method",
        "",
        f"`{method}`: {first}",
        "",
        f"Its uncertainty (higher = more uncertain): {unc}.",
        "",
    ]


def _training_section(config: Mapping[str, Any]) -> list[str]:
    train = dict(config.get("train_config") or {})
    enc = _encoder(config)
    rows = [
        ("embedding width", config.get("dim")),
        ("frozen encoder", _encoder_label(enc.get("model"))),
        ("encoder revision", enc.get("revision")),
        ("encoder files SHA-256", enc.get("files_sha256")),
        ("tables", config.get("embeddings")),
        ("split", config.get("split")),
        ("protocol", config.get("protocol") or train.get("protocol")),
        ("adapter input", config.get("adapter_input")),
        (
            "input calibration",
            ", ".join(f"{k} = {v:.6g}" for k, v in (config.get("input_calibration") or {}).items())
            or None,
        ),
        ("epochs", f"{config.get('epoch')} of {config.get('epochs')}"),
        ("optimiser", train.get("optimizer")),
        ("learning rate", train.get("lr")),
        ("batch size", train.get("batch_size")),
        ("weight decay", train.get("weight_decay")),
        ("adapter width x depth", f"{train.get('hidden_dim')} x {train.get('depth') or 'default'}"),
        ("seed", train.get("seed")),
    ]
    lines = [
        "## Training data and protocol",
        "",
        "Trained on cached embeddings of a frozen vision-language model; only the adapter "
        "is here, the encoder is referenced, not copied.",
        "",
        "| setting | value |",
        "|---|---|",
    ]
    lines += [f"| {k} | `{v}` |" for k, v in rows if v not in (None, "", "None of None")]
    return [*lines, ""]


def _metric_table(metrics: Mapping[str, float]) -> tuple[list[tuple[str, str]], dict, dict]:
    """(the (split, direction) columns present, {(metric, column): value}, {split: rsum})."""
    values: dict[tuple[str, tuple[str, str]], float] = {}
    rsum: dict[str, float] = {}
    for name, value in metrics.items():
        split = "validation" if name.startswith("val_") else "test"
        if name.removeprefix("val_").removeprefix("test_") == "rsum":
            rsum[split] = value
            continue
        found = _METRIC.fullmatch(name)
        if found and found.group(3) in METRIC_MEANINGS:
            values[(found.group(3), (split, found.group(2)))] = value
    order = [(s, d) for s in ("test", "validation") for d in ("t2i", "i2t")]
    columns = [c for c in order if any(col == c for _, col in values)]
    return columns, values, rsum


def _metrics_section(metrics: Mapping[str, float], source: Mapping[str, Any] | None) -> list[str]:
    lines = ["## Evaluation", ""]
    columns, values, rsum = _metric_table(metrics)
    if not columns and not rsum:
        return [
            *lines,
            "No evaluation was recorded with this adapter (exported from a "
            "checkpoint folder): run `asymvlm evaluate` on your tables.",
            "",
        ]
    run = dict(source or {})
    where = f"MLflow run `{run.get('run_id')}`" + (
        f" (experiment `{run['experiment']}`)" if run.get("experiment") else ""
    )
    lines += [
        f"The final numbers of {where}. "
        + "; ".join(f"**{d}**: {m}" for d, m in DIRECTION_MEANINGS.items())
        + ".",
        "",
        "| metric | " + " | ".join(f"{d} ({s})" for s, d in columns) + " |",
        "|---|" + "---|" * len(columns),
    ]
    shown = [k for k in METRIC_MEANINGS if any((k, c) in values for c in columns)]
    for key in shown:
        cells = [f"{values[(key, c)]:.4f}" if (key, c) in values else "–" for c in columns]
        lines.append(f"| {key} | " + " | ".join(cells) + " |")
    if rsum:
        lines += [
            "",
            "RSUM (both directions, %): "
            + ", ".join(f"{v:.2f} ({s})" for s, v in rsum.items())
            + ".",
        ]
    lines += ["", "What the numbers mean:", ""]
    lines += [f"* `{k}`: {METRIC_MEANINGS[k]}" for k in [*shown, *(["rsum"] if rsum else [])]]
    return [*lines, ""]


def _use_section(repo: str | None, config: Mapping[str, Any]) -> list[str]:
    name = f"hf-hub:{repo}" if repo else "FOLDER"
    enc = _encoder(config).get("model")
    lines = ["## How to use", "", "```bash", "pip install asymvlm", ""]
    if enc and enc not in _NO_ENCODER:
        lines += [
            f'asymvlm score-text --checkpoint {name} "a dog" "a golden retriever catching '
            'a red frisbee"',
            "```",
            "",
            "```python",
            "from asymvlm import Scorer",
            "",
            f'scorer = Scorer.from_pretrained("{name}")',
            'scorer.caption_uncertainty(["a dog"])  # kappa, uncertainty, mu',
            "```",
        ]
    else:
        lines += [
            f"asymvlm evaluate --checkpoint {name} --embeddings TABLES --split test "
            "--output metrics.json",
            "```",
        ]
    lines += [
        "",
        "Publish a folder with `hf upload ORG/REPO FOLDER` (the folder holds no pickle; "
        "`config.json` records the SHA-256 of `model.safetensors`, checked on load).",
        "",
    ]
    return lines


def _limits_section(config: Mapping[str, Any]) -> list[str]:
    enc = _encoder(config).get("model")
    lines = [
        "## Intended use",
        "",
        "Research on uncertainty in vision-language retrieval: ranking captions by how "
        "specific they are, flagging queries whose retrieval is likely wrong, abstaining "
        "(risk-coverage), none-of-the-above decisions. Not for decisions about people.",
        "",
        "## Limits",
        "",
        "* The adapter only makes sense on embeddings of the exact frozen encoder named "
        "above (its revision and file hash are recorded); any other encoder gives "
        "meaningless numbers.",
        "* The uncertainty ranks captions within the training domain; on other data it is "
        "uncalibrated and its meaning is not guaranteed.",
        "* Numbers above come from the run's own tables, not from a public benchmark unless "
        "those tables are one.",
    ]
    if enc in _NO_ENCODER:
        lines.append(
            "* Trained on a **synthetic world** (toy embeddings with known uncertainty): "
            "for learning and testing the method, not for real images or text."
        )
    elif enc and not _hub_model(enc):
        lines.append(
            f"* The encoder is a local folder (`{_encoder_label(enc)}`, its path in "
            "`config.json`): on another machine give its copy with `--encoder` "
            "(`encoder=`); a copy with other files is refused."
        )
    return [*lines, ""]


def model_card(
    config: Mapping[str, Any],
    *,
    metrics: Mapping[str, float] | None = None,
    source: Mapping[str, Any] | None = None,
    repo: str | None = None,
    license: str = "apache-2.0",
) -> str:
    """The ``README.md`` of an exported adapter: the metadata block, then the method, training
    data and protocol, evaluation (``metrics``, the run's final values; ``source``: the run's
    ``run_id`` and ``experiment``), use (``repo``: the Hub repository it goes to, for the
    snippets), intended use and limits."""
    head = yaml.safe_dump(card_metadata(config, license), sort_keys=False, allow_unicode=True)
    method = str(config["method"])
    lines = [
        "---",
        head.rstrip(),
        "---",
        "",
        f"# {method} adapter"
        + (
            f" for {_encoder_label(_encoder(config).get('model'))}"
            if _encoder(config).get("model")
            else ""
        ),
        "",
        "A probabilistic adapter for a frozen vision-language model, exported by the "
        f"`asymvlm` package {package_version()} (AsymVLM, Ju et al., NeurIPS 2025, and its "
        "baselines): it turns a caption's embedding into a distribution whose spread is "
        "the caption's uncertainty.",
        "",
    ]
    lines += _method_section(method)
    lines += _training_section(config)
    lines += _metrics_section(metrics or {}, source)
    lines += _use_section(repo, config)
    lines += _limits_section(config)
    return "\n".join(lines).rstrip() + "\n"
