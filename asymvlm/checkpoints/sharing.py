"""Adapters shared as model folders (docs/sharing.md): where one comes from
(:func:`resolve_checkpoint`) and its export as a Hugging Face model folder with a model card."""

from __future__ import annotations

import logging
import math
import os
import re
import string
from collections.abc import Mapping
from importlib import resources
from importlib.metadata import version
from typing import Any

from asymvlm.checkpoints.folder import (
    CONFIG_FILE,
    EXPORT_FORMAT,
    WEIGHTS_FILE,
    check_no_pickle,
    load_checkpoint,
    publish_folder,
    read_checkpoint_meta,
    sibling_paths,
    write_config,
    write_weights,
)
from asymvlm.config import redact
from asymvlm.embedding.encoders.names import local_source
from asymvlm.errors import AsymVLMError, CheckpointError, ConfigError
from asymvlm.extras import check_extras
from asymvlm.methods import METHODS
from asymvlm.metrics.glossary import DIRECTION_MEANINGS, METRIC_MEANINGS
from asymvlm.tracking.queries import STORE_URIS

logger = logging.getLogger(__name__)

#: Encoder names that are not models (the tables of a synthetic world).
_NO_ENCODER = "synthetic-world"
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
_METRIC = re.compile(r"(?:(val|test)_)?(?:(?:t2i|i2t)_)?(.*)")
#: The exported README.md, filled by :func:`model_card` (``string.Template``).
_CARD = "model_card.md"


HUB_PREFIX = "hf-hub:"
NO_STORE = "no tracking store configured; give --tracking-uri or set MLFLOW_TRACKING_URI"


def is_model_uri(source: str) -> bool:
    """Whether ``source`` names an MLflow model or a Hub repository, not a local folder."""
    return "://" in source or source.startswith((*STORE_URIS, HUB_PREFIX))


def _hub_snapshot(source: str) -> str:
    """The local snapshot of ``hf-hub:ORG/REPO[@REVISION]`` (downloaded, or from the cache)."""
    from huggingface_hub import errors as hub
    from huggingface_hub import snapshot_download, utils

    repo, at, revision = source.removeprefix(HUB_PREFIX).partition("@")
    if not _HUB_ID.fullmatch(repo) or (at and not revision):
        raise CheckpointError(
            f"{source}: not a Hub model name (hf-hub:ORG/REPO or hf-hub:ORG/REPO@REVISION)"
        )
    quiet = utils.are_progress_bars_disabled()
    utils.disable_progress_bars()  # a few small files: no bars on the console
    try:
        return snapshot_download(repo, revision=revision or None)
    except hub.RevisionNotFoundError:
        reason = f"the repository has no revision {revision!r}"
    except hub.RepositoryNotFoundError:  # gated ones too
        reason = "no such repository on the Hub (or it is private or gated: hf auth login)"
    except hub.LocalEntryNotFoundError:
        reason = "not in the Hugging Face cache, and the Hub cannot be reached (or HF_HUB_OFFLINE)"
    except Exception as exc:  # a proxy, a server error, a full disk...
        reason = " ".join(str(exc).split())[:300] or type(exc).__name__
    finally:
        if not quiet:
            utils.enable_progress_bars()
    raise CheckpointError(f"{source}: cannot download the model: {reason}")


def resolve_checkpoint(
    source: str, tracking_uri: str | None = None, *, pretrained: bool = False
) -> str:
    """A local checkpoint folder for ``source`` (a folder, an MLflow model URI or a Hub name); a
    model folder (Hub snapshot, export, any folder with ``pretrained``) with a pickle is refused."""
    if source.startswith(HUB_PREFIX):
        folder, pretrained = _hub_snapshot(source), True
    elif not is_model_uri(source):
        if not os.path.isdir(source):
            raise CheckpointError(
                f"{source}: no such folder (a checkpoint is a folder, runs:/..., models:/... "
                "or hf-hub:ORG/REPO)"
            )
        folder = source
        meta = read_checkpoint_meta(source) or {}
        pretrained = pretrained or meta.get("format") == EXPORT_FORMAT
    else:
        from asymvlm.tracking import download

        check_extras("tracking")  # named before the store it would read
        store = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
        if not store and source.startswith(STORE_URIS):
            raise ConfigError(f"{source}: {NO_STORE}")
        try:
            local = download(source, store)
        except (ImportError, AsymVLMError):  # no MLflow (the extra is named), no such store
            raise
        except Exception as exc:  # any failure of the store or the URI: one line naming it
            where = f" from {redact(store)}" if store else ""
            raise CheckpointError(f"{source}: cannot download the model{where}: {exc}") from None
        folder = next((d for d, _, files in sorted(os.walk(local)) if CONFIG_FILE in files), local)
    if pretrained:
        check_no_pickle(folder, source)
    if read_checkpoint_meta(folder) is None:
        raise CheckpointError(f"{source}: not a checkpoint folder (no {CONFIG_FILE})")
    if not os.path.isfile(os.path.join(folder, WEIGHTS_FILE)):
        raise CheckpointError(f"{source}: no {WEIGHTS_FILE} (a partial copy or upload?)")
    return folder


