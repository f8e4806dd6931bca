"""Text in, uncertainty out: new captions (and images) scored with a trained adapter.

* :mod:`~asymvlm.scoring.scorer` -- :class:`Scorer`: the adapter with the frozen encoder its
  tables were embedded with (``asymvlm score-text``, the Serve deployment);
* :mod:`~asymvlm.scoring.lookup` -- :class:`TableEncoder`: captions looked up in tables, for
  adapters of tables without an encoder (the synthetic worlds);
* :mod:`~asymvlm.scoring.models` -- the adapter as MLflow models (embeddings in, captions in),
  logged for every trial of a sweep and served by ``mlflow models serve``.
"""

from asymvlm.scoring.lookup import TableEncoder
from asymvlm.scoring.scorer import NOT_AN_ENCODER, CaptionScores, Scorer, ScoringInputError

__all__ = ["NOT_AN_ENCODER", "CaptionScores", "Scorer", "ScoringInputError", "TableEncoder"]
