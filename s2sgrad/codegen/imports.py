"""The import block of a generated module.

Takes the module-level names the lifted code uses and how the source module binds them;
returns import statements that bind exactly those names: the source module's own import
statements (relative ones made absolute) and, for helpers and constants defined in the
source module, `from <source module> import name` so they are the very same objects.
"""

from __future__ import annotations

import keyword
import sys
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


def importable(dotted: str) -> bool:
    """Whether `import <dotted>` can be written: identifiers, no keywords."""
    return all(
        part.isidentifier() and not keyword.iskeyword(part)
        for part in dotted.split(".")
    )


def import_block(
    used: Iterable[str],
    globals_: Mapping[str, GlobalName],
    module_name: str | None,
    extra: Iterable[str] = (),
    future: bool = False,
) -> list[str]:
    """Return the generated module's import lines, deterministic and deduplicated.

    Sorted as isort (and ruff's `I` rules) sort them: `__future__`, the standard
    library, third-party packages, then the source module's own package; within each,
    `import x` lines before `from x import y` lines, one line per module (and one per
    `name as alias`).
    """
    if module_name is not None and not importable(module_name):
        module_name = None  # `my-ops`, `class.ops`: no import statement can name it
    plain: set[str] = set()
    froms: dict[str, set[str]] = {}
    lines_in = [*extra]
    local: list[str] = []
    for name in sorted(set(used)):
        spec = globals_.get(name)
        if spec is None:
            continue
        if spec.import_code is None:
            local.append(name)
            continue
        lines_in += [
            absolute(line, module_name) for line in spec.import_code.split("\n")
        ]
    if local:
        if module_name is None:
            raise ValueError("helpers need the source module's importable name")
        lines_in.append(f"from {module_name} import {', '.join(local)}")
    for line in lines_in:
        if line.startswith("from __future__"):
            continue
        if line.startswith("import "):
            plain.add(line[len("import ") :])
        else:
            module, _, names = line[len("from ") :].partition(" import ")
            froms.setdefault(module, set()).update(n.strip() for n in names.split(","))
    own = (module_name or "").split(".")[0]
    sections: list[list[str]] = [[], [], []]
    for item in sorted(plain, key=_module_key):
        sections[_section(item.split(" ")[0], own)].append(f"import {item}")
    for module in sorted(froms, key=_module_key):
        # isort without `combine-as-imports` (ruff's default): the plain names on one
        # line, each `name as alias` on its own, the lines in the order of their
        # first names.
        plain_names = sorted(
            (n for n in froms[module] if " as " not in n), key=name_key
        )
        groups = [[n] for n in froms[module] if " as " in n]
        groups += [plain_names] if plain_names else []
        for group in sorted(groups, key=lambda g: name_key(g[0])):
            names = ", ".join(group)
            sections[_section(module, own)].append(f"from {module} import {names}")
    # Generated annotations evaluate on Python 3.10+; the user's, kept as written, stay
    # text (PEP 563) where the source module says so.
    out = ["from __future__ import annotations"] if future else []
    for section in sections:
        if section:
            if out:
                out.append("")
            out += section
    return out


def _section(module: str, own: str) -> int:
    """0: the standard library, 1: third-party, 2: the source module's package."""
    root = module.split(".")[0]
    if root in sys.stdlib_module_names:
        return 0
    return 2 if own and root == own else 1


def _module_key(module: str) -> str:
    return module.lower()


def name_key(name: str) -> tuple[int, str]:
    """isort's `order-by-type`: CONSTANTS, then Classes, then functions and values."""
    bare = name.split(" as ")[0]
    if bare.isupper() and len(bare) > 1:
        kind = 0
    elif bare[:1].isupper():  # `_Private` is no class to isort: `_` is uncased
        kind = 1
    else:
        kind = 2
    return kind, name.lower()
