"""``python -m asymvlm.demo [--output DIR]``: the offline single-process demo (no network, no GPU)
-- a synthetic world, the frozen model, Determ. FT and AsymVLM (vMF, PS) on its test split, as
``results.json``, ``results.md`` and ``fig3_synthetic.png``."""

from __future__ import annotations

import json
import logging
import os
import time

import pandas as pd

from asymvlm import logs
from asymvlm.entry import ArgumentParser, guarded
from asymvlm.evaluation.registry import evaluate_split
from asymvlm.metrics import spearman_uncertainty
from asymvlm.report.figures import plot_binned_recall
from asymvlm.report.seed_tables import markdown
from asymvlm.runner import train
from asymvlm.splits import load_split
from asymvlm.synthetic import WorldConfig, write_world
from asymvlm.training import TrainConfig

DEMO_METHODS = ("clip", "determ-ft", "asymvlm-vmf", "asymvlm-ps")

logger = logging.getLogger(__name__)


def results_table(results: dict[str, dict]) -> str:
    """Markdown table in the layout of Table A.2 (i2t | t2i)."""
    cells = [("recall@1", "R@1", ".3f"), ("r2", "R²", ".3f"), ("spearman", "S", "+.3f")]
    rows = [
        {"method": name}
        | {f"{d} {h}": _fmt(r[d][k], f) for d in ("i2t", "t2i") for k, h, f in cells}
        | {"S(u, abstraction)": _fmt(r.get("spearman_uncertainty_abstraction"), "+.3f")}
        for name, r in results.items()
    ]
    return markdown(pd.DataFrame(rows))


def _fmt(x: float | None, spec: str) -> str:
    return "—" if x is None else format(x, spec)  # None: undefined (a constant uncertainty)


def run(output: str, epochs: int = 40, methods: tuple[str, ...] = DEMO_METHODS) -> dict:
    world = os.path.join(output, "world")
    if not os.path.exists(os.path.join(world, "manifest.json")):
        logger.info("writing the synthetic world to %s", world)
        write_world(world, WorldConfig())
    test = load_split(world, "test")
    abstraction = -test.split.extra_text_columns["level"]  # level 0 = most general
    results: dict[str, dict] = {}
    for name in methods:
        t0 = time.perf_counter()
        cfg = TrainConfig(method=name, epochs=epochs, lr=1e-3, optimizer="adamw", hidden_dim=256)
        model, _ = train(
            world, "train", cfg, output=os.path.join(output, "checkpoints", name), overwrite=True
        )  # a re-run of the demo replaces its checkpoints
        res = evaluate_split("retrieval", model, test)
        unc = model.text_uncertainty(test.text_emb)
        res["spearman_uncertainty_abstraction"] = (
            None if unc is None else spearman_uncertainty(unc.detach(), abstraction)
        )
        res["seconds"] = time.perf_counter() - t0
        results[name] = res
        logger.info("%s: t2i R@1 %.3f (%.0f s)", name, res["t2i"]["recall@1"], res["seconds"])
    with open(os.path.join(output, "results.json"), "w") as fh:
        json.dump(results, fh, indent=2)
    table = results_table(results)
    with open(os.path.join(output, "results.md"), "w") as fh:
        fh.write("# AsymVLM demo on the synthetic world (test split)\n\n" + table + "\n")
    fig = plot_binned_recall(results, os.path.join(output, "fig3_synthetic.png"), "(synthetic)")
    logger.info("\n%s\n\nresults: %s/results.md, figure: %s", table, output, fig)
    return results


def main(argv: list[str] | None = None) -> int:
    """Bad input is one ``error:`` line and exit code 2."""

    def demo() -> int:
        parser = ArgumentParser(
            prog="python -m asymvlm.demo",
            description="The offline single-process demo (no network, no GPU): a synthetic "
            "world, the frozen model, Determ. FT and AsymVLM (vMF, PS) on its test split.",
        )
        parser.add_argument(
            "--output", default="outputs/demo", help="output folder (default outputs/demo)"
        )
        parser.add_argument("--epochs", type=int, default=40, help="of each method (default 40)")
        parser.add_argument("--verbose", action="store_true", help="every library's messages too")
        args = parser.parse_args(argv)
        logs.configure(verbose=args.verbose)
        run(args.output, args.epochs)
        return 0

    return guarded(demo)


if __name__ == "__main__":
    raise SystemExit(main())
