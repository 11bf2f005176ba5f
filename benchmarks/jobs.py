"""Training jobs at scale: Kueue's scheduler performance test in its own shape, through the
Kubernetes path end to end, and admitted jobs per second at the policy level.

``python -m benchmarks.jobs [--scale 1.0] [--policy-jobs 2000] [--policy-only] [--json OUT]``

**Kubernetes path.** 5 cohorts x 6 tenants; each tenant is guaranteed 20 H100s and may borrow
up to 100 in its cohort; the cluster holds exactly the guarantees (600 GPUs in 30 kwok nodes of
20). Per tenant, ``scale`` x (350 small jobs of 1 GPU running 200 ms, 100 medium of 5 GPUs
running 500 ms, 50 large of 20 GPUs running 1,000 ms), created every 100 / 500 / 1,200 ms, as
Kueue's test creates its workloads. Each job is a ``batch/v1`` Job created in the tenant's
namespace with ``schedulerName: gpuportal`` (``tests.support.k8s`` starts etcd, kube-apiserver,
kube-controller-manager and kwok); the portal admits it (``portal.jobs.kube.admission``), the
allocator places it, the binder binds its pod, and kwok completes the pod after the job's
runtime (``tests.support.kwok_stages``). The portal's loops (admission, allocator tick, job
controller, binder) run each in a thread of its own, as in ``gpuportal serve``. Reported: wall
time (first Job created to last job ended), GPU usage (GPU-seconds held by running jobs over
capacity x wall time) and the mean time from a Job's creation to its admission (its attempt
started), per class, next to Kueue's published baseline; and the portal's apiserver calls per
job. kube-controller-manager runs with a higher client rate than its default (``--kcm-qps``).

**Policy level.** ``JobController.submit`` over a real allocator on SQLite with a runner that
starts nothing: jobs of the three classes, spread over the tenants, each placed and its attempt
launched and committed at once, on a cluster large enough for all of them; admitted jobs per
second.
"""

from __future__ import annotations

import argparse
import cProfile
import heapq
import json
import re
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast
from urllib.parse import urlsplit

from benchmarks.jobs_probes import portal_client, time_binder
from policies.flavors import FlavorKind
from policies.isolation import IsolationSettings, TenantSpec
from policies.jobs import JobState
from policies.requests import DeviceRequest
from policies.topology import LinkClass
from portal.allocator import Allocator
from portal.inventory.kubernetes import to_node
from portal.inventory.simulated import generate
from portal.jobs.backend import Backend
from portal.jobs.controller import JobController
from portal.jobs.runner import MemberExit, MemberLaunch
from portal.jobs.spec import Backend as BackendKind
from portal.jobs.spec import JobSpec
from portal.store.writer import Store

COHORTS, PER_COHORT = 5, 6
GUARANTEED, LIMIT = 20, 100
NODE_GPUS, NODES = 20, 30
FLAVOR = "H100-80GB"


@dataclass(frozen=True, slots=True)
class JobClass:
    name: str
    count: int  # per tenant, at scale 1
    members: int
    gpus: int  # per member
    runtime_ms: int
    every_ms: int


# A member holds at most 16 GPUs: the large jobs' 20 GPUs are a gang of 4 members x 5.
CLASSES = (
    JobClass("small", 350, 1, 1, 200, 100),
    JobClass("medium", 100, 1, 5, 500, 500),
    JobClass("large", 50, 4, 5, 1000, 1200),
)
KUEUE_BASELINE = {
    "wall_s": 351.0,
    "gpu_usage_pct": 58.7,
    "mean_admission_s": {"large": 6.7, "medium": 76.8, "small": 215.0},
}


def tenants() -> list[tuple[str, str]]:
    """(tenant, cohort) pairs."""
    return [(f"c{c}t{t}", f"c{c}") for c in range(COHORTS) for t in range(PER_COHORT)]


# ---- policy level ------------------------------------------------------------------------------


