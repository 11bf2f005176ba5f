"""The weight cache over real folders and a real HTTP server on loopback that counts the bytes
it serves: one fetch per node whatever the replicas, a mismatch never kept, read-only copies,
and least-recently-used eviction that spares what running replicas use."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from policies.errors import Conflict, InvalidRequest, Unavailable
from policies.services import ModelRef
from portal.allocator import Allocator
from portal.inference.digest import folder_digest
from portal.inference.service import build_for_service
from portal.inference.weights import WeightCache
from portal.settings import load_settings
from portal.store.writer import Store

T0 = datetime(2026, 1, 1, tzinfo=UTC)


class Served:
    """Files served over HTTP on loopback, with the bytes sent so far."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.bytes_sent = 0
        self.lock = threading.Lock()
        served = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = served.root / self.path.lstrip("/")
                if not path.is_file():
                    self.send_error(404)
                    return
                data = path.read_bytes()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                with served.lock:
                    served.bytes_sent += len(data)

            def do_HEAD(self) -> None:
                # The size a source declares (the Kubernetes cache asks before a fetch).
                path = served.root / self.path.lstrip("/")
                if not path.is_file():
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(path.stat().st_size))
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.server.server_port}/{name}"


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    (tmp_path / "www").mkdir()
    s = Served(tmp_path / "www")
    yield s
    s.server.shutdown()
    s.server.server_close()


def http_model(served: Served, name: str, size: int) -> ModelRef:
    """A one-file model of ``size`` bytes served at ``name``, with its digest."""
    (served.root / name).write_bytes(bytes(i % 251 for i in range(size)))
    folder = served.root / f"{name}.d"
    folder.mkdir()
    (folder / name).write_bytes((served.root / name).read_bytes())
    return ModelRef(served.url(name), folder_digest(folder))


def cache(
    tmp_path: Path, node_bytes: int = 10_000_000, tenant_bytes: int = 10_000_000
) -> WeightCache:
    return WeightCache(tmp_path / "cache", node_bytes=node_bytes, tenant_bytes=tenant_bytes)


def test_replicas_that_start_together_fetch_once_per_node(tmp_path: Path, served: Served) -> None:
    size = 300_000
    model = http_model(served, "tiny.safetensors", size)
    wc = cache(tmp_path)
    nodes = ["n1"] * 4 + ["n2"] * 2
    paths: dict[int, Path] = {}

    def start(i: int) -> None:
        paths[i] = wc.ensure(nodes[i], "team-a", model, (), T0).path

    threads = [threading.Thread(target=start, args=(i,)) for i in range(len(nodes))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert served.bytes_sent == size * len(set(nodes))
    assert len({paths[i] for i in range(4)}) == 1 and paths[4] == paths[5] != paths[0]
    assert (paths[0] / "tiny.safetensors").stat().st_size == size
    # A later replica is warm: nothing fetched, nothing served.
    again = wc.ensure("n1", "team-a", model, (), T0 + timedelta(seconds=1))
    assert not again.cold and served.bytes_sent == size * 2


def test_a_digest_mismatch_is_refused_and_nothing_is_kept(tmp_path: Path, served: Served) -> None:
    model = http_model(served, "m.bin", 1000)
    wrong = ModelRef(model.uri, "sha256:" + "1" * 64)
    wc = cache(tmp_path)
    with pytest.raises(InvalidRequest) as err:
        wc.ensure("n1", "team-a", wrong, (), T0)
    assert err.value.field == "model.digest" and model.digest in str(err.value)
    assert [p.name for p in (tmp_path / "cache").rglob("*")] == ["n1"]  # no copy, no record
    assert wc.entries(()) == []
    # The right digest is then fetched and kept.
    assert (wc.ensure("n1", "team-a", model, (), T0).path / "m.bin").is_file()


def test_a_replica_cannot_write_to_the_cache(tmp_path: Path) -> None:
    src = tmp_path / "model"
    (src / "sub").mkdir(parents=True)
    (src / "config.json").write_text("{}")
    (src / "sub" / "w.bin").write_bytes(b"x" * 100)
    wc = cache(tmp_path)
    path = wc.ensure("n1", "team-a", ModelRef(src.as_uri(), folder_digest(src)), (), T0).path
    assert path.stat().st_mode & 0o777 == 0o555 and (path / "sub").stat().st_mode & 0o777 == 0o555
    assert (path / "config.json").stat().st_mode & 0o777 == 0o444
    writer = (
        "import sys, pathlib\n"
        "p = pathlib.Path(sys.argv[1])\n"
        "assert (p / 'config.json').read_text() == '{}'\n"
        "for how in (lambda: (p / 'config.json').write_text('x'),\n"
        "            lambda: (p / 'new').write_text('x'),\n"
        "            lambda: (p / 'sub' / 'w.bin').unlink()):\n"
        "    try:\n        how()\n    except PermissionError:\n        continue\n"
        "    sys.exit('wrote')\n"
    )
    command = [sys.executable, "-c", writer, str(path)]
    if os.geteuid() == 0:
        # Root ignores file modes: the engine runs as an ordinary user, as it would in a pod.
        for parent in (path, *path.parents):
            if parent == Path("/"):
                break
            parent.chmod(parent.stat().st_mode | 0o005 | (0o001 if parent.is_dir() else 0))
        command = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *command]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert (path / "config.json").read_text() == "{}" and not (path / "new").exists()


