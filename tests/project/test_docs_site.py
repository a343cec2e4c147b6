"""The docs site (mkdocs.yml) builds with `mkdocs build --strict` and reads right in headless Chromium."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from PIL import Image
from report_browser import chromium_dom, chromium_screenshot

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


class _Config(yaml.SafeLoader):
    """mkdocs.yml with its !!python tags (the slugify function) read as plain values."""


_Config.add_multi_constructor("tag:yaml.org,2002:python/", lambda loader, suffix, node: None)


def nav_pages(nav) -> list[str]:
    out = []
    for entry in nav:
        for value in (entry.values() if isinstance(entry, dict) else [entry]):
            out += nav_pages(value) if isinstance(value, list) else [value]
    return out


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(ROOT / "mkdocs.yml"),
                        "--site-dir", str(out)], capture_output=True, text=True, timeout=300, cwd=ROOT,
                       env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "WARNING" not in r.stderr, r.stderr[-3000:]
    return out


def test_every_page_is_in_the_nav_once_and_every_nav_entry_is_a_page():
    config = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=_Config)
    listed = nav_pages(config["nav"])
    pages = sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md"))
    assert sorted(listed) == pages, set(listed) ^ set(pages)
    assert len(listed) == len(set(listed))


def test_the_site_builds_strictly_with_every_page(site):
    for page in DOCS.rglob("*.md"):
        html = site / page.relative_to(DOCS).with_suffix(".html")
        assert html.exists(), html
    assert (site / "search" / "search_index.json").exists()


@pytest.mark.parametrize("page", ["index.html", "fleet.html"])
def test_a_page_reads_in_chromium_with_its_title_nav_and_tables(site, tmp_path, page):
    dom = chromium_dom(site / page, tmp_path)
    title = re.search(r"<h1[^>]*>(.*?)</h1>", dom, re.S)
    assert title and re.sub(r"<[^>]+>", "", title.group(1)).strip(), dom[:2000]
    assert 'class="md-nav' in dom and "<table" in dom, dom[:2000]
    png = chromium_screenshot(site / page, tmp_path, size="1280,1600")
    with Image.open(png) as im:
        colours = im.convert("RGB").getcolors(maxcolors=1 << 16)
    # a page that drew: its text and the theme's header give many colours, a blank one gives one
    assert colours is None or len(colours) > 50, f"{page}: the screenshot has {len(colours)} colours"
    print(f"\nscreenshot: {png}")  # for a person to look at (pytest -s --basetemp DIR keeps it)
