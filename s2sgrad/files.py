"""Writing the caches s2sgrad keeps beside Python's bytecode: whole, or not at all."""

from __future__ import annotations

import os
from pathlib import Path


def write_atomic(path: Path, data: bytes, mode: int) -> None:
    """Write `data` to `path` through a pid-suffixed temporary file and `os.replace`.

    The file is created with `mode` less the umask, as importlib writes `.pyc` files;
    `O_EXCL` never writes through a file or link left at the temporary name, which is
    removed first (a killed process with this id may have left it).
    """
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        tmp.unlink(missing_ok=True)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
        with open(os.open(tmp, flags, mode), "wb") as handle:
            handle.write(data)
        os.replace(tmp, path)
    except OSError:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        raise
