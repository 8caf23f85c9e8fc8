"""One self-contained HTML report per run: ``report.html``, readable in any browser without a network.

:func:`render` builds the page from what a finished run wrote and nothing else, so that ``snapaudit report
RUN_DIR`` regenerates it at any time (:func:`write_report`); every config-file command (``audit``, ``cpa``,
``pii``, ``finetune``) writes it into its run folder when the run is done, and ``snapaudit simulate --out
FILE.json`` beside its JSON file. The page holds, in order:

1. **The headline**: the run's own Markdown report (``table.md`` or ``report.md``: its tables and the
   assumptions each command states in words), as HTML.
2. **The results**, cell for cell: the headline JSON (``results.json``, ``summary.json``, ``report.json`` or
   the ``simulate`` list) as one table per list of records, or as rows of name and value; a cell shows a string
   as it is and any other value as its JSON text, so the table can be checked against the file.
3. **Figures**: every SVG the run drew (inline, as ``data:`` images, so that their element ids cannot clash),
   the PNGs of older runs the same way, and the training curves of every record of per-step losses under a
   ``history`` or ``histories`` key (drawn here).
4. **Assumptions, warnings and releases not covered**: every string the results file holds under a key that
   names one (``assumption``, ``warning``, ``caveat``, ``not_covered``, ``status``, ``note``), with its place in
   the file.
5. **The configuration** (the run stamp ``run.json``: command, resume-file version, fingerprint, the config
   with defaults filled in), the versions that rendered the page, and the files it read with their SHA-256.

No JavaScript; no request leaves the page (no external style, font, script or image): a data-protection
officer can open it offline, attach it to a review, and see the same numbers as the JSON files.
"""

from __future__ import annotations

import base64
import datetime as _dt
import hashlib
import html
import io
import json
import os
import re
from collections.abc import Iterable, Mapping
from typing import Any

from snapaudit_jax.utils.errors import InputError
from snapaudit_jax.utils.io import write_text

__all__ = ["HEADLINE_FILES", "REPORT_FILE", "cell_text", "markdown_to_html", "render", "write_report"]

REPORT_FILE = "report.html"
# Per kind of run: (headline JSON, full JSON, Markdown report), the first file that exists wins.
HEADLINE_FILES = ("results.json", "summary.json", "report.json")
FULL_FILES = ("results_full.json", "validity_checks.json", "report.json")
MARKDOWN_FILES = ("table.md", "report.md")
STAMP_FILE = "run.json"
_NOTE_KEY = re.compile(r"assumption|warning|caveat|not_covered|status|note|limitation", re.IGNORECASE)
_MAX_NOTES = 400
_LONG_TEXT = 80
_NARROW = 4
_STYLE = """
body { font: 15px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2em auto; max-width: 72em;
       padding: 0 1em; color: #1b1b1b; }
h1 { font-size: 1.6em; margin-bottom: 0.2em; } h2 { border-bottom: 1px solid #ccc; margin-top: 2em; }
table { border-collapse: collapse; margin: 0.8em 0; font-size: 0.92em; }
th, td { border: 1px solid #bbb; padding: 0.25em 0.55em; text-align: right; vertical-align: top; }
th { background: #f0f0f0; } td.text, th.text { text-align: left; }
.wide { overflow-x: auto; } .meta { color: #555; } code, pre { font-family: ui-monospace, monospace; }
pre { background: #f6f6f6; padding: 0.8em; overflow-x: auto; font-size: 0.85em; }
figure { margin: 1em 0; } figure img { max-width: 100%; height: auto; border: 1px solid #ddd; }
figcaption { color: #555; font-size: 0.9em; } li.note code { color: #555; }
"""


def cell_text(value: Any) -> str:
    """The text of one results-table cell.

    Args:
      value: a JSON value of a results file.

    Returns:
      A string as it is; anything else as its JSON text (``1.0``, ``false``, ``null``, ``Infinity``).
    """
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, allow_nan=True)


def _read_json(path: str) -> Any:
    with open(path, encoding="utf-8") as fh:
        return json.loads(fh.read(), parse_constant=lambda name: float(name))


def _first(run_dir: str, names: Iterable[str]) -> str | None:
    for name in names:
        if os.path.isfile(os.path.join(run_dir, name)):
            return name
    return None


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# ---------------------------------------------------------------------------
# Markdown (the subset the commands write: headings, tables, lists, paragraphs, code)
# ---------------------------------------------------------------------------


