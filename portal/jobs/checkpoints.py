"""The checkpoint contract between the portal and a training script (``docs/training-contract.md``).

A checkpoint is a folder ``<GPUPORTAL_CHECKPOINT_DIR>/step-<N>/`` (``N`` the training step, a
decimal number) that the script writes in full and then marks complete by creating the file
``step-<N>/COMPLETE`` last, by an atomic rename. A folder without that marker is *torn* (the
attempt died while writing it) and is never resumed from. When the portal restarts an attempt it
sets ``GPUPORTAL_RESUME_FROM`` to the newest complete checkpoint's folder, or to the empty string.

This module uses only the standard library, so a training script may import it; it need not:
the contract is a few lines of any language.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

__all__ = [
    "DONE_MARKER",
    "mark_complete",
    "newest_complete_checkpoint",
    "resume_from_env",
    "step_path",
]

DONE_MARKER = "COMPLETE"
_STEP = re.compile(r"step-([0-9]+)")


def step_path(checkpoint_dir: Path, step: int) -> Path:
    """The folder of the checkpoint of ``step`` (not created here)."""
    if step < 0:
        raise ValueError(f"invalid checkpoint step {step}: expected 0 or more")
    return checkpoint_dir / f"step-{step}"


def mark_complete(step_dir: Path) -> None:
    """Mark ``step_dir`` complete, after every file of it is written: the marker is written to
    a temporary name, flushed to disk and renamed into place, so it exists whole or not at all.
    """
    marker = step_dir / DONE_MARKER
    partial = step_dir / f".{DONE_MARKER}.partial"
    with partial.open("w") as f:
        f.write("complete\n")
        f.flush()
        os.fsync(f.fileno())
    partial.replace(marker)
    fd = os.open(step_dir, os.O_RDONLY)
    try:
        os.fsync(fd)  # make the rename itself durable
    finally:
        os.close(fd)


def newest_complete_checkpoint(checkpoint_dir: Path) -> tuple[Path, int] | None:
    """``(folder, step)`` of the newest checkpoint that has its done-marker, or ``None`` when
    there is none (or ``checkpoint_dir`` does not exist). Torn folders, files and names that are
    not ``step-<N>`` are skipped."""
    try:
        entries = list(os.scandir(checkpoint_dir))
    except (FileNotFoundError, NotADirectoryError):
        return None
    best: tuple[int, str] | None = None
    for entry in entries:
        match = _STEP.fullmatch(entry.name)
        if match is None or not entry.is_dir(follow_symlinks=False):
            continue
        if not (Path(entry.path) / DONE_MARKER).is_file():
            continue
        # Ties (step-7 and step-07) break on the name, so the answer never depends on the
        # order the file system lists them in.
        key = (int(match.group(1)), entry.name)
        if best is None or key > best:
            best = key
    if best is None:
        return None
    return checkpoint_dir / best[1], best[0]


def resume_from_env(environ: Mapping[str, str] = os.environ) -> tuple[Path, int] | None:
    """``(folder, step)`` named by ``GPUPORTAL_RESUME_FROM``, or ``None`` to start afresh."""
    value = environ.get("GPUPORTAL_RESUME_FROM", "")
    if not value:
        return None
    path = Path(value)
    match = _STEP.fullmatch(path.name)
    if match is None:
        raise ValueError(f"invalid GPUPORTAL_RESUME_FROM {value!r}: expected a step-<N> folder")
    return path, int(match.group(1))
