"""Reading the Kubernetes objects of an attempt: how a member pod ended, and the nodes'
readiness, from the plain JSON the API answers (pure functions, no I/O)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from portal.jobs.backend import LogChunk
from portal.jobs.kube import manifests as m

FINISHED = ("Complete", "Failed")
"""Job conditions after which the Job controller starts no more pods."""


def json_of(response: Any) -> dict[str, Any]:
    """The body of an answer read with ``_preload_content=False`` (plain JSON, no models)."""
    data: dict[str, Any] = json.loads(response.data or b"{}")
    return data


def api_message(e: ApiException) -> str:
    """What the apiserver said when it refused (its Status message, else the reason)."""
    try:
        return str(json.loads(e.body or "{}").get("message") or e.reason)
    except ValueError:
        return str(e.body or e.reason)


def epoch(stamp: str | None, default: float) -> float:
    if not stamp:
        return default
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def index(pod: Mapping[str, Any]) -> int | None:
    meta = pod.get("metadata") or {}
    raw = (meta.get("labels") or {}).get(m.COMPLETION_INDEX) or (meta.get("annotations") or {}).get(
        m.COMPLETION_INDEX
    )
    return int(raw) if raw is not None and str(raw).isdigit() else None


def finished(job: Mapping[str, Any]) -> bool:
    conditions = (job.get("status") or {}).get("conditions") or []
    return any(c.get("type") in FINISHED and c.get("status") == "True" for c in conditions)


def complete(job: Mapping[str, Any]) -> bool:
    """Whether the Job controller found every index succeeded."""
    conditions = (job.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Complete" and c.get("status") == "True" for c in conditions)


@dataclass(frozen=True, slots=True)
class NodeState:
    ready: bool
    since: float  # when the Ready condition last changed


def live(pod: Mapping[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")


def has_member(pod: Mapping[str, Any]) -> bool:
    return any(
        c.get("name") == m.CONTAINER for c in (pod.get("spec") or {}).get("containers") or []
    )


def container_states(status: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    statuses = status.get("containerStatuses") or []
    member = [s for s in statuses if s.get("name") == m.CONTAINER]
    return [(s.get("state") or {}).get("terminated") or {} for s in member or statuses]


def exit_code(status: Mapping[str, Any]) -> int | None:
    """A failed member's non-zero exit code, or None when no container tells (an evicted
    pod, say)."""
    codes = [int(t["exitCode"]) for t in container_states(status) if t.get("exitCode") is not None]
    failing = [c for c in codes if c != 0]
    return failing[0] if failing else None


def terminated_at(status: Mapping[str, Any], default: float) -> float:
    stamps = [t.get("finishedAt") for t in container_states(status) if t.get("finishedAt")]
    return min((epoch(s, default) for s in stamps), default=default)


def node_state(node: Mapping[str, Any], now: float) -> NodeState:
    """A node's readiness (not ready since ``now`` when it reports no Ready condition)."""
    conditions = (node.get("status") or {}).get("conditions") or []
    ready = next((c for c in conditions if c.get("type") == "Ready"), None)
    if ready is None:
        return NodeState(False, now)
    return NodeState(ready.get("status") == "True", epoch(ready.get("lastTransitionTime"), now))


def pod_log(
    core: client.CoreV1Api,
    name: str,
    namespace: str,
    container: str | None,
    offset: int,
    limit: int,
) -> LogChunk:
    """``limit`` bytes of a pod container's log from ``offset``, through the API (the kubelet
    serves it). One byte more than asked is read, so a log that goes on is not taken as read
    in full; the chunk's size is the log's length known so far. Raises ``ApiException``."""
    text = cast(Any, core.read_namespaced_pod_log)(
        name,
        namespace,
        container=container,
        limit_bytes=offset + limit + 1,
        _preload_content=False,
    ).data
    data = bytes(text or b"")
    return LogChunk(data[offset : offset + limit], len(data))
