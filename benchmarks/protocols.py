"""Every method with an official implementation, under both protocols, on one synthetic world.

    python benchmarks/protocols.py [--epochs 20] [--hidden-dim 256] [--output DIR]

Trains asymvlm-vmf, asymvlm-ps, probvlm, pfe, pcmepp and prolip with ``protocol: official`` (the
authors' code: init, loss, uncertainty, their per-method optimiser and lr) and ``improved``
(this project's; SGD 1e-2 for all), one seed, on the default synthetic world
(:class:`asymvlm.synthetic.WorldConfig`), and prints one JSON object: per method and protocol
the test split's Recall@1, Spearman S and R² of the binned curve, AUROC and AURC in both
directions, the Spearman of the caption uncertainty with the caption's specificity (level) and
the seconds it took; a run whose loss diverged is reported as such. Both protocols train the
same number of epochs with the same adapter width
(``--hidden-dim``; ProbVLM's official backbone keeps its two hidden layers).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

from asymvlm.errors import NonFiniteError
from asymvlm.evaluation import evaluate_retrieval
from asymvlm.metrics import spearman_uncertainty
from asymvlm.runner import train
from asymvlm.splits import load_split
from asymvlm.synthetic import WorldConfig, write_world
from asymvlm.training import TrainConfig

METHODS = ("asymvlm-vmf", "asymvlm-ps", "probvlm", "pfe", "pcmepp", "prolip")
KEYS = ("recall@1", "spearman", "r2", "auroc", "aurc")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--hidden-dim", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=2048)
    parser.add_argument("--methods", nargs="+", default=list(METHODS))
    parser.add_argument("--output", default=None, help="folder for the world and checkpoints")
    args = parser.parse_args(argv)
    output = args.output or tempfile.mkdtemp(prefix="protocols-")
    world = os.path.join(output, "world")
    if not os.path.exists(os.path.join(world, "manifest.json")):
        write_world(world, WorldConfig())
    test = load_split(world, "test")
    level = test.split.extra_text_columns["level"]  # 0 = most general caption
    rows: dict[str, dict] = {}
    for method in args.methods:
        for protocol in ("official", "improved"):
            t0 = time.perf_counter()
            cfg = TrainConfig(
                method=method,
                protocol=protocol,
                epochs=args.epochs,
                hidden_dim=args.hidden_dim,
                batch_size=args.batch_size,
                device="cpu",
            )
            ckpt = os.path.join(output, "checkpoints", f"{method}-{protocol}")
            try:
                model, _ = train(world, "train", cfg, output=ckpt, overwrite=True)
            except NonFiniteError as err:  # a result too: this protocol's defaults diverge
                rows[f"{method}/{protocol}"] = {
                    "optimizer": cfg.optimizer,
                    "lr": cfg.lr,
                    "diverged": str(err).split(":")[0],
                }
                print(f"{method}/{protocol}: diverged ({err})", file=sys.stderr, flush=True)
                continue
            res = evaluate_retrieval(model, test)
            unc = model.text_uncertainty(test.text_emb)
            row = {f"{d}_{k}": res[d].get(k) for d in ("t2i", "i2t") for k in KEYS}
            row.update(
                optimizer=cfg.optimizer,
                lr=cfg.lr,
                spearman_uncertainty_level=spearman_uncertainty(unc.detach(), level),
                seconds=round(time.perf_counter() - t0, 1),
            )
            rows[f"{method}/{protocol}"] = row
            print(f"{method}/{protocol}: {row}", file=sys.stderr, flush=True)
    print(
        json.dumps(
            {
                "epochs": args.epochs,
                "hidden_dim": args.hidden_dim,
                "world": "WorldConfig()",
                "results": rows,
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
