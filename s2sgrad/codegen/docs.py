"""Docstrings and comments of generated code: what is saved, what is promoted, and why."""

from __future__ import annotations

from s2sgrad.lift import Lifted, Recompute, Saved

_WHY = {
    "input": "input",
    "output": "output",
    "temporary": "temporary of the inputs",
    "constant": "constant (no differentiable input)",
    "metadata": "metadata `{expression}`",
}


def describe(saved: Saved) -> str:
    text = _WHY[saved.kind].format(expression=saved.expression, source=saved.source)
    if saved.promoted:
        text += ", promoted: its gradient flows back"
    elif saved.kind == "temporary":
        text += ", saved only"
    return f"{saved.name}: {text}"


def where(lifted: Lifted, path: str) -> str:
    diff = lifted.source
    return f"{path}:{diff.first_line}-{diff.last_line}"


def forward_doc(lifted: Lifted, path: str) -> str:
    lines = [f"Compute `{lifted.source.name}` and the context its backward reads.", ""]
    lines.append(f"Lifted from {where(lifted, path)}.")
    lines += _context_lines(lifted)
    return "\n".join(lines)


def backward_doc(lifted: Lifted, path: str) -> str:
    diff = lifted.source
    grads = ", ".join(diff.grad_params)
    lines = [
        f"Map the gradient(s) of `{diff.name}` ({grads}) to its inputs' gradients.",
        "",
        f"The closure `{diff.backward.name.value}` of {path}:{diff.backward_line}, "
        "with its captures read from `ctx`.",
    ]
    return "\n".join(lines)


def function_doc(lifted: Lifted) -> str:
    diff = lifted.source
    lines = [f"`{diff.name}` as an autograd Function."]
    if lifted.extras:
        names = ", ".join(s.name for s in lifted.extras)
        lines += ["", f"forward also returns {names}, for setup_context to save."]
    if lifted.once_differentiable:
        lines += [
            "",
            "backward is once_differentiable: it reads a temporary that is saved but not",
            "promoted, so a second-order gradient would silently miss its dependence on",
            "the inputs; raising is the honest answer.",
        ]
    return "\n".join(lines)


def recompute_doc(lifted: Lifted, plan: Recompute, path: str) -> str:
    names = ", ".join(f"`{t}`" for t in plan.returns)
    lines = [f"Recompute {names} of `{lifted.source.name}` for its backward.", ""]
    lines.append(
        f"Replays the forward statements of {where(lifted, path)} they depend on;"
    )
    lines.append("backward calls it instead of saving them, because:")
    lines += [f"    {reason}" for reason in plan.reasons]
    return "\n".join(lines)


def op_doc(lifted: Lifted) -> str:
    diff = lifted.source
    if diff.docstring:
        return diff.docstring
    return (
        f"Differentiable `{diff.name}`: returns what the closure-style source returns."
    )


def _context_lines(lifted: Lifted) -> list[str]:
    if not lifted.context:
        return ["", "The context is empty: backward reads nothing from forward."]
    return ["", "Context:", *(f"    {describe(s)}" for s in lifted.context)]


def docstring(text: str, indent: str = "    ") -> str:
    """Return `text` as the source of a triple-quoted docstring."""
    body = text.replace("\\", "\\\\").replace('"""', '\\"\\"\\"')
    if "\n" not in body:
        return f'"""{body}"""'
    lines = body.split("\n")
    rest = "\n".join((indent + line) if line else "" for line in lines[1:])
    return f'"""{lines[0]}\n{rest}\n{indent}"""'