class _NoRunner:
    """Starts nothing: the policy level measures deciding and committing, not running."""

    def launch(self, members: Sequence[MemberLaunch]) -> None:
        pass

    def stop(self, job_id: str, attempt: int, grace_s: float, *, wait: bool = True) -> None:
        pass

    def poll(self) -> Sequence[MemberExit]:
        return ()

    def adopt(self) -> Sequence[tuple[str, int]]:
        return ()

    def log_path(self, job_id: str, attempt: int, rank: int) -> Path:
        return Path("/nonexistent")


def policy_level(jobs: int, folder: Path) -> dict[str, Any]:
    """Admitted jobs per second through ``JobController.submit`` (see the module doc)."""
    mix = [c for c in CLASSES for _ in range(c.count)]
    chosen = [mix[(i * 7919) % len(mix)] for i in range(jobs)]  # a fixed interleaving
    need = sum(c.gpus * c.members for c in chosen)
    # Twice the GPUs the jobs need: gangs of 5-GPU members leave 3 of 8 per node unused.
    nodes = generate({"hgx-h100-8": need // 4 + 1})
    with Store(f"sqlite:///{folder / 'policy.db'}") as store:
        alloc = Allocator(store)
        alloc.start(nodes)
        names = tenants()
        share = need + NODE_GPUS  # quota never binds: the policy level measures placing
        for tenant, cohort in names:
            alloc.set_tenant(tenant, cohort=cohort)
            alloc.set_quota(tenant, FLAVOR, guaranteed=share, limit=share, overcommit=True)
        backend = Backend(kind=BackendKind.KUBERNETES, runner=_NoRunner())
        controller = JobController(alloc, backend=backend)
        controller.start()
        admitted = 0
        started = time.perf_counter()
        for i in range(jobs):
            c = chosen[i]
            tenant = names[i % len(names)][0]
            view = controller.submit(_spec(tenant, f"{c.name}-{i}", c))
            admitted += view.job.state is JobState.RUNNING
        elapsed = time.perf_counter() - started
    return {"jobs": jobs, "admitted": admitted, "seconds": elapsed, "per_s": admitted / elapsed}


def queued_round(queued: int, folder: Path) -> dict[str, Any]:
    """Seconds of one round of the loops (allocator tick, then job controller step) with
    ``queued`` jobs waiting: Kueue's cluster (30 nodes of 20 GPUs, the tenants' quotas) full,
    every job of the three classes behind it. A round reads every active job, so its cost
    in the queue's length bounds how fast a long queue turns over."""
    nodes = generate({"hgx-h100-8": NODES * NODE_GPUS // 8})
    with Store(f"sqlite:///{folder / 'queued.db'}") as store:
        alloc = Allocator(store)
        alloc.start(nodes)
        names = tenants()
        for tenant, cohort in names:
            alloc.set_tenant(tenant, cohort=cohort)
            alloc.set_quota(tenant, FLAVOR, guaranteed=GUARANTEED, limit=LIMIT)
        backend = Backend(kind=BackendKind.KUBERNETES, runner=_NoRunner())
        controller = JobController(alloc, backend=backend)
        controller.start()
        for i in range(queued):
            c = CLASSES[i % len(CLASSES)]
            controller.enqueue(_spec(names[i % len(names)][0], f"{c.name}-{i}", c))
        waiting = sum(1 for j in controller.active_jobs() if j.state is JobState.QUEUED)
        rounds = []
        for _ in range(3):
            started = time.perf_counter()
            alloc.tick()
            controller.step()
            rounds.append(time.perf_counter() - started)
    return {"jobs": queued, "queued": waiting, "round_s": sorted(rounds)[1], "rounds_s": rounds}


def _spec(tenant: str, name: str, c: JobClass) -> JobSpec:
    devices = DeviceRequest(kind=FlavorKind.GPU, count=c.gpus, models=frozenset({FLAVOR}))
    return JobSpec(tenant, "bench", name, c.members, devices, image="registry.invalid/bench:0")


# ---- the Kubernetes path -------------------------------------------------------------------------


def _job_manifest(name: str, namespace: str, c: JobClass) -> dict[str, Any]:
    from tests.support.kwok_stages import RUN_FOR

    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "completionMode": "Indexed",
            "completions": c.members,
            "parallelism": c.members,
            "backoffLimit": 0,
            "template": {
                "metadata": {"annotations": {RUN_FOR: f"{c.runtime_ms}ms"}},
                "spec": {
                    "schedulerName": "gpuportal",
                    "restartPolicy": "Never",
                    "serviceAccountName": "tenant-jobs",
                    "automountServiceAccountToken": False,
                    "securityContext": {
                        "runAsNonRoot": True,
                        "runAsUser": 1000,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "containers": [
                        {
                            "name": "train",
                            "image": "registry.invalid/bench:0",
                            "resources": {"limits": {"nvidia.com/gpu": str(c.gpus)}},
                            "securityContext": {
                                "allowPrivilegeEscalation": False,
                                "capabilities": {"drop": ["ALL"]},
                            },
                        }
                    ],
                },
            },
        },
    }


@dataclass(frozen=True, slots=True)
class PathOptions:
    """How the Kubernetes path runs (``main``'s flags)."""

    kcm_qps: int = 200  # the controller manager's client rate (its default, 20, caps Jobs/s)
    interval_s: float = 0.05  # the least time between two rounds of each of the portal's loops
    profile: Path | None = None  # cProfile statistics of each loop thread: <profile>.<loop>
    binder_workers: int | None = None  # the binder's decisions carried out at once (its default)
    connections: int = 64  # the portal's client connection pool (its loops' pools share it)


DEFAULTS = PathOptions()


def kubernetes_path(scale: float, folder: Path, options: PathOptions = DEFAULTS) -> dict[str, Any]:
    """The Kueue-shaped run through the test control plane (see the module doc)."""
    from kubernetes import client

    from portal.isolation import reconcile
    from portal.jobs.kube.admission import Admission
    from portal.jobs.kube.runner import KubeRunner
    from portal.jobs.kube.service import kube_backend
    from portal.kube.binder import Binder
    from tests.support import gpu_nodes
    from tests.support.k8s import running_cluster

    settings = IsolationSettings()
    plan = [(c, max(1, round(c.count * scale))) for c in CLASSES]
    flags = {
        "kube-controller-manager": [
            f"--kube-api-qps={options.kcm_qps}",
            f"--kube-api-burst={2 * options.kcm_qps}",
            # The Job controller's workers (5 by default) each wait on the apiserver.
            f"--concurrent-job-syncs={max(5, options.kcm_qps // 10)}",
        ]
    }
    with (
        running_cluster(folder / "k8s", flags) as cluster,
        portal_client(cluster, options.connections) as api,
    ):
        core = client.CoreV1Api(api)
        specs = [
            TenantSpec(
                name=t,
                gpu_limits={FLAVOR: LIMIT},
                cpu_millis=1_000_000,
                memory_mib=4_000_000,
                pods=2000,
            )
            for t, _ in tenants()
        ]
        reconcile(specs, settings, api)
        for namespace in [settings.namespace(t) for t, _ in tenants()]:
            _wait(lambda ns=namespace: _quota_ready(core, ns), f"quota status of {namespace}")
        for i in range(NODES):
            spec = gpu_nodes.GpuNodeSpec(
                name=f"bench-{i:02d}",
                gpu=gpu_nodes.H100_80GB_HBM3,
                gpu_count=NODE_GPUS,
                link=LinkClass.NVSWITCH,
                zone="zone-a",
                rack=f"rack-{i // 8}",
                cpu="512",
                memory="4Ti",
                pods=500,
            )
            cluster.add_gpu_node(gpu_nodes.node_manifest(spec))
        _wait(
            lambda: all(n.spec is None or not n.spec.taints for n in core.list_node().items),
            "nodes untainted",
        )
        nodes = [to_node(api.sanitize_for_serialization(n)) for n in core.list_node().items]
        with Store(f"sqlite:///{folder / 'portal.db'}") as store:
            alloc = Allocator(store)
            alloc.start([n for n in nodes if n is not None])
            for t, cohort in tenants():
                alloc.set_tenant(t, cohort=cohort)
                alloc.set_quota(t, FLAVOR, guaranteed=GUARANTEED, limit=LIMIT)
            backend = kube_backend(settings, api)
            runner = backend.runner
            assert isinstance(runner, KubeRunner)
            controller = JobController(alloc, backend=backend, stop_grace_s=0)
            controller.start()
            # Passed only when given: the same file measures a tree whose binder lacks it.
            chosen = options.binder_workers
            workers: dict[str, Any] = {} if chosen is None else {"act_workers": chosen}
            binder = Binder(api, alloc, settings, jobs=runner.jobs_informer(), **workers)
            binder_times = time_binder(binder)
            admission = Admission(api, controller, settings)
            calls = _count_calls(api)
            created: dict[str, tuple[str, float]] = {}  # "ns/name" -> (class, created at)
            total = len(tenants()) * sum(n for _, n in plan)
            creator = threading.Thread(
                target=_create_all, args=(cluster, plan, settings, created), daemon=True
            )
            loops = {
                "jobs-admission": admission.admit,
                "allocator": alloc.tick,
                "jobs": controller.step,
                "binder": binder.bind_pending,
            }
            start = time.time()
            creator.start()

            def settled() -> bool:
                if len(created) < total or controller.active_jobs():
                    return False
                return len(controller.jobs()) == total

            began_cpu = time.process_time()
            rounds, cpu = _run_loops(loops, settled, options)
            # The whole process: the loops' worker threads (the binder's and the launches'
            # pools) and the informers' watches too, and the creator of the Jobs (the same
            # work in every run).
            process_cpu = time.process_time() - began_cpu
            runner.close()
            report = _report(controller, created, start, scale, total)
            report["loop_rounds"] = rounds
            report["loop_cpu_s"] = cpu
            report["loop_cpu_ms_per_job"] = 1000 * sum(cpu.values()) / total
            report["process_cpu_ms_per_job"] = 1000 * process_cpu / total
            report["loop_interval_s"] = options.interval_s
            report["kcm_qps"] = options.kcm_qps
            report["portal_api_calls"] = dict(sorted(calls.items(), key=lambda kv: -kv[1]))
            report["portal_api_calls_per_job"] = sum(calls.values()) / total
            report["binder"] = binder_times
            report["binder_workers"] = options.binder_workers
            report["connections"] = options.connections
            return report
    raise AssertionError("unreachable")  # pragma: no cover


def _run_loops(
    loops: dict[str, Any], settled: Any, options: PathOptions
) -> tuple[dict[str, int], dict[str, float]]:
    """Run each loop in a thread of its own, as ``gpuportal serve`` does (a loop waits for
    the apiserver while the others work), until ``settled``; rounds and CPU seconds per loop
    (the loop thread's own CPU time, without the pools it hands work to)."""
    done = threading.Event()
    rounds = dict.fromkeys(loops, 0)
    cpu = dict.fromkeys(loops, 0.0)
    errors: list[BaseException] = []

    def run(name: str, step: Any) -> None:
        profiler = cProfile.Profile() if options.profile else None
        began_cpu = time.thread_time()
        try:
            while not done.is_set():
                began = time.monotonic()
                if profiler is not None:
                    profiler.enable()
                step()
                if profiler is not None:
                    profiler.disable()
                rounds[name] += 1
                done.wait(max(0.0, options.interval_s - (time.monotonic() - began)))
        except BaseException as e:  # the run is void: say why
            errors.append(e)
            done.set()
        finally:
            cpu[name] = time.thread_time() - began_cpu
            if profiler is not None and options.profile is not None:
                profiler.dump_stats(f"{options.profile}.{name}")

    threads = [threading.Thread(target=run, args=item, name=item[0]) for item in loops.items()]
    for t in threads:
        t.start()
    while not done.is_set() and not settled():
        done.wait(0.5)
    done.set()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return rounds, cpu


def call_kind(method: str, url: str) -> str:
    """``GET /api/v1/namespaces/{namespace}/pods/{name}``: a request without its server,
    query, namespace and object name (a watch says so)."""
    parts = urlsplit(url)
    path = re.sub(r"/namespaces/[^/]+", "/namespaces/{namespace}", parts.path)
    path = re.sub(r"/(pods|jobs|nodes|services|workloads)/[^/]+", r"/\1/{name}", path)
    return f"{method} {path}" + (" (watch)" if "watch=true" in parts.query else "")


def _count_calls(api: Any) -> dict[str, int]:
    """Count the portal's apiserver requests by method and path (templated: one row per kind
    of call, not per object). Watches count once per request."""
    calls: dict[str, int] = {}
    lock = threading.Lock()
    call_api = api.call_api

    def counted(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        # ApiClient.call_api(method, url, ...) in the pinned client: the full URL, query
        # included (keys were "<url> GET" before this order was fixed).
        what = call_kind(method, url)
        with lock:
            calls[what] = calls.get(what, 0) + 1
        return call_api(method, url, *args, **kwargs)

    api.call_api = counted
    return calls


def _create_all(
    cluster: Any,
    plan: Sequence[tuple[JobClass, int]],
    settings: IsolationSettings,
    created: dict[str, tuple[str, float]],
) -> None:
    from kubernetes import client

    events: list[tuple[float, str, str, int]] = []
    for t, _ in tenants():
        for c, n in plan:
            for k in range(n):
                heapq.heappush(events, (k * c.every_ms / 1000, t, c.name, k))
    by_name = {c.name: c for c in CLASSES}
    with cluster.api_client() as api:
        batch = client.BatchV1Api(api)
        start = time.time()
        while events:
            at, tenant, name, k = heapq.heappop(events)
            delay = start + at - time.time()
            if delay > 0:
                time.sleep(delay)
            namespace = settings.namespace(tenant)
            job = _job_manifest(f"{name}-{k}", namespace, by_name[name])
            batch.create_namespaced_job(namespace, cast(Any, job))
            created[f"{namespace}/{name}-{k}"] = (name, time.time())


def _report(
    controller: JobController,
    created: dict[str, tuple[str, float]],
    start: float,
    scale: float,
    total: int,
) -> dict[str, Any]:
    waits: dict[str, list[float]] = {c.name: [] for c in CLASSES}
    gpu_seconds = 0.0
    last_end = start
    states: dict[str, int] = {}
    failures: dict[str, int] = {}
    for view in controller.jobs():
        job = view.job
        states[job.state.value] = states.get(job.state.value, 0) + 1
        if job.state is not JobState.SUCCEEDED:
            failures[job.message] = failures.get(job.message, 0) + 1
        cls, at = created[job.name]
        attempts = controller.attempts(job.id)
        began = next((a.started_at for a in attempts if a.started_at), None)
        ended = job.ended_at or datetime.now(UTC)
        if began is not None:
            waits[cls].append(began.timestamp() - at)
        # What the allocator held for it (every attempt, preempted ones included).
        gpu_seconds += 3600 * controller.gpu_hours(job.id)
        last_end = max(last_end, ended.timestamp())
    wall = last_end - start
    return {
        "scale": scale,
        "jobs": total,
        "states": states,
        "not_succeeded": failures,
        "wall_s": wall,
        "gpu_usage_pct": 100 * gpu_seconds / (NODES * NODE_GPUS * wall),
        "mean_admission_s": {k: sum(v) / len(v) if v else None for k, v in waits.items()},
        "kueue_baseline": KUEUE_BASELINE,
    }


def _quota_ready(core: Any, namespace: str) -> bool:
    from kubernetes.client.exceptions import ApiException

    try:
        q = core.read_namespaced_resource_quota("tenant-quota", namespace)
    except ApiException:
        return False
    return bool(q.status and q.status.hard)


def _wait(check: Any, what: str, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    raise TimeoutError(f"{what}: not within {timeout_s} s")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.jobs", description=__doc__)
    parser.add_argument("--scale", type=float, default=1.0, help="fraction of Kueue's job counts")
    parser.add_argument("--policy-jobs", type=int, default=2000, help="jobs at the policy level")
    parser.add_argument("--policy-only", action="store_true", help="skip the Kubernetes path")
    parser.add_argument(
        "--queued",
        type=int,
        default=0,
        help="also time one round of the loops with this many jobs submitted (0: skip)",
    )
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument(
        "--kcm-qps",
        type=int,
        default=DEFAULTS.kcm_qps,
        help="kube-controller-manager's --kube-api-qps (burst twice that; its default is 20)",
    )
    parser.add_argument(
        "--interval-s",
        type=float,
        default=DEFAULTS.interval_s,
        help="least seconds between two rounds of the portal's loops",
    )
    parser.add_argument(
        "--profile", type=Path, help="cProfile statistics of each loop: PROFILE.<loop>"
    )
    parser.add_argument(
        "--binder-workers", type=int, help="the binder's decisions carried out at once"
    )
    parser.add_argument(
        "--connections",
        type=int,
        default=DEFAULTS.connections,
        help="the portal's client connection pool size",
    )
    args = parser.parse_args(argv)
    options = PathOptions(
        args.kcm_qps, args.interval_s, args.profile, args.binder_workers, args.connections
    )
    with tempfile.TemporaryDirectory(prefix="gpuportal-jobs-bench-") as tmp:
        results: dict[str, Any] = {"policy": policy_level(args.policy_jobs, Path(tmp))}
        print(
            f"policy level: {results['policy']['admitted']} of {args.policy_jobs} jobs admitted "
            f"in {results['policy']['seconds']:.2f} s: {results['policy']['per_s']:.0f} jobs/s "
            "(goal >= 50/s)"
        )
        if args.queued:
            results["queued_round"] = q = queued_round(args.queued, Path(tmp))
            print(
                f"one round of the loops with {q['queued']} of {q['jobs']} jobs queued: "
                f"{q['round_s']:.2f} s (median of 3)"
            )
        if not args.policy_only:
            k8s = kubernetes_path(args.scale, Path(tmp), options)
            results["kubernetes"] = k8s
            base = KUEUE_BASELINE
            print(f"kubernetes path, scale {args.scale:g} ({k8s['jobs']} jobs): {k8s['states']}")
            print(f"  wall time   {k8s['wall_s']:8.1f} s   (Kueue {base['wall_s']} s at scale 1)")
            print(
                f"  GPU usage   {k8s['gpu_usage_pct']:8.1f} %   (Kueue {base['gpu_usage_pct']} %)"
            )
            for name, mean in k8s["mean_admission_s"].items():
                kueue = base["mean_admission_s"][name]  # type: ignore[index]
                shown = "n/a" if mean is None else f"{mean:8.2f} s"
                print(f"  admission {name:<6} {shown}   (Kueue {kueue} s)")
            print(
                f"  per job: {k8s['portal_api_calls_per_job']:.1f} apiserver calls, "
                f"{k8s['loop_cpu_ms_per_job']:.1f} ms CPU of the portal's loop threads, "
                f"{k8s['process_cpu_ms_per_job']:.1f} ms of its whole process"
            )
            b = k8s["binder"]
            print(
                f"  binder: {b['passes']} passes, {b['pass_s']:.1f} s in them "
                f"({b['decide_s']:.1f} s deciding, {b['list_s']:.1f} s of it listing pods), "
                f"{b['acted']} decisions carried out ({b['act_s']:.1f} s summed over its "
                f"workers), at most {b['most_decisions_in_a_pass']} in a pass"
            )
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