def _inline(text: str) -> str:
    """Escapes ``text`` and renders ``code``, **bold** and *emphasis*."""
    parts = re.split(r"(`[^`]*`)", text)
    out = []
    for part in parts:
        if len(part) >= 2 and part.startswith("`") and part.endswith("`"):
            out.append(f"<code>{html.escape(part[1:-1])}</code>")
            continue
        part = html.escape(part, quote=False)
        part = re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", part)
        part = re.sub(r"(?<![\w*])\*(?!\s)(.+?)(?<!\s)\*(?![\w*])", r"<em>\1</em>", part)
        out.append(part)
    return "".join(out)


def _table_cells(line: str) -> list[str]:
    body = line.strip()
    if body.startswith("|"):
        body = body[1:]
    if body.endswith("|"):
        body = body[:-1]
    return [c.strip() for c in body.split("|")]


def markdown_to_html(text: str) -> str:
    """The Markdown the commands write, as HTML.

    Args:
      text: Markdown: ``#`` headings (one level down: the page's title is its only ``<h1>``), pipe tables (with
        their column alignment), ``-``/``*``/``1.`` lists, fenced code, paragraphs; inline code, bold and
        emphasis.

    Returns:
      The HTML fragment; every character of ``text`` is escaped.
    """
    lines = text.splitlines()
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        if not stripped:
            i += 1
            continue
        if stripped.startswith("```"):
            j = i + 1
            while j < len(lines) and not lines[j].strip().startswith("```"):
                j += 1
            out.append("<pre>" + html.escape("\n".join(lines[i + 1:j])) + "</pre>")
            i = j + 1
            continue
        heading = re.match(r"(#{1,6})\s+(.*)", stripped)
        if heading:
            level = min(6, len(heading.group(1)) + 1)  # the page's title is the only <h1>
            out.append(f"<h{level}>{_inline(heading.group(2))}</h{level}>")
            i += 1
            continue
        if stripped.startswith("|") and i + 1 < len(lines) and re.fullmatch(r"\|?[\s:|-]+\|?",
                                                                            lines[i + 1].strip()):
            header = _table_cells(stripped)
            aligns = ["right" if c.endswith(":") else "text" for c in _table_cells(lines[i + 1])]
            rows = []
            j = i + 2
            while j < len(lines) and lines[j].strip().startswith("|"):
                rows.append(_table_cells(lines[j]))
                j += 1

            def cls(k):
                return ' class="text"' if k >= len(aligns) or aligns[k] == "text" else ""

            head = "".join(f"<th{cls(k)}>{_inline(c)}</th>" for k, c in enumerate(header))
            body = "".join("<tr>" + "".join(f"<td{cls(k)}>{_inline(c)}</td>" for k, c in enumerate(row)) + "</tr>"
                           for row in rows)
            out.append(f'<div class="wide"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>')
            i = j
            continue
        item = re.match(r"(\s*)([-*]|\d+\.)\s+(.*)", line)
        if item:
            ordered = item.group(2)[0].isdigit()
            items = []
            while i < len(lines):
                m = re.match(r"(\s*)([-*]|\d+\.)\s+(.*)", lines[i])
                if m and m.group(2)[0].isdigit() == ordered:
                    items.append(m.group(3))
                elif lines[i].startswith((" ", "\t")) and lines[i].strip() and items:
                    items[-1] += " " + lines[i].strip()  # a continued item
                else:
                    break
                i += 1
            tag = "ol" if ordered else "ul"
            out.append(f"<{tag}>" + "".join(f"<li>{_inline(x)}</li>" for x in items) + f"</{tag}>")
            continue
        para = [stripped]
        i += 1
        while i < len(lines) and lines[i].strip() and not re.match(r"\s*(#{1,6}\s|\||```|[-*]\s|\d+\.\s)", lines[i]):
            para.append(lines[i].strip())
            i += 1
        out.append(f"<p>{_inline(' '.join(para))}</p>")
    return "\n".join(out)


# ---------------------------------------------------------------------------
# The results, cell for cell
# ---------------------------------------------------------------------------


def _is_scalar(value: Any) -> bool:
    return value is None or isinstance(value, (str, int, float, bool))


