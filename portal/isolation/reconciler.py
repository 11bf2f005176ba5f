"""Make the cluster's isolation objects match the tenants: create, correct, delete.

Each run, in order:

1. build every tenant's manifests (pure, ``policies.isolation``) and refuse duplicates;
2. list the objects we manage (label ``<prefix>managed-by=gpuportal`` plus a tenant label) and
   pick those no tenant wants any more;
3. refuse, before changing anything, to delete a tenant namespace that still has pods, unless
   ``force`` (``TenantHasPods`` names them);
4. server-side apply every wanted object (field manager ``gpuportal``, ``force``: we own these
   fields, a hand edit is drift to undo) and classify it by comparing the object before and
   after: absent before → created; resourceVersion equal → unchanged; otherwise updated if
   anything but status and bookkeeping metadata changed (a controller writing a
   ResourceQuota's status between our read and our apply is not our change);
5. delete the unwanted objects (a namespace takes its contents with it).

Running it twice in a row reports everything unchanged the second time.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

from policies.errors import Conflict, InvalidRequest
from policies.isolation import MANAGER, IsolationSettings, Manifest, TenantSpec, tenant_manifests

APPLY_CONTENT_TYPE = "application/apply-patch+yaml"


@dataclass(frozen=True, slots=True)
class _Kind:
    kind: str
    api_version: str
    plural: str
    namespaced: bool

    def collection(self, namespace: str | None = None) -> str:
        base = "/api/v1" if self.api_version == "v1" else f"/apis/{self.api_version}"
        if self.namespaced and namespace is not None:
            return f"{base}/namespaces/{quote(namespace, safe='')}/{self.plural}"
        return f"{base}/{self.plural}"

    def item(self, namespace: str | None, name: str) -> str:
        return f"{self.collection(namespace)}/{quote(name, safe='')}"


# Apply order: the namespace first, then what lives in it.
_KINDS = (
    _Kind("Namespace", "v1", "namespaces", namespaced=False),
    _Kind("ServiceAccount", "v1", "serviceaccounts", namespaced=True),
    _Kind("ResourceQuota", "v1", "resourcequotas", namespaced=True),
    _Kind("LimitRange", "v1", "limitranges", namespaced=True),
    _Kind("NetworkPolicy", "networking.k8s.io/v1", "networkpolicies", namespaced=True),
    _Kind("Role", "rbac.authorization.k8s.io/v1", "roles", namespaced=True),
    _Kind("RoleBinding", "rbac.authorization.k8s.io/v1", "rolebindings", namespaced=True),
)
_BY_KIND = {k.kind: k for k in _KINDS}
# Changed by the server on every write, or by controllers: not part of what we declare.
_BOOKKEEPING = ("resourceVersion", "managedFields", "generation")


@dataclass(frozen=True, slots=True, order=True)
class ObjectRef:
    """One object: kind, namespace (``None`` for cluster-scoped) and name."""

    kind: str
    namespace: str | None
    name: str

    def __str__(self) -> str:
        where = f"{self.namespace}/" if self.namespace else ""
        return f"{self.kind} {where}{self.name}"


@dataclass(frozen=True, slots=True)
class ReconcileResult:
    """What one run did, per object (each sorted)."""

    created: tuple[ObjectRef, ...] = ()
    updated: tuple[ObjectRef, ...] = ()
    deleted: tuple[ObjectRef, ...] = ()
    unchanged: tuple[ObjectRef, ...] = ()

    @property
    def changed(self) -> bool:
        return bool(self.created or self.updated or self.deleted)


class TenantHasPods(Conflict):
    """A tenant namespace to delete still has pods (and ``force`` was not given)."""

    def __init__(self, pods: Sequence[str]) -> None:
        self.pods = tuple(pods)
        shown = ", ".join(self.pods[:20]) + (" …" if len(self.pods) > 20 else "")
        super().__init__(
            f"refusing to delete tenant namespaces that still have {len(self.pods)} pod(s): "
            f"{shown}; stop them first, or reconcile with force=True to delete them too"
        )


def reconcile(
    tenants: Sequence[TenantSpec],
    settings: IsolationSettings,
    api_client: ApiClient,
    *,
    force: bool = False,
) -> ReconcileResult:
    """Make the cluster's tenant isolation objects match ``tenants`` (see the module doc)."""
    desired = _desired(tenants, settings)
    api = _Api(api_client)
    existing = _managed_objects(api, settings)
    doomed = sorted(ref for ref in existing if ref not in desired)
    doomed_namespaces = {ref.name for ref in doomed if ref.kind == "Namespace"}
    if not force:
        pods = [p for ns in sorted(doomed_namespaces) for p in _pods(api, ns)]
        if pods:
            raise TenantHasPods(pods)

    created: list[ObjectRef] = []
    updated: list[ObjectRef] = []
    unchanged: list[ObjectRef] = []
    for ref, manifest in desired.items():
        kind = _BY_KIND[ref.kind]
        path = kind.item(ref.namespace, ref.name)
        before = api.get(path)
        try:
            after = api.apply(path, manifest)
        except ApiException as e:
            e.add_note(f"while applying {ref}")
            raise
        if before is None:
            created.append(ref)
        elif _version(before) == _version(after) or _content(before) == _content(after):
            unchanged.append(ref)
        else:
            updated.append(ref)

    for ref in doomed:
        if ref.kind != "Namespace" and ref.namespace in doomed_namespaces:
            continue  # goes with its namespace
        api.delete(_BY_KIND[ref.kind].item(ref.namespace, ref.name))
    return ReconcileResult(
        tuple(sorted(created)), tuple(sorted(updated)), tuple(doomed), tuple(sorted(unchanged))
    )


