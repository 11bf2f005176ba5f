"""Typed settings of gpuportal, read from ``GPUPORTAL_``-prefixed environment variables.

Every field has a description; ``load_settings`` turns validation failures into
``InvalidRequest`` so the CLI reports them like any other bad input.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import (
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict

from policies.errors import InvalidRequest
from policies.quota import validate_tenant_name

# Placement policies the service can run: every named one except FGD, which needs the request
# distribution of a trace up front (gpuportal learns it instead).
SERVICE_POLICIES = ("gpuportal", "binpack", "bestfit", "dotprod", "gpupacking", "random")

ENV_PREFIX = "GPUPORTAL_"


class Settings(BaseSettings):
    """Settings of one gpuportal installation.

    Relative paths are resolved against the current directory when the settings are loaded.
    """

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, frozen=True, extra="forbid")

    state_dir: Path = Field(
        default=Path(".run/demo"),
        description=(
            "Directory for local state: the hub configuration, its SQLite databases, cookie "
            "secret and the demo users' home directories. Created on first use."
        ),
    )
    database_url: str = Field(
        default="",
        description=(
            "SQLAlchemy URL of the portal's database. Empty means SQLite at "
            "<state_dir>/portal.sqlite (the embedded default); PostgreSQL for production, "
            "e.g. postgresql+psycopg://user@host/gpuportal."
        ),
    )
    demo_ip: str = Field(
        default="127.0.0.1",
        description="Address of the demo's public proxy; 0.0.0.0 exposes it to the network.",
    )
    demo_port: int = Field(
        default=8000,
        ge=1,
        le=65535,
        description="TCP port of the demo's public proxy (the URL users open).",
    )
    demo_password: SecretStr | None = Field(
        default=None,
        description=(
            "Shared password of the demo users. Unset means a random one, generated once and "
            "kept in <state_dir>/demo-password."
        ),
    )

    service_ip: str | None = Field(
        default=None,
        description=(
            "Address `gpuportal serve` listens on. Unset: the host of JUPYTERHUB_SERVICE_URL "
            "when the hub manages the service, else 127.0.0.1."
        ),
    )
    service_port: int | None = Field(
        default=None,
        ge=1,
        le=65535,
        description=(
            "TCP port of `gpuportal serve`. Unset: the port of JUPYTERHUB_SERVICE_URL, else 8090."
        ),
    )
    service_prefix: str | None = Field(
        default=None,
        description=(
            "URL path the service answers under, e.g. /services/gpuportal/. Unset: "
            "JUPYTERHUB_SERVICE_PREFIX, else /."
        ),
    )
    inventory: str = Field(
        default="demo",
        description=(
            "Where the GPUs come from: `demo` (the bundled simulated inventory), "
            "`preset:NAME=COUNT[,NAME=COUNT]` (generated simulated nodes), `file:PATH` (a "
            "simulated inventory YAML, re-read when it changes), `kubernetes` (the cluster's "
            "GPU nodes, watched) or `nvml` (this host's GPUs)."
        ),
    )
    tokens_file: Path | None = Field(
        default=None,
        description=(
            "YAML file of static API tokens (token -> name, kind, scopes, groups), for "
            "operators, Prometheus and tests; used before asking the hub."
        ),
    )
    hub_api_url: str | None = Field(
        default=None,
        description=(
            "The hub's API URL used to check tokens. Unset: JUPYTERHUB_API_URL when "
            "JUPYTERHUB_API_TOKEN is set too (the hub manages the service)."
        ),
    )
    log_format: Literal["json", "text"] = Field(
        default="json", description="Service logs on stderr: JSON lines, or plain text."
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        default="info", description="Lowest level of service log records written."
    )
    ray_image: str = Field(
        default="rayproject/ray:2.60.0",
        min_length=1,
        description=(
            "Container image of the Ray clusters' head and workers on Kubernetes (the "
            "RayClusters the KubeRay operator runs); it must hold Ray `ray_version`."
        ),
    )
    ray_version: str = Field(
        default="2.60.0",
        min_length=1,
        description=(
            "The Ray version in `ray_image`: on Kubernetes the only `ray_version` a Ray "
            "cluster may ask for, and the RayCluster's `rayVersion`."
        ),
    )
    ray_token_key: SecretStr | None = Field(
        default=None,
        min_length=32,
        description=(
            "Kubernetes: the key each Ray cluster's authentication token is derived from "
            "(an HMAC of the cluster's id; docs/ray.md), at least 32 characters. Every "
            "portal replica needs the same one, and changing it changes every cluster's "
            "token. Unset: generated once and kept in <state_dir>/ray-token-key."
        ),
    )
    tick_interval_s: float = Field(
        default=1.0,
        gt=0,
        le=3600,
        description=(
            "Seconds between allocator ticks (preemption deadlines, queued work that release "
            "cycles did not retry, ETAs)."
        ),
    )
    hub_reconcile_interval_s: float = Field(
        default=60.0,
        gt=0,
        le=3600,
        description=(
            "Under JupyterHub, seconds between checks that release the GPUs of notebook "
            "servers the hub no longer runs (reason server-gone); the first runs at start."
        ),
    )
    hub_reconcile_min_age_s: float = Field(
        default=30.0,
        ge=0,
        le=3600,
        description=(
            "Under JupyterHub, how long a notebook workload must have held its devices before "
            "the check above may release it (a spawn in flight is never judged)."
        ),
    )
    shutdown_timeout_s: float = Field(
        default=30.0,
        gt=0,
        le=3600,
        description="On SIGTERM, how long in-flight requests may take before they are cut.",
    )
    placement_policy: str = Field(
        default="gpuportal",
        description=(
            "The allocator's placement scorer: `gpuportal` (fragmentation-, topology- and "
            "MIG-aware, learns the request mix; the default), `binpack` (fullest node first, "
            "best-connected sets; cheaper per decision), or a published baseline "
            "(`bestfit`, `dotprod`, `gpupacking`, `random`) for comparison."
        ),
    )
    simulated_samples: bool = Field(
        default=False,
        description=(
            "With a simulated inventory (`demo`, `preset:`, `file:`), feed synthetic GPU "
            "samples (a slow wave per device) into telemetry every 10 s, so dashboards, alerts "
            "and efficiency have data without GPUs. The demo turns it on."
        ),
    )
    pricing_file: Path | None = Field(
        default=None,
        description=(
            "YAML file of GPU prices per hour and monthly money budgets for cost accounting "
            "(docs/cost.md). Unset: cost shows GPU-hours with every model unpriced."
        ),
    )
    isolation_file: Path | None = Field(
        default=None,
        description=(
            "YAML file of the tenant isolation settings on Kubernetes: where the hub, proxy "
            "and portal run and their pod labels, namespace and label prefixes, DNS, API "
            "server and private address ranges, device resource names (docs/isolation.md). "
            "The Helm chart writes one for its release. Unset: the defaults."
        ),
    )

    weight_cache_bytes: int = Field(
        default=200 * 2**30,
        ge=1,
        description=(
            "Bytes of model weights the local backend's weight cache holds per node; least "
            "recently used models no running replica uses are evicted to make room "
            "(docs/services.md)."
        ),
    )
    weight_cache_tenant_bytes: int = Field(
        default=100 * 2**30,
        ge=1,
        description=(
            "Bytes of the weight cache one tenant may hold per node (each model it uses counts "
            "in full); at most `GPUPORTAL_WEIGHT_CACHE_BYTES`."
        ),
    )
    weight_cache_node_path: str = Field(
        default="",
        description=(
            "Kubernetes: the absolute folder on each GPU node under which each tenant's weight "
            "cache lies (`<path>/<namespace>`, a local PersistentVolume; docs/services.md). "
            "Empty: no weight cache on Kubernetes, engines fetch their models themselves."
        ),
    )
    weight_fetch_image: str = Field(
        default="",
        description=(
            "Kubernetes: the image of the weight cache's fetch pods, one holding the gpuportal "
            "package (the portal's own image); needed with `GPUPORTAL_WEIGHT_CACHE_NODE_PATH`."
        ),
    )

    drain_timeout_s: float = Field(
        default=30.0,
        ge=0,
        le=3600,
        description=(
            "Seconds a ready inference replica chosen for removal keeps answering the "
            "requests it already has before it is stopped anyway; it leaves the gateway's "
            "rotation at once and is stopped as soon as nothing is in flight (docs/services.md)."
        ),
    )

    prestart_budget_gpus: float = Field(
        default=0.0,
        ge=0,
        le=100_000,
        allow_inf_nan=False,
        description=(
            "GPU-equivalents pre-started notebook environments may hold in all (placeholders "
            "of the platform's tenant for the spawn options the forecast expects next, given "
            "back before anyone waits; docs/spawner.md). 0, the default: off."
        ),
    )
    prestart_horizon_s: float = Field(
        default=600.0,
        ge=60,
        le=86_400,
        description=(
            "Seconds ahead the pre-started environments cover: an option keeps enough for "
            "its forecast spawns over them with probability 0.8 (at most 4)."
        ),
    )
    prestart_tenant: str = Field(
        default="platform",
        description=(
            "The platform's own tenant the placeholders are charged to (created if missing, "
            "its limit on every flavor set to the budget, no guarantee)."
        ),
    )
    prestart_interval_s: float = Field(
        default=5.0,
        gt=0,
        le=3600,
        description=(
            "Seconds between rounds of the pre-start pool; a request that queues starts a "
            "round at once."
        ),
    )

    leader_election: Literal["off", "lease"] = Field(
        default="off",
        description=(
            "`lease`: replicas elect the one that serves with a Kubernetes Lease; the others "
            "wait as standbys (`/ready` 503) and one takes over within a lease duration when "
            "the leader is lost (docs/service.md). `off`: one process, no election."
        ),
    )
    lease_name: str = Field(
        default="gpuportal-leader", min_length=1, description="Name of the Lease object."
    )
    lease_namespace: str | None = Field(
        default=None,
        description="Namespace of the Lease. Unset: the pod's own namespace, else `default`.",
    )
    lease_duration_s: float = Field(
        default=10.0,
        ge=2,
        le=300,
        description=(
            "How long a Lease not renewed stays the leader's: a standby takes over after it. "
            "The leader renews every fifth of it and stops serving after seven tenths."
        ),
    )

    @field_validator("placement_policy")
    @classmethod
    def _known_policy(cls, name: str) -> str:
        if name not in SERVICE_POLICIES:
            raise ValueError("one of " + ", ".join(SERVICE_POLICIES))
        return name

    @field_validator("prestart_tenant")
    @classmethod
    def _tenant_name(cls, name: str) -> str:
        try:
            return validate_tenant_name(name)
        except InvalidRequest as exc:
            raise ValueError(exc.valid) from None

    @field_validator("weight_cache_tenant_bytes")
    @classmethod
    def _tenant_cache_within_node(cls, size: int, info: ValidationInfo) -> int:
        node = info.data.get("weight_cache_bytes")
        if node is not None and size > node:
            raise ValueError(f"at most GPUPORTAL_WEIGHT_CACHE_BYTES ({node})")
        return size

    @field_validator("weight_cache_node_path")
    @classmethod
    def _node_path_absolute(cls, path: str) -> str:
        if path and (not path.startswith("/") or "\x00" in path):
            raise ValueError(
                f"an absolute folder on the nodes, like /var/lib/gpuportal/weights, not {path!r}"
            )
        return path

    @model_validator(mode="after")
    def _fetch_image_with_node_path(self) -> Settings:
        if self.weight_cache_node_path and not self.weight_fetch_image:
            raise ValueError(
                "GPUPORTAL_WEIGHT_FETCH_IMAGE: the portal's image, needed with "
                "GPUPORTAL_WEIGHT_CACHE_NODE_PATH"
            )
        return self

    @model_validator(mode="after")
    def _resolve_paths(self) -> Settings:
        # The model is frozen; object.__setattr__ is the sanctioned way to fill derived values
        # in an "after" validator.
        state_dir = self.state_dir.expanduser().resolve()
        object.__setattr__(self, "state_dir", state_dir)
        if not self.database_url:
            object.__setattr__(self, "database_url", f"sqlite:///{state_dir / 'portal.sqlite'}")
        return self


def load_settings(**overrides: Any) -> Settings:
    """Read settings from the environment; ``overrides`` (e.g. CLI flags) win over it.

    Raises:
        InvalidRequest: a value (from the environment or an override) is not valid.
    """
    given = {name: value for name, value in overrides.items() if value is not None}
    try:
        return Settings(**given)
    except ValidationError as exc:
        first = exc.errors()[0]
        name = str(first["loc"][0]) if first["loc"] else "settings"
        source = f"{name} (command line)" if name in given else f"{ENV_PREFIX}{name.upper()}"
        raise InvalidRequest(
            f"setting {source}", repr(first.get("input")), _valid(first["msg"])
        ) from exc


def _valid(message: str) -> str:
    # pydantic says "Input should be a valid integer"; InvalidRequest says "expected ...".
    for prefix in ("Input should be ", "Value error, "):
        if message.startswith(prefix):
            return message[len(prefix) :]
    return message
