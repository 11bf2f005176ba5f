"""``IsolationSettings`` from plain data (a YAML or JSON mapping, as an installation's
configuration file gives it): keys are the settings' field names; lists become tuples. Every
key is checked before anything is built, so a misspelt key is named instead of ignored."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from policies.errors import InvalidRequest
from policies.isolation.spec import IsolationSettings

_FIELDS = frozenset(f.name for f in dataclasses.fields(IsolationSettings))
_DEFAULTS = IsolationSettings()
# Fields whose value is a list of strings in the file (tuples or a set in the settings).
_LISTS = {"api_server_cidrs", "private_cidrs", "flavors"}


def isolation_settings(raw: Mapping[str, object]) -> IsolationSettings:
    """The settings ``raw`` gives, defaults for the keys it leaves out.

    Raises:
        InvalidRequest: an unknown key, a value of the wrong kind, or one the settings refuse.
    """
    if not isinstance(raw, Mapping):
        raise InvalidRequest("isolation settings", repr(raw), "a mapping of setting to value")
    values: dict[str, object] = {}
    for key, value in raw.items():
        if key not in _FIELDS:
            raise InvalidRequest(
                "isolation setting", repr(key), "one of " + ", ".join(sorted(_FIELDS))
            )
        values[key] = _value(key, value)
    return IsolationSettings(**values)  # type: ignore[arg-type]


def _value(key: str, value: object) -> object:
    if key in _LISTS:
        if key == "flavors" and value is None:
            return None
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise InvalidRequest(key, repr(value), "a list of strings")
        return frozenset(value) if key == "flavors" else tuple(value)
    default = getattr(_DEFAULTS, key)
    if isinstance(default, Mapping):
        return value  # IsolationSettings checks label mappings itself
    if isinstance(default, bool) or not isinstance(default, int | str):
        raise AssertionError(f"no conversion for isolation setting {key}")  # a new field kind
    kind = "an integer" if isinstance(default, int) else "a string"
    if isinstance(value, bool) or not isinstance(value, type(default)):
        raise InvalidRequest(key, repr(value), kind)
    return value
