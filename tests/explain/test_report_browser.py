"""The HTML report in a real browser: headless Chromium over the DevTools protocol."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from collector.trace.traceio import Trace
from explain.report.build import build_report
from explain.report.html import render_html
from tests.explain.chromium_cdp import Browser, ensure_chromium
from tests.explain.report_helpers import make_diagnosis, make_timeline, make_trace, make_verdict

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory):
    b = Browser(ensure_chromium(), tmp_path_factory.mktemp("chromium-profile"))
    yield b
    b.close()


def test_detector_catches_console_errors_exceptions_and_failed_loads(browser: Browser, tmp_path: Path) -> None:
    bad = tmp_path / "bad.html"
    bad.write_text("<html><body><h1>broken</h1><img src='missing.png'>"
                   "<script>console.error('boom'); throw new Error('uncaught');</script></body></html>")
    problems = browser.open(bad.as_uri()).problems
    assert any("console.error: boom" in p for p in problems)
    assert any("exception:" in p and "uncaught" in p for p in problems)
    assert any("ERR_FILE_NOT_FOUND" in p for p in problems)


def test_report_renders_without_errors_and_is_not_blank(browser: Browser, tmp_path: Path) -> None:
    trace = make_trace(tmp_path / "toy", with_logs=True)
    report = build_report(Trace.open(trace), make_timeline(), make_verdict(), make_diagnosis())
    page = tmp_path / "report.html"
    page.write_text(render_html(report), encoding="utf-8")
    result = browser.open(page.as_uri())
    assert result.problems == []
    img = np.asarray(Image.open(io.BytesIO(result.screenshot)).convert("L"), dtype=np.float64)
    assert img.shape[1] >= 1200 and img.shape[0] > 2000  # the whole page, figures included
    assert img.std() > 20  # text and figures, not a blank page
    # figures really drew: a good share of the page is neither background nor white
    assert (img < 200).mean() > 0.05
    (tmp_path / "report.png").write_bytes(result.screenshot)  # kept by pytest for a look
