"""Render review records as terminal text, with or without ANSI colors.

Takes `ReviewRecord`s, the terminal width and whether to color; returns the text. The
source and the generated code stand side by side when both fit in the width, one above
the other otherwise. Invariant: without color the output is plain ASCII-compatible text
that depends only on the records and the width (the golden tests compare it).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import zip_longest

from s2sgrad.review.highlight import (
    Span,
    generated_captures,
    highlight,
    source_captures,
)
from s2sgrad.review.model import CaptureRecord, ReviewRecord, Snippet

_ANSI = {
    "heading": "1",
    "rule": "2",
    "number": "36",
    "lineno": "2",
    "keyword": "1",
    "string": "32",
    "comment": "2;3",
    "capture-input": "1;34",
    "capture-output": "1;32",
    "capture-temporary": "1;35",
    "capture-constant": "1;33",
    "capture-metadata": "1;36",
}
_GUTTER = " | "

Line = list[Span]


def render_text(records: Sequence[ReviewRecord], width: int, color: bool) -> str:
    """Return the review of `records` as text for a terminal `width` columns wide."""
    lines: list[Line] = []
    for record in records:
        if lines:
            lines.append([])
        lines += _record(record, width)
    return "".join(_ansi(line) if color else _plain(line) for line in lines)


def _plain(line: Line) -> str:
    return "".join(text for text, _ in _rstrip(line)) + "\n"


def _ansi(line: Line) -> str:
    parts = []
    for text, style in _rstrip(line):
        code = _ANSI.get(style) if style else None
        parts.append(f"\x1b[{code}m{text}\x1b[0m" if code else text)
    return "".join(parts) + "\n"


def _rstrip(line: Line) -> Line:
    """Drop trailing whitespace, styled or not."""
    spans = list(line)
    while spans and not spans[-1][0].rstrip():
        spans.pop()
    if spans:
        spans[-1] = (spans[-1][0].rstrip(), spans[-1][1])
    return spans


def _width(line: Line) -> int:
    return sum(len(text) for text, _ in line)


def _record(record: ReviewRecord, width: int) -> list[Line]:
    title = (
        f"{record.name}  {record.path}:{record.first_line}-{record.last_line}"
        f" -> {record.output}  (policy: {record.policy})"
    )
    lines: list[Line] = [[(title, "heading")], [("=" * len(title), "rule")], []]
    lines += _code(record, width)
    lines += [[], *_captures(record.captures)]
    if record.temporaries:
        lines += [[], *_temporaries(record)]
    lines += [[], *_context(record)]
    return lines


def _numbered(snippet: Snippet, names: dict[str, str]) -> list[Line]:
    spans = highlight(snippet.text, names)
    last = snippet.first_line + len(spans) - 1
    digits = len(str(last))
    return [
        [(f"{snippet.first_line + i:>{digits}}  ", "lineno"), *line]
        for i, line in enumerate(spans)
    ]


def _code(record: ReviewRecord, width: int) -> list[Line]:
    """Put the source beside the generated code, or above it when they do not fit."""
    left: list[Line] = [[("Source", "heading")]]
    left += _numbered(record.source, source_captures(record))
    right: list[Line] = [[("Generated", "heading")]]
    generated = generated_captures(record)
    for index, snippet in enumerate(record.generated):
        if index:
            right.append([])
        right += _numbered(snippet, generated)
    column = max(_width(line) for line in left)
    if column + len(_GUTTER) + max(_width(line) for line in right) <= width:
        empty: Line = []
        return [
            [*a, (" " * (column - _width(a)), None), (_GUTTER, "rule"), *b]
            for a, b in zip_longest(left, right, fillvalue=empty)
        ]
    return [*left, [], *right]


def _table(rows: Iterable[Sequence[Span]]) -> list[Line]:
    """Align cells in columns two spaces apart."""
    rows = list(rows)
    widths = [max(len(row[i][0]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for row in rows:
        line: Line = [("  ", None)]
        for (text, style), column in zip(row, widths, strict=True):
            line += [(text, style), (" " * (column - len(text) + 2), None)]
        lines.append(line)
    return lines


def _captures(captures: Sequence[CaptureRecord]) -> list[Line]:
    if not captures:
        return [[("Captures: none (backward reads nothing from forward)", "heading")]]
    header = ["name", "kind", "from", "read by", "ctx", "saved as", "gradient"]
    rows: list[list[Span]] = [[(h, "heading") for h in header]]
    for capture in captures:
        reader: str = capture.read_by
        if capture.line is not None:
            reader += f", line {capture.line}"
        slot = "-" if capture.slot is None else str(capture.slot)
        kind = f"capture-{capture.kind}"
        rows.append(
            [
                (capture.name, kind),
                (capture.kind, kind),
                (capture.expression, None),
                (reader, None),
                (slot, None),
                (capture.saved, None),
                (capture.gradient, None),
            ]
        )
    return [[("Captures", "heading")], *_table(rows)]


def _temporaries(record: ReviewRecord) -> list[Line]:
    lines: list[Line] = [[("Temporaries: how their gradients flow back", "heading")]]
    for temp in record.temporaries:
        how: str = temp.how
        if temp.grad_param:
            how += f" (backward takes {temp.grad_param})"
        lines.append(
            [("  ", None), (temp.name, "capture-temporary"), (f": {how}", None)]
        )
        lines.append([(f"      why: {temp.why}", None)])
    if record.vjp_statements:
        lines.append([("  The generated VJP differentiates:", None)])
        lines += [[(f"      {statement}", None)] for statement in record.vjp_statements]
    if record.first_order:
        lines.append(
            [("  backward is first-order only: a second-order use raises", None)]
        )
    return lines


def _context(record: ReviewRecord) -> list[Line]:
    if not record.context:
        return [[("Context tuple: () (empty)", "heading")]]
    names = ", ".join(slot.name for slot in record.context)
    tuple_text = f"({names},)" if len(record.context) == 1 else f"({names})"
    rows = [
        [
            (str(slot.index), None),
            (slot.name, f"capture-{slot.kind}"),
            (slot.kind, f"capture-{slot.kind}"),
            (slot.location, None),
        ]
        for slot in record.context
    ]
    return [[("Context tuple: ", "heading"), (tuple_text, None)], *_table(rows)]
