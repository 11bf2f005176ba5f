"""The fetch module a Kubernetes fetch pod runs (``python -m portal.inference.fetch``), as a
real process against a real HTTP server on loopback: it fetches once, leaves a read-only entry
and its marker, and refuses a mismatch or an oversized model with distinct exit codes,
keeping nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from policies.services import ModelRef
from portal.inference import fetch
from tests.portal.inference.test_weights import Served, http_model


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    (tmp_path / "www").mkdir()
    s = Served(tmp_path / "www")
    yield s
    s.server.shutdown()
    s.server.server_close()


def run_fetch(
    model: ModelRef, root: Path, limit: int = 10_000_000, report: Path | None = None
) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "portal.inference.fetch", model.uri, model.digest, str(root)]
    command += ["--limit", str(limit)]
    if report is not None:
        command += ["--report", str(report)]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)


def test_a_fetch_pod_fetches_once_and_leaves_a_read_only_entry(
    tmp_path: Path, served: Served
) -> None:
    size = 200_000
    model = http_model(served, "w.safetensors", size)
    root = tmp_path / "cache"
    root.mkdir()
    first = run_fetch(model, root, report=tmp_path / "report")
    assert first.returncode == fetch.OK, first.stderr
    assert json.loads((tmp_path / "report").read_text()) == {
        "digest": model.digest,
        "size": size,
        "fetched": size,
    }
    entry = fetch.entry_of(root, model.digest)
    assert (entry / "w.safetensors").stat().st_size == size
    assert entry.stat().st_mode & 0o777 == 0o555
    assert (entry / "w.safetensors").stat().st_mode & 0o777 == 0o444
    assert json.loads(fetch.marker_of(root, model.digest).read_text())["size"] == size
    # A Job's pod run again (a retry, a re-created Job) finds the entry whole: nothing fetched.
    again = run_fetch(model, root)
    assert again.returncode == fetch.OK and json.loads(again.stdout)["fetched"] == 0
    assert served.bytes_sent == size
    assert sorted(p.name for p in root.iterdir()) == sorted([entry.name, f"{entry.name}.json"])


def test_a_mismatch_or_an_oversized_model_is_refused_and_nothing_is_kept(
    tmp_path: Path, served: Served
) -> None:
    model = http_model(served, "m.bin", 5_000)
    root = tmp_path / "cache"
    root.mkdir()
    wrong = ModelRef(model.uri, "sha256:" + "2" * 64)
    refused = run_fetch(wrong, root)
    assert refused.returncode == fetch.MISMATCH
    assert model.digest in refused.stderr and "nothing was cached or mounted" in refused.stderr
    assert list(root.iterdir()) == []
    large = run_fetch(model, root, limit=4_999)
    assert large.returncode == fetch.TOO_LARGE and "4999" in large.stderr
    missing = run_fetch(ModelRef(served.url("absent.bin"), model.digest), root)
    assert missing.returncode == fetch.UNAVAILABLE and "404" in missing.stderr
    assert list(root.iterdir()) == []


def run_evict(digest: str, root: Path) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "portal.inference.fetch", "--evict", digest, str(root)]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)


def test_an_evict_pod_removes_one_read_only_entry_and_its_marker_only(
    tmp_path: Path, served: Served
) -> None:
    root = tmp_path / "cache"
    root.mkdir()
    gone, kept = (http_model(served, name, 3_000) for name in ("gone.bin", "kept.bin"))
    for model in (gone, kept):
        assert run_fetch(model, root).returncode == fetch.OK
    done = run_evict(gone.digest, root)
    assert done.returncode == fetch.OK, done.stderr
    assert json.loads(done.stdout) == {"digest": gone.digest, "evicted": True}
    entry = fetch.entry_of(root, kept.digest)
    assert sorted(p.name for p in root.iterdir()) == sorted([entry.name, f"{entry.name}.json"])
    # Done twice (a retried pod): nothing left to remove, not an error.
    again = run_evict(gone.digest, root)
    assert again.returncode == fetch.OK and json.loads(again.stdout)["evicted"] is False
    # A bad digest is refused by name and removes nothing (never a path outside the root).
    bad = run_evict("../" + kept.digest.removeprefix("sha256:"), root)
    assert bad.returncode == fetch.USAGE and "invalid digest" in bad.stderr
    assert entry.is_dir() and fetch.marker_of(root, kept.digest).is_file()
    # The evicted digest is fetched again as new; the kept one is found whole.
    assert json.loads(run_fetch(gone, root).stdout)["fetched"] == 3_000
    assert json.loads(run_fetch(kept, root).stdout)["fetched"] == 0
