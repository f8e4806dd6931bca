"""The search on Ray Serve (asymvlm_ray/search_serving.py): the same answers as the index in
process, shards merged as one index, clip-retrieval's route, bad requests, and the page in a
real headless browser (Debian's chromium)."""

from __future__ import annotations

import base64
import os
import shutil
from typing import Any

import pytest

from asymvlm.cli import main as cli_main
from asymvlm.indexing import Index, IndexSettings, build_index
from tests.helpers import free_port, hierarcaps_subset, post_json, requires_hierarcaps

pytestmark = [requires_hierarcaps, pytest.mark.slow]


@pytest.fixture(scope="module")
def indexed(ray_session, tmp_path_factory) -> dict[str, Any]:
    """HierarCaps images embedded with a tiny random CLIP (a test and a val split), an adapter,
    and its index in one shard and in two."""
    from asymvlm.data.tiny import save_tiny_clip

    base = tmp_path_factory.mktemp("search-serving")
    model = save_tiny_clip(str(base / "tiny-clip"))
    csv, images = hierarcaps_subset(base / "hc", n=12)
    root, checkpoint = str(base / "tables"), str(base / "adapter")
    for split in ("test", "val"):
        command = (
            f"embed --dataset hierarcaps --annotations {csv} --images {images} --model {model} "
            f"--split {split} --output {root} --batch-size 12"
        )
        assert cli_main(command.split()) == 0
    train = f"train --embeddings {root} --split test --method asymvlm-ps --epochs 3 --quiet"
    assert cli_main([*train.split(), "--output", checkpoint]) == 0
    one, two = str(base / "index-1"), str(base / "index-2")
    build_index(root, "test", checkpoint, one)
    build_index(root, "test", checkpoint, two, IndexSettings(shards=2))
    return {"one": one, "two": two, "images": images, "tables": root}


@pytest.fixture(scope="module")
def served(indexed):
    """The two-shard index on Ray Serve on 127.0.0.1; its URL."""
    from ray import serve

    from asymvlm_ray.schema import SearchConfig
    from asymvlm_ray.search_serving import deploy

    cfg = SearchConfig(
        index=indexed["two"], port=free_port(), cpus_per_replica=0.5, name="test-search"
    )
    try:
        yield deploy(cfg)
    finally:
        serve.shutdown()


def _same(served: Any, here: Any) -> bool:
    """The same answers: ids, texts and decisions exactly, numbers to 1e-6 (the
    replica's encodings differ from this process's in their last bits)."""
    if isinstance(here, dict):
        return served.keys() == here.keys() and all(_same(served[k], here[k]) for k in here)
    if isinstance(here, list):
        return len(served) == len(here) and all(map(_same, served, here))
    if isinstance(here, float):
        return served == pytest.approx(here, rel=1e-6)
    return served == here


def _captions(indexed) -> list[str]:
    from asymvlm import tables

    return list(tables.read_split(indexed["tables"], "test").texts[:6])


def test_served_answers_are_the_indexs_answers(indexed, served) -> None:
    captions = _captions(indexed)
    local = Index.open(indexed["one"])
    status, body = post_json(served + "/search", {"captions": captions, "k": 4})
    assert status == 200
    assert _same(body["results"], [r.model_dump() for r in local.search_text(captions, 4)])
    names = sorted(os.listdir(indexed["images"]))[:2]
    raw = [open(os.path.join(indexed["images"], n), "rb").read() for n in names]
    payload = {"images": [base64.b64encode(b).decode() for b in raw], "k": 3}
    status, body = post_json(served + "/search", payload)
    want = [r.model_dump() for r in local.search_images(raw, 3)]
    assert status == 200 and _same(body["results"], want)
    assert all(hit["text"] and hit["kappa"] > 0 for r in body["results"] for hit in r["results"])


def test_clip_retrievals_client_request_is_answered(indexed, served) -> None:
    caption = _captions(indexed)[0]
    request = {
        "text": caption,
        "modality": "image",
        "num_images": 5,
        "indice_name": "x",
        "deduplicate": True,
        "use_safety_model": True,
        "aesthetic_score": 9,
    }
    status, body = post_json(served + "/knn-service", request)
    (want,) = Index.open(indexed["one"]).search_text([caption], 5)
    assert status == 200
    assert [r["id"] for r in body] == [h.row for h in want.results]
    assert _same([r["similarity"] for r in body], [h.score for h in want.results])
    assert {r["decision"] for r in body} <= {want.decision} and all(r["url"] for r in body)


@pytest.mark.parametrize(
    ("route", "payload", "message"),
    [
        ("search", {"captions": ["a dog"], "k": 0}, "k = 0: give 1 to 1000"),
        ("search", {}, "nothing to search: give captions or images"),
        ("search", {"captions": [" "]}, "caption 0: empty"),
        ("search", {"images": ["not base64!"]}, "image 0: not base64"),
        ("knn-service", {"text": "a dog", "modality": "text"}, "this index answers text -> image"),
    ],
)
def test_a_bad_request_is_a_400_with_its_reason(served, route, payload, message) -> None:
    status, body = post_json(f"{served}/{route}", payload)
    assert status == 400 and body["detail"].startswith(message)


def test_the_page_shows_kappa_the_decision_and_thumbnails_in_a_browser(indexed, served) -> None:
    if not shutil.which("chromedriver"):
        pytest.fail("chromium and its driver are not installed (scripts/setup.sh installs them)")
    from selenium import webdriver
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    answers = Index.open(indexed["one"]).search_text(_captions(indexed), 10)
    want = next(answer for answer in answers if answer.results)  # one with results to show
    caption = want.query
    options = webdriver.ChromeOptions()
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage"):
        options.add_argument(flag)
    browser = webdriver.Chrome(options=options)
    try:
        browser.get(served + "/")
        wait = WebDriverWait(browser, 30)
        wait.until(lambda b: not b.find_element(By.ID, "warning").get_attribute("hidden"))
        assert "random test encoder" in browser.find_element(By.ID, "warning").text
        browser.find_element(By.ID, "query").send_keys(caption)
        browser.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
        wait.until(lambda b: b.find_element(By.ID, "decision").text)
        assert browser.find_element(By.ID, "kappa").text == f"{want.kappa:.2f}"
        assert browser.find_element(By.ID, "decision").text == want.decision
        figures = browser.find_elements(By.CSS_SELECTOR, "figure.hit")
        assert len(figures) == len(want.results)
        shown = [f.find_element(By.TAG_NAME, "figcaption").text.split(" ")[1] for f in figures]
        assert shown == [hit.image_id for hit in want.results]
        loaded = "return [...document.images].every(i => i.complete && i.naturalWidth > 0)"
        wait.until(lambda b: b.execute_script(loaded))
    finally:
        browser.quit()
