"""The import block of a generated module.

Takes the module-level names the lifted code uses and how the source module binds them;
returns import statements that bind exactly those names: the source module's own import
statements (relative ones made absolute) and, for helpers and constants defined in the
source module, `from <source module> import name` so they are the very same objects.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from s2sgrad.frontend.model import GlobalName


def absolute(code: str, module_name: str | None) -> str:
    """Rewrite a relative `from .x import y` against the source module's package."""
    if not code.startswith("from ."):
        return code
    rest = code[len("from ") :]
    level = len(rest) - len(rest.lstrip("."))
    parts = (module_name or "").split(".")
    if module_name is None or level > len(parts) - 1:
        raise ValueError(code)
    package = ".".join(parts[: len(parts) - level])
    target, _, names = rest[level:].partition(" import ")
    target = target.strip()
    base = f"{package}.{target}" if target else package
    return f"from {base} import {names}"


def import_block(
    used: Iterable[str],
    globals_: Mapping[str, GlobalName],
    module_name: str | None,
    extra: Iterable[str] = (),
) -> list[str]:
    """Return the generated module's import lines, deterministic and deduplicated."""
    plain = {"import torch", *(e for e in extra if e.startswith("import "))}
    froms = {e for e in extra if not e.startswith("import ")}
    local: list[str] = []
    future = False
    for name in sorted(set(used)):
        spec = globals_.get(name)
        if spec is None:
            continue
        if spec.import_code is None:
            local.append(name)
            continue
        for line in spec.import_code.split("\n"):
            line = absolute(line, module_name)
            if line.startswith("from __future__"):
                future = True
            elif line.startswith("import "):
                plain.add(line)
            else:
                froms.add(line)
    lines = ["from __future__ import annotations"] if future else []
    lines += sorted(plain) + sorted(froms)
    if local:
        if module_name is None:
            raise ValueError("helpers need the source module's importable name")
        lines.append(f"from {module_name} import {', '.join(sorted(local))}")
    return lines
