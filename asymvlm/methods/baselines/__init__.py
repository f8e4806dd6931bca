"""Probabilistic baselines on cached frozen embeddings (paper Sec. 5, App. B.3): ProbVLM
(:mod:`.probvlm`), the post-hoc Gaussians PFE*, PCME++*, ProLIP* (:mod:`.gaussian`) and ELIP
(:mod:`.elip`). Importing this package registers them."""

from asymvlm.methods.baselines import elip, gaussian, probvlm

__all__ = ["elip", "gaussian", "probvlm"]
