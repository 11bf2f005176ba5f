"""Bytes fetched by the weight cache: N replicas on K nodes fetch a model K times.

``python -m benchmarks.weight_cache [--mib 64] [--replicas 16] [--nodes 2] [--json OUT]``

A model of one file (``--mib`` MiB) is served by an HTTP server on loopback that counts the
bytes it sends. ``--replicas`` replicas, spread round-robin over ``--nodes`` nodes, all ask
their node's ``WeightCache`` for it at once (one thread each, as replicas that start
together). Reported: the bytes served against size x distinct nodes, the time until every
replica had its read-only copy (the cold fetch, digest check included), and the time of a
further round in which every copy is already cached (warm).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from policies.services import ModelRef
from portal.inference.digest import folder_digest
from portal.inference.weights import WeightCache

CHUNK = 1 << 20


def serve(root: Path) -> tuple[ThreadingHTTPServer, list[int]]:
    sent = [0]
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = root / self.path.lstrip("/")
            size = path.stat().st_size
            self.send_response(200)
            self.send_header("Content-Length", str(size))
            self.end_headers()
            with path.open("rb") as f:
                while chunk := f.read(CHUNK):
                    self.wfile.write(chunk)
                    with lock:
                        sent[0] += len(chunk)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, sent


def run(mib: int, replicas: int, nodes: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "www" / "m").mkdir(parents=True)
        model_file = root / "www" / "model.safetensors"
        with model_file.open("wb") as f:
            for i in range(mib):
                f.write(bytes([i % 256]) * CHUNK)
        (root / "www" / "m" / model_file.name).hardlink_to(model_file)
        digest = folder_digest(root / "www" / "m")
        server, sent = serve(root / "www")
        size = model_file.stat().st_size
        model = ModelRef(f"http://127.0.0.1:{server.server_port}/{model_file.name}", digest)
        cache = WeightCache(root / "cache", node_bytes=4 * size, tenant_bytes=2 * size)
        where = [f"n{i % nodes + 1}" for i in range(replicas)]

        def round_() -> float:
            errors: list[BaseException] = []

            def one(node: str) -> None:
                try:
                    cache.ensure(node, "team-a", model, (), datetime.now(UTC))
                except BaseException as exc:
                    errors.append(exc)

            threads = [threading.Thread(target=one, args=(n,)) for n in where]
            t0 = time.perf_counter()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            if errors:
                raise errors[0]
            return time.perf_counter() - t0

        cold = round_()
        warm = round_()
        server.shutdown()
        server.server_close()
        return {
            "model_bytes": size,
            "replicas": replicas,
            "nodes": nodes,
            "bytes_served": sent[0],
            "size_x_nodes": size * nodes,
            "cold_round_s": round(cold, 3),
            "warm_round_s": round(warm, 3),
        }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mib", type=int, default=64)
    p.add_argument("--replicas", type=int, default=16)
    p.add_argument("--nodes", type=int, default=2)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    result = run(args.mib, args.replicas, args.nodes)
    print(json.dumps(result, indent=2))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
