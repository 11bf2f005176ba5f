"""The service's isolation settings: ``GPUPORTAL_ISOLATION_FILE`` (YAML, the field names of
``policies.isolation.IsolationSettings``; the Helm chart writes one for its release), or the
defaults without it. ``gpuportal serve`` reads it once at start and hands the same settings
to the isolation loop and the pod binder, so the namespaces and labels they use agree."""

from __future__ import annotations

from pathlib import Path

import yaml

from policies.errors import InvalidRequest
from policies.isolation import IsolationSettings, isolation_settings


def load_isolation_settings(path: Path | None) -> IsolationSettings:
    """The settings in ``path``; the defaults for ``None``.

    Raises:
        InvalidRequest: the file cannot be read, is not a YAML mapping, or holds a bad setting.
    """
    if path is None:
        return IsolationSettings()
    try:
        raw = yaml.safe_load(path.expanduser().read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise InvalidRequest("isolation file", str(path), f"a readable YAML file ({exc})") from exc
    if raw is None:
        return IsolationSettings()
    if not isinstance(raw, dict):
        raise InvalidRequest("isolation file", str(path), "a YAML mapping of setting to value")
    return isolation_settings(raw)
