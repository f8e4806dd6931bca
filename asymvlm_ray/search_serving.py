"""Ray Serve wiring of the search (docs/search.md): an ingress that encodes the queries and
decides, one deployment per shard that ranks its rows, the page at ``/`` and clip-retrieval's
``/knn-service``. Routes:

* ``POST /search`` ``{"captions": [...], "images": [base64], "k"}`` -> ``{"results": [...]}``,
  one :class:`asymvlm.indexing.SearchResult` per query (captions first);
* ``POST /knn-service``: clip-retrieval's request (``text`` or ``image``, ``modality``,
  ``num_images``) -> its list of ``{"id", "similarity", "caption", "url"}``, plus ``kappa`` and
  ``decision``;
* ``GET /`` the page, ``GET /image/{row}`` an indexed image's file, ``GET /health``.
"""

# No ``from __future__ import annotations``: FastAPI reads the annotations at runtime.
import asyncio
import itertools
import mimetypes
import operator
import os
from importlib.resources import files
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, RedirectResponse
from pydantic import BaseModel
from ray import serve

from asymvlm.indexing.records import Hit
from asymvlm.scoring import ScoringInputError
from asymvlm_ray.schema import SearchConfig
from asymvlm_ray.serve_app import bad_request, checked_captions, decoded_images
from asymvlm_ray.session import require_ray

app = FastAPI(title="asymvlm search", description="a kappa-aware index of images and captions")


class SearchRequest(BaseModel):
    captions: list[str] = []
    images: list[str] = []  # base64 of encoded images
    k: int | None = None


class KnnRequest(BaseModel):
    """clip-retrieval's ``/knn-service`` request; the keys this index has no use for are read
    and left alone (safety and aesthetic models, deduplication, mclip, the index's name)."""

    text: str | None = None
    image: str | None = None
    image_url: str | None = None
    embedding_input: list[float] | None = None
    modality: str = "image"
    num_images: int = 40
    indice_name: str | None = None


@app.exception_handler(ScoringInputError)
def _bad_input(request: Request, exc: ScoringInputError) -> JSONResponse:
    return JSONResponse(status_code=400, content={"detail": str(exc)})


@serve.deployment
class ShardDeployment:
    """One shard of the index (:class:`asymvlm.indexing.shard.Shard`) in one replica."""

    def __init__(self, location: str, shard: int) -> None:
        from asymvlm.indexing.index_folder import Index, local_folder, read_manifest
        from asymvlm.indexing.shard import Shard

        manifest = read_manifest(location)
        index = Index(local_folder(location), manifest)
        self.shard = Shard(index.folder, manifest.shards[shard], index.method, index.form)

    def ranked(self, direction: str, encoding: dict, k: int) -> list[list[Hit]]:
        return self.shard.ranked(direction, encoding, k)

    def cap_counts(self, queries: Any, cosines: Any) -> Any:
        return self.shard.cap_counts(queries, cosines)


