"""Every operation of the API's OpenAPI document has a client operation (or a stated reason
not to), so a route added to the API without one fails here.

Each client operation (``portal.client.core``, ``reports`` and the per-noun modules) is
started without I/O: the first ``Call`` it yields is matched against the generated document's
path templates.
"""

from __future__ import annotations

import re
from pathlib import Path

from policies.requests import WorkloadKind
from portal.allocator import Allocator
from portal.api import create_app
from portal.api.auth import StaticAuthenticator
from portal.api.schemas import DevicesIn, ElasticIn
from portal.client import core, jobs, ray, ray_jobs, reports, services
from portal.store.writer import Store

NOT_IN_CLIENT = {
    ("POST", "/api/v1/telemetry/samples"): "node agents send samples with portal.agent",
    ("GET", "/"): "JupyterHub's service check and people, not clients",
    ("GET", "/health"): "probes, not clients",
    ("GET", "/ready"): "probes, not clients",
    ("GET", "/metrics"): "Prometheus scrapes it",
    ("GET", "/gateway/{tenant}/{service}/v1/models"): "OpenAI clients (Service.base_url)",
    ("POST", "/gateway/{tenant}/{service}/v1/chat/completions"): "OpenAI clients",
    ("POST", "/gateway/{tenant}/{service}/v1/completions"): "OpenAI clients",
}


def client_operations() -> list[core.Op[object]]:
    return [
        core.tenants(1),
        core.tenant("t"),
        core.set_tenant("t", cohort=None, weight=1, pools=(), if_match='"1"', create=False),
        core.quotas(1, None),
        core.quota("t", "f"),
        core.elastic("t"),
        core.set_elastic("t", ElasticIn(), if_match='"1"', create=False),
        core.set_quota(
            "t", "f", guaranteed=0, limit=0, budget_gpu_hours=None, if_match='"1"', create=False
        ),
        core.request(
            "t",
            DevicesIn(),
            name="n",
            kind=WorkloadKind.NOTEBOOK,
            priority=0,
            gang_size=1,
            expected_duration_s=None,
            idempotency_key=None,
        ),
        core.status("w"),
        core.release("w"),
        core.workloads(1, None, None),
        core.queue(1, None),
        core.usage(1, None),
        core.nodes(1),
        core.node_changes("e.1"),
        core.node("n"),
        core.capacity(),
        core.offers("t"),
        reports.cost(None, None, None, (), None),
        reports.chargeback(None, None, None, None),
        reports.budgets(1, None),
        reports.service_hours(None, None, None),
        reports.capacity_forecast(None, None),
        reports.prestart(),
        reports.series("d", None, None, None, None, None),
        reports.device_usage(None, None),
        reports.alerts(1, None, (), None),
        jobs.submit({}),
        jobs.get("j"),
        jobs.listed(1, None, None),
        jobs.cancel("j"),
        jobs.attempts("j", 1),
        jobs.cost("j"),
        jobs.logs("j", None, 0, 0),
        services.deploy({}),
        services.get("s"),
        services.listed(1, None),
        services.cache(1, None, None),
        services.patch("s", {}),
        services.delete("s"),
        services.replicas("s", 1),
        services.events("s", 1),
        services.logs("s", 1, 0),
        ray.create({}),
        ray.get("r"),
        ray.listed(1, None),
        ray.scale("r", 1),
        ray.cost("r"),
        ray.token("r"),
        ray.costs(1, None, None),
        ray.resume("r"),
        ray.delete("r"),
        ray_jobs.submit(None, {}),
        ray_jobs.submit("r", {}),
        ray_jobs.get("j"),
        ray_jobs.listed(1, None, None),
        ray_jobs.listed(1, None, "r"),
        ray_jobs.stop("j"),
        ray_jobs.logs("j", None, 0),
        ray_jobs.cost("j"),
    ]


def api_operations(tmp_path: Path) -> set[tuple[str, str]]:
    store = Store(f"sqlite:///{tmp_path / 'portal.db'}")
    try:
        paths = create_app(Allocator(store), StaticAuthenticator({})).openapi()["paths"]
    finally:
        store.close()
    return {(method.upper(), path) for path, item in paths.items() for method in item}


def template_of(method: str, path: str, templates: set[tuple[str, str]]) -> tuple[str, str]:
    # Literal templates first: ``/services/cache`` also fits ``/services/{service_id}``.
    for m, template in sorted(templates, key=lambda t: t[1].count("{")):
        pattern = re.sub(r"\{[^}]+\}", "[^/]+", template)
        if m == method and re.fullmatch(pattern, path):
            return m, template
    raise AssertionError(f"{method} {path} matches no operation of the API")


def test_every_api_operation_has_a_client_operation(tmp_path: Path) -> None:
    templates = api_operations(tmp_path)
    covered = set()
    for op in client_operations():
        call = next(op)
        covered.add(template_of(call.method, "/" + call.path, templates))
        op.close()
    missing = templates - covered - NOT_IN_CLIENT.keys()
    assert not missing, f"API operations without a client operation: {sorted(missing)}"
    assert not covered & NOT_IN_CLIENT.keys()