def _records_table(rows: list[Mapping[str, Any]], caption: str) -> str:
    """One HTML table of a list of records: the union of their scalar fields as columns, in first-seen order.
    In a wide table (over :data:`_NARROW` columns) a field holding a long text (over :data:`_LONG_TEXT`
    characters: sentences, listed under the assumptions when their key names one) is left out and named in the
    caption; a narrow table (a list of releases and their status) keeps its sentences."""
    columns: list[str] = []
    long = set()
    for row in rows:
        for key, value in row.items():
            if isinstance(value, str) and len(value) > _LONG_TEXT:
                long.add(key)
            if key not in columns and _is_scalar(value):
                columns.append(key)
    if len(columns) <= _NARROW:
        long = set()
    columns = [c for c in columns if c not in long]
    if long:
        caption += f" (long text fields not shown: {', '.join(sorted(long))})"
    head = "".join(f'<th class="text">{html.escape(c)}</th>' for c in columns)
    body = []
    for row in rows:
        cells = []
        for c in columns:
            if c not in row:  # a field this record lacks: an empty cell, not a value
                cells.append('<td class="text"></td>')
                continue
            kind = "text" if isinstance(row[c], str) else "num"
            cells.append(f'<td class="{kind}" data-key="{html.escape(c)}">{html.escape(cell_text(row[c]))}</td>')
        body.append("<tr>" + "".join(cells) + "</tr>")
    return (f'<div class="wide"><table class="results" data-caption="{html.escape(caption)}"><caption>'
            f"{html.escape(caption)}</caption><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody>"
            "</table></div>")


def _flat_items(value: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """``(dotted name, scalar)`` of a JSON object's scalars (lists of scalars count as one value)."""
    items: list[tuple[str, Any]] = []
    if isinstance(value, Mapping):
        for key, sub in value.items():
            items += _flat_items(sub, f"{prefix}{key}.")
    elif isinstance(value, list) and value and all(isinstance(x, Mapping) for x in value):
        for k, sub in enumerate(value):
            items += _flat_items(sub, f"{prefix}{k}.")
    else:
        items.append((prefix[:-1], value))
    return items


def _results_html(headline: Any, name: str) -> str:
    """The headline JSON as tables: a list of records as one table; an object as rows of name and value (its
    lists of records as tables of their own)."""
    if isinstance(headline, list) and headline and all(isinstance(x, Mapping) for x in headline):
        return _records_table(headline, name)
    if isinstance(headline, Mapping):
        parts, rows = [], []
        for key, value in headline.items():
            if isinstance(value, list) and value and all(isinstance(x, Mapping) for x in value):
                parts.append(_records_table(value, f"{name}: {key}"))
            else:
                rows += [(f"{key}.{k}" if k else key, v) for k, v in _flat_items(value)]
        if rows:
            body = "".join(f'<tr><td class="text">{html.escape(k)}</td>'
                           f'<td class="{"text" if isinstance(v, str) else "num"}" data-key="{html.escape(k)}">'
                           f"{html.escape(cell_text(v))}</td></tr>" for k, v in rows)
            parts.insert(0, f'<div class="wide"><table class="results" data-caption="{html.escape(name)}"><caption>'
                            f'{html.escape(name)}</caption><thead><tr><th class="text">name</th><th class="text">'
                            f"value</th></tr></thead><tbody>{body}</tbody></table></div>")
        return "\n".join(parts)
    return f"<pre>{html.escape(json.dumps(headline, indent=1, sort_keys=True))}</pre>"


# ---------------------------------------------------------------------------
# Figures
# ---------------------------------------------------------------------------


def _figure(data: bytes, mime: str, caption: str) -> str:
    encoded = base64.b64encode(data).decode("ascii")
    return (f'<figure><img alt="{html.escape(caption)}" src="data:{mime};base64,{encoded}">'
            f"<figcaption>{html.escape(caption)}</figcaption></figure>")


def _histories(value: Any, path: str = "", inside: bool = False) -> list[tuple[str, dict[str, list[float]]]]:
    """``(path, {series: values})`` of every object under a ``history`` / ``histories`` key that holds per-step
    numeric lists (losses, gradient norms, batch sizes)."""
    found = []
    if isinstance(value, Mapping):
        series = {k: v for k, v in value.items() if isinstance(v, list) and len(v) > 1
                  and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v)}
        if inside and series:
            found.append((path, series))
        for key, sub in value.items():
            here = f"{path}.{key}" if path else str(key)
            found += _histories(sub, here, inside or "histor" in str(key).lower())
    elif isinstance(value, list):
        for k, sub in enumerate(value):
            found += _histories(sub, f"{path}.{k}", inside)
    return found


