"""What the service controller answers about a service: its record and live replicas."""

from __future__ import annotations

from dataclasses import dataclass

from policies.services import ReplicaState
from portal.allocator import WorkloadStatus
from portal.store.records import ReplicaRecord, ServiceRecord


@dataclass(frozen=True, slots=True)
class ReplicaView:
    replica: ReplicaRecord
    workload: WorkloadStatus | None


@dataclass(frozen=True, slots=True)
class ServiceView:
    """A service as its owner sees it: the record and its live replicas (each with its
    workload: queue reason, position and ETA while it waits)."""

    service: ServiceRecord
    replicas: tuple[ReplicaView, ...]

    @property
    def ready(self) -> int:
        return sum(1 for r in self.replicas if r.replica.state is ReplicaState.READY)
