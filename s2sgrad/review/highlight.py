"""Split code into styled spans, marking the names of captures by kind.

Takes code text and a map from names to capture kinds; returns one list of (text, style)
spans per line, where style is None, `keyword`, `string`, `comment`, `number` or
`capture-<kind>`. Both renderers (terminal and HTML) use it, so a capture is marked the
same way in each. Invariant: joining a line's spans gives the line back unchanged.
"""

from __future__ import annotations

import io
import keyword
import tokenize
from collections.abc import Mapping

from s2sgrad.lines import split_lines
from s2sgrad.review.model import ReviewRecord

Span = tuple[str, str | None]

_TOKEN_STYLE = {
    tokenize.STRING: "string",
    tokenize.COMMENT: "comment",
    tokenize.NUMBER: "number",
}


def highlight(code: str, captures: Mapping[str, str]) -> list[list[Span]]:
    """Return the spans of each line of `code`."""
    lines = split_lines(code)
    styles: list[list[str | None]] = [[None] * len(line) for line in lines]
    try:
        for token in tokenize.generate_tokens(io.StringIO(code).readline):
            style = _style(token, captures)
            if style is not None:
                _paint(styles, token.start, token.end, style)
    except (tokenize.TokenError, SyntaxError):
        pass  # a fragment that does not tokenize is shown plain
    return [_spans(line, marks) for line, marks in zip(lines, styles, strict=True)]


def source_captures(record: ReviewRecord) -> dict[str, str]:
    """Map the forward names the closure captures to their kinds."""
    found: dict[str, str] = {}
    for capture in record.captures:
        if capture.read_by == "closure":
            found.setdefault(capture.source, capture.kind)
    return found


def generated_captures(record: ReviewRecord) -> dict[str, str]:
    """Map the names the generated code keeps in the context to their kinds."""
    return {capture.name: capture.kind for capture in record.captures}


def _style(token: tokenize.TokenInfo, captures: Mapping[str, str]) -> str | None:
    if token.type == tokenize.NAME:
        if token.string in captures:
            return f"capture-{captures[token.string]}"
        if keyword.iskeyword(token.string):
            return "keyword"
        return None
    return _TOKEN_STYLE.get(token.type)


def _paint(
    styles: list[list[str | None]],
    start: tuple[int, int],
    end: tuple[int, int],
    style: str,
) -> None:
    for row in range(start[0], end[0] + 1):
        if row > len(styles):
            break
        marks = styles[row - 1]
        first = start[1] if row == start[0] else 0
        last = end[1] if row == end[0] else len(marks)
        marks[first:last] = [style] * (min(last, len(marks)) - first)


def _spans(line: str, marks: list[str | None]) -> list[Span]:
    spans: list[Span] = []
    for char, style in zip(line, marks, strict=True):
        if spans and spans[-1][1] == style:
            spans[-1] = (spans[-1][0] + char, style)
        else:
            spans.append((char, style))
    return spans
