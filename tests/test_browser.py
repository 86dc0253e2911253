"""One real-browser render: headless Chromium opens report pages and screenshots them.

Skipped when no Chromium is installed, except on CI (the ``CI`` environment variable set), where a
missing browser is a failure: CI installs the Debian package ``chromium``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from PIL import Image

from traceinsight.analysis import analyze
from traceinsight.load import load_trace
from traceinsight.render.html import HtmlRenderer
from traceinsight.results import Report, result_of
from traceinsight.rules import evaluate

SAMPLES = Path(__file__).resolve().parents[1] / "sample_traces"
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
WIDTH, HEIGHT = 1280, 4000


def find_chromium() -> str:
    """The browser executable. Called inside each test so that on CI a missing one FAILS it."""
    for name in BROWSERS:
        found = shutil.which(name)
        if found:
            return found
    message = f"no headless browser found (looked for {', '.join(BROWSERS)}); apt-get install chromium"
    if os.environ.get("CI"):
        pytest.fail(f"CI is set but {message}")
    pytest.skip(message)


def brightness(png: Path, point: tuple[int, int]) -> int:
    """Sum of the RGB channels of one pixel."""
    with Image.open(png) as image:
        pixel = image.convert("RGB").getpixel(point)
    assert isinstance(pixel, tuple)
    return sum(int(channel) for channel in pixel)


def write_page(name: str, directory: Path) -> Path:
    """Render one sample trace's report into ``directory``."""
    trace = load_trace(SAMPLES / name)
    analysis = analyze(trace)
    report = Report(analysis=analysis, findings=evaluate(analysis))
    html = HtmlRenderer(directory).render(result_of(report))
    page = directory / "report.html"
    page.write_text(html, encoding="utf-8")
    return page


def screenshot(
    chromium: str, page: Path, png: Path, profile: Path, *extra: str
) -> subprocess.CompletedProcess[str]:
    """Run headless Chromium on a fresh profile, offline, and save a screenshot."""
    command = [
        chromium,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--hide-scrollbars",
        f"--user-data-dir={profile}",
        f"--screenshot={png}",
        f"--window-size={WIDTH},{HEIGHT}",
        *extra,
        page.as_uri(),
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=180, check=False)


@pytest.mark.parametrize(
    "name",
    [
        "gp100_mlp_pageable_sync.json.gz",
        "v100_resnet50_workers0.pt.trace.json.gz",
        "v100_ddp_ns_timestamps.pt.trace.json.gz",  # a healthy trace: no findings
    ],
)
def test_report_renders_in_headless_chromium(name: str, tmp_path: Path) -> None:
    chromium = find_chromium()
    page = write_page(name, tmp_path)
    png = tmp_path / "report.png"
    result = screenshot(chromium, page, png, tmp_path / "profile")
    assert result.returncode == 0, result.stderr[-2000:]
    assert png.is_file(), result.stderr[-2000:]
    with Image.open(png) as image:
        assert image.size == (WIDTH, HEIGHT)
        # A blank or error page is one or two colours; a rendered report has text and charts.
        colours = image.convert("RGB").getcolors(maxcolors=1_000_000)
        assert colours is not None and len(colours) > 200
    assert brightness(png, (5, 5)) > 600  # the light scheme unless the reader asks for dark


def test_report_follows_the_dark_colour_scheme(tmp_path: Path) -> None:
    chromium = find_chromium()
    page = write_page("gp100_mlp_pageable_sync.json.gz", tmp_path)
    dark = tmp_path / "dark.png"
    scheme = "--blink-settings=preferredColorScheme=0"  # 0 = dark
    result = screenshot(chromium, page, dark, tmp_path / "profile", scheme)
    assert result.returncode == 0, result.stderr[-2000:]
    assert brightness(dark, (5, 5)) < 200