def _local(name: str) -> str | None:
    """The local files of an encoder name (a folder, ``open_clip:local-dir:...``), else None."""
    try:
        return local_source(name)
    except ValueError:  # a malformed open_clip name: not a folder either
        return None


def _label(name: str) -> str:
    """A Hub id or open_clip name as is, a local folder by its last component."""
    local = _local(name)
    return f"{os.path.basename(local.rstrip('/'))} (a local folder)" if local else name


def _evaluation(metrics: Mapping[str, float], run: Mapping[str, Any] | None) -> str:
    """The card's evaluation: one row per final metric of the run, then what each means."""
    rows, keys = [], []
    for name, value in metrics.items():
        key = _METRIC.fullmatch(name).group(2)  # type: ignore[union-attr]
        if key in METRIC_MEANINGS:
            split = "validation" if name.startswith("val_") else "test"
            rows.append(f"| {name} | {split} | {value:.4f} |")
            keys += [key] * (key not in keys)
    if not rows or not run:
        return (
            "No evaluation was recorded with this adapter (exported from a checkpoint "
            "folder): run `asymvlm evaluate` on your tables."
        )
    experiment = f" (experiment `{run['experiment']}`)" if run.get("experiment") else ""
    meanings = "; ".join(f"**{d}**: {m}" for d, m in DIRECTION_MEANINGS.items())
    return "\n".join(
        [
            f"The final numbers of MLflow run `{run.get('run_id')}`{experiment}. {meanings}.",
            "",
            "| metric | split | value |",
            "|---|---|---|",
            *rows,
            "",
            "What the numbers mean:",
            "",
            *(f"* `{k}`: {METRIC_MEANINGS[k]}" for k in keys),
        ]
    )


def model_card(
    config: Mapping[str, Any],
    *,
    metrics: Mapping[str, float] | None = None,
    source: Mapping[str, Any] | None = None,
    repo: str | None = None,
    license: str = "apache-2.0",
) -> str:
    """The ``README.md`` of an exported adapter (``metrics`` of the run ``source``)."""
    from huggingface_hub import ModelCardData

    method = str(config["method"])
    train = dict(config.get("train_config") or {})
    enc = {"model": config.get("embedding_model"), **(config.get("encoder") or {})}
    name = enc["model"] if isinstance(enc["model"], str) and enc["model"] else None
    base = name if name and not _local(name) and _HUB_ID.fullmatch(name) else None
    tags = ["asymvlm", "probabilistic-embeddings", "uncertainty", "vision-language", "clip-adapter"]
    data = ModelCardData(
        library_name="asymvlm", license=license, tags=[*tags, method], base_model=base
    )
    cls = METHODS.get(method)
    summary = (cls.__doc__ or "").strip().splitlines()[0] if cls and cls.__doc__ else None
    package = config.get("method_package") or {}  # a method from an installed plugin
    plugin = f"{package['name']}=={package['version']}" if package.get("name") else ""
    versions = {n: config.get(f"{n}_version") for n in ("asymvlm", "torch")}
    trained_with = ", ".join(f"{n} {v}" for n, v in versions.items() if v) or None
    size = config.get("adapter_size") or {}
    calibration = ", ".join(
        f"{k} = {v:.6g}" for k, v in (config.get("input_calibration") or {}).items()
    )
    epochs = (config.get("epoch"), config.get("epochs"))
    rows = [
        ("embedding width", config.get("dim")),
        ("frozen encoder", _label(name) if name else None),
        ("encoder revision", enc.get("revision")),
        ("encoder files SHA-256", enc.get("files_sha256")),
        ("tables", config.get("embeddings")),
        ("split", config.get("split")),
        ("tables fingerprint", config.get("tables_fingerprint")),
        ("protocol", config.get("protocol") or train.get("protocol")),
        ("adapter input", config.get("adapter_input")),
        ("input calibration", calibration or None),
        ("epochs", "{} of {}".format(*epochs) if None not in epochs else None),
        ("optimizer", train.get("optimizer")),
        ("lr", train.get("lr")),
        ("batch_size", train.get("batch_size")),
        ("weight_decay", train.get("weight_decay")),
        ("adapter width x depth", f"{size['hidden_dim']} x {size['depth']}" if size else None),
        ("seed", train.get("seed")),
        ("trained with", trained_with),
        ("git commit", config.get("git_commit")),
    ]
    where = f"hf-hub:{repo}" if repo else "FOLDER"
    if name and name != _NO_ENCODER:
        usage = (
            f'asymvlm score-text --checkpoint {where} "a dog" "a golden retriever catching a red '
            f'frisbee"\n```\n\n```python\nfrom asymvlm import Scorer\n\n'
            f'scorer = Scorer.from_pretrained("{where}")\n'
            'scorer.caption_uncertainty(["a dog"])  # kappa, uncertainty, mu'
        )
    else:
        usage = (
            f"asymvlm evaluate --checkpoint {where} --embeddings TABLES --split test "
            "--output metrics.json"
        )
    limits = ""
    if name == _NO_ENCODER:
        limits = (
            "\n* Trained on a **synthetic world** (toy embeddings with known uncertainty): for "
            "learning and testing the method, not for real images or text."
        )
    elif name and _local(name):
        limits = (
            f"\n* The encoder is a local folder (`{_label(name)}`, its path in `config.json`): on "
            "another machine give its copy with `--encoder` (`encoder=`); a copy with other "
            "files is refused."
        )
    origin = f" (from the package `{plugin}`)" if plugin else ""
    template = resources.files(__package__).joinpath(_CARD).read_text(encoding="utf-8")
    return string.Template(template).substitute(
        card_data=data.to_yaml(),
        title=f"{method} adapter" + (f" for {_label(name)}" if name else ""),
        asymvlm_version=version("asymvlm"),
        method_line=f"`{method}`{origin}: {summary or '(not a registered method here)'}",
        uncertainty=cls.uncertainty_doc if cls else "see the method",
        settings="\n".join(f"| {k} | `{v}` |" for k, v in rows if v not in (None, "")),
        evaluation=_evaluation(metrics or {}, source),
        install="asymvlm" + (f" {plugin}" if plugin else ""),
        usage=usage,
        limits=limits,
    )