def _curves_svg(path: str, series: Mapping[str, list[float]]) -> bytes | None:
    """The per-step series of one history (losses on a log axis when positive), as SVG; ``None`` without
    matplotlib."""
    try:
        from snapaudit_jax.report.plots import pyplot

        plt = pyplot()
    except Exception:  # matplotlib is an optional extra: the page then has no curves, and says so
        return None
    preferred = [k for k in series if any(w in k.lower() for w in ("loss", "grad_norm_mean", "clipped"))]
    shown = (preferred or [k for k in series if k != "step"])[:4] or list(series)[:1]
    steps = series.get("step")
    fig, axes = plt.subplots(1, len(shown), figsize=(3.6 * len(shown), 2.8), squeeze=False)
    for ax, key in zip(axes[0], shown):
        values = series[key]
        x = steps if steps is not None and len(steps) == len(values) else range(len(values))
        ax.plot(x, values, lw=1.2, marker="." if len(values) < 50 else None)
        ax.set_title(key, fontsize=10)
        ax.set_xlabel("step")
        if all(v > 0 for v in values):
            ax.set_yscale("log")
    fig.suptitle(path, fontsize=10)
    fig.tight_layout()
    buf = io.BytesIO()
    try:
        fig.savefig(buf, format="svg")
    finally:
        plt.close(fig)
    return buf.getvalue()


# ---------------------------------------------------------------------------
# Notes: assumptions, warnings, releases not covered
# ---------------------------------------------------------------------------


def _notes(value: Any, path: str = "", inherited: bool = False) -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []
    if isinstance(value, Mapping):
        for key, sub in value.items():
            here = f"{path}.{key}" if path else str(key)
            found += _notes(sub, here, inherited or bool(_NOTE_KEY.search(str(key))))
    elif isinstance(value, list):
        for k, sub in enumerate(value):
            found += _notes(sub, f"{path}[{k}]", inherited)
    elif inherited and isinstance(value, str) and value.strip():
        found.append((path, value))
    return found


# ---------------------------------------------------------------------------
# The page
# ---------------------------------------------------------------------------


