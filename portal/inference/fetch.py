"""The fetch of one model into a node's weight cache on Kubernetes: what a fetch pod runs
(``python -m portal.inference.fetch URI DIGEST ROOT --limit BYTES``), with the local cache's
own fetch and digest check (``weights.fetch_checked``); and the eviction of one entry, what an
evict pod runs (``python -m portal.inference.fetch --evict DIGEST ROOT``).

``ROOT`` is the tenant's cache folder on the node (its claim, mounted read-write in this pod
only). The model goes to a temporary folder beside its entry; a matching copy is made
read-only and renamed to ``ROOT/<hex digest>``, then ``ROOT/<hex digest>.json`` (its size) is
written by a rename: the marker says the entry is whole, so a fetch that was cut off is done
again, and one that finished is not. An eviction removes the marker first, then the folder
(as the local cache does): cut off between the two, it leaves files no marker vouches for,
which the next fetch of that digest replaces. The exit code says how it went (``EXIT_REASONS``), so
the portal can tell a refusal from a failure worth trying again without reading the pod's log.
"""

from __future__ import annotations

import argparse
import json
import sys
import uuid
from pathlib import Path

from policies.errors import Conflict, InvalidRequest, PortalError
from policies.services import DIGEST, ModelRef
from portal.inference.digest import PREFIX, folder_size
from portal.inference.weights import DigestMismatch, fetch_checked, read_only, remove

OK = 0
USAGE = 2
"""The arguments or the URI are not valid (argparse's code for bad arguments too)."""
MISMATCH = 3
"""The files are not the ones the digest names: refused, nothing kept."""
TOO_LARGE = 4
"""The model is larger than a tenant may cache on a node."""
UNAVAILABLE = 5
"""The source did not answer, or answered with an error: worth trying again."""
EXIT_REASONS = {
    USAGE: "the model URI cannot be fetched",
    MISMATCH: "the fetched files do not match model.digest: refused, nothing was mounted",
    TOO_LARGE: "the model is larger than the tenant's weight cache on a node",
    UNAVAILABLE: "the model's source did not answer or answered with an error",
}


def entry_of(root: Path, digest: str) -> Path:
    return root / digest.removeprefix(PREFIX)


def marker_of(root: Path, digest: str) -> Path:
    return root / f"{digest.removeprefix(PREFIX)}.json"


def fetch_entry(root: Path, model: ModelRef, limit: int) -> tuple[int, int]:
    """Make ``root``'s entry of ``model`` whole: (its size, the bytes fetched now: 0 when it
    was whole already). Raises what ``fetch_checked`` raises; nothing is kept then."""
    entry, marker = entry_of(root, model.digest), marker_of(root, model.digest)
    if marker.is_file() and entry.is_dir():
        return int(json.loads(marker.read_text())["size"]), 0
    if entry.exists():
        remove(entry)  # left by a fetch cut off between its rename and its marker
    tmp = root / f".fetch-{entry.name}-{uuid.uuid4().hex}"
    tmp.mkdir(mode=0o700)
    try:
        fetched = fetch_checked(model, tmp, limit)
        size = folder_size(tmp)
        read_only(tmp)
        tmp.rename(entry)
    finally:
        if tmp.exists():
            remove(tmp)
    part = marker.with_name(f".{marker.name}.{uuid.uuid4().hex}")
    part.write_text(json.dumps({"digest": model.digest, "size": size}))
    part.replace(marker)
    return size, fetched


def evict_entry(root: Path, digest: str) -> bool:
    """Remove ``root``'s entry of ``digest``; whether there was one (an eviction done twice
    finds nothing the second time, and that is not an error)."""
    if not DIGEST.fullmatch(digest):
        raise InvalidRequest("digest", digest, "sha256: and 64 lowercase hex digits")
    entry, marker = entry_of(root, digest), marker_of(root, digest)
    found = marker.exists() or entry.exists()
    marker.unlink(missing_ok=True)
    if entry.exists():
        remove(entry)
    return found


def exit_code(exc: PortalError) -> int:
    if isinstance(exc, DigestMismatch):
        return MISMATCH
    if isinstance(exc, Conflict):
        return TOO_LARGE
    if isinstance(exc, InvalidRequest):
        return USAGE
    return UNAVAILABLE


def evict_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m portal.inference.fetch --evict", description="Remove one cache entry."
    )
    parser.add_argument("digest", help="the entry's digest, sha256:<64 hex>")
    parser.add_argument("root", type=Path, help="the tenant's cache folder on this node")
    args = parser.parse_args(argv)
    try:
        found = evict_entry(args.root, args.digest)
    except PortalError as exc:
        print(exc.message, file=sys.stderr)
        return USAGE
    print(json.dumps({"digest": args.digest, "evicted": found}))
    return OK


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--evict"]:
        return evict_main(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m portal.inference.fetch", description=__doc__)
    parser.add_argument("uri", help="the model's http:// or https:// URI")
    parser.add_argument("digest", help="the model's digest, sha256:<64 hex>")
    parser.add_argument("root", type=Path, help="the tenant's cache folder on this node")
    parser.add_argument("--limit", type=int, required=True, help="bytes a model may have")
    parser.add_argument(
        "--report", type=Path, help="a file to write the outcome to (a pod's termination log)"
    )
    args = parser.parse_args(argv)
    try:
        model = ModelRef(args.uri, args.digest)
        size, fetched = fetch_entry(args.root, model, args.limit)
    except PortalError as exc:
        # The pod's termination message (FallbackToLogsOnError): what the portal shows.
        print(exc.message, file=sys.stderr)
        return exit_code(exc)
    outcome = json.dumps({"digest": model.digest, "size": size, "fetched": fetched})
    print(outcome)
    if args.report is not None:
        args.report.write_text(outcome)
    return OK


if __name__ == "__main__":
    sys.exit(main())