def test_eviction_is_least_recently_used_and_spares_entries_in_use(
    tmp_path: Path, served: Served
) -> None:
    m1, m2, m3 = (http_model(served, f"m{i}.bin", 1000) for i in (1, 2, 3))
    wc = cache(tmp_path, node_bytes=10_000, tenant_bytes=2_000)
    wc.ensure("n1", "team-a", m1, (), T0)
    wc.ensure("n1", "team-a", m2, (), T0 + timedelta(seconds=1))
    # m1 is the least recently used but a running replica uses it: m2 goes.
    wc.ensure("n1", "team-a", m3, [("n1", m1.digest)], T0 + timedelta(seconds=2))
    held = {e.digest for e in wc.entries([("n1", m1.digest)])}
    assert held == {m1.digest, m3.digest}
    # Both in use: the tenant's cap refuses a fourth model, and nothing is evicted or kept.
    m4 = http_model(served, "m4.bin", 1000)
    with pytest.raises(Conflict, match="tenant team-a on node n1"):
        wc.ensure("n1", "team-a", m4, [("n1", m1.digest), ("n1", m3.digest)], T0)
    assert {e.digest for e in wc.entries(())} == {m1.digest, m3.digest}
    # Another tenant has its own cap; a digest it shares is one copy, charged to each.
    wc.ensure("n1", "team-b", m1, (), T0 + timedelta(seconds=3))
    rows = wc.entries((), tenants={"team-b"})
    assert [(r.tenant, r.digest) for r in rows] == [("team-b", m1.digest)]
    assert served.bytes_sent == 4000  # m1 m2 m3 fetched, m4 fetched and refused, m1 shared


def test_the_node_cap_evicts_other_tenants_unused_entries(tmp_path: Path, served: Served) -> None:
    m1, m2, m3 = (http_model(served, f"m{i}.bin", 1000) for i in (1, 2, 3))
    wc = cache(tmp_path, node_bytes=2_000, tenant_bytes=2_000)
    wc.ensure("n1", "team-a", m1, (), T0)
    wc.ensure("n1", "team-b", m2, (), T0 + timedelta(seconds=1))
    wc.ensure("n1", "team-b", m3, [("n1", m2.digest)], T0 + timedelta(seconds=2))
    assert {(e.tenant, e.digest) for e in wc.entries(())} == {
        ("team-b", m2.digest),
        ("team-b", m3.digest),
    }
    assert not (tmp_path / "cache" / "n1" / m1.digest.removeprefix("sha256:")).exists()


def test_bad_uris_and_sizes_are_clear_errors(tmp_path: Path, served: Served) -> None:
    wc = cache(tmp_path, node_bytes=5_000, tenant_bytes=1_000)
    digest = "sha256:" + "2" * 64
    with pytest.raises(InvalidRequest, match="file://, http:// or https://"):
        wc.ensure("n1", "team-a", ModelRef("s3://bucket/key", digest), (), T0)
    with pytest.raises(InvalidRequest, match="exists on this host"):
        wc.ensure("n1", "team-a", ModelRef("file:///no/such/model", digest), (), T0)
    with pytest.raises(Unavailable, match="404"):
        wc.ensure("n1", "team-a", ModelRef(served.url("missing.bin"), digest), (), T0)
    big = http_model(served, "big.bin", 1500)
    with pytest.raises(Conflict, match="GPUPORTAL_WEIGHT_CACHE_TENANT_BYTES"):
        wc.ensure("n1", "team-a", big, (), T0)
    assert wc.entries(()) == [] and not list((tmp_path / "cache" / "n1").iterdir())
    with pytest.raises(InvalidRequest, match="tenant bytes <= node bytes"):
        WeightCache(tmp_path / "c2", node_bytes=100, tenant_bytes=200)


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"GPUPORTAL_WEIGHT_CACHE_BYTES": "lots"}, "GPUPORTAL_WEIGHT_CACHE_BYTES"),
        ({"GPUPORTAL_WEIGHT_CACHE_BYTES": "0"}, "GPUPORTAL_WEIGHT_CACHE_BYTES"),
        (
            {"GPUPORTAL_WEIGHT_CACHE_BYTES": "100", "GPUPORTAL_WEIGHT_CACHE_TENANT_BYTES": "200"},
            "GPUPORTAL_WEIGHT_CACHE_TENANT_BYTES",
        ),
    ],
)
def test_bad_cache_settings_name_the_variable(
    env: dict[str, str], named: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(InvalidRequest, match=named):
        load_settings()


def test_the_service_builds_its_cache_from_the_settings(tmp_path: Path) -> None:
    settings = load_settings(
        state_dir=tmp_path, weight_cache_bytes=5000, weight_cache_tenant_bytes=3000
    )
    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    try:
        controller = build_for_service(Allocator(store), settings)
        weights = controller.backend.weights if controller.backend else None
        assert weights is not None
        assert (weights.node_bytes, weights.tenant_bytes) == (5000, 3000)
        assert weights.root == tmp_path / "weights"
    finally:
        store.close()
