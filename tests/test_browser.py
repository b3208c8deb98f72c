"""The `s2sgrad review --html` page, loaded from a file URL in headless Chromium."""

import os
import shutil
import struct
import subprocess
import sys
import zlib
from html.parser import HTMLParser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = shutil.which("chromium")

pytestmark = pytest.mark.skipif(
    CHROMIUM is None and not os.environ.get("CI"),
    reason="needs Debian's `chromium` on PATH (`.ci/run` installs it; in CI this runs)",
)


def chromium(profile, *args):
    """Run headless Chromium with nothing that reaches the network."""
    assert CHROMIUM, "chromium is not installed: `.ci/run` installs it with apt-get"
    run = subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={profile}",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    return run.stdout


class Outline(HTMLParser):
    """Collect, from the DOM Chromium serialized, what the checks below look at."""

    def __init__(self):
        super().__init__()
        self.stack = []
        self.panes = {}  # pane class -> its text
        self.capture_rows = 0
        self.marks = 0

    def handle_starttag(self, tag, attrs):
        classes = (dict(attrs).get("class") or "").split()
        self.stack.append((tag, classes))
        if "pane" in classes:
            self.panes.setdefault(classes[-1], "")
        if tag == "tr" and self._inside("table", "captures") and self._inside("tbody"):
            self.capture_rows += 1
        if tag == "mark" and self._inside("div", "generated"):
            self.marks += 1

    def handle_endtag(self, tag):
        while self.stack and self.stack.pop()[0] != tag:
            pass

    def handle_data(self, data):
        for pane in ("source", "generated"):
            if self._inside("div", pane):
                self.panes[pane] += data

    def _inside(self, tag, cls=None):
        return any(t == tag and (cls is None or cls in c) for t, c in self.stack)


def png_size_and_colors(path):
    """Return (width, height, number of distinct bytes in the image data)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    chunks, offset = [], 8
    while offset < len(data):
        (length,) = struct.unpack(">I", data[offset : offset + 4])
        kind = data[offset + 4 : offset + 8]
        if kind == b"IDAT":
            chunks.append(data[offset + 8 : offset + 8 + length])
        offset += 12 + length
    pixels = zlib.decompress(b"".join(chunks))
    return width, height, len(set(pixels))


def test_review_page_renders_captures_table_and_both_code_panes(tmp_path):
    page = tmp_path / "review.html"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "s2sgrad",
            "review",
            "samples/temporary.py",
            "--html",
            str(page),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert run.returncode == 0, run.stderr
    url = page.as_uri()

    outline = Outline()
    outline.feed(chromium(tmp_path / "profile", "--dump-dom", url))
    assert set(outline.panes) == {"source", "generated"}
    assert "def add_mul(a: torch.Tensor, b: torch.Tensor):" in outline.panes["source"]
    assert "def add_mul_forward(" in outline.panes["generated"]
    assert "def squared_distance_backward(" in outline.panes["generated"]
    # add_mul keeps b, t, a_shape (b's shape is read off b); squared_distance keeps d,
    # x_shape, y_shape.
    assert outline.capture_rows == 6
    assert outline.marks > 10

    shot = tmp_path / "page.png"
    chromium(
        tmp_path / "profile", f"--screenshot={shot}", "--window-size=1400,900", url
    )
    width, height, colors = png_size_and_colors(shot)
    assert (width, height) == (1400, 900)
    assert colors > 100, "the screenshot is blank"