def _ref(manifest: Manifest) -> ObjectRef:
    meta = manifest["metadata"]
    return ObjectRef(manifest["kind"], meta.get("namespace"), meta["name"])


def _desired(
    tenants: Sequence[TenantSpec], settings: IsolationSettings
) -> dict[ObjectRef, Manifest]:
    """Wanted objects in apply order (namespaces first, then by kind)."""
    names = [t.name for t in tenants]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise InvalidRequest("tenants", ", ".join(duplicates), "each tenant listed once")
    manifests = [m for t in tenants for m in tenant_manifests(t, settings)]
    order = {k.kind: i for i, k in enumerate(_KINDS)}
    manifests.sort(key=lambda m: order[m["kind"]])
    return {_ref(m): m for m in manifests}


def _managed_objects(api: _Api, settings: IsolationSettings) -> list[ObjectRef]:
    """Every tenant object we manage (the portal's own objects carry no tenant label)."""
    selector = f"{settings.label('managed-by')}={MANAGER},{settings.label('tenant')}"
    refs = []
    for kind in _KINDS:
        for item in api.list(kind.collection(), selector):
            meta = item["metadata"]
            if meta.get("deletionTimestamp"):
                continue  # already going
            refs.append(ObjectRef(kind.kind, meta.get("namespace"), meta["name"]))
    return refs


def _pods(api: _Api, namespace: str) -> list[str]:
    items = api.list(f"/api/v1/namespaces/{quote(namespace, safe='')}/pods", None)
    return sorted(f"{namespace}/{p['metadata']['name']}" for p in items)


def _version(obj: dict[str, Any]) -> str | None:
    version = obj.get("metadata", {}).get("resourceVersion")
    return str(version) if version is not None else None


def _content(obj: dict[str, Any]) -> dict[str, Any]:
    """The object without status and server bookkeeping."""
    meta = {k: v for k, v in obj.get("metadata", {}).items() if k not in _BOOKKEEPING}
    return {**{k: v for k, v in obj.items() if k != "status"}, "metadata": meta}


class _Api:
    """The few REST calls the reconciler makes, on plain JSON, through the client's
    authentication and TLS settings."""

    def __init__(self, client: ApiClient) -> None:
        self._client = client

    def _call(
        self,
        method: str,
        path: str,
        query: Iterable[tuple[str, str]] = (),
        body: Manifest | None = None,
        content_type: str | None = None,
    ) -> tuple[int, dict[str, Any] | None]:
        headers = {"Accept": "application/json"}
        if content_type is not None:
            headers["Content-Type"] = content_type
        method_, url, headers_, body_, post = self._client.param_serialize(
            method=method,
            resource_path=path,
            query_params=list(query),
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        # The generated client leaves RESTResponse untyped.
        response: Any = self._client.call_api(
            method_, url, header_params=headers_, body=body_, post_params=post
        )
        response.read()
        status = int(response.status)
        if status == 404:
            return status, None
        if status >= 400:
            raise ApiException(http_resp=response)
        data = json.loads(response.data) if response.data else None
        return status, data

    def get(self, path: str) -> dict[str, Any] | None:
        return self._call("GET", path)[1]

    def list(self, path: str, selector: str | None) -> list[dict[str, Any]]:
        query = [("labelSelector", selector)] if selector else []
        _, data = self._call("GET", path, query)
        return list((data or {}).get("items") or [])

    def apply(self, path: str, manifest: Manifest) -> dict[str, Any]:
        query = [("fieldManager", MANAGER), ("force", "true")]
        status, data = self._call("PATCH", path, query, manifest, APPLY_CONTENT_TYPE)
        if data is None:
            raise ApiException(status=status, reason=f"apply of {path} returned no object")
        return data

    def delete(self, path: str) -> None:
        # Foreground: a namespace reports Terminating until its contents are gone.
        self._call("DELETE", path, [("propagationPolicy", "Foreground")])
