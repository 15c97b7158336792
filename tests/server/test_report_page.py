"""The report pages (server/observe/report_page.py, server/doors/pages_router.py, `faithproxy report --html`):
rendered from real verified requests (the proxy on 127.0.0.1 in front of a fake vLLM chain and the
local judge) and read in a real browser, Debian's chromium headless through chromium-driver and
selenium, with JavaScript off. Chain A has a planted step the judge flags and a rewrite fixes; chain B's
planted step has every rewrite flagged too, so it is sent residual; both have reasoning steps the
judge gate keeps from the judge (gated). Also: escaping of hostile model text, keys, 404s, filters.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from faithproxy.benchmarks.standins.judge_server import create_app as create_judge_app
from faithproxy.clients.judges import JudgeConfig
from faithproxy.server.app import create_app
from faithproxy.server.observe.report_page import (
    ListedReports,
    list_row,
    render_report,
    report_row,
    step_label,
    view_of_report,
    view_of_trace,
)
from faithproxy.server.observe.reports import ReportStore
from faithproxy.server.settings import Settings
from faithproxy.testing import Chain, FakeUpstream, corrected_sentence, planted_sentence, threaded_app

KEY = "sk-report-page"
AUTH = {"Authorization": f"Bearer {KEY}"}
FIXED = (6, 1, 2)  # chain n, seed, planted index: fixed by the first rewrite
RESIDUAL = (6, 2, 3)  # its rewrites are flagged as well
HOSTILE = '<script>document.title="owned"</script><img src=x onerror="document.title=1">'


def _body(n: int, seed: int, planted: int, model: str = "chain-model") -> dict[str, Any]:
    content = f"chain n={n} seed={seed} planted={planted}"
    return {"model": model, "stream": True, "messages": [{"role": "user", "content": content}]}


@contextlib.contextmanager
def _proxy(trace: Path) -> Iterator[str]:
    """The proxy in its own thread and loop: the browser's calls block this one."""
    oracle = {"unfaithful": [planted_sentence(*FIXED), planted_sentence(*RESIDUAL), corrected_sentence(*RESIDUAL)]}
    with threaded_app(create_judge_app(oracle)) as judge_url:
        judge = JudgeConfig(
            name="j", backend="anthropic", model="judge-model", base_url=judge_url, api_key="sk-test", max_retries=0
        )  # type: ignore[arg-type]
        settings = Settings(upstream_url="http://vllm.test", judges=[judge], api_keys=[KEY], trace_path=str(trace))  # type: ignore[arg-type]
        app = create_app(settings, upstream_transport=FakeUpstream(Chain(token_s=0.0, ttft_s=0.0)).transport())
        with threaded_app(app) as url:
            yield url


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    """A headless chromium with JavaScript off. Missing browser or driver: the test fails (CI installs
    them with scripts/install_chromium.sh), it does not skip."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    binary, driver_path = shutil.which("chromium"), shutil.which("chromedriver")
    assert binary and driver_path, "chromium and chromedriver are needed: bash scripts/install_chromium.sh"
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1200,1600"):
        options.add_argument(flag)
    options.add_experimental_option("prefs", {"profile.managed_default_content_settings.javascript": 2})
    driver = webdriver.Chrome(options=options, service=Service(driver_path))
    try:
        driver.execute_cdp_cmd("Network.enable", {})
        driver.execute_cdp_cmd("Network.setExtraHTTPHeaders", {"headers": AUTH})  # the API key, as curl would
        yield driver
    finally:
        driver.quit()


def _steps(driver: Any) -> dict[str, list[Any]]:
    from selenium.webdriver.common.by import By

    out: dict[str, list[Any]] = {}
    for item in driver.find_elements(By.CSS_SELECTOR, "ol.steps > li"):
        out.setdefault(item.get_attribute("data-label") or "", []).append(item)
    return out


def _not_blank(png: bytes) -> None:
    from PIL import Image

    image = Image.open(io.BytesIO(png)).convert("L")
    low, high = image.getextrema()
    assert image.size[0] >= 800 and high - low > 100  # text on a background, not one flat colour


def test_pages_of_real_verified_requests_in_chromium(chromium: Any, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    trace = tmp_path / "trace.jsonl"
    with _proxy(trace) as url, httpx.Client(timeout=60, headers=AUTH) as http:
        ids = {}
        for name, chain in (("fixed", FIXED), ("residual", RESIDUAL)):
            response = http.post(f"{url}/v1/chat/completions", json=_body(*chain))
            assert response.status_code == 200
            ids[name] = response.headers["x-faithproxy-request-id"]
        # the same keys as the API
        assert (http.get(f"{url}/reports", headers={"Authorization": "Bearer wrong"})).status_code == 401
        assert (http.get(f"{url}/reports/{ids['fixed']}", headers={"Authorization": ""})).status_code == 401
        missing = http.get(f"{url}/reports/no-such-id")
        assert missing.status_code == 404 and "unknown or expired" in missing.text

        chromium.get(f"{url}/reports")
        links = [a.get_attribute("href") for a in chromium.find_elements(By.CSS_SELECTOR, "#reports a")]
        assert links == [f"{url}/reports/{ids['residual']}", f"{url}/reports/{ids['fixed']}"]  # newest first
        assert chromium.find_elements(By.TAG_NAME, "script") == []
        chromium.get(f"{url}/reports?verdict=residual")
        assert [a.text for a in chromium.find_elements(By.CSS_SELECTOR, "#reports a")] == [ids["residual"]]
        chromium.get(f"{url}/reports?model=other-model")
        assert chromium.find_element(By.ID, "empty").text.startswith("No checked request")

        chromium.get(f"{url}/reports/{ids['fixed']}")
        steps = _steps(chromium)
        (fixed,) = steps["fixed"]
        original = fixed.find_element(By.CSS_SELECTOR, "del.original")
        assert original.text == planted_sentence(*FIXED)
        assert original.value_of_css_property("text-decoration-line") == "line-through"  # struck through
        assert corrected_sentence(*FIXED) in fixed.find_element(By.CLASS_NAME, "text").text
        assert fixed.find_element(By.CLASS_NAME, "label").text == "FIXED"
        assert steps["gated"] and all("Gated" in s.text for s in steps["gated"])
        assert steps["faithful"] and "residual" not in steps
        assert re.match(r"[1-9]\d* calls; tokens: [1-9]", chromium.find_element(By.ID, "bill").text)  # the judge's bill
        assert corrected_sentence(*FIXED) in chromium.find_element(By.ID, "seen-content").text
        chromium.save_screenshot(str(tmp_path / "live_fixed.png"))  # docs/report_page.png is one of these
        _not_blank((tmp_path / "live_fixed.png").read_bytes())

        chromium.get(f"{url}/reports/{ids['residual']}")
        steps = _steps(chromium)
        (residual,) = steps["residual"]
        assert residual.find_element(By.CLASS_NAME, "label").text == "RESIDUAL"
        assert planted_sentence(*RESIDUAL) in residual.find_element(By.CLASS_NAME, "text").text
        assert "Residual: sent as the model wrote it" in residual.text
        assert "fixed" not in steps

    # offline: the CLI renders the trace file the server wrote; the trace keeps the question and rewrites
    out = tmp_path / "html"
    done = subprocess.run(
        [sys.executable, "-m", "faithproxy.cli", "report", str(trace), "--html", str(out)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    chromium.get((out / "index.html").as_uri())
    hrefs = [a.get_attribute("href") for a in chromium.find_elements(By.CSS_SELECTOR, "#reports a")]
    assert hrefs == [(out / f"{ids['residual']}.html").as_uri(), (out / f"{ids['fixed']}.html").as_uri()]
    chromium.get((out / f"{ids['residual']}.html").as_uri())
    assert chromium.find_element(By.ID, "question").text == "chain n=6 seed=2 planted=3"
    (residual,) = _steps(chromium)["residual"]
    rejected = residual.find_elements(By.CSS_SELECTOR, "del.rejected")
    assert rejected and all(r.text == corrected_sentence(*RESIDUAL) for r in rejected)
    chromium.get((out / f"{ids['fixed']}.html").as_uri())
    (fixed,) = _steps(chromium)["fixed"]
    assert fixed.find_element(By.CSS_SELECTOR, "del.original").text == planted_sentence(*FIXED)
    assert fixed.find_element(By.CLASS_NAME, "reason").text.startswith("Judge's reason: ")  # the trace keeps it
    assert "duration_s" in chromium.find_element(By.ID, "timings").text
    chromium.save_screenshot(str(tmp_path / "report_page.png"))
    _not_blank((tmp_path / "report_page.png").read_bytes())


def _hostile_record() -> dict[str, Any]:
    step = {
        "index": 0,
        "channel": "content",
        "kind": "perception",
        "text": HOSTILE,
        "original_text": HOSTILE,
        "detected": "unfaithful",
        "verdict": "faithful",
        "rejected": [HOSTILE],
        "residual": False,
        "reason": HOSTILE,
        "unchecked_reason": None,
    }
    return {
        "id": "x<b>1</b>",
        "time": 0,
        "model": HOSTILE,
        "mode": "correct",
        "detector": "judge",
        "prompt": HOSTILE,
        "steps": [step],
    }


def test_model_text_is_escaped_in_chromium(chromium: Any, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    trace = tmp_path / "hostile.jsonl"
    trace.write_text(json.dumps(_hostile_record()) + "\n")
    done = subprocess.run(
        [sys.executable, "-m", "faithproxy.cli", "report", str(trace), "--html", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    page = (tmp_path / "out" / "x_b_1__b_.html").read_text()
    assert "<script>" not in page and "<img" not in page and "&lt;script&gt;" in page
    chromium.get((tmp_path / "out" / "x_b_1__b_.html").as_uri())
    assert chromium.find_elements(By.TAG_NAME, "script") == [] and chromium.find_elements(By.TAG_NAME, "img") == []
    (fixed,) = _steps(chromium)["fixed"]
    assert fixed.find_element(By.CSS_SELECTOR, "del.original").text == HOSTILE  # shown as text
    assert chromium.find_element(By.ID, "question").text == HOSTILE
    index = (tmp_path / "out" / "index.html").read_text()
    assert "<script>" not in index and "x&lt;b&gt;1&lt;/b&gt;" in index


def test_step_labels_and_rendering_without_a_browser() -> None:
    assert step_label({"unchecked_reason": "gated"}) == "gated"
    assert step_label({"unchecked_reason": "budget"}) == "unchecked"
    assert step_label({"unchecked_reason": "detector_none", "detected": "faithful"}) is None
    assert step_label({"detected": "unknown"}) is None and step_label({"detected": None}) is None
    assert step_label({"detected": "unfaithful", "original_text": "a", "residual": False}) == "fixed"
    assert step_label({"detected": "unfaithful", "original_text": "a", "residual": True}) == "residual"
    assert step_label({"detected": "unfaithful", "residual": True}) == "residual"
    assert step_label({"detected": "unsure"}) == "unsure" and step_label({"detected": "faithful"}) == "faithful"
    html = render_report(view_of_trace(_hostile_record()), list_href="index.html")
    # model, question, step text, original, rejected rewrite, reason, what the client saw
    assert HOSTILE not in html and html.count("&lt;script&gt;") == 7


def test_the_list_is_bounded_like_the_store() -> None:
    now = [0.0]
    listed = ListedReports(ReportStore(2, 10.0), 2, 10.0, clock=lambda: now[0])
    for i in range(3):
        listed.put(f"r{i}", {"id": f"r{i}", "model": "m", "faithfulness": {"steps": []}})
    assert [row["id"] for row in listed.recent()] == ["r2", "r1"]
    assert listed.max_count == 2  # the store's own attributes pass through
    now[0] = 11.0
    assert listed.recent() == []


def test_the_list_row_of_a_report_is_the_row_of_its_view() -> None:
    step = {"index": 0, "kind": "perception", "detected": "unfaithful", "original_text": "a", "residual": False}
    gated = {"index": 1, "kind": "reasoning", "detected": "unknown", "unchecked_reason": "gated"}
    summary = {"mode": "correct", "detector": "judge", "steps": [step, gated], "upr_detected": 1.0, "upr_residual": 0.0}
    report = {"id": "r", "created": 1_760_000_000, "model": "m", "outcome": "completed", "faithfulness": summary}
    assert report_row(report) == list_row(view_of_report(report))
    assert report_row(report)["labels"] == ["fixed", "gated"]


def test_images_are_shown_only_when_kept_and_only_raster_data_urls() -> None:
    png = "data:image/png;base64,iVBORw0KGgo="
    svg = "data:image/svg+xml;base64,PHN2Zz48L3N2Zz4="  # a document of its own: never inlined
    images = [{"sha256": "aa", "data_url": png}, {"sha256": "bb", "data_url": svg}, {"sha256": "cc"}]
    report = {"id": "r", "model": "m", "images": images, "faithfulness": {"steps": []}}
    html = render_report(view_of_report(report), list_href="/reports")
    assert html.count('<img class="image"') == 1 and f'src="{png}"' in html
    assert "Image not kept (sha256 bb)" in html and "Image not kept (sha256 cc)" in html and "svg" not in html
