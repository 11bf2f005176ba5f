"""The service's isolation settings file (``GPUPORTAL_ISOLATION_FILE``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from policies.errors import InvalidRequest
from policies.isolation import IsolationSettings
from portal.isolation.config import load_isolation_settings
from portal.settings import load_settings


def test_without_a_file_the_defaults_hold() -> None:
    assert load_isolation_settings(None) == IsolationSettings()


def test_the_file_set_in_the_environment_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "isolation.yaml"
    path.write_text(
        "hub_namespace: jhub\nhub_pod_labels: {component: hub}\nshared_gpu_replicas: 4\n"
    )
    monkeypatch.setenv("GPUPORTAL_ISOLATION_FILE", str(path))
    got = load_isolation_settings(load_settings().isolation_file)
    assert (got.hub_namespace, dict(got.hub_pod_labels), got.shared_gpu_replicas) == (
        "jhub",
        {"component": "hub"},
        4,
    )
    assert got.namespace_prefix == IsolationSettings().namespace_prefix


def test_an_empty_file_means_the_defaults(tmp_path: Path) -> None:
    path = tmp_path / "isolation.yaml"
    path.write_text("# nothing set\n")
    assert load_isolation_settings(path) == IsolationSettings()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("- hub_namespace\n", "a YAML mapping of setting to value"),
        ("hub_namespace: [unclosed\n", "a readable YAML file"),
        ("hub_namepsace: jhub\n", "one of admin_group_template"),
        ("notebook_port: eighty\n", "an integer"),
    ],
)
def test_a_bad_file_is_refused_with_what_is_wrong(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "isolation.yaml"
    path.write_text(text)
    with pytest.raises(InvalidRequest) as err:
        load_isolation_settings(path)
    assert expected in err.value.valid


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(InvalidRequest) as err:
        load_isolation_settings(tmp_path / "nope.yaml")
    assert "nope.yaml" in str(err.value) and "a readable YAML file" in err.value.valid
