"""HierarCaps downloads (asymvlm.data.hierarcaps_fetch) against a local HTTP server.

The server (127.0.0.1, a free port) serves the first rows of the real HierarCaps csv and their
real images, copied from the shared read-only copy into a temporary folder; it counts the
requests. The environment never points at the real cache or the real local copy.
"""

from __future__ import annotations

import functools
import hashlib
import http.server
import logging
import shutil
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from asymvlm.data import demo_sets, hierarcaps_fetch
from asymvlm.data.hierarcaps_fetch import (
    HierarCapsChecksumError,
    HierarCapsError,
    locate_hierarcaps,
)
from tests.helpers import HIERARCAPS, hierarcaps_subset, requires_hierarcaps

pytestmark = requires_hierarcaps

N_ROWS = 5
LOGGER = hierarcaps_fetch.__name__


@dataclass
class Served:
    """What the test server serves: ``folder`` (csv + images/) under ``url``."""

    folder: Path
    url: str
    requests: list[str] = field(default_factory=list)

    @property
    def base_urls(self) -> dict[str, str]:
        return {"csv": f"{self.url}/hierarcaps_test.csv", "images": f"{self.url}/images/"}

    @property
    def names(self) -> list[str]:
        return sorted(p.name for p in (self.folder / "images").iterdir())


