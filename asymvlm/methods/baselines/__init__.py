"""Probabilistic baselines, ported to cached frozen embeddings (paper Sec. 5, App. B.3).

* ``probvlm`` (:mod:`.probvlm`): ProbVLM (Upadhyay et al. 2023) -- per modality a BayesCap
  adapter predicting a generalised Gaussian per dimension; retrieval by the cosine of mu_hat.
* ``pfe``, ``pcmepp``, ``prolip`` (:mod:`.gaussian`): PFE*, PCME++*, ProLIP*, post-hoc --
  frozen means, a variance head per modality.
* ``elip`` (:mod:`.elip`): ELIP (evidential retrieval) -- residual adapters on both modalities,
  Dirichlet evidence over a gallery, u = K / S.

Every method has the protocols ``improved`` and ``official`` (README "Protocols"). Every
uncertainty is "higher = more uncertain", except ProbVLM's under ``official``, which is the
precision the authors' evaluation ranks by. The post-hoc methods (pfe, pcmepp, prolip) never
move the means, so their retrieval scores are the frozen model's cosines.
"""

from asymvlm.methods.baselines.elip import (
    ELIP,
    bayes_risk,
    dirichlet_alpha,
    evidential_loss,
    evidential_uncertainty,
    misleading_evidence_kl,
)
from asymvlm.methods.baselines.gaussian import (
    PCMEPP,
    PFE,
    ProLIP,
    csd,
    inclusion_hypothesis,
    inclusion_loss,
    log_inclusion,
    mutual_likelihood_score,
    probabilistic_cosine,
    vib_kl,
)
from asymvlm.methods.baselines.probvlm import (
    ProbVLM,
    ggd_nll,
    ggd_variance,
    official_ggd_term,
    official_precision,
)

__all__ = [
    "ELIP",
    "PCMEPP",
    "PFE",
    "ProLIP",
    "ProbVLM",
    "bayes_risk",
    "csd",
    "dirichlet_alpha",
    "evidential_loss",
    "evidential_uncertainty",
    "ggd_nll",
    "ggd_variance",
    "inclusion_hypothesis",
    "inclusion_loss",
    "log_inclusion",
    "misleading_evidence_kl",
    "mutual_likelihood_score",
    "official_ggd_term",
    "official_precision",
    "probabilistic_cosine",
    "vib_kl",
]
