"""Ray Serve wiring: :class:`asymvlm.Scorer` behind FastAPI. ``POST /uncertainty``
``{"captions"}`` -> ``{"results": [{"text", "kappa", "uncertainty"}]}``; ``POST /score``
``{"captions", "images": [base64]}`` -> ``{"scores"}``; ``GET /health``; bad input: a 400."""

# No ``from __future__ import annotations``: FastAPI reads the annotations at runtime.
import itertools
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from ray import serve

from asymvlm.scoring import ScoringInputError
from asymvlm_ray.schema import ServeConfig
from asymvlm_ray.serve_app import bad_request, checked_captions, decoded_images
from asymvlm_ray.session import require_ray

app = FastAPI(title="asymvlm scorer", description="caption uncertainty of a trained adapter")


class UncertaintyRequest(BaseModel):
    captions: list[str]


class ScoreRequest(BaseModel):
    captions: list[str]
    images: list[str]  # base64 of encoded images (JPEG, PNG, ...)


@app.exception_handler(ScoringInputError)
def _bad_input(request: Request, exc: ScoringInputError) -> JSONResponse:
    return JSONResponse(status_code=400, content={"detail": str(exc)})


def _scorer(cfg: ServeConfig, device: str) -> Any:
    """The scorer of ``cfg`` (defined before the deployment, which is pickled as it is made)."""
    from asymvlm.scoring import Scorer

    return Scorer.from_checkpoint(
        cfg.checkpoint, encoder=cfg.encoder, device=device, tracking_uri=cfg.tracking_uri
    )


@serve.deployment
@serve.ingress(app)
class ScorerDeployment:
    """One replica: the scorer on its device; batched ``/uncertainty`` when ``batching``."""

    def __init__(self, settings: dict[str, Any]) -> None:
        self.cfg = ServeConfig.model_validate(settings)
        self.scorer = _scorer(self.cfg, self.cfg.device)
        self._batched.set_max_batch_size(self.cfg.max_batch_size)
        self._batched.set_batch_wait_timeout_s(self.cfg.batch_wait_timeout_s)

    def _captions(self, captions: list[str]) -> list[str]:
        if not captions:
            raise bad_request("no captions")
        return checked_captions(self.cfg, captions)

    def _images(self, images: list[str]) -> list[bytes]:
        if not images:
            raise bad_request("no images")
        return decoded_images(self.cfg, images)

    @app.get("/health")
    def health(self) -> dict[str, Any]:
        return {
            "status": "ok",
            "method": self.scorer.meta["method"],
            "dim": int(self.scorer.meta["dim"]),
            "encoder": self.scorer.encoder.info.model,
        }

    @app.post("/uncertainty")
    async def uncertainty(self, request: UncertaintyRequest) -> dict[str, Any]:
        captions = self._captions(request.captions)
        if self.cfg.batching:
            return {"results": await self._batched(captions)}
        return {"results": self.scorer.caption_uncertainty(captions).records()}

    @serve.batch(max_batch_size=32, batch_wait_timeout_s=0.01)
    async def _batched(self, requests: list[list[str]]) -> list[list[dict[str, Any]]]:
        """The captions of every request that came together, embedded as one batch."""
        records = iter(self.scorer.caption_uncertainty([c for r in requests for c in r]).records())
        return [list(itertools.islice(records, len(r))) for r in requests]

    @app.post("/score")
    async def score(self, request: ScoreRequest) -> dict[str, Any]:
        captions, images = self._captions(request.captions), self._images(request.images)
        return {"scores": self.scorer.score(images, captions).tolist()}


def check(cfg: ServeConfig) -> dict[str, Any]:
    """Load the scorer here, so a bad checkpoint fails before any deployment; its config."""
    return _scorer(cfg, "cpu").meta


def deploy(cfg: ServeConfig) -> str:
    """Start Serve's HTTP proxy on ``host:port`` and deploy the scorer; returns its URL."""
    require_ray("Serve")
    serve.start(http_options={"host": cfg.host, "port": cfg.port})
    options = {"num_cpus": cfg.cpus_per_replica, "num_gpus": cfg.gpus_per_replica}
    bound = ScorerDeployment.options(
        name=cfg.name, num_replicas=cfg.replicas, ray_actor_options=options
    ).bind(cfg.model_dump())
    serve.run(bound, name=cfg.name, route_prefix=cfg.route_prefix, blocking=False)
    return f"http://{cfg.host}:{cfg.port}{cfg.route_prefix.rstrip('/')}"
