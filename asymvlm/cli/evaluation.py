"""``asymvlm evaluate``, ``score`` and ``analyze <kind>``: :mod:`asymvlm.evaluation.registry` on the
command line, its flags made from the evaluations' specs (:mod:`asymvlm.evaluation.specs`)."""

from __future__ import annotations

import argparse
import json
import logging

from asymvlm.cli.flags import (
    Help,
    add_data_args,
    add_output_file,
    add_tracking_uri,
    check_output_file,
    parse_kv,
)
from asymvlm.errors import ConfigError

logger = logging.getLogger(__name__)
COMMANDS = {
    "evaluate": "retrieval + uncertainty metrics of a checkpoint",
    "score": "per-caption kappa and uncertainty",
    "analyze": "the paper's evaluations (Tables 1-3, Figs. 3 and 5) and the OOD suite",
}


def _loading(args: argparse.Namespace) -> dict[str, object]:
    """How :mod:`asymvlm.api` loads the checkpoint and the split."""
    keys = "checkpoint embeddings split device adapter_input allow_incomplete tracking_uri".split()
    return {k: getattr(args, k) for k in keys}


def cmd_evaluate(args: argparse.Namespace) -> int:
    """The registry's ``retrieval`` of one checkpoint on one split (:func:`asymvlm.evaluate`)."""
    from asymvlm import api, storage
    from asymvlm.evaluation.specs import spec
    from asymvlm.tables import Location

    keys = ("levels", "fold_size", "chunk_size", "memory_budget")
    options = {k: getattr(args, k) for k in keys}
    values = {"data": Location(args.embeddings, args.split)} | options
    spec("retrieval", values, "asymvlm evaluate", flags=True)  # errors name the flags
    check_output_file(args)
    result = api.evaluate(**_loading(args), progress=not args.quiet, **options)
    if args.output:
        storage.write_text(args.output, json.dumps(result, indent=2, allow_nan=False))  # atomic
    for direction in ("t2i", "i2t"):
        r = result[direction]

        def shown(key: str, spec: str = ".3f", r: dict = r) -> str:
            return "n/a" if r.get(key) is None else format(r[key], spec)

        print(
            f"{direction}: R@1 {r['recall@1']:.4f}  R@5 {r['recall@5']:.4f}  "
            f"R@10 {r['recall@10']:.4f}  S {shown('spearman', '+.3f')}  R2 {shown('r2')}  "
            f"AUROC {shown('auroc')}  AUPR {shown('aupr')}  FPR@95TPR {shown('fpr@95tpr')}  "
            f"ECE {shown('ece')}"
        )
    if args.output:
        logger.info("every metric (binned recall, risk-coverage ...) written to %s", args.output)
    return 0


def cmd_score(args: argparse.Namespace) -> int:
    """A row per caption (:func:`asymvlm.score`) written as parquet."""
    import pyarrow.parquet as pq

    from asymvlm import api, storage

    if not args.output.endswith(".parquet"):
        raise ConfigError(f"--output {args.output}: write a .parquet file")
    check_output_file(args)
    table = api.score(**_loading(args))
    with storage.atomic_path(args.output) as (fs, tmp):
        pq.write_table(table, tmp, filesystem=fs)
    unc = table.column("uncertainty")
    if unc.null_count == len(unc):
        logger.info("%s defines no caption uncertainty (column is null)", args.checkpoint)
    logger.info("%d captions scored -> %s", table.num_rows, args.output)
    return 0


def _flag(key: str) -> str:
    return "--" + {"sets": "set"}.get(key, key).replace("_", "-")


def cmd_analyze(args: argparse.Namespace) -> int:
    from asymvlm import storage
    from asymvlm.evaluation import registry
    from asymvlm.evaluation.adapters import checkpoint_adapters, sweep_adapters
    from asymvlm.evaluation.specs import SPECS, spec

    values: dict[str, object] = {}
    for key in SPECS[args.kind].model_fields:
        value = getattr(args, key, None)
        if isinstance(value, list):  # NAME=ROOT:SPLIT, repeated
            value = parse_kv(value, _flag(key), METAVARS[key])
        values[key] = value
    parsed = spec(args.kind, values, f"asymvlm analyze {args.kind}", flags=True)
    check_output_file(args)
    methods = checkpoint_adapters(args.checkpoint, tracking_uri=args.tracking_uri)
    if args.sweep:
        if not args.tracking_uri:
            raise ConfigError("--sweep needs --tracking-uri (or $MLFLOW_TRACKING_URI)")
        methods.update(sweep_adapters(args.tracking_uri, args.sweep))
    if args.frozen or not methods:
        methods = registry.with_frozen(methods, parsed)
    result = registry.evaluate(parsed, methods)
    text = json.dumps(result, indent=2, default=float)
    print(text)
    if args.output:
        storage.write_text(args.output, text + "\n")
    if args.tracking_uri:
        dumped = parsed.model_dump(mode="json", exclude={"kind"}, exclude_none=True)
        params = {k: v for k, v in dumped.items() if isinstance(v, str | int)}
        if args.kind == "zeroshot":
            params.setdefault("fine_tuned_on", "?")
        run_id = registry.log_evaluation(
            args.tracking_uri, args.experiment, args.kind, result, params=params
        )
        logger.info("logged as MLflow run %s", run_id)
    return 0


