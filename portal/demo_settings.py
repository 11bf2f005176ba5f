"""The settings the demo passes on to its services, and the example prices it uses.

JupyterHub gives a managed service only the environment its entry names, so ``gpuportal demo``
collects the ``GPUPORTAL_*`` settings of ``gpuportal serve`` set where it runs
(``service_settings``), checks them (``check_service_settings``) and names them in the
service's entry. The example prices (``demo_pricing_file``) apply unless
``GPUPORTAL_PRICING_FILE`` is among them.
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib import resources
from pathlib import Path

from pydantic import ValidationError

from policies.errors import InvalidRequest
from portal.alerting.wiring import AlertingSettings
from portal.settings import ENV_PREFIX, Settings

DEMO_PRICING = "data/demo-pricing.yaml"  # example prices, relative to the portal package

# Settings of `gpuportal serve` that the demo decides itself; every other GPUPORTAL_* setting
# of the service (portal.settings, portal.alerting.wiring) set here is passed on to it.
_DEMO_OWNED = frozenset(
    {
        "state_dir",
        "database_url",
        "inventory",
        "demo_ip",
        "demo_port",
        "demo_password",
        "service_ip",
        "service_port",
        "service_prefix",
        "hub_api_url",
    }
)
DASHBOARDS_SETTINGS = ("GPUPORTAL_DASHBOARDS_COOKIE_SECRET",)


def service_settings(environ: Mapping[str, str]) -> dict[str, str]:
    """The ``GPUPORTAL_*`` settings of the services in ``environ`` that the demo passes on to
    them: all of ``gpuportal serve``'s but those the demo decides itself (such as the
    database), and the dashboards' cookie secret."""
    names = {
        f"{ENV_PREFIX}{name.upper()}"
        for name in (*Settings.model_fields, *AlertingSettings.model_fields)
        if name not in _DEMO_OWNED
    }
    return dict(
        sorted((k, v) for k, v in environ.items() if k in names or k in DASHBOARDS_SETTINGS)
    )


def check_service_settings() -> None:
    """Read the service's settings from this process's environment as the service will: a bad
    value stops the demo here, with the setting named, instead of making the hub restart the
    service over and over.

    Raises:
        InvalidRequest: a value is not valid.
    """
    try:
        AlertingSettings()
    except ValidationError as exc:
        first = exc.errors()[0]
        name = str(first["loc"][0]) if first["loc"] else "settings"
        raise InvalidRequest(
            f"setting {ENV_PREFIX}{name.upper()}", repr(first.get("input")), first["msg"]
        ) from exc


def demo_pricing_file() -> Path:
    """The example prices the demo uses unless GPUPORTAL_PRICING_FILE is set."""
    return Path(str(resources.files("portal").joinpath(DEMO_PRICING)))
