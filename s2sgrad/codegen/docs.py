"""One-line docstrings of generated code, each pointing at the source lines.

What is saved, promoted or recomputed, and why, is `s2sgrad review`'s to show: the
module itself says where each function comes from, and comments say why where the
code alone does not.
"""

from __future__ import annotations

from s2sgrad.autodiff.record import Differentiated


def _span(record: Differentiated, path: str) -> str:
    diff = record.source
    return f"{path}:{diff.first_line}-{diff.last_line}"


def forward_doc(record: Differentiated, path: str) -> str:
    name = record.source.name
    return f"Forward of `{name}` ({_span(record, path)}), and what backward reads."


def backward_doc(record: Differentiated, path: str, promoted: list[str]) -> str:
    diff = record.source
    text = f"Backward of `{diff.name}` ({path}:{diff.backward_line})"
    if len(promoted) == 1:
        text += f", then the gradient of `{promoted[0]}`"
    elif promoted:
        text += f", then those of {', '.join(f'`{p}`' for p in promoted)}"
    return text + "."


def recompute_doc(record: Differentiated, names: tuple[str, ...], path: str) -> str:
    shown = ", ".join(f"`{n}`" for n in names)
    return f"Recompute {shown} of `{record.source.name}` as forward does ({_span(record, path)})."


def op_doc(record: Differentiated, path: str) -> str:
    diff = record.source
    if diff.docstring:
        return diff.docstring
    return f"Differentiable `{diff.name}` ({_span(record, path)})."


def docstring(text: str, indent: str = "    ") -> str:
    """Return `text` as the source of a triple-quoted docstring."""
    body = text.replace("\\", "\\\\").replace('"""', '\\"\\"\\"')
    if "\n" not in body:
        return f'"""{body}"""'
    lines = body.split("\n")
    rest = "\n".join((indent + line) if line else "" for line in lines[1:])
    return f'"""{lines[0]}\n{rest}\n{indent}"""'
