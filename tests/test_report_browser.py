"""Reports in a real browser: headless Chromium (Debian's ``chromium``) opens them, and the
tests look at what a person would get: no console errors, no network request, a page as tall
as its content and no wider than the window, charts whose drawing fits their frame, and a
screenshot that is not blank.

Without Chromium the tests are skipped, saying so; under ``CI=true`` they fail instead
(``.ci/run`` installs Chromium before ``make test``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.browser import Browser, Loaded, decode_png, find_chromium, spread
from tests.conftest import DrillReport, RunReport

WIDTH = 1200
SCALE = 0.25  # the screenshot is decoded in pure Python: a quarter size is plenty
VARIANCE_FLOOR = 150.0  # grey-level variance of a page of text and charts: several hundred
INK_FLOOR = 0.03  # share of pixels that are not the background colour


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    binary = find_chromium()
    if binary is None:
        if os.environ.get("CI") == "true":
            pytest.fail("CI=true but no Chromium: .ci/run installs it (apt-get install chromium)")
        pytest.skip("no Chromium (Debian: apt-get install chromium); under CI=true this fails")
    with Browser(binary, width=WIDTH) as opened:
        yield opened


def looks_right(loaded: Loaded) -> None:
    assert loaded.console == []
    assert loaded.exceptions == []
    assert loaded.log == []
    assert loaded.requests == [loaded.url]  # the page itself, nothing else
    m = loaded.measures
    assert m["scripts"] == 0
    assert m["texts"] > 20  # the charts' labels are real text
    assert m["scrollWidth"] <= m["clientWidth"]  # nothing sticks out sideways
    # as tall as its content: nothing cut off, no blank stretch below the footer
    assert m["contentBottom"] <= m["scrollHeight"] <= m["contentBottom"] + 40
    assert loaded.content_size["height"] == pytest.approx(m["scrollHeight"], abs=1)
    assert m["svgs"]
    for svg in m["svgs"]:  # every chart's drawing inside its viewBox
        assert svg["x"] >= -1
        assert svg["y"] >= -1
        assert svg["x"] + svg["width"] <= svg["viewWidth"] + 1
        assert svg["y"] + svg["height"] <= svg["viewHeight"] + 1
        assert 0 < svg["shownWidth"] <= WIDTH
    image = decode_png(loaded.png)
    assert image.width == pytest.approx(WIDTH * SCALE, abs=1)
    assert image.height == pytest.approx(m["scrollHeight"] * SCALE, abs=1)
    variance, ink = spread(image)
    assert variance > VARIANCE_FLOOR
    assert ink > INK_FLOOR


def test_an_incident_report_in_chromium(browser: Browser, run_report: RunReport) -> None:
    loaded = browser.load(run_report.path, scale=SCALE)
    looks_right(loaded)
    assert loaded.measures["details"] > 0  # message bodies fold away on screen
    assert loaded.measures["printOnly"] == 0


def test_an_incident_report_on_paper(browser: Browser, run_report: RunReport) -> None:
    """As it prints: the message bodies written out (nothing unfolds on paper), A4 pages."""
    loaded = browser.load(run_report.path, scale=SCALE, media="print", pdf=True)
    assert loaded.console == []
    assert loaded.measures["details"] == 0
    assert loaded.measures["printOnly"] > 0
    assert loaded.measures["scrollWidth"] <= loaded.measures["clientWidth"]
    assert loaded.pdf.startswith(b"%PDF-")
    pages = loaded.pdf.count(b"/Type /Page") - loaded.pdf.count(b"/Type /Pages")
    assert 1 <= pages <= 6


@pytest.mark.parametrize("playbook", ["memory-pressure", "gpu-lost-fatal-xid", "cloud-burst"])
def test_drill_reports_in_chromium(
    browser: Browser, drill_reports: dict[str, DrillReport], playbook: str
) -> None:
    looks_right(browser.load(drill_reports[playbook].path, scale=SCALE))


def test_the_checks_catch_a_bad_page(browser: Browser, tmp_path: Path) -> None:
    """A blank page, a script error and a fetch are each caught: the checks above can fail."""
    blank = tmp_path / "blank.html"
    blank.write_text("<!DOCTYPE html><html><body></body></html>", encoding="utf-8")
    variance, ink = spread(decode_png(browser.load(blank, scale=SCALE).png))
    assert variance < VARIANCE_FLOOR
    assert ink < INK_FLOOR
    bad = tmp_path / "bad.html"
    bad.write_text(
        "<!DOCTYPE html><html><body><p>x</p><script>console.error('boom');"
        "undefined_function();</script><img src='http://example.invalid/x.png'>"
        "<div style='width:3000px'>wide</div></body></html>",
        encoding="utf-8",
    )
    loaded = browser.load(bad, scale=SCALE)
    assert loaded.console
    assert loaded.exceptions
    assert "http://example.invalid/x.png" in loaded.requests
    assert loaded.measures["scripts"] == 1
    assert loaded.measures["scrollWidth"] > loaded.measures["clientWidth"]