class _ShardHandle:
    """A shard replica as the index's merge sees a local shard: a blocking call, made from a
    worker thread (``asyncio.to_thread``), never on the replica's event loop."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle

    def ranked(self, direction: str, encoding: dict, k: int) -> list[list[Hit]]:
        return self.handle.ranked.remote(direction, encoding, k).result()

    def cap_counts(self, queries: Any, cosines: Any) -> Any:
        return self.handle.cap_counts.remote(queries, cosines).result()


@serve.deployment
@serve.ingress(app)
class SearchDeployment:
    """The queries' encoder, the decisions and the merge of the shards' results."""

    def __init__(self, settings: dict[str, Any], shards: list[Any]) -> None:
        from asymvlm.indexing.index_folder import Index, local_folder, read_manifest

        self.cfg = SearchConfig.model_validate(settings)
        if shards:  # a replica per shard, merged here
            manifest = read_manifest(self.cfg.index)
            self.index = Index(local_folder(self.cfg.index), manifest, encoder=self.cfg.encoder)
            self.index.shards = [_ShardHandle(handle) for handle in shards]
        else:  # one shard: searched here, without a hop
            self.index = Index.open(self.cfg.index, encoder=self.cfg.encoder)
        self.index.scorer()  # the encoder loads now, not on the first query
        self._batched.set_max_batch_size(self.cfg.max_batch_size)
        self._batched.set_batch_wait_timeout_s(self.cfg.batch_wait_timeout_s)

    def _k(self, k: int | None) -> int:
        k = self.cfg.k if k is None else k
        if not 1 <= k <= self.cfg.max_k:
            raise bad_request(f"k = {k}: give 1 to {self.cfg.max_k}")
        return k

    @serve.batch(max_batch_size=32, batch_wait_timeout_s=0.01)
    async def _batched(self, requests: list[tuple[list[str], int]]) -> list[list[dict]]:
        """The captions of requests that came together (of one k), encoded and searched as one."""
        out: list[list[dict]] = []
        for k, group in itertools.groupby(requests, key=operator.itemgetter(1)):
            captions = [request[0] for request in group]
            every = [caption for group in captions for caption in group]
            found = iter(await asyncio.to_thread(self.index.search_text, every, k))
            out += [[r.model_dump() for r in itertools.islice(found, len(cs))] for cs in captions]
        return out

    @app.post("/search")
    async def search(self, request: SearchRequest) -> dict[str, Any]:
        captions, images, k = (
            checked_captions(self.cfg, request.captions),
            decoded_images(self.cfg, request.images),
            self._k(request.k),
        )
        if not captions and not images:
            raise bad_request("nothing to search: give captions or images")
        results = []
        if captions:
            if self.cfg.batching:
                results += await self._batched((captions, k))
            else:
                found = await asyncio.to_thread(self.index.search_text, captions, k)
                results += [r.model_dump() for r in found]
        if images:
            found = await asyncio.to_thread(self.index.search_images, images, k)
            results += [r.model_dump() for r in found]
        return {"results": results}

    @app.post("/knn-service")
    async def knn_service(self, request: KnnRequest) -> list[dict[str, Any]]:
        k = self._k(request.num_images)
        if request.text and request.image:
            raise bad_request("give text or image, not both")
        if request.text and request.modality == "image":
            search, queries = self.index.search_text, checked_captions(self.cfg, [request.text])
        elif request.image and request.modality == "text":
            search, queries = self.index.search_images, decoded_images(self.cfg, [request.image])
        else:
            raise bad_request(
                "this index answers text -> image (text, modality image) and image -> text "
                "(image, modality text); not image_url, embedding_input or one modality to itself"
            )
        (result,) = await asyncio.to_thread(search, queries, k)  # the shards are waited on
        return [
            {
                "id": hit.row,
                "similarity": hit.score,
                "caption": hit.text,
                "url": hit.path,
                "image_id": hit.image_id,
                "kappa": result.kappa,
                "decision": result.decision,
            }
            for hit in result.results
        ]

    @app.get("/image/{row}")
    def image(self, row: int) -> Any:
        path = self.index.image_path(row)
        if path is None:
            raise HTTPException(status_code=404, detail=f"image row {row}: no file is known")
        if path.startswith(("http://", "https://")):
            return RedirectResponse(path)
        if not os.path.isfile(path):
            raise HTTPException(status_code=404, detail=f"image row {row}: {path} is not here")
        return FileResponse(path, media_type=mimetypes.guess_type(path)[0] or "image/jpeg")

    @app.get("/")
    def page(self) -> HTMLResponse:
        return HTMLResponse(files("asymvlm_ray").joinpath("search_page.html").read_text())

    @app.get("/health")
    def health(self) -> dict[str, Any]:
        manifest = self.index.manifest
        return {
            "status": "ok",
            "method": manifest.method,
            "encoder": manifest.encoder,
            "random_encoder": manifest.random_encoder,
            "images": manifest.images,
            "captions": manifest.captions,
            "shards": len(manifest.shards),
            "decisions": sorted(manifest.policies),
            "k": self.cfg.k,
        }


def check(cfg: SearchConfig) -> Any:
    """Open the index here, so a bad folder fails before any deployment; its manifest."""
    from asymvlm.indexing.index_folder import read_manifest

    return read_manifest(cfg.index)


def deploy(cfg: SearchConfig) -> str:
    """Start Serve's HTTP proxy on ``host:port``; deploy the ingress and, for an index of
    several shards, a replica per shard."""
    require_ray("Serve")
    manifest = check(cfg)
    serve.start(http_options={"host": cfg.host, "port": cfg.port})
    options = {"num_cpus": cfg.cpus_per_replica, "num_gpus": cfg.gpus_per_replica}
    shards = [
        ShardDeployment.options(name=f"shard-{i}", ray_actor_options=options).bind(cfg.index, i)
        for i in range(len(manifest.shards))
        if len(manifest.shards) > 1
    ]
    ingress = SearchDeployment.options(ray_actor_options=options).bind(cfg.model_dump(), shards)
    serve.run(ingress, name=cfg.name, route_prefix=cfg.route_prefix, blocking=False)
    return f"http://{cfg.host}:{cfg.port}{cfg.route_prefix.rstrip('/')}"
