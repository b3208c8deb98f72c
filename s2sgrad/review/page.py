"""Render review records as one self-contained HTML page.

Takes `ReviewRecord`s; returns the text of a page with inline CSS and no scripts, fonts
or images from anywhere else, so it opens from a file and can be attached to a CI run.
Each differentiator gets its source and generated code side by side, capture names
highlighted by kind, then the captures table, the temporaries and the context layout.
Invariant: every piece of user text goes through `html.escape`.
"""

from __future__ import annotations

import html
import re
from collections.abc import Sequence

from s2sgrad.review.highlight import generated_captures, highlight, source_captures
from s2sgrad.review.model import CaptureRecord, ReviewRecord, Snippet

_CSS = """
:root {
  --input: #1f5fbf; --output: #1a7f37; --temporary: #a0309a; --constant: #9a6700;
  --metadata: #0b7a8a; --rule: #d0d7de; --muted: #57606a; --code-bg: #f6f8fa;
}
* { box-sizing: border-box; }
body { margin: 0; padding: 24px 32px; color: #1f2328; background: #fff;
  font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; }
h1 { font-size: 22px; margin: 0 0 4px; }
h2 { font-size: 18px; margin: 32px 0 8px; padding-top: 16px; border-top: 2px solid var(--rule); }
h2 code { font-size: 18px; font-weight: 700; }
h2 .where, h3 small { font-weight: normal; color: var(--muted); font-size: 13px; }
h3 { font-size: 15px; margin: 18px 0 6px; }
code, pre { font: 12.5px/1.5 ui-monospace, "DejaVu Sans Mono", "Liberation Mono", monospace; }
.legend span, .kind { display: inline-block; padding: 0 6px; border-radius: 4px;
  color: #fff; font-size: 12px; }
.legend span { margin-right: 6px; }
.panes { display: grid; grid-template-columns: minmax(0, 1fr) minmax(0, 1.4fr); gap: 16px; }
.pane { border: 1px solid var(--rule); border-radius: 6px; background: var(--code-bg);
  overflow: auto; }
.pane h3 { margin: 0; padding: 6px 10px; border-bottom: 1px solid var(--rule);
  background: #eaeef2; }
.pane pre { margin: 0; padding: 8px 0; }
.snippet { display: block; }
.pane .snippet + .snippet { border-top: 1px dashed var(--rule); margin-top: 8px;
  padding-top: 8px; }
.line { display: block; padding: 0 10px; white-space: pre; }
.ln { display: inline-block; min-width: 3.5em; color: #8c959f; user-select: none; }
.keyword { color: #cf222e; }
.string { color: #0a3069; }
.comment { color: #6e7781; font-style: italic; }
.number { color: #0550ae; }
mark { background: transparent; font-weight: 700; border-bottom: 2px solid; }
table { border-collapse: collapse; margin: 4px 0 8px; }
th, td { text-align: left; padding: 4px 10px; border-bottom: 1px solid var(--rule);
  vertical-align: top; }
th { background: #eaeef2; }
td code { background: var(--code-bg); padding: 0 3px; border-radius: 3px; }
ul { margin: 4px 0; padding-left: 22px; }
"""

_KINDS = ("input", "output", "temporary", "constant", "metadata")
_CSS += "".join(
    f".capture-{k} {{ color: var(--{k}); }}\n.kind-{k} {{ background: var(--{k}); }}\n"
    for k in _KINDS
)

_e = html.escape


def render_html(records: Sequence[ReviewRecord], title: str) -> str:
    """Return the page reviewing `records`."""
    legend = "".join(f'<span class="kind-{k}">{k}</span>' for k in _KINDS)
    body = [
        f"<h1>s2sgrad review: {_e(title)}</h1>",
        f'<p class="legend">Capture kinds: {legend}</p>',
        *(_record(record) for record in records),
    ]
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>s2sgrad review: {_e(title)}</title>\n"
        f"<style>{_CSS}</style>\n</head>\n<body>\n"
        + "\n".join(body)
        + "\n</body>\n</html>\n"
    )


def _anchor(record: ReviewRecord) -> str:
    return re.sub(r"[^A-Za-z0-9_-]+", "-", f"{record.path}-{record.name}").strip("-")