def _add_checkpoint_args(p: argparse.ArgumentParser) -> None:
    where = (
        "a checkpoint or model folder, an MLflow model URI (runs:/.., models:/..; "
        "store: --tracking-uri) or hf-hub:ORG/REPO[@REVISION]"
    )
    p.add_argument("--checkpoint", required=True, metavar="DIR|URI", help=where)
    add_tracking_uri(p)
    reads = "override what the checkpoint says it reads"
    p.add_argument("--adapter-input", choices=["raw", "unit"], help=reads)
    incomplete = "accept an incomplete checkpoint (a run in progress, killed or diverged)"
    p.add_argument("--allow-incomplete", action="store_true", help=incomplete)


METAVARS = {
    "memory_budget": "BYTES",
    "template_aggregation": "mean|logmeanexp",
    "sets": "NAME=ROOT:SPLIT",
    "perturbed": "KIND:SEVERITY=ROOT:SPLIT",
}


def _add_inputs(p: argparse.ArgumentParser, kind: str, skip: tuple[str, ...] = ()) -> None:
    """An option per field of the evaluation's spec (which validates it), repeated for a map."""
    from asymvlm.evaluation.specs import SPECS

    for key, info in SPECS[kind].model_fields.items():
        if key == "kind" or key in skip:
            continue
        tp = str(info.annotation)
        repeat = tp.startswith("dict")
        p.add_argument(
            _flag(key),
            dest=key,
            required=info.is_required() and not repeat,
            action="append" if repeat else "store",
            default=None if info.is_required() else info.default,
            metavar=METAVARS.get(key)
            or ("N" if "[int," in tp else "ROOT:SPLIT" if "Location" in tp else "TEXT"),
            help=info.description,
        )


def register(sub: argparse._SubParsersAction) -> None:
    from asymvlm.evaluation.specs import SPECS

    p = sub.add_parser(
        "evaluate",
        help=COMMANDS["evaluate"],
        description="Recall@{1,5,10} both ways, binned Recall@1 by uncertainty, Spearman S, R2 "
        "(the registry's retrieval, as `asymvlm analyze retrieval`).",
        formatter_class=Help,
    )
    add_data_args(p, "test")
    _add_checkpoint_args(p)
    _add_inputs(p, "retrieval", skip=("data",))
    add_output_file(p, "FILE.json", "also write every metric as JSON (binned, curves)")
    p.set_defaults(func=cmd_evaluate)

    p = sub.add_parser("score", help=COMMANDS["score"], formatter_class=Help)
    add_data_args(p, "test")
    _add_checkpoint_args(p)
    add_output_file(p, "FILE.parquet", "a row per caption", required=True)
    p.set_defaults(func=cmd_score)

    p = sub.add_parser(
        "analyze",
        help=COMMANDS["analyze"],
        description="Run one evaluation of the paper (Table 1, Tables 2-3, Fig. 5) or the OOD "
        "suite on embedding tables, for adapters from checkpoint folders or a sweep's seed runs; "
        "prints JSON, optionally logs an MLflow run that `asymvlm report` picks up. "
        "`asymvlm analyze KIND --help` lists the options of one.",
    )
    kinds = p.add_subparsers(dest="kind", required=True, metavar="KIND")
    for kind, model in SPECS.items():
        k = kinds.add_parser(
            kind,
            help=model.title,
            description=f"{model.title[0].upper()}{model.title[1:]}. Locations are ROOT:SPLIT of "
            "embedding tables.",
            formatter_class=Help,
        )
        _add_inputs(k, kind)
        each = "adapter folder, MLflow model URI or hf-hub:ORG/REPO (repeat)"
        k.add_argument("--checkpoint", action="append", default=[], metavar="DIR|URI", help=each)
        k.add_argument("--sweep", default=None, help="a sweep's MLflow run id: its seed adapters")
        k.add_argument("--frozen", action="store_true", help="also the frozen model (clip)")
        add_output_file(k, "FILE.json", "write the JSON here too")
        logged = "runs:/, --sweep are read from and the result logged to (none: not logged)"
        add_tracking_uri(k, logged)
        k.add_argument("--experiment", default="asymvlm", help="MLflow experiment")
        k.set_defaults(func=cmd_analyze)
