"""The one definition of a model's digest: what ``model.digest`` must equal.

A model is a folder. Its digest is ``sha256:`` and the sha256 of a canonical manifest: one line
per regular file, sorted by its path relative to the folder (``/``-separated), each line the
file's own sha256 in hex, its size in bytes and its path, separated by single spaces. Naming the
paths and sizes means renaming or moving a file changes the digest, and hashing each file on
its own keeps the manifest small however large the weights are. A model fetched as one file
(an ``https://`` URI) is a folder that holds that one file under its name.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

from policies.errors import InvalidRequest

READ_CHUNK = 1 << 20
PREFIX = "sha256:"


def file_sha256(path: Path, seen: Callable[[int], None] | None = None) -> str:
    """The hex sha256 of one file, read in chunks; ``seen`` is told each chunk's size."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(READ_CHUNK):
            h.update(chunk)
            if seen is not None:
                seen(len(chunk))
    return h.hexdigest()


def manifest(folder: Path, seen: Callable[[int], None] | None = None) -> str:
    """The canonical manifest of ``folder`` (see the module's text). Symbolic links are
    refused: a digest must name the bytes it covers, not a place that can change."""
    if not folder.is_dir():
        raise InvalidRequest("model", str(folder), "a folder of the model's files")
    lines = []
    for path in sorted(folder.rglob("*"), key=lambda p: p.relative_to(folder).as_posix()):
        rel = path.relative_to(folder).as_posix()
        if path.is_symlink():
            raise InvalidRequest("model", rel, "regular files and folders, no symbolic links")
        if path.is_file():
            lines.append(f"{file_sha256(path, seen)} {path.stat().st_size} {rel}\n")
    return "".join(lines)


def folder_digest(folder: Path, seen: Callable[[int], None] | None = None) -> str:
    """``sha256:<hex>`` of ``folder``'s manifest."""
    return PREFIX + hashlib.sha256(manifest(folder, seen).encode()).hexdigest()


def folder_size(folder: Path) -> int:
    """The bytes of the regular files under ``folder``."""
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())