def _record(record: ReviewRecord) -> str:
    where = (
        f"{_e(record.path)}:{record.first_line}-{record.last_line} &rarr; "
        f"{_e(record.output)} &middot; policy {_e(record.policy)}"
    )
    source = _snippet(record.source, source_captures(record))
    names = generated_captures(record)
    generated = "".join(_snippet(s, names) for s in record.generated)
    parts = [
        f'<section class="differentiator" id="{_anchor(record)}">',
        f'<h2><code>{_e(record.name)}</code> <span class="where">{where}</span></h2>',
        '<div class="panes">',
        f'<div class="pane source"><h3>Source <small>{_e(record.path)}</small></h3>'
        f"<pre>{source}</pre></div>",
        f'<div class="pane generated"><h3>Generated <small>{_e(record.output)}</small>'
        f"</h3><pre>{generated}</pre></div>",
        "</div>",
        "<h3>Captures</h3>",
        _captures(record.captures),
    ]
    if record.temporaries:
        parts += [
            "<h3>Temporaries: how their gradients flow back</h3>",
            _temporaries(record),
        ]
    parts += ["<h3>Context tuple</h3>", _context(record), "</section>"]
    return "\n".join(parts)


def _snippet(snippet: Snippet, names: dict[str, str]) -> str:
    lines = []
    for i, spans in enumerate(highlight(snippet.text, names)):
        cells = []
        for text, style in spans:
            if style is None:
                cells.append(_e(text))
            elif style.startswith("capture-"):
                kind = style.removeprefix("capture-")
                cells.append(
                    f'<mark class="{style}" title="{_e(text)}: {kind}">{_e(text)}</mark>'
                )
            else:
                cells.append(f'<span class="{style}">{_e(text)}</span>')
        number = snippet.first_line + i
        lines.append(
            f'<span class="line"><span class="ln">{number}</span>{"".join(cells)}</span>'
        )
    return f'<span class="snippet">{"".join(lines)}</span>'


def _kind(kind: str) -> str:
    return f'<span class="kind kind-{kind}">{kind}</span>'


def _captures(captures: Sequence[CaptureRecord]) -> str:
    if not captures:
        return '<p class="captures">none: backward reads nothing from forward</p>'
    head = [
        "name",
        "kind",
        "from",
        "read by",
        "ctx",
        "saved as",
        "promoted",
        "gradient",
    ]
    rows = []
    for capture in captures:
        reader: str = capture.read_by
        if capture.line is not None:
            reader += f", line {capture.line}"
        cells = [
            f'<code class="capture-{capture.kind}">{_e(capture.name)}</code>',
            _kind(capture.kind),
            f"<code>{_e(capture.expression)}</code>",
            _e(reader),
            "&ndash;" if capture.slot is None else str(capture.slot),
            _e(capture.saved),
            "yes" if capture.promoted else "recomputed" if capture.recomputed else "no",
            _e(capture.gradient),
        ]
        rows.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    header = "".join(f"<th>{h}</th>" for h in head)
    return (
        f'<table class="captures"><thead><tr>{header}</tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table>"
    )


def _temporaries(record: ReviewRecord) -> str:
    items = []
    for temp in record.temporaries:
        how = _e(temp.how)
        if temp.grad_param:
            how += f" (backward takes <code>{_e(temp.grad_param)}</code>)"
        items.append(
            f'<li><code class="capture-temporary">{_e(temp.name)}</code>: '
            f"<strong>{how}</strong>: {_e(temp.why)}</li>"
        )
    if record.vjp_statements:
        statements = ", ".join(f"<code>{_e(s)}</code>" for s in record.vjp_statements)
        items.append(f"<li>The generated VJP differentiates {statements}</li>")
    if record.first_order:
        items.append("<li>backward is first-order only: a second-order use raises</li>")
    return f'<ul class="temporaries">{"".join(items)}</ul>'


def _context(record: ReviewRecord) -> str:
    if not record.context:
        return '<p class="context"><code>()</code>: backward reads nothing from forward</p>'
    names = ", ".join(slot.name for slot in record.context)
    text = f"({names},)" if len(record.context) == 1 else f"({names})"
    rows = "".join(
        f"<tr><td>{slot.index}</td>"
        f'<td><code class="capture-{slot.kind}">{_e(slot.name)}</code></td>'
        f"<td>{_kind(slot.kind)}</td><td><code>{_e(slot.location)}</code></td></tr>"
        for slot in record.context
    )
    return (
        f"<p><code>{_e(text)}</code></p>"
        '<table class="context"><thead><tr><th>index</th><th>name</th><th>kind</th>'
        f"<th>kept in</th></tr></thead><tbody>{rows}</tbody></table>"
    )