class _Handler(http.server.SimpleHTTPRequestHandler):
    """Serves a folder and records every request's path on the server."""

    def do_GET(self) -> None:
        self.server.requests.append(self.path)  # type: ignore[attr-defined]
        super().do_GET()

    def log_message(self, format: str, *args: object) -> None:
        pass


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _closed_port() -> int:
    """A port on 127.0.0.1 where nothing listens."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def no_local(monkeypatch, tmp_path) -> Path:
    """No local copy (neither ``$ASYMVLM_HIERARCAPS`` nor one beside the checkout), the default
    cache in tmp, no mirror variables, no proxy, no retry sleeps; returns the cache folder."""
    monkeypatch.delenv("ASYMVLM_HIERARCAPS", raising=False)
    monkeypatch.delenv("ASYMVLM_HIERARCAPS_CSV_URL", raising=False)
    monkeypatch.delenv("ASYMVLM_COCO_IMAGES_URL", raising=False)
    monkeypatch.setattr(demo_sets, "_REPO", str(tmp_path / "elsewhere" / "repo"))
    cache = tmp_path / "cache"
    monkeypatch.setenv("ASYMVLM_CACHE", str(cache))
    for var in ("no_proxy", "NO_PROXY"):
        monkeypatch.setenv(var, "*")
    monkeypatch.setattr(hierarcaps_fetch, "RETRY_BACKOFF_S", 0.0)
    monkeypatch.setattr(hierarcaps_fetch, "TIMEOUT_S", 10.0)
    assert demo_sets.find_hierarcaps() is None
    return cache


@pytest.fixture
def served(tmp_path, monkeypatch) -> Iterator[Served]:
    """A server on 127.0.0.1 serving the first ``N_ROWS`` rows of the real csv and their
    images; the pinned csv sum is replaced by the small csv's."""
    assert HIERARCAPS is not None
    folder = tmp_path / "served"
    csv_path, _ = hierarcaps_subset(folder, n=N_ROWS)
    monkeypatch.setattr(hierarcaps_fetch, "CSV_SHA256", _sha256(Path(csv_path)))
    handler = functools.partial(_Handler, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.requests = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        host, port = server.server_address[:2]
        yield Served(folder, f"http://{host}:{port}", server.requests)  # type: ignore[attr-defined]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def _messages(caplog, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == level]


def test_download_layout_sums_and_no_request_on_second_call(no_local, served, monkeypatch, caplog):
    # the mirror variables and the default cache ($ASYMVLM_CACHE) are what the call uses
    monkeypatch.setenv("ASYMVLM_HIERARCAPS_CSV_URL", served.base_urls["csv"])
    monkeypatch.setenv("ASYMVLM_COCO_IMAGES_URL", served.base_urls["images"])
    caplog.set_level(logging.INFO, logger=LOGGER)
    root = locate_hierarcaps()
    assert root == str(no_local / "hierarcaps")
    root_p = Path(root)
    assert (root_p / "hierarcaps_test.csv").read_bytes() == (
        served.folder / "hierarcaps_test.csv"
    ).read_bytes()
    assert sorted(p.name for p in (root_p / "images").iterdir()) == served.names
    for name in served.names:
        assert (root_p / "images" / name).read_bytes() == (
            served.folder / "images" / name
        ).read_bytes()
    # sha256sum's format, one line per file
    lines = (root_p / "SHA256SUMS").read_text().splitlines()
    expected = ["hierarcaps_test.csv", *(f"images/{n}" for n in served.names)]
    assert sorted(line.split("  ", 1)[1] for line in lines) == sorted(expected)
    for line in lines:
        digest, rel = line.split("  ", 1)
        assert digest == _sha256(root_p / rel)
    assert sorted(served.requests) == sorted(
        ["/hierarcaps_test.csv", *(f"/images/{n}" for n in served.names)]
    )
    infos = _messages(caplog, logging.INFO)
    assert len(infos) == 2, infos
    assert infos[0] == f"downloading HierarCaps ({N_ROWS} images) into {root}"
    assert infos[1].startswith(f"HierarCaps ready in {root}: {N_ROWS} images downloaded")
    assert not _messages(caplog, logging.WARNING)

    # the cached copy is verified and used as it is: no request, no log line
    served.requests.clear()
    caplog.clear()
    assert locate_hierarcaps() == root
    assert served.requests == []
    assert not _messages(caplog, logging.INFO)
    # nor with downloads disabled
    assert locate_hierarcaps(download=False) == root
    assert served.requests == []


def test_damaged_and_missing_images_are_fetched_again_alone(no_local, served, tmp_path, caplog):
    cache = tmp_path / "other-cache"
    root = Path(locate_hierarcaps(cache, base_urls=served.base_urls))
    assert root == cache / "hierarcaps"
    sums_before = (root / "SHA256SUMS").read_text()
    damaged, missing = served.names[0], served.names[1]
    good = (root / "images" / damaged).read_bytes()
    (root / "images" / damaged).write_bytes(good[: len(good) // 2])  # a truncated jpeg
    (root / "images" / missing).unlink()
    served.requests.clear()
    caplog.set_level(logging.INFO, logger=LOGGER)
    caplog.clear()  # only the repair's messages
    assert locate_hierarcaps(cache, base_urls=served.base_urls) == str(root)
    assert sorted(served.requests) == sorted([f"/images/{damaged}", f"/images/{missing}"])
    assert (root / "images" / damaged).read_bytes() == good
    assert (root / "images" / missing).is_file()
    assert (root / "SHA256SUMS").read_text() == sums_before
    assert _messages(caplog, logging.INFO)[0] == (
        f"downloading HierarCaps (2 of {N_ROWS} images) into {root}"
    )
    # with downloads disabled, a damaged cache is not used: None and one warning
    (root / "images" / damaged).write_bytes(b"not a jpeg")
    served.requests.clear()
    caplog.clear()
    assert locate_hierarcaps(cache, download=False, base_urls=served.base_urls) is None
    assert served.requests == []
    warnings = _messages(caplog, logging.WARNING)
    assert len(warnings) == 1 and "1 of 5 cached images missing or damaged" in warnings[0]


def test_csv_checksum_mismatch_is_an_error_naming_url_and_sums(no_local, served, monkeypatch):
    actual = hierarcaps_fetch.CSV_SHA256
    monkeypatch.setattr(hierarcaps_fetch, "CSV_SHA256", "0" * 64)
    with pytest.raises(HierarCapsChecksumError) as info:
        locate_hierarcaps(base_urls=served.base_urls)
    message = str(info.value)
    assert served.base_urls["csv"] in message
    assert "0" * 64 in message and actual in message
    assert not (no_local / "hierarcaps" / "hierarcaps_test.csv").exists()
    assert served.requests == ["/hierarcaps_test.csv"]  # a wrong sum is not retried


def test_image_404_is_an_error_naming_the_file_and_the_rest_is_kept(no_local, served):
    gone = served.names[2]
    kept = served.folder / "kept.jpg"
    shutil.move(served.folder / "images" / gone, kept)
    with pytest.raises(HierarCapsError) as info:
        locate_hierarcaps(base_urls=served.base_urls)
    message = str(info.value)
    assert gone in message and "HTTP 404" in message
    assert f"{served.base_urls['images']}{gone}" in message
    assert message.startswith(f"HierarCaps download incomplete: 1 of {N_ROWS} images failed")
    root = no_local / "hierarcaps"
    assert sorted(p.name for p in (root / "images").iterdir()) == served.names
    assert not (root / "SHA256SUMS").exists()  # recorded only once complete
    assert served.requests.count(f"/images/{gone}") == 1  # a 404 is not retried

    # once the server has it, the next call fetches that image alone
    shutil.move(kept, served.folder / "images" / gone)
    served.requests.clear()
    assert locate_hierarcaps(base_urls=served.base_urls) == str(root)
    assert served.requests == [f"/images/{gone}"]
    assert (root / "SHA256SUMS").is_file()


def test_undecodable_image_is_retried_then_an_error(no_local, served):
    bad = served.names[0]
    (served.folder / "images" / bad).write_bytes(b"<html>not found</html>")
    with pytest.raises(HierarCapsError, match=rf"{bad}: .*not a decodable image"):
        locate_hierarcaps(base_urls=served.base_urls)
    assert served.requests.count(f"/images/{bad}") == hierarcaps_fetch.RETRIES
    assert not (no_local / "hierarcaps" / "images" / bad).exists()


def test_no_network_returns_none_with_one_warning(no_local, caplog):
    port = _closed_port()
    urls = {
        "csv": f"http://127.0.0.1:{port}/hierarcaps_test.csv",
        "images": f"http://127.0.0.1:{port}/images/",
    }
    caplog.set_level(logging.INFO, logger=LOGGER)
    assert locate_hierarcaps(base_urls=urls) is None
    records = [r for r in caplog.records if r.name == LOGGER]
    assert len(records) == 1 and records[0].levelno == logging.WARNING
    message = records[0].getMessage()
    assert "\n" not in message
    assert "ASYMVLM_HIERARCAPS" in message and "network" in message
    assert str(no_local / "hierarcaps") in message

    caplog.clear()
    assert locate_hierarcaps(download=False, base_urls=urls) is None
    assert len(_messages(caplog, logging.WARNING)) == 1


def test_interrupted_download_resumes_without_fetching_the_csv_again(no_local, served, caplog):
    offline_images = {**served.base_urls, "images": f"http://127.0.0.1:{_closed_port()}/images/"}
    caplog.set_level(logging.WARNING, logger=LOGGER)
    assert locate_hierarcaps(base_urls=offline_images) is None  # csv fetched, images not
    warnings = _messages(caplog, logging.WARNING)
    assert len(warnings) == 1 and f"{N_ROWS} images still missing" in warnings[0]
    assert served.requests == ["/hierarcaps_test.csv"]
    served.requests.clear()
    root = locate_hierarcaps(base_urls=served.base_urls)
    assert root == str(no_local / "hierarcaps")
    assert sorted(served.requests) == sorted(f"/images/{n}" for n in served.names)


def test_local_copy_wins_without_any_request(no_local, served, monkeypatch, tmp_path):
    local = tmp_path / "local"
    hierarcaps_subset(local, n=2)
    monkeypatch.setenv("ASYMVLM_HIERARCAPS", str(local))
    assert demo_sets.find_hierarcaps() == str(local)
    assert locate_hierarcaps(base_urls=served.base_urls) == str(local)
    assert served.requests == []
    assert not no_local.exists()


def test_unknown_base_url_key_is_rejected(no_local):
    with pytest.raises(ValueError, match="unknown key"):
        locate_hierarcaps(base_urls={"cvs": "http://127.0.0.1:1/x.csv"})
