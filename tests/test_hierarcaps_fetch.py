"""HierarCaps downloads from a local HTTP server serving the first rows of the real csv."""

from __future__ import annotations

import functools
import hashlib
import http.server
import logging
import shutil
import threading
from pathlib import Path

import pytest

from asymvlm.data import demo_sets, hierarcaps_fetch
from asymvlm.data.hierarcaps_fetch import HierarCapsChecksumError, HierarCapsError
from asymvlm.data.hierarcaps_fetch import locate_hierarcaps as locate
from tests.helpers import free_port, hierarcaps_subset, requires_hierarcaps

pytestmark = requires_hierarcaps
N = 5


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class Handler(http.server.SimpleHTTPRequestHandler):
    def do_GET(self) -> None:
        self.server.requests.append(self.path)  # type: ignore[attr-defined]
        super().do_GET()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def cache(monkeypatch, tmp_path) -> Path:
    """No local copy, the default cache in tmp, no retry sleeps."""
    monkeypatch.delenv("ASYMVLM_HIERARCAPS", raising=False)
    monkeypatch.setattr(demo_sets, "_REPO", str(tmp_path / "elsewhere" / "repo"))
    monkeypatch.setenv("ASYMVLM_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("NO_PROXY", "*")
    monkeypatch.setattr(hierarcaps_fetch, "RETRY_BACKOFF_S", 0.0)
    return tmp_path / "cache" / "hierarcaps"


@pytest.fixture
def served(tmp_path, monkeypatch):
    """(folder, {csv, images} URLs, requests) of a server of the first ``N`` rows."""
    folder = tmp_path / "served"
    csv_path, _ = hierarcaps_subset(folder, n=N)
    monkeypatch.setattr(hierarcaps_fetch, "CSV_SHA256", sha256(Path(csv_path)))
    handler = functools.partial(Handler, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.requests = []  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    urls = {"csv": f"{url}/hierarcaps_test.csv", "images": f"{url}/images/"}
    sources(monkeypatch, **urls)
    yield folder, urls, server.requests
    server.shutdown()
    server.server_close()


def sources(monkeypatch, csv: str | None = None, images: str | None = None) -> None:
    monkeypatch.setenv("ASYMVLM_HIERARCAPS_CSV_URL", csv or "")
    monkeypatch.setenv("ASYMVLM_COCO_IMAGES_URL", images or "")


def messages(caplog, level: int) -> list[str]:
    name = hierarcaps_fetch.__name__
    return [r.getMessage() for r in caplog.records if r.name == name and r.levelno == level]


def test_download_verifies_and_repairs_alone(cache, served, monkeypatch, caplog):
    folder, urls, requests = served
    names = sorted(p.name for p in (folder / "images").iterdir())
    caplog.set_level(logging.INFO, logger=hierarcaps_fetch.__name__)
    assert locate() == str(cache)
    for rel in ["hierarcaps_test.csv", *(f"images/{n}" for n in names)]:
        assert (cache / rel).read_bytes() == (folder / rel).read_bytes()
        assert f"{sha256(cache / rel)}  {rel}" in (cache / "SHA256SUMS").read_text()
    assert sorted(requests) == sorted(["/hierarcaps_test.csv", *(f"/images/{n}" for n in names)])
    assert messages(caplog, logging.INFO) == [
        f"downloading HierarCaps ({N} of {N} images) into {cache}",
        f"HierarCaps ready in {cache}: {N} images downloaded",
    ]
    # the cached copy is verified and used as it is: no request
    requests.clear()
    assert locate() == str(cache) and requests == []

    # a damaged and a missing image are fetched again, alone
    damaged, missing = names[:2]
    good = (cache / "images" / damaged).read_bytes()
    (cache / "images" / damaged).write_bytes(good[: len(good) // 2])
    (cache / "images" / missing).unlink()
    sums = (cache / "SHA256SUMS").read_text()
    assert locate() == str(cache)
    assert sorted(requests) == [f"/images/{damaged}", f"/images/{missing}"]
    assert (cache / "images" / damaged).read_bytes() == good
    assert (cache / "SHA256SUMS").read_text() == sums


def test_a_wrong_csv_is_an_error_and_not_kept(cache, served, monkeypatch):
    folder, urls, requests = served
    actual = hierarcaps_fetch.CSV_SHA256
    monkeypatch.setattr(hierarcaps_fetch, "CSV_SHA256", "0" * 64)
    with pytest.raises(HierarCapsChecksumError, match=rf"{urls['csv']}: .*{'0' * 64}.*{actual}"):
        locate()
    assert not (cache / "hierarcaps_test.csv").exists()
    assert requests == ["/hierarcaps_test.csv"]  # a wrong sum is not retried
    (folder / "hierarcaps_test.csv").write_text("id,captions,image_url\n0,a,http://x/../..\n")
    monkeypatch.setattr(hierarcaps_fetch, "CSV_SHA256", sha256(folder / "hierarcaps_test.csv"))
    with pytest.raises(HierarCapsError, match=r"hierarcaps_test\.csv: row 1: bad image_url"):
        locate()


def test_failed_images_are_named_and_the_rest_kept(cache, served):
    folder, urls, requests = served
    gone, bad = sorted(p.name for p in (folder / "images").iterdir())[2:4]
    shutil.move(folder / "images" / gone, folder / "kept.jpg")
    good = (folder / "images" / bad).read_bytes()
    (folder / "images" / bad).write_bytes(b"<html>not found</html>")
    with pytest.raises(HierarCapsError) as info:
        locate()
    message = str(info.value)
    assert message.startswith(f"HierarCaps download incomplete: 2 of {N} images failed")
    assert f"{urls['images']}{gone}: HTTP 404" in message
    assert f"{bad}: {urls['images']}{bad}: the body is not a decodable image" in message
    assert len(list((cache / "images").iterdir())) == N - 2
    assert not (cache / "SHA256SUMS").exists()  # recorded only once complete
    assert requests.count(f"/images/{gone}") == 1  # a 404 is not retried
    assert requests.count(f"/images/{bad}") == hierarcaps_fetch.RETRIES

    # once the server has them, the next call fetches those images alone
    shutil.move(folder / "kept.jpg", folder / "images" / gone)
    (folder / "images" / bad).write_bytes(good)
    requests.clear()
    assert locate() == str(cache)
    assert sorted(requests) == sorted([f"/images/{gone}", f"/images/{bad}"])


def test_no_network_is_one_warning_and_an_interrupted_download_resumes(
    cache, served, monkeypatch, caplog
):
    _, urls, requests = served
    offline = f"http://127.0.0.1:{free_port()}"
    caplog.set_level(logging.INFO, logger=hierarcaps_fetch.__name__)
    sources(monkeypatch, csv=f"{offline}/x.csv")
    assert locate() is None
    (warning,) = messages(caplog, logging.WARNING)
    assert "network" in warning and "ASYMVLM_HIERARCAPS" in warning and str(cache) in warning
    caplog.clear()
    sources(monkeypatch, csv=urls["csv"], images=f"{offline}/images/")
    assert locate() is None
    assert f"{N} images still missing" in messages(caplog, logging.WARNING)[0]
    assert requests == ["/hierarcaps_test.csv"]
    requests.clear()
    sources(monkeypatch, **urls)
    assert locate() == str(cache)
    assert len(requests) == N and "/hierarcaps_test.csv" not in requests


def test_local_copy_wins(cache, served, monkeypatch, tmp_path):
    monkeypatch.setenv(
        "ASYMVLM_HIERARCAPS", str(Path(hierarcaps_subset(tmp_path / "l", 2)[0]).parent)
    )
    assert locate() == str(tmp_path / "l") and served[2] == [] and not cache.exists()
