"""The allocator engine: the single writer of allocations, quotas and the queue.

Small API used by the rest of the portal: ``Allocator.request()``, ``release()``, ``status()``,
``queue()``, ``usage()``, ``set_quota()``, ``set_tenant()``; errors are the typed classes of
``policies.errors``.
"""

from portal.allocator.engine import Allocator
from portal.allocator.views import QueueEntry, ReconcileReport, WorkloadStatus

__all__ = ["Allocator", "QueueEntry", "ReconcileReport", "WorkloadStatus"]
