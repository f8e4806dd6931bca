"""Evaluations of the paper, each usable from Python, the CLI, the pipeline and the protocol.

:mod:`~asymvlm.evaluation.registry` names every kind (retrieval, zero-shot, none-of-the-above,
HierarCaps, OOD) with its typed inputs; :mod:`~asymvlm.evaluation.suite` computes them on
embedding tables; :mod:`~asymvlm.evaluation.adapters` gives the adapters to evaluate.
"""

from asymvlm.evaluation.retrieval import caption_scores, encode_split, evaluate_retrieval

__all__ = ["caption_scores", "encode_split", "evaluate_retrieval"]
