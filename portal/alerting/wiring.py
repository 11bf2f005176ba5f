"""Telemetry upkeep, alert evaluation and their actions in ``gpuportal serve``.

``register_for_service(loops, allocator, settings, budgets=...)`` registers two loops,
``telemetry`` (roll-ups and retention) and ``alerts`` (evaluation, then the webhook and the
culler), configured by ``GPUPORTAL_``-prefixed environment variables (``AlertingSettings``,
read and checked by ``load_alerting_settings`` before the service starts anything; the rules'
thresholds and durations: ``portal.alerting.rules``). ``budgets`` (cost accounting's
``budget_samples``) feeds the ``budget_burn`` rule. Culling needs the hub:
``JUPYTERHUB_API_URL`` and a token with ``admin:servers`` in ``JUPYTERHUB_API_TOKEN`` (set for
a hub-managed service; give its role the scope).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict, SettingsError

from policies.alerts.engine import Rule
from policies.errors import InvalidRequest
from portal.alerting.culler import Culler, CullPolicy
from portal.alerting.rules import build_rules
from portal.alerting.service import Action, AlertService, BudgetSource
from portal.alerting.webhook import WebhookAction
from portal.allocator import Allocator
from portal.service.loops import Loops
from portal.telemetry.service import Telemetry
from portal.telemetry.store import Retention

log = logging.getLogger(__name__)


class TenantCullPolicy(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = True
    warn_after_s: float = Field(default=0.0, ge=0, le=30 * 86_400)
    grace_s: float = Field(default=900.0, ge=0, le=30 * 86_400)


class AlertingSettings(BaseSettings):
    """Settings of telemetry upkeep, alerts and culling."""

    model_config = SettingsConfigDict(env_prefix="GPUPORTAL_", frozen=True, extra="ignore")

    alerts_interval_s: float = Field(
        default=60.0,
        ge=1,
        le=3600,
        description="Seconds between alert evaluations; at least the agents' sample interval.",
    )
    telemetry_interval_s: float = Field(
        default=30.0, ge=1, le=3600, description="Seconds between roll-up rounds."
    )
    telemetry_raw_retention_s: float = Field(default=2 * 86_400.0, description="Raw samples.")
    telemetry_minute_retention_s: float = Field(default=31 * 86_400.0, description="1-min.")
    telemetry_hour_retention_s: float = Field(default=400 * 86_400.0, description="1-hour.")
    alerts_webhook_url: str = Field(
        default="", description="POST firing and resolved alerts here as JSON; empty: off."
    )
    cull_idle_gpu_servers: bool = Field(
        default=False, description="Warn, then stop, notebooks whose GPUs stay idle."
    )
    cull_policies: dict[str, TenantCullPolicy] = Field(
        default_factory=dict,
        description='Per tenant, JSON: {"team-a": {"grace_s": 600}}; others get the defaults.',
    )
    cull_warn_after_s: float = Field(default=0.0, ge=0, le=30 * 86_400)
    cull_grace_s: float = Field(default=900.0, ge=0, le=30 * 86_400)
    alert_rules: dict[str, Any] = Field(
        default_factory=dict,
        description='Rules\' thresholds and durations, JSON: {"idle": {"for_s": 900}}.',
    )
    alert_tenant_rules: dict[str, Any] = Field(
        default_factory=dict,
        description='Per tenant, JSON: {"team-a": {"idle": {"for_s": 900}}}; others: the above.',
    )

    def rules(self) -> tuple[Rule, ...]:
        """The rules with these settings; raises ``InvalidRequest`` naming a bad value."""
        return build_rules(self.alert_rules, self.alert_tenant_rules)


def load_alerting_settings(**overrides: Any) -> AlertingSettings:
    """The settings from the environment (``overrides`` win), rules included, checked whole.

    Raises:
        InvalidRequest: a value that is not valid, named with its environment variable.
    """
    try:
        cfg = AlertingSettings(**overrides)
    except SettingsError as exc:  # not JSON where JSON is wanted
        name = str(exc).split('"')[1] if '"' in str(exc) else "alerting settings"
        env = f"GPUPORTAL_{name.upper()}"
        raise InvalidRequest(f"setting {env}", repr(os.environ.get(env, "")), "JSON") from exc
    except ValidationError as exc:
        first = exc.errors()[0]
        name = str(first["loc"][0]) if first["loc"] else "settings"
        path = ".".join(str(p) for p in first["loc"][1:])
        raise InvalidRequest(
            f"setting GPUPORTAL_{name.upper()}" + (f" {path}" if path else ""),
            repr(first.get("input")),
            str(first["msg"]).removeprefix("Input should be "),
        ) from exc
    cfg.rules()
    return cfg


def build_actions(
    alloc: Allocator,
    service: AlertService,
    settings: AlertingSettings,
    environ: Mapping[str, str],
) -> list[Action]:
    """The configured actions; raises ``InvalidRequest`` when culling lacks the hub."""
    actions: list[Action] = []
    if settings.alerts_webhook_url:
        actions.append(WebhookAction(settings.alerts_webhook_url))
    webhooks = list(actions)
    if settings.cull_idle_gpu_servers:
        hub, token = environ.get("JUPYTERHUB_API_URL"), environ.get("JUPYTERHUB_API_TOKEN")
        if not hub or not token:
            raise InvalidRequest(
                "setting GPUPORTAL_CULL_IDLE_GPU_SERVERS",
                "true",
                "false, or run as a hub service (JUPYTERHUB_API_URL and JUPYTERHUB_API_TOKEN set)",
            )
        actions.append(
            Culler(
                alloc,
                hub,
                token,
                lambda: service.state.firing(),
                policies={
                    t: CullPolicy(p.enabled, p.warn_after_s, p.grace_s)
                    for t, p in settings.cull_policies.items()
                },
                default=CullPolicy(True, settings.cull_warn_after_s, settings.cull_grace_s),
                notify=webhooks,
            )
        )
    return actions


def register_for_service(
    loops: Loops,
    alloc: Allocator,
    settings: AlertingSettings | None = None,
    environ: Mapping[str, str] | None = None,
    *,
    budgets: BudgetSource | None = None,
) -> AlertService:
    """Register the ``telemetry`` and ``alerts`` loops; returns the alert service (for its
    metrics: ``AlertCollector(lambda: service.state.alerts.values())``). ``budgets``: the
    tenants' budgets for ``budget_burn`` (without it the rule never fires)."""
    cfg = settings or AlertingSettings()
    telemetry = Telemetry(
        alloc,
        retention=Retention(
            raw_s=cfg.telemetry_raw_retention_s,
            minute_s=cfg.telemetry_minute_retention_s,
            hour_s=cfg.telemetry_hour_retention_s,
        ),
    )
    service = AlertService(
        alloc, rules=cfg.rules(), interval_s=cfg.alerts_interval_s, budgets=budgets
    )
    service.actions.extend(build_actions(alloc, service, cfg, environ or os.environ))

    def evaluate() -> None:
        service.evaluate()

    loops.add("telemetry", cfg.telemetry_interval_s, telemetry.maintain)
    loops.add("alerts", cfg.alerts_interval_s, evaluate)
    log.info(
        "alerts every %.0f s with %d action(s), budgets %s",
        cfg.alerts_interval_s,
        len(service.actions),
        "on" if budgets is not None else "off",
    )
    return service
