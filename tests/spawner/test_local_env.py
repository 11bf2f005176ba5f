"""What a local server's environment says about its devices, and the state a hub keeps."""

from __future__ import annotations

from spawner.local import device_env
from spawner.mixin import GPUAllocation, allocation_env

WHOLE = GPUAllocation(
    "w1", "team-a", "gpu:H100-80GB:2", "2 × H100-80GB NVLink", "H100-80GB", "n1", (2, 3),
    ("GPU-a", "GPU-b"), milli=1000,
)  # fmt: skip
SHARE = GPUAllocation(
    "w2", "team-b", "share:T4:250", "0.25 × T4 (3 GiB)", "T4/share", "t1", (1,), ("",),
    milli=250, gpu_memory_mib=3840,
)  # fmt: skip
CPU = GPUAllocation("", "team-a", "cpu", "CPU only")


def test_whole_gpus_are_visible_by_uuid_without_mps_limits() -> None:
    assert device_env(WHOLE) == {
        "CUDA_VISIBLE_DEVICES": "GPU-a,GPU-b",
        "NVIDIA_VISIBLE_DEVICES": "GPU-a,GPU-b",
    }


def test_a_share_gets_mps_limits_and_falls_back_to_indices_without_uuids() -> None:
    assert device_env(SHARE) == {
        "CUDA_VISIBLE_DEVICES": "1",
        "NVIDIA_VISIBLE_DEVICES": "1",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=3840M",
    }


def test_cpu_only_sees_no_gpu() -> None:
    assert device_env(CPU) == {"CUDA_VISIBLE_DEVICES": "", "NVIDIA_VISIBLE_DEVICES": "void"}
    assert allocation_env(CPU) == {
        "GPUPORTAL_TENANT": "team-a",
        "GPUPORTAL_OPTION": "cpu",
        "GPUPORTAL_OPTION_LABEL": "CPU only",
    }


def test_the_allocation_is_described_in_gpuportal_variables() -> None:
    assert allocation_env(SHARE) == {
        "GPUPORTAL_TENANT": "team-b",
        "GPUPORTAL_OPTION": "share:T4:250",
        "GPUPORTAL_OPTION_LABEL": "0.25 × T4 (3 GiB)",
        "GPUPORTAL_WORKLOAD_ID": "w2",
        "GPUPORTAL_FLAVOR": "T4/share",
        "GPUPORTAL_NODE": "t1",
        "GPUPORTAL_GPUS": "1",
        "GPUPORTAL_GPU_UUIDS": "",
        "GPUPORTAL_GPU_MILLI": "250",
        "GPUPORTAL_GPU_MEMORY_MIB": "3840",
    }


def test_an_allocation_survives_the_hub_state_round_trip() -> None:
    for a in (WHOLE, SHARE, CPU):
        assert GPUAllocation.from_state(a.to_state()) == a
    # State written by an older spawner version without newer fields still loads.
    assert GPUAllocation.from_state({"workload_id": "w", "tenant": "t", "option": "cpu",
                                     "label": "CPU only", "gpus": [1]}).gpus == (1,)  # fmt: skip