def _check_target(output: str, source_folder: str, overwrite: bool) -> None:
    """Refuse the checkpoint's own folder, one holding other files, an export without overwrite."""
    target = sibling_paths(output)[0]
    if target == os.path.realpath(source_folder):
        raise CheckpointError(f"{output}: the checkpoint's own folder; export to a new folder")
    if not os.path.lexists(target) or os.path.isdir(target) and not os.listdir(target):
        return
    try:
        earlier = (read_checkpoint_meta(target) or {}).get("format") == EXPORT_FORMAT
    except CheckpointError:  # an unreadable config.json: not ours
        earlier = False
    if not (earlier and overwrite):
        what = "files that are not an exported model; choose a new or empty folder"
        what = "an exported model; pass --overwrite to replace it" if earlier else what
        raise CheckpointError(f"{output} already holds {what}")


def export_adapter(
    source: str,
    output: str,
    *,
    tracking_uri: str | None = None,
    repo: str | None = None,
    license: str = "apache-2.0",
    overwrite: bool = False,
) -> dict[str, Any]:
    """Export the adapter of ``source`` into the model folder ``output``; its ``config.json``."""
    folder = resolve_checkpoint(source, tracking_uri)
    method, meta = load_checkpoint(folder, "cpu")
    _check_target(output, folder, overwrite)
    state = method.state_dict()
    run = None  # the MLflow run that logged source, if any
    if source.startswith(("runs:/", "models:/")):
        from asymvlm.tracking import model_run

        try:
            run = model_run(source, tracking_uri)
        except Exception as exc:  # the store cannot say: the card says no run was recorded
            reason = " ".join(str(exc).split())[:200]
            logger.warning(
                "%s: its run cannot be read (%s); the card has no evaluation", source, reason
            )
    config = dict(meta)
    if meta.get("embeddings"):  # no path of this machine in a published folder
        config["embeddings"] = os.path.basename(str(meta["embeddings"]).rstrip("/"))
    config.update(
        format=EXPORT_FORMAT,
        asymvlm_version=meta.get("asymvlm_version") or version("asymvlm"),
        protocol=(meta.get("train_config") or {}).get("protocol")
        or (meta.get("method_kwargs") or {}).get("protocol"),
        input_calibration={
            k: float(v) for k, v in state.items() if k.endswith("input_scale") and v.numel() == 1
        },
    )
    metrics: dict[str, float] = {}
    if run is not None:
        metrics = {
            k: float(v)
            for k, v in sorted(run["metrics"].items())
            if isinstance(v, int | float) and math.isfinite(v)
        }
        config["source"] = {
            "mlflow_run_id": run["run_id"],
            "run_name": run["run_name"],
            "experiment": run["experiment"],
        }
        config["metrics"] = metrics
    card = model_card(config, metrics=metrics, source=run, repo=repo, license=license)

    def write(staging: str) -> None:
        write_weights(state, staging)
        write_config(config, staging)
        with open(os.path.join(staging, "README.md"), "w", encoding="utf-8") as fh:
            fh.write(card)

    publish_folder(output, write)
    logger.info("exported %s (%s) -> %s", source, meta["method"], output)
    return config
