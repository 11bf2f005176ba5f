"""Seed files: tenants and their quotas per flavor, applied idempotently when the service starts.

::

    tenants:
      team-a:
        cohort: research          # optional
        weight: 1.0               # optional, default 1.0
        pools: [a100-pool]        # optional
        quotas:
          H100-80GB: {guaranteed: 2, limit: 4}
          H100-80GB/3g.40gb: {guaranteed: 0, limit: 7, budget_gpu_hours: 100}
          T4: {guaranteed: 1, limit: 2, ceiling_guaranteed: 2, ceiling_limit: 4}
          A100-80GB: {guaranteed: 8, limit: 8, overcommit: true}

The file is the platform admin's: ``ceiling_guaranteed``/``ceiling_limit`` (optional) bound what
the tenant's own admins may set later, and ``overcommit: true`` allows guarantees that add up to
more than the flavor's capacity (``docs/quota.md``).

The whole file is checked before anything is applied. A seed creates what does not exist yet and
never undoes an edit: the service applies it at every start, so "the file wins" would revert
every quota an admin changed through the API, CLI or dashboards at the next restart. The
database remembers a digest of each entry (tenant settings, and each quota) as last applied
(``meta`` rows ``seed:...``); an existing tenant or quota is changed only when the file's entry
itself changed since then. Entries left alone because they were edited since are logged.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from sqlalchemy import delete, select

from policies.errors import InvalidRequest, PortalError
from policies.flavors import Flavor
from portal.allocator import Allocator
from portal.store.reader import META
from portal.store.writer import Store

log = logging.getLogger(__name__)

_TENANT_KEYS = frozenset({"cohort", "weight", "pools", "quotas"})
_QUOTA_KEYS = frozenset(
    {"guaranteed", "limit", "budget_gpu_hours", "ceiling_guaranteed", "ceiling_limit", "overcommit"}
)


@dataclass(frozen=True, slots=True)
class SeedQuota:
    flavor: str
    guaranteed: int
    limit: int
    budget_gpu_hours: float | None = None
    ceiling_guaranteed: int | None = None
    ceiling_limit: int | None = None
    overcommit: bool = False


@dataclass(frozen=True, slots=True)
class SeedTenant:
    name: str
    cohort: str | None
    weight: float
    pools: tuple[str, ...]
    quotas: tuple[SeedQuota, ...]


def load(path: Path) -> list[SeedTenant]:
    """Read and check a seed file.

    Raises:
        InvalidRequest: the file is missing, not YAML, or a value is malformed (named by its
            place in the file).
    """
    try:
        doc = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise InvalidRequest("seed file", str(path), f"a readable file ({exc.strerror})") from exc
    except yaml.YAMLError as exc:
        raise InvalidRequest("seed file", str(path), f"valid YAML ({exc})") from exc
    return parse(doc, str(path))


def parse(doc: object, where: str) -> list[SeedTenant]:
    if not isinstance(doc, Mapping) or set(doc) != {"tenants"}:
        raise InvalidRequest(where, _short(doc), "a mapping with one key, tenants")
    tenants = doc["tenants"]
    if not isinstance(tenants, Mapping):
        raise InvalidRequest(f"{where}: tenants", _short(tenants), "a mapping name -> tenant")
    return [
        _tenant(str(name), body or {}, f"{where}: tenants.{name}") for name, body in tenants.items()
    ]


def _tenant(name: str, body: object, here: str) -> SeedTenant:
    if not isinstance(body, Mapping) or not set(body) <= _TENANT_KEYS:
        raise InvalidRequest(
            here, _short(body), "a mapping with " + ", ".join(sorted(_TENANT_KEYS))
        )
    weight = body.get("weight", 1.0)
    if isinstance(weight, bool) or not isinstance(weight, int | float) or weight <= 0:
        raise InvalidRequest(f"{here}.weight", repr(weight), "a number > 0")
    pools = body.get("pools") or []
    if not isinstance(pools, list) or not all(isinstance(p, str) for p in pools):
        raise InvalidRequest(f"{here}.pools", repr(pools), "a list of pool names")
    cohort = body.get("cohort")
    if cohort is not None and not isinstance(cohort, str):
        raise InvalidRequest(f"{here}.cohort", repr(cohort), "a cohort name")
    quotas = body.get("quotas") or {}
    if not isinstance(quotas, Mapping):
        raise InvalidRequest(f"{here}.quotas", _short(quotas), "a mapping flavor -> quota")
    return SeedTenant(
        name,
        cohort,
        float(weight),
        tuple(sorted(set(pools))),
        tuple(_quota(str(fl), q, f"{here}.quotas.{fl}") for fl, q in quotas.items()),
    )


def _quota(flavor: str, body: object, here: str) -> SeedQuota:
    if not isinstance(body, Mapping) or not {"guaranteed", "limit"} <= set(body) <= _QUOTA_KEYS:
        raise InvalidRequest(
            here,
            _short(body),
            "{guaranteed: N, limit: M[, budget_gpu_hours: H, ceiling_guaranteed: G, "
            "ceiling_limit: L, overcommit: true]}",
        )
    values: dict[str, Any] = {}
    for key in ("guaranteed", "limit", "ceiling_guaranteed", "ceiling_limit"):
        v = body.get(key)
        if v is None and key.startswith("ceiling_"):
            values[key] = None
            continue
        if isinstance(v, bool) or not isinstance(v, int):
            raise InvalidRequest(f"{here}.{key}", repr(v), "an integer")
        values[key] = v
    overcommit = body.get("overcommit", False)
    if not isinstance(overcommit, bool):
        raise InvalidRequest(f"{here}.overcommit", repr(overcommit), "true or false")
    budget = body.get("budget_gpu_hours")
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int | float)):
        raise InvalidRequest(f"{here}.budget_gpu_hours", repr(budget), "a number or null")
    try:
        name = str(Flavor.parse(flavor))
    except PortalError as exc:
        raise InvalidRequest(here, repr(flavor), f"a flavor name ({exc.message})") from exc
    return SeedQuota(
        name,
        values["guaranteed"],
        values["limit"],
        None if budget is None else float(budget),
        values["ceiling_guaranteed"],
        values["ceiling_limit"],
        overcommit,
    )


def apply(allocator: Allocator, tenants: list[SeedTenant]) -> int:
    """Create what is missing, change what the file changed; returns how many tenants and quotas
    changed. An existing tenant or quota whose entry in the file is the one last applied keeps
    its current values (an admin's edit), and so does one that existed before any seed named it.

    Raises:
        PortalError: the allocator refused a value (unknown flavor, limit below guaranteed,
            ...); what was applied before it stays.
    """
    memory = _Memory(allocator.store)
    applied = memory.load()
    seen: dict[str, str] = {}
    changed = skipped = 0
    current = {t.name: t for t in allocator.tenants()}
    for seed in tenants:
        old = current.get(seed.name)
        want = (seed.cohort, seed.weight, seed.pools)
        key, digest = _key(seed.name), _digest(want)
        seen[key] = digest
        if old is None or _file_changed(applied, key, digest):
            if old is None or (old.cohort, old.weight, old.pools) != want:
                allocator.set_tenant(
                    seed.name,
                    cohort=seed.cohort,
                    weight=seed.weight,
                    pools=seed.pools,
                    expected_version=old.version if old else 0,
                )
                changed += 1
        elif (old.cohort, old.weight, old.pools) != want:
            skipped += 1
            _kept(f"tenant {seed.name}", want, (old.cohort, old.weight, old.pools))
        quotas = {q.flavor: q for q in allocator.quotas(seed.name)}
        for q in seed.quotas:
            have = quotas.get(q.flavor)
            # Ceilings the file leaves out (None) are whatever the quota has.
            want_q = (
                q.guaranteed,
                q.limit,
                q.budget_gpu_hours,
                q.ceiling_guaranteed,
                q.ceiling_limit,
            )
            key, digest = _key(seed.name, q.flavor), _digest(want_q)
            seen[key] = digest
            now = None
            if have is not None:
                now = (
                    have.guaranteed,
                    have.limit,
                    have.budget_gpu_hours,
                    None if q.ceiling_guaranteed is None else have.ceiling_guaranteed,
                    None if q.ceiling_limit is None else have.ceiling_limit,
                )
            if now == want_q:
                continue
            if have is not None and not _file_changed(applied, key, digest):
                skipped += 1
                _kept(f"quota {seed.name} {q.flavor}", want_q, now)
                continue
            allocator.set_quota(
                seed.name,
                q.flavor,
                guaranteed=q.guaranteed,
                limit=q.limit,
                budget_gpu_hours=q.budget_gpu_hours,
                ceiling_guaranteed=q.ceiling_guaranteed,
                ceiling_limit=q.ceiling_limit,
                overcommit=q.overcommit,
                expected_version=have.version if have else None,
            )
            changed += 1
    memory.save({k: v for k, v in seen.items() if applied.get(k) != v})
    log.info(
        "seed applied: %d change(s), %d entry(ies) kept as edited since",
        changed,
        skipped,
        extra={"fields": {"changes": changed, "kept": skipped}},
    )
    return changed


def _file_changed(applied: Mapping[str, str], key: str, digest: str) -> bool:
    """Whether the file's entry differs from the one last applied (an entry never applied
    counts as unchanged: what exists already was set by someone else)."""
    return key in applied and applied[key] != digest


def _kept(what: str, file_says: object, now: object) -> None:
    log.info(
        "seed: %s kept as edited since the seed was applied (the file says %s, it is %s)",
        what,
        file_says,
        now,
        extra={"fields": {"entry": what}},
    )


def _key(tenant: str, flavor: str = "") -> str:
    # Meta keys are at most 64 characters; tenant and flavor names may be longer together.
    return "seed:" + hashlib.sha256(f"{tenant}\0{flavor}".encode()).hexdigest()[:40]


def _digest(values: tuple[object, ...]) -> str:
    return hashlib.sha256(repr(values).encode()).hexdigest()


class _Memory:
    """The digests of seed entries as last applied, in the database's ``meta`` table."""

    def __init__(self, store: Store) -> None:
        self._engine = store.engine

    def load(self) -> dict[str, str]:
        with self._engine.connect() as conn:
            rows = conn.execute(select(META).where(META.c.key.startswith("seed:")))
            return {r.key: r.value for r in rows}

    def save(self, digests: Mapping[str, str]) -> None:
        if not digests:
            return
        with self._engine.begin() as conn:
            conn.execute(delete(META).where(META.c.key.in_(list(digests))))
            conn.execute(META.insert(), [{"key": k, "value": v} for k, v in digests.items()])


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
