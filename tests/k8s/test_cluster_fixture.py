"""The control-plane fixture's failure paths and process handling; no cluster needed."""

from __future__ import annotations

import os
import re
import shutil
import socket
import stat
import subprocess
import time
from pathlib import Path

import pytest

from tests.support import k8s
from tests.support.k8s import BIN_DIR_ENV, BINARIES, BUILD_SCRIPT, KWOK_STAGES, ClusterSetupError
from tests.support.ports import free_port


def test_missing_bin_dir_is_named_with_the_way_to_build_it(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    with pytest.raises(ClusterSetupError) as err:
        k8s.locate_binaries({BIN_DIR_ENV: str(missing)})
    assert str(missing) in str(err.value)
    assert "scripts/build-k8s-tools" in str(err.value)


def test_missing_binaries_are_named(tmp_path: Path) -> None:
    for name in ("etcd", "kwok"):
        (tmp_path / name).write_text("#!/bin/sh\n")
        (tmp_path / name).chmod(stat.S_IRWXU)
    (tmp_path / "kube-apiserver").write_text("not executable")
    with pytest.raises(
        ClusterSetupError,
        match=re.escape("missing kube-apiserver, kube-controller-manager, kwok-stages.yaml in "),
    ):
        k8s.check_bin_dir(tmp_path)


def test_complete_bin_dir_is_accepted(tmp_path: Path) -> None:
    for name in BINARIES:
        (tmp_path / name).write_text("#!/bin/sh\n")
        (tmp_path / name).chmod(stat.S_IRWXU)
    (tmp_path / KWOK_STAGES).write_text("")
    assert k8s.locate_binaries({BIN_DIR_ENV: str(tmp_path)}) == tmp_path


def test_build_without_go_says_go_is_missing(tmp_path: Path) -> None:
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        # An empty tools root forces a build; the bogus GO makes it fail before compiling.
        "GPUPORTAL_K8S_TOOLS_DIR": str(tmp_path / "tools"),
        "GO": str(tmp_path / "no-go-here"),
    }
    with pytest.raises(ClusterSetupError) as err:
        k8s.locate_binaries(env, BUILD_SCRIPT)
    assert "Go is not installed" in str(err.value)
    assert "kube-apiserver" in str(err.value)


def test_missing_build_script_is_named(tmp_path: Path) -> None:
    with pytest.raises(ClusterSetupError, match=r"build script .*missing"):
        k8s.locate_binaries({}, tmp_path / "build-k8s-tools")


def test_missing_openssl_is_named() -> None:
    with pytest.raises(ClusterSetupError, match="'openssl' is not on PATH"):
        k8s.require_tool("openssl", path="")


def test_free_port_is_bindable_on_loopback() -> None:
    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_a_component_that_dies_is_reported_with_its_log(tmp_path: Path) -> None:
    comp = k8s.start_component("doomed", ["sh", "-c", "echo bad flag --foo; exit 3"], tmp_path)
    with pytest.raises(ClusterSetupError) as err:
        k8s.wait_until(comp, lambda: False, "GET /readyz", timeout_s=10)
    message = str(err.value)
    assert "doomed exited with code 3 before GET /readyz" in message
    assert "bad flag --foo" in message
    assert str(tmp_path / "doomed.log") in message


def test_a_component_that_never_gets_ready_times_out_with_its_log(tmp_path: Path) -> None:
    comp = k8s.start_component("slow", ["sh", "-c", "echo still starting; sleep 30"], tmp_path)
    try:
        with pytest.raises(ClusterSetupError, match=r"(?s)slow not ready .*still starting"):
            k8s.wait_until(comp, lambda: False, "GET /readyz", timeout_s=1)
    finally:
        comp.stop()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_stop_kills_the_whole_process_group_even_if_it_ignores_sigterm(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    script = f"trap '' TERM; sleep 300 & echo $! > {pid_file}; wait"
    comp = k8s.start_component("stubborn", ["sh", "-c", script], tmp_path)
    deadline = time.monotonic() + 10
    while not pid_file.exists() or not pid_file.read_text().strip():
        assert time.monotonic() < deadline, "child pid never written"
        time.sleep(0.05)
    child = int(pid_file.read_text())
    comp.stop(grace_s=0.5)
    assert not comp.running()
    deadline = time.monotonic() + 5
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child), "the background child survived stop()"


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")
def test_pki_issues_client_certificates_with_groups(tmp_path: Path) -> None:
    openssl = k8s.require_tool("openssl")
    pki = k8s.Pki(tmp_path, openssl)
    pki.create_ca()
    cert, key = pki.issue("alice", "alice", orgs=("g1", "g2"))
    text = subprocess.run(
        [openssl, "x509", "-in", str(cert), "-noout", "-subject", "-ext", "extendedKeyUsage"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert "O = g1, O = g2, CN = alice" in text
    assert "TLS Web Client Authentication" in text
    verify = subprocess.run(
        [openssl, "verify", "-CAfile", str(pki.ca_cert), str(cert)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert key.exists()
