"""The paper's evaluations: named in :mod:`~asymvlm.evaluation.registry`, computed on tables by
:mod:`~asymvlm.evaluation.suite`, for the adapters of :mod:`~asymvlm.evaluation.adapters`."""

from asymvlm.evaluation.retrieval import caption_scores, encode_split, evaluate_retrieval

__all__ = ["caption_scores", "encode_split", "evaluate_retrieval"]
