"""The service's report of the settings it was given: names, values in effect, no secrets."""

from __future__ import annotations

import os

import pytest

from portal.alerting.wiring import AlertingSettings
from portal.service.server import settings_report
from portal.settings import load_settings


def test_given_settings_are_reported_by_variable_with_credentials_masked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in list(os.environ):
        if name.startswith("GPUPORTAL_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("GPUPORTAL_SIMULATED_SAMPLES", "false")
    monkeypatch.setenv("GPUPORTAL_ALERTS_INTERVAL_S", "15")
    monkeypatch.setenv("GPUPORTAL_CULL_IDLE_GPU_SERVERS", "1")
    monkeypatch.setenv("GPUPORTAL_ALERTS_WEBHOOK_URL", "https://hooks.example.org/T0/secret")
    monkeypatch.setenv("GPUPORTAL_DATABASE_URL", "postgresql+psycopg://u:pw@db/gpuportal")
    monkeypatch.setenv("GPUPORTAL_RAY_TOKEN_KEY", "k" * 40)
    report = settings_report(load_settings(tick_interval_s=0.5), AlertingSettings())
    assert report == {
        "GPUPORTAL_ALERTS_INTERVAL_S": "15",
        "GPUPORTAL_ALERTS_WEBHOOK_URL": "(set)",
        "GPUPORTAL_CULL_IDLE_GPU_SERVERS": "true",  # the value in effect, not the text given
        "GPUPORTAL_DATABASE_URL": "(set)",
        "GPUPORTAL_RAY_TOKEN_KEY": "(set)",
        "GPUPORTAL_SIMULATED_SAMPLES": "false",
        "GPUPORTAL_TICK_INTERVAL_S": "0.5",  # a flag counts as given
    }
