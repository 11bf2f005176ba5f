"""GPU-aware idle culling: warn the owner of a notebook whose GPUs stay idle, then stop it
through JupyterHub's REST API after a grace period.

Idleness is the ``idle`` alert (GPU utilization of the allocation below the rule's threshold
for its ``for`` duration), not kernel or HTTP activity: a notebook with a busy kernel and idle
GPUs is idle here, and one that trains from a cron job is not. Only notebook workloads holding
GPUs are considered: training jobs and inference services are never culled, and CPU-only
servers have no GPU allocation, so JupyterHub's usual culler keeps handling them.

Per tenant (``CullPolicy``), once every device of a notebook has had its idle alert firing for
``warn_after_s``:

1. **warn**: an ``idle_cull`` alert scoped to the owner (listed by ``GET /api/v1/alerts`` and
   sent to the webhook like any other) says when the server will be stopped; logged too;
2. **stop** after ``grace_s``, if still idle: ``DELETE /hub/api/users/{owner}/servers/{server}``
   (``.../server`` for the default server); the warning resolves, saying so;
3. if a GPU gets busy during the grace period, the idle alert resolves, and so does the
   warning: nothing is stopped.

The hub token needs the ``admin:servers`` scope (or ``servers`` on the users concerned).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from urllib.parse import quote

import httpx

from policies.alerts import Alert, AlertKey, AlertState, Transition
from policies.errors import InvalidRequest, NotFound
from policies.requests import WorkloadKind
from portal.alerting.store import AlertStore
from portal.allocator import Allocator, WorkloadStatus
from portal.telemetry.attribution import hub_server

log = logging.getLogger(__name__)

RULE = "idle_cull"
IDLE_RULE = "idle"


@dataclass(frozen=True, slots=True)
class CullPolicy:
    """A tenant's culling policy.

    Attributes:
        enabled: False: never cull this tenant's notebooks (the idle alert still fires).
        warn_after_s: how long the idle alert must have been firing before the warning.
        grace_s: time from the warning to the stop.
    """

    enabled: bool = True
    warn_after_s: float = 0.0
    grace_s: float = 15 * 60.0

    def __post_init__(self) -> None:
        for name, value in (("warn after", self.warn_after_s), ("grace", self.grace_s)):
            if not 0 <= value <= 30 * 86_400:
                raise InvalidRequest(f"cull {name}", value, "0..2592000 seconds")


def _when(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M UTC")


class Culler:
    """An alert action (``AlertService(actions=[culler])``) that warns, then stops, notebooks
    whose GPUs stay idle.

    Args:
        alloc: the allocator (workload kind, owner, name and devices).
        hub_api_url: e.g. ``http://127.0.0.1:8081/hub/api``.
        hub_token: a hub token with ``admin:servers``.
        firing: the alerts firing now (``lambda: service.state.firing()``).
        policies: per-tenant policies; others get ``default``.
        notify: actions told of each warning and its resolution (the webhook).
    """

    def __init__(
        self,
        alloc: Allocator,
        hub_api_url: str,
        hub_token: str,
        firing: Callable[[], Iterable[Alert]],
        *,
        policies: Mapping[str, CullPolicy] | None = None,
        default: CullPolicy | None = None,
        notify: Sequence[Callable[[Sequence[Transition], float], None]] = (),
        client: httpx.Client | None = None,
    ) -> None:
        self.alloc = alloc
        self.hub_api_url = hub_api_url.rstrip("/")
        self.firing = firing
        self.policies = dict(policies or {})
        self.default = default or CullPolicy()
        self.notify = list(notify)
        self.store = AlertStore(alloc.store.engine)
        self._client = client or httpx.Client(
            timeout=10.0, headers={"Authorization": f"token {hub_token}"}
        )
        # Warnings survive a restart: they are alerts in the store.
        self.warnings: dict[str, Alert] = {
            a.key.subject: a for a in self.store.active() if a.key.rule == RULE
        }
        self.stopped: set[str] = set()  # asked the hub to stop; the spawner releases them

    def policy(self, tenant: str) -> CullPolicy:
        return self.policies.get(tenant, self.default)

    def __call__(self, transitions: Sequence[Transition], now: float) -> None:
        idle_since = self._idle_notebooks()
        for wid in sorted(set(self.warnings) - set(idle_since)):
            self._resolve(wid, now, "its GPUs are in use again; it will not be stopped")
        for wid, (status, since) in sorted(idle_since.items()):
            if wid in self.stopped:
                continue
            policy = self.policy(status.tenant)
            warning = self.warnings.get(wid)
            if not policy.enabled:
                continue
            if warning is None:
                if now - since >= policy.warn_after_s:
                    self._warn(status, now, policy)
            elif now - warning.active_since >= policy.grace_s:
                self._stop(status, now)

    def _idle_notebooks(self) -> dict[str, tuple[WorkloadStatus, float]]:
        """Notebooks whose every device has a firing idle alert, and since when (the latest
        of their firing times)."""
        fired: dict[str, list[float]] = {}
        for a in self.firing():
            if a.key.rule == IDLE_RULE and a.state is AlertState.FIRING and a.fired_at:
                fired.setdefault(a.key.subject, []).append(a.fired_at)
        out: dict[str, tuple[WorkloadStatus, float]] = {}
        for wid, times in fired.items():
            try:
                status = self.alloc.status(wid)
            except NotFound:
                continue
            devices = sum(max(1, len(a.gpu_uuids)) for a in status.allocations)
            if status.kind == WorkloadKind.NOTEBOOK and devices and len(times) >= devices:
                out[wid] = (status, max(times))
        return out

    def _warn(self, status: WorkloadStatus, now: float, policy: CullPolicy) -> None:
        server = hub_server(status.owner, status.name) or "(default)"
        warning = Alert(
            key=AlertKey(RULE, f"server:{status.owner}/{server}", status.id),
            state=AlertState.FIRING,
            tenant=status.tenant,
            owner=status.owner,
            workloads=(status.id,),
            summary=(
                f"the GPUs of {status.owner}'s server {server} are idle; it will be stopped "
                f"at {_when(now + policy.grace_s)} unless they are used"
            ),
            value=now + policy.grace_s,
            active_since=now,
            fired_at=now,
        )
        self.store.save([warning])
        self.warnings[status.id] = warning
        log.warning("idle GPU server warned: %s", warning.summary)
        self._tell(Transition(None, warning, now))

    def _resolve(self, wid: str, now: float, why: str) -> None:
        warning = self.warnings.pop(wid)
        done = replace(
            warning,
            state=AlertState.RESOLVED,
            resolved_at=now,
            summary=f"{warning.summary} — {why}",
        )
        self.store.save([done])
        log.info("idle GPU server warning resolved: %s", done.summary)
        self._tell(Transition(AlertState.FIRING, done, now))

    def _tell(self, transition: Transition) -> None:
        for action in self.notify:
            try:
                action([transition], transition.at)
            except Exception:  # a broken notifier must not stop culling
                log.exception("notifying %r of %s failed", action, transition.alert.key)

    def _stop(self, status: WorkloadStatus, now: float) -> None:
        user = quote(status.owner, safe="")
        server = hub_server(status.owner, status.name)
        path = (
            f"/users/{user}/servers/{quote(server, safe='')}" if server else f"/users/{user}/server"
        )
        try:
            r = self._client.delete(self.hub_api_url + path)
        except httpx.HTTPError as exc:
            log.warning("could not stop idle GPU server %s: %s; retrying next round", path, exc)
            return
        if r.status_code not in (202, 204, 404):
            log.warning(
                "the hub refused to stop idle GPU server %s: %s %s; retrying next round",
                path,
                r.status_code,
                r.text[:200],
            )
            return
        self.stopped.add(status.id)
        gone = "was already stopped" if r.status_code == 404 else "was stopped"
        self._resolve(status.id, now, f"it {gone} at {_when(now)}")

    def close(self) -> None:
        self._client.close()