def _versions() -> dict[str, str]:
    from importlib import metadata

    out = {}
    for package in ("snapaudit-jax", "jax", "flax", "numpy"):
        try:
            out[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            continue
    return out


def render(run_dir: str, *, results_file: str | None = None, title: str | None = None,
           figures: Iterable[tuple[bytes, str]] = (), markdown: str | None = None) -> str:
    """The HTML text of a finished run's report.

    Args:
      run_dir: the run folder (or, for ``simulate``, the folder of its ``--out`` file).
      results_file: one JSON file's name in ``run_dir`` to report alone (``simulate --out``: its folder may hold
        anything, so nothing else of it is read); default: the run folder's files (the first of
        :data:`HEADLINE_FILES` that exists, the stamp, the full results, the Markdown report, the figures).
      title: the page's title (default ``snapaudit <command>: <folder name>``).
      figures: more figures, ``(SVG bytes, caption)`` (``simulate`` draws its plot for the page).
      markdown: the headline's Markdown where the folder has none (``simulate``'s table).

    Returns:
      The page (UTF-8 text).

    Raises:
      InputError: ``run_dir`` is not a folder, or holds no results file (naming what was looked for).
    """
    if not os.path.isdir(run_dir):
        raise InputError(f"RUN_DIR must be a run folder, got {run_dir!r} (not a folder)")
    name = results_file or _first(run_dir, HEADLINE_FILES)
    if name is None or not os.path.isfile(os.path.join(run_dir, name)):
        wanted = results_file or " or ".join(HEADLINE_FILES)
        raise InputError(f"RUN_DIR {run_dir!r} holds no results file ({wanted}): is the run finished?")
    read = {name: os.path.join(run_dir, name)}
    headline = _read_json(read[name])
    single = results_file is not None
    stamp_path = os.path.join(run_dir, STAMP_FILE)
    stamp = _read_json(stamp_path) if not single and os.path.isfile(stamp_path) else None
    if stamp is not None:
        read[STAMP_FILE] = stamp_path
    full_name = None if single else _first(run_dir, FULL_FILES)
    full = headline
    if full_name is not None and full_name != name:  # the fine-tuning card is both: read once
        read[full_name] = os.path.join(run_dir, full_name)
        full = _read_json(read[full_name])
    md_name = None if single else _first(run_dir, MARKDOWN_FILES)
    command = stamp.get("command") if isinstance(stamp, Mapping) else None
    folder = os.path.basename(os.path.abspath(run_dir))
    title = title or f"snapaudit {command or 'run'}: {folder}"

    sections = [f"<h1>{html.escape(title)}</h1>"]
    meta = [f"rendered {_dt.datetime.now(_dt.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}"]
    if isinstance(stamp, Mapping) and stamp.get("fingerprint"):
        meta.append(f"run fingerprint <code>{html.escape(str(stamp['fingerprint']))}</code>")
    sections.append(f'<p class="meta">{" &middot; ".join(meta)}</p>')

    if md_name is not None:
        read[md_name] = os.path.join(run_dir, md_name)
        with open(read[md_name], encoding="utf-8") as fh:
            markdown, md_label = fh.read(), md_name
    else:
        md_label = "summary"
    if markdown is not None:
        sections.append(f'<section id="headline"><h2>Headline ({html.escape(md_label)})</h2>'
                        f"{markdown_to_html(markdown)}</section>")

    results_section = (f'<section id="results"><h2>Results ({html.escape(name)}, cell for cell)</h2>'
                       f"{_results_html(headline, name)}</section>")

    extra, figures = list(figures), []
    for data, caption in extra:
        figures.append(_figure(data, "image/svg+xml", caption))
    files = [] if single else sorted(os.listdir(run_dir))
    svgs = [f for f in files if f.endswith(".svg")]
    for f in svgs:
        with open(os.path.join(run_dir, f), "rb") as fh:
            figures.append(_figure(fh.read(), "image/svg+xml", f))
    for f in files:  # older runs drew PNGs only
        if f.endswith(".png") and f[:-4] + ".svg" not in svgs:
            with open(os.path.join(run_dir, f), "rb") as fh:
                figures.append(_figure(fh.read(), "image/png", f))
    for path, series in _histories(full):
        svg = _curves_svg(path, series)
        if svg is not None:
            figures.append(_figure(svg, "image/svg+xml", f"training curves: {path}"))
    if figures:
        sections.append('<section id="figures"><h2>Figures</h2>' + "\n".join(figures) + "</section>")

    notes = _notes(full)
    if full is not headline:
        notes += [n for n in _notes(headline) if n not in notes]
    places: dict[str, list[str]] = {}  # one item per text, with every place that states it
    for path, text in notes:
        places.setdefault(text, []).append(path)
    if places:
        shown = list(places.items())[:_MAX_NOTES]
        more = "" if len(places) <= _MAX_NOTES else f"<p>{len(places) - _MAX_NOTES} more in the JSON files.</p>"
        items = "".join(f'<li class="note">{html.escape(text)} <code>{html.escape(", ".join(where[:6]))}'
                        f'{html.escape(f" and {len(where) - 6} more" if len(where) > 6 else "")}</code></li>'
                        for text, where in shown)
        sections.append('<section id="assumptions"><h2>Assumptions, warnings and releases not covered</h2>'
                        f"<ul>{items}</ul>{more}</section>")
    sections.append(results_section)

    config_parts = []
    if isinstance(stamp, Mapping):
        for key in ("command", "version", "fingerprint"):
            if key in stamp:
                config_parts.append(f"<tr><td class=\"text\">{key}</td><td class=\"text\">"
                                    f"{html.escape(cell_text(stamp[key]))}</td></tr>")
        config_parts = ["<table>" + "".join(config_parts) + "</table>"]
        config_parts.append("<pre>" + html.escape(json.dumps(stamp.get("config"), indent=2, sort_keys=True))
                            + "</pre>")
    versions = "".join(f"<tr><td class=\"text\">{html.escape(k)}</td><td class=\"text\">{html.escape(v)}</td></tr>"
                       for k, v in _versions().items())
    digests = "".join(f"<tr><td class=\"text\">{html.escape(f)}</td><td class=\"text\"><code>{_sha256(p)}</code>"
                      "</td></tr>" for f, p in read.items())
    sections.append('<section id="provenance"><h2>Configuration and provenance</h2>' + "".join(config_parts)
                    + f"<h3>Rendered with</h3><table>{versions}</table>"
                    + f"<h3>Files read (SHA-256)</h3><table>{digests}</table></section>")

    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head>\n<body>\n"
            + "\n".join(sections) + "\n</body></html>\n")


def write_report(run_dir: str, out: str | None = None, **kwargs) -> str:
    """Renders :func:`render` and writes it atomically.

    Args:
      run_dir: see :func:`render`.
      out: the page's path (default ``run_dir/report.html``).
      **kwargs: :func:`render`'s keywords.

    Returns:
      The path written.

    Raises:
      InputError: see :func:`render`.
    """
    text = render(run_dir, **kwargs)
    path = out or os.path.join(run_dir, REPORT_FILE)
    write_text(path, text)
    return path
