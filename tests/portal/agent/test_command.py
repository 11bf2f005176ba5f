"""``gpuportal agent`` from the command line, and the demo source."""

from __future__ import annotations

import math
import signal
import subprocess
import sys
import time

import pytest

from policies.mig import geometry
from portal.agent.demo import DemoSource
from portal.cli import run
from portal.errors import EXIT_USAGE
from portal.inventory import simulated
from portal.telemetry.wire import SampleBatch
from tests.support import fake_nvml
from tests.support.fake_nvml import Driver


@pytest.mark.parametrize("driver", [Driver.MISSING, Driver.NOT_LOADED])
def test_without_a_driver_it_says_so_in_one_line_and_exits_non_zero(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], driver: Driver
) -> None:
    fake_nvml.install(monkeypatch, fake_nvml.no_driver(driver))

    code = run(["agent", "--stdout", "--once"])

    out, err = capsys.readouterr()
    assert code == EXIT_USAGE
    assert out == ""
    assert err.count("\n") == 1
    assert err.startswith("gpuportal agent: error: no NVIDIA driver found: ")
    assert err.rstrip().endswith("--demo samples simulated GPUs instead")


def test_once_to_stdout_prints_one_batch_of_this_hosts_gpus(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    machine = fake_nvml.t4_two_sockets()
    machine.gpus[0].usage.gpu_pct = 12
    fake_nvml.install(monkeypatch, machine)

    code = run(["agent", "--stdout", "--once", "--node", "t4-box"])

    out, err = capsys.readouterr()
    assert code == 0
    batch = SampleBatch.model_validate_json(out)
    assert batch.node == "t4-box"
    assert [(s.gpu_uuid, s.utilization_pct) for s in batch.samples] == [
        ("GPU-t4-0", 12),
        ("GPU-t4-1", 0),
    ]
    assert "t4-box: 2 GPU(s)" in err


def test_sending_needs_a_token(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("GPUPORTAL_AGENT_TOKEN", raising=False)
    assert run(["agent", "--demo", "--once"]) == EXIT_USAGE
    assert "GPUPORTAL_AGENT_TOKEN" in capsys.readouterr().err


def test_kubernetes_mode_needs_the_node_name(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_nvml.install(monkeypatch, fake_nvml.t4_two_sockets())
    monkeypatch.delenv("GPUPORTAL_AGENT_NODE_NAME", raising=False)
    assert run(["agent", "--kubernetes", "--stdout", "--once"]) == EXIT_USAGE
    assert "GPUPORTAL_AGENT_NODE_NAME" in capsys.readouterr().err


def test_a_bad_setting_names_the_variable_and_the_value(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("GPUPORTAL_AGENT_INTERVAL_S", "-5")
    assert run(["agent", "--demo", "--stdout", "--once"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "GPUPORTAL_AGENT_INTERVAL_S" in err and "'-5'" in err


def test_demo_once_prints_a_batch_per_simulated_node(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["agent", "--demo", "--stdout", "--once"]) == 0
    batches = [SampleBatch.model_validate_json(line) for line in capsys.readouterr().out.split()]
    assert [b.node for b in batches] == [n.name for n in simulated.load_demo()]


def test_demo_values_are_reproducible_and_mig_parents_add_up_their_instances() -> None:
    nodes = simulated.load_demo()
    first = DemoSource(nodes, clock=lambda: 1_800_000_000.0).batches()
    again = DemoSource(nodes, clock=lambda: 1_800_000_000.0).batches()
    later = DemoSource(nodes, clock=lambda: 1_800_000_150.0).batches()
    assert first == again
    assert first != later
    mig_nodes = [
        (n, b) for n, b in zip(nodes, first, strict=True) if any(g.mig_enabled for g in n.gpus)
    ]
    assert mig_nodes, "the demo inventory has MIG GPUs"
    node, batch = mig_nodes[0]
    gpu = next(g for g in node.gpus if g.mig_enabled and g.mig_layout)
    parent = next(
        s
        for s in batch.samples
        if s.gpu_instance_id is None and s.gpu_uuid.endswith(f"-{gpu.index}")
    )
    instances = [s for s in batch.samples if s.gpu_uuid == parent.gpu_uuid and s.gpu_instance_id]
    geom = geometry(gpu.model)
    slices = [geom.profile(i.profile).compute_slices for i in gpu.mig_layout]
    measured = [s.utilization_pct for s in instances]  # the simulation measures every device
    assert parent.utilization_pct is not None and None not in measured
    weighted = sum((u or 0.0) * k for u, k in zip(measured, slices, strict=True))
    assert math.isclose(parent.utilization_pct, round(weighted / geom.compute_slices, 1))


def test_the_agent_process_samples_on_schedule_and_stops_cleanly_on_sigterm() -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "portal.cli", "agent", "--demo", "--stdout", "--interval", "0.2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        time.sleep(3)
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=10)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, err
    rounds = len(out.split()) // len(simulated.load_demo())
    assert rounds >= 3  # started within 3 s, then every 0.2 s
