"""Checks of a run's ``report.html``: parsed here, and loaded in headless Chromium where it is installed.

:func:`check_report` parses the page (its results tables must equal the JSON file cell for cell, every figure
must be an inline image that decodes, nothing may load from elsewhere or run a script) and, when Chromium is
installed (:data:`CHROMIUM`; Debian's ``chromium`` package), loads a copy of the page with a probe script:
no load error, every figure drawn at a non-zero size, and the table text the browser shows equal to the JSON.
"""

from __future__ import annotations

import base64
import html
import json
import os
import re
import shutil
import subprocess
import tempfile
from html.parser import HTMLParser

from snapaudit_jax.report.html import cell_text

CHROMIUM = next((p for p in (shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome")) if p), None)
NO_CHROMIUM = "headless Chromium is not installed (Debian: apt-get install chromium)"

_PROBE = """<script>
window.__errors = [];
window.addEventListener("error", function (e) {
  window.__errors.push(String(e.message || (e.target && (e.target.src || e.target.href) || "error")).slice(0, 200));
}, true);
window.addEventListener("load", function () {
  var figures = Array.prototype.map.call(document.querySelectorAll("figure img"), function (img) {
    var r = img.getBoundingClientRect();
    return {w: r.width, h: r.height, natural: img.naturalWidth, complete: img.complete};
  });
  var tables = Array.prototype.map.call(document.querySelectorAll("table.results"), function (t) {
    return {caption: t.dataset.caption, rows: Array.prototype.map.call(t.tBodies[0].rows, function (row) {
      return Array.prototype.filter.call(row.cells, function (c) { return c.dataset.key !== undefined; })
        .map(function (c) { return [c.dataset.key, c.textContent]; });
    })};
  });
  var out = document.createElement("pre");
  out.id = "__probe";
  out.textContent = JSON.stringify({errors: window.__errors, figures: figures, tables: tables});
  document.body.appendChild(out);
});
</script>"""


class _Page(HTMLParser):
    """The page's results tables (``data-key`` cells per row), images, scripts and external references."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.tables, self.images, self.scripts, self.external = [], [], 0, []
        self._cell = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "table" and "results" in (a.get("class") or "").split():
            self.tables.append({"caption": a.get("data-caption"), "rows": []})
        elif tag == "tr" and self.tables:
            self.tables[-1]["rows"].append([])
        elif tag == "td" and "data-key" in a and self.tables:
            self._cell = [a["data-key"], ""]
        elif tag == "img":
            self.images.append(a.get("src", ""))
        elif tag == "script":
            self.scripts += 1
        for key in ("src", "href"):
            value = a.get(key) or ""
            if value and not value.startswith(("data:", "#")):
                self.external.append(value)

    def handle_data(self, data):
        if self._cell is not None:
            self._cell[1] += data

    def handle_endtag(self, tag):
        if tag == "td" and self._cell is not None:
            self.tables[-1]["rows"][-1].append(tuple(self._cell))
            self._cell = None
        elif tag == "table" and self.tables:
            self.tables[-1]["rows"] = [r for r in self.tables[-1]["rows"] if r]


def _expected_rows(records: list[dict], shown: list[list[tuple[str, str]]]) -> None:
    assert len(shown) == len(records)
    for record, row in zip(records, shown):
        assert row, "a results row without cells"
        for key, text in row:
            assert key in record and text == cell_text(record[key]), (key, text, record.get(key))


def _resolve(value, dotted: str):
    """The value at a dotted name of the page's name/value table (keys that hold dots themselves are matched
    whole)."""
    parts = dotted.split(".")
    while parts:
        for n in range(len(parts), 0, -1):
            key = ".".join(parts[:n])
            if isinstance(value, list) and key.isdigit() and int(key) < len(value):
                value, parts = value[int(key)], parts[n:]
                break
            if isinstance(value, dict) and key in value:
                value, parts = value[key], parts[n:]
                break
        else:
            raise AssertionError(f"{dotted!r} is not a name of the results file")
    return value


def _check_tables(tables: list[dict], results) -> None:
    assert tables, "no results table"
    if isinstance(results, list):
        _expected_rows(results, tables[0]["rows"])
        return
    for table in tables:
        caption = table["caption"].split(" (long text fields", 1)[0]
        key = caption.split(": ", 1)[1] if ": " in caption else None
        if key is not None:  # a list of records under results[key]
            _expected_rows(results[key], table["rows"])
            continue
        for row in table["rows"]:
            (name, text), = row
            assert text == cell_text(_resolve(results, name)), (name, text)


def browser_probe(page: str) -> dict:
    """Loads a copy of the HTML file ``page`` with the probe in headless Chromium: ``{"errors", "figures",
    "tables"}`` as the browser saw them."""
    with tempfile.TemporaryDirectory(prefix="report-probe-") as scratch:
        text = open(page, encoding="utf-8").read()
        probed = os.path.join(scratch, "probe.html")
        with open(probed, "w", encoding="utf-8") as fh:
            fh.write(text.replace("<head>", "<head>" + _PROBE, 1))
        proc = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                               f"--user-data-dir={os.path.join(scratch, 'profile')}", "--virtual-time-budget=5000",
                               "--dump-dom", "file://" + probed], capture_output=True, text=True, timeout=120)
    found = re.search(r'<pre id="__probe">(.*?)</pre>', proc.stdout, re.S)
    assert found, f"Chromium did not render the page (exit {proc.returncode}): {proc.stderr[-1500:]}"
    return json.loads(html.unescape(found.group(1)))


def check_report(page: str, results_file: str, *, figures: int = 0) -> dict:
    """Asserts that the report ``page`` shows ``results_file`` cell for cell, holds at least ``figures`` inline
    figures that decode, loads nothing from elsewhere and runs no script; then, where Chromium is installed,
    that it loads without errors, draws every figure at a non-zero size and shows the same table text.

    Returns:
      ``{"parsed": ..., "browser": ... or None}``.
    """
    with open(results_file, encoding="utf-8") as fh:
        results = json.loads(fh.read(), parse_constant=float)
    parser = _Page()
    parser.feed(open(page, encoding="utf-8").read())
    assert parser.scripts == 0 and parser.external == [], (parser.scripts, parser.external[:5])
    assert len(parser.images) >= figures, (len(parser.images), figures)
    for src in parser.images:
        head, _, payload = src.partition(",")
        assert head in ("data:image/svg+xml;base64", "data:image/png;base64"), head
        data = base64.b64decode(payload, validate=True)
        assert data.startswith(b"\x89PNG") if "png" in head else b"<svg" in data[:2000]
    _check_tables(parser.tables, results)
    out = {"parsed": parser, "browser": None}
    if CHROMIUM is not None:
        seen = browser_probe(page)
        assert seen["errors"] == [], seen["errors"]
        assert len(seen["figures"]) == len(parser.images)
        assert all(f["complete"] and f["natural"] > 0 and f["w"] > 0 and f["h"] > 0 for f in seen["figures"]), seen
        assert [[tuple(c) for c in row] for row in seen["tables"][0]["rows"]] == parser.tables[0]["rows"]
        out["browser"] = seen
    return out
