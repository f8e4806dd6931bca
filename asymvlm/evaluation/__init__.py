"""Evaluations of the paper, each usable from Python, the CLI and the pipeline."""

from asymvlm.evaluation.retrieval import caption_scores, encode_split, evaluate_retrieval

__all__ = ["caption_scores", "encode_split", "evaluate_retrieval"]
