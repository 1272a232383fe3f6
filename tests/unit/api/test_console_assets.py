"""The console's vendored front-end files are what `scripts/vendor-console.sh` fetched from
npm (their sha256 in VERSIONS), each beside its licence, and every file a page loads is
there: the console is served by aenv alone, no CDN."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from api.console.render import TEMPLATES

STATIC = Path(__file__).resolve().parents[3] / "api" / "console" / "static"
VENDOR = STATIC / "vendor"


def test_vendored_files_match_what_the_script_recorded() -> None:
    lines = [
        ln for ln in (VENDOR / "VERSIONS").read_text().splitlines() if ln and not ln.startswith("#")
    ]
    recorded = {}
    for ln in lines:
        digest, name = ln.split()[:2]
        recorded[name] = digest
        assert hashlib.sha256((VENDOR / name).read_bytes()).hexdigest() == digest, name
    shipped = {p.name for p in VENDOR.iterdir()} - {"VERSIONS"}
    assert shipped == set(recorded), "a vendored file not recorded, or recorded and missing"
    for package in ("htmx", "xterm", "addon-fit"):
        assert f"{package}.LICENSE" in recorded


def test_every_asset_a_page_loads_is_served_from_here() -> None:
    refs: set[str] = set()
    for page in TEMPLATES.glob("*.html"):
        text = page.read_text().replace('xmlns="http://www.w3.org/2000/svg"', "")
        assert "http://" not in text and "https://" not in text, page  # no CDN, no web font
        refs |= set(re.findall(r'(?:src|href)="(/console/static/[^"]+)"', text))
    assert refs, "no asset found: the pattern is stale"
    for ref in refs:
        assert (STATIC / ref.removeprefix("/console/static/")).is_file(), ref
