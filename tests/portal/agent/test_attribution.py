"""Process → workload, from a fixture /proc tree (cgroups of pods, environments of servers)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from portal.agent.attribution import Attribution, PodRef, ProcessAttributor, pod_uid

UID = "4f0c6e2a-5b1d-4c3e-9a7f-0123456789ab"


def proc(
    root: Path,
    pid: int,
    *,
    ppid: int = 1,
    env: dict[str, str] | None = None,
    cgroup: str = "0::/user.slice\n",
) -> None:
    d = root / str(pid)
    d.mkdir(parents=True)
    (d / "status").write_text(f"Name:\tpython\nPid:\t{pid}\nPPid:\t{ppid}\n")
    (d / "cgroup").write_text(cgroup)
    if env is not None:
        (d / "environ").write_bytes(b"".join(f"{k}={v}\0".encode() for k, v in env.items()))


@pytest.mark.parametrize(
    "cgroup",
    [
        # cgroup v1, cgroupfs driver
        f"12:devices:/kubepods/burstable/pod{UID}/0a1b2c3d4e\n11:memory:/kubepods/burstable/"
        f"pod{UID}/0a1b2c3d4e\n",
        # cgroup v2, systemd driver (dashes become underscores in the slice name)
        "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
        + UID.replace("-", "_")
        + ".slice/cri-containerd-0a1b2c3d4e.scope\n",
        # guaranteed QoS class: no QoS level in the path
        f"0::/kubepods/pod{UID}/0a1b2c3d4e\n",
    ],
)
def test_pod_uid_from_each_cgroup_layout(cgroup: str) -> None:
    assert pod_uid(cgroup) == UID


def test_no_pod_uid_outside_kubernetes() -> None:
    assert pod_uid("0::/user.slice/user-1000.slice/session-3.scope\n") is None


def test_kubernetes_process_maps_to_its_pod_and_the_pods_workload_label(tmp_path: Path) -> None:
    proc(tmp_path, 4242, cgroup=f"0::/kubepods/burstable/pod{UID}/abc\n")
    pods = {UID: PodRef(namespace="gp-team-a", name="jupyter-alice", workload_id="wl-17")}
    attribute = ProcessAttributor(tmp_path, pods.get)

    assert attribute(4242) == Attribution(
        workload_id="wl-17", namespace="gp-team-a", pod="jupyter-alice"
    )


def test_local_kernel_inherits_the_servers_workload_through_its_parent(tmp_path: Path) -> None:
    # The server has the spawner's variables; its kernel's environ is not readable (no file).
    server_env = {
        "GPUPORTAL_WORKLOAD_ID": "wl-9",
        "JUPYTERHUB_USER": "alice",
        "JUPYTERHUB_SERVER_NAME": "gpu",
    }
    proc(tmp_path, 500, env=server_env)
    proc(tmp_path, 501, ppid=500)
    proc(tmp_path, 502, ppid=501, env={"PATH": "/usr/bin"})
    attribute = ProcessAttributor(tmp_path)

    assert attribute(502) == Attribution(workload_id="wl-9", user="alice", server="gpu")


def test_hub_server_without_a_workload_id_is_named_by_user_and_server(tmp_path: Path) -> None:
    proc(tmp_path, 600, env={"JUPYTERHUB_USER": "bob"})
    assert ProcessAttributor(tmp_path)(600) == Attribution(user="bob", server="")


def test_unattributable_processes_and_vanished_ones_are_none(tmp_path: Path) -> None:
    proc(tmp_path, 700, env={"HOME": "/root"})
    no_pods: dict[str, PodRef] = {}
    attribute = ProcessAttributor(tmp_path, no_pods.get)

    assert attribute(700) is None  # no pod, no portal variables up to init
    assert attribute(9999) is None  # gone


def test_answers_are_cached_until_the_pid_is_gone(tmp_path: Path) -> None:
    proc(tmp_path, 800, env={"GPUPORTAL_WORKLOAD_ID": "old"})
    attribute = ProcessAttributor(tmp_path)
    assert attribute(800) == Attribution(workload_id="old")

    (tmp_path / "800" / "environ").write_bytes(b"GPUPORTAL_WORKLOAD_ID=new\0")
    assert attribute(800) == Attribution(workload_id="old")
    attribute.forget_except(set())
    assert attribute(800) == Attribution(workload_id="new")


@given(uid=st.uuids(), qos=st.sampled_from(["", "burstable", "besteffort"]))
def test_any_pod_uid_survives_both_cgroup_drivers(uid: uuid.UUID, qos: str) -> None:
    text = str(uid)
    cgroupfs = f"0::/kubepods/{qos + '/' if qos else ''}pod{text}/0123abcd\n"
    slice_qos = f"kubepods-{qos}.slice/kubepods-{qos}-" if qos else "kubepods-"
    systemd = f"0::/kubepods.slice/{slice_qos}pod{text.replace('-', '_')}.slice/cri-x.scope\n"
    assert pod_uid(cgroupfs) == text
    assert pod_uid(systemd) == text
