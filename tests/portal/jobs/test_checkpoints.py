"""The checkpoint contract: the newest checkpoint with its done-marker wins, torn ones (no
marker) and stray names are skipped."""

from __future__ import annotations

from pathlib import Path

import pytest

from portal.jobs.checkpoints import (
    DONE_MARKER,
    mark_complete,
    newest_complete_checkpoint,
    resume_from_env,
    step_path,
)


def _checkpoint(root: Path, step: int, *, complete: bool = True) -> Path:
    folder = step_path(root, step)
    folder.mkdir(parents=True)
    (folder / "params.npz").write_bytes(b"weights")
    if complete:
        mark_complete(folder)
    return folder


def test_newest_complete_wins_by_step_not_by_name(tmp_path: Path) -> None:
    _checkpoint(tmp_path, 9)
    ten = _checkpoint(tmp_path, 10)  # "step-10" sorts before "step-9" as text
    _checkpoint(tmp_path, 2)
    assert newest_complete_checkpoint(tmp_path) == (ten, 10)


def test_a_torn_checkpoint_is_skipped(tmp_path: Path) -> None:
    twenty = _checkpoint(tmp_path, 20)
    _checkpoint(tmp_path, 30, complete=False)  # the attempt died while writing it
    assert newest_complete_checkpoint(tmp_path) == (twenty, 20)


def test_a_marker_left_half_written_does_not_count(tmp_path: Path) -> None:
    twenty = _checkpoint(tmp_path, 20)
    torn = _checkpoint(tmp_path, 30, complete=False)
    (torn / f".{DONE_MARKER}.partial").write_text("compl")  # died before the rename
    assert newest_complete_checkpoint(tmp_path) == (twenty, 20)


def test_stray_names_files_and_marker_folders_are_skipped(tmp_path: Path) -> None:
    five = _checkpoint(tmp_path, 5)
    (tmp_path / "step-99").write_text("a file, not a folder")
    (tmp_path / "step-x").mkdir()
    (tmp_path / "step-x" / DONE_MARKER).write_text("")
    (tmp_path / "step-50.tmp").mkdir()
    (tmp_path / "step-50.tmp" / DONE_MARKER).write_text("")
    (tmp_path / "step-60" / DONE_MARKER).mkdir(parents=True)  # a folder named like the marker
    assert newest_complete_checkpoint(tmp_path) == (five, 5)


def test_nothing_to_resume_from(tmp_path: Path) -> None:
    assert newest_complete_checkpoint(tmp_path / "missing") is None
    assert newest_complete_checkpoint(tmp_path) is None
    _checkpoint(tmp_path, 3, complete=False)
    assert newest_complete_checkpoint(tmp_path) is None


def test_mark_complete_leaves_only_the_marker(tmp_path: Path) -> None:
    folder = _checkpoint(tmp_path, 1)
    assert sorted(p.name for p in folder.iterdir()) == [DONE_MARKER, "params.npz"]


def test_resume_from_env() -> None:
    assert resume_from_env({}) is None
    assert resume_from_env({"GPUPORTAL_RESUME_FROM": ""}) is None
    assert resume_from_env({"GPUPORTAL_RESUME_FROM": "/c/step-40"}) == (Path("/c/step-40"), 40)
    with pytest.raises(ValueError, match="step-<N>"):
        resume_from_env({"GPUPORTAL_RESUME_FROM": "/c/latest"})


def test_negative_steps_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="-1"):
        step_path(tmp_path, -1)
