"""A real Kubernetes control plane for the ``k8s`` tests: etcd, kube-apiserver,
kube-controller-manager and kwok (simulated kubelets for fake GPU nodes), all on loopback.

The session fixture ``k8s_cluster`` builds the binaries if needed (``scripts/build-k8s-tools``),
makes a throwaway PKI with openssl, starts the four processes in their own process groups with
logs under a temporary folder, waits for each to be ready and stops them all at the end of the
session (SIGTERM, then SIGKILL), also from an ``atexit`` handler and, on Linux, through the
parent-death signal if pytest itself is killed.

Identities: ``admin`` (client certificate and token, group ``system:masters``) and the plain
users in ``USERS`` (static tokens, groups as listed), authorized by RBAC only.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import shutil
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest
import yaml
from kubernetes import client as k8s_client

from tests.support import kwok_stages
from tests.support.ports import LOOPBACK, free_port

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO_ROOT / "scripts" / "build-k8s-tools"
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kwok")
# kwok's node and pod lifecycle (Stages), copied from the pinned kwok module by the build script.
KWOK_STAGES = "kwok-stages.yaml"
# Points straight at a folder of prebuilt binaries (skips the build script).
BIN_DIR_ENV = "GPUPORTAL_K8S_BIN_DIR"
# kwok hands out pod IPs from here, so a test can serve a "pod" on its loopback address.
POD_CIDR = "127.100.0.0/16"
SERVICE_CIDR = "10.96.0.0/24"
KWOK_NODE_SELECTOR = "kwok.x-k8s.io/node=fake"
READY_TIMEOUT_S = 90.0
STOP_GRACE_S = 10.0


class ClusterSetupError(RuntimeError):
    """The control plane could not be located or started; the message says what to fix."""


@dataclass(frozen=True, slots=True)
class UserIdentity:
    """A plain user authenticated by a static bearer token."""

    name: str
    groups: tuple[str, ...]
    token: str


USERS: Mapping[str, UserIdentity] = {
    u.name: u
    for u in (
        UserIdentity("alice", ("gpuportal:tenant-a",), "alice-token-0a1b2c3d4e5f"),
        UserIdentity("bob", ("gpuportal:tenant-b",), "bob-token-6a7b8c9d0e1f"),
        UserIdentity(
            "carol", ("gpuportal:tenant-a", "gpuportal:tenant-admins"), "carol-token-2f3e"
        ),
        UserIdentity("dave", (), "dave-token-4d5c6b7a"),
    )
}
ADMIN = UserIdentity("admin", ("system:masters",), "admin-token-9f8e7d6c5b4a")


# --- locating the binaries -------------------------------------------------------------------


def check_bin_dir(bin_dir: Path) -> Path:
    """Return ``bin_dir`` if it holds every binary, else raise naming what is missing."""
    if not bin_dir.is_dir():
        raise ClusterSetupError(
            f"Kubernetes tools folder {bin_dir} does not exist; expected {', '.join(BINARIES)} "
            f"there. Run scripts/build-k8s-tools or point {BIN_DIR_ENV} at a folder holding them."
        )
    missing = [b for b in BINARIES if not os.access(bin_dir / b, os.X_OK)]
    if not (bin_dir / KWOK_STAGES).is_file():
        missing.append(KWOK_STAGES)
    if missing:
        raise ClusterSetupError(
            f"missing {', '.join(missing)} in {bin_dir}; expected executables "
            f"{', '.join(BINARIES)} and {KWOK_STAGES}. Run scripts/build-k8s-tools to (re)build."
        )
    return bin_dir


def locate_binaries(
    env: Mapping[str, str] | None = None, build_script: Path = BUILD_SCRIPT
) -> Path:
    """The folder with the control-plane binaries, building them first if needed."""
    env = dict(os.environ if env is None else env)
    if env.get(BIN_DIR_ENV):
        return check_bin_dir(Path(env[BIN_DIR_ENV]))
    if not build_script.is_file():
        raise ClusterSetupError(f"build script {build_script} is missing")
    proc = subprocess.run(
        ["bash", str(build_script)], env=env, capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise ClusterSetupError(
            f"{build_script.name} failed with exit code {proc.returncode}:\n"
            + _tail(proc.stderr, 30)
        )
    lines = proc.stdout.strip().splitlines()
    if not lines:
        raise ClusterSetupError(f"{build_script.name} printed no bin folder on stdout")
    return check_bin_dir(Path(lines[-1]))


def require_tool(name: str, path: str | None = None) -> str:
    """Full path of an executable on PATH, or a clear error naming it."""
    found = shutil.which(name, path=path)
    if found is None:
        raise ClusterSetupError(
            f"'{name}' is not on PATH; the k8s test cluster needs it "
            f"(Debian: apt-get install {name})."
        )
    return found


def _tail(text: str, lines: int) -> str:
    return "\n".join(text.splitlines()[-lines:])


def log_tail(path: Path, lines: int = 40) -> str:
    try:
        return _tail(path.read_text(errors="replace"), lines)
    except OSError:
        return f"(no log at {path})"


# --- PKI --------------------------------------------------------------------------------------


def _openssl(openssl: str, *args: str) -> None:
    proc = subprocess.run([openssl, *args], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise ClusterSetupError(f"openssl {' '.join(args[:2])} failed:\n{_tail(proc.stderr, 10)}")


@dataclass(frozen=True, slots=True)
class Pki:
    """Certificates and keys of one throwaway cluster (EC P-256: quick to generate)."""

    folder: Path
    openssl: str

    @property
    def ca_cert(self) -> Path:
        return self.folder / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.folder / "ca.key"

    def create_ca(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        _openssl(
            self.openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
            "-nodes", "-keyout", str(self.ca_key), "-out", str(self.ca_cert), "-days", "3",
            "-subj", "/CN=gpuportal-test-ca",
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        )  # fmt: skip

    def issue(
        self, name: str, common_name: str, orgs: Sequence[str] = (), server: bool = False
    ) -> tuple[Path, Path]:
        """Sign a client (or, with ``server``, a loopback serving) certificate; (cert, key)."""
        cert, key, csr = (self.folder / f"{name}.{ext}" for ext in ("crt", "key", "csr"))
        subject = "".join(f"/O={o}" for o in orgs) + f"/CN={common_name}"
        _openssl(
            self.openssl, "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
            "-nodes", "-keyout", str(key), "-out", str(csr), "-subj", subject,
        )  # fmt: skip
        ext = self.folder / f"{name}.ext"
        usage = "serverAuth" if server else "clientAuth"
        lines = [
            "basicConstraints=critical,CA:FALSE",
            "keyUsage=critical,digitalSignature,keyEncipherment",
            f"extendedKeyUsage={usage}",
        ]
        if server:
            lines.append(
                "subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes,"
                "DNS:kubernetes.default,DNS:kubernetes.default.svc,IP:10.96.0.1"
            )
        ext.write_text("\n".join(lines) + "\n")
        _openssl(
            self.openssl, "x509", "-req", "-in", str(csr), "-CA", str(self.ca_cert),
            "-CAkey", str(self.ca_key), "-CAcreateserial", "-days", "3", "-out", str(cert),
            "-extfile", str(ext),
        )  # fmt: skip
        return cert, key

    def service_account_keys(self) -> tuple[Path, Path]:
        """(private, public) key pair the apiserver signs service-account tokens with."""
        private, public = self.folder / "sa.key", self.folder / "sa.pub"
        _openssl(self.openssl, "ecparam", "-name", "prime256v1", "-genkey", "-noout",
                 "-out", str(private))  # fmt: skip
        _openssl(self.openssl, "ec", "-in", str(private), "-pubout", "-out", str(public))
        return private, public


def kubeconfig(
    server: str,
    ca: Path,
    user: str,
    *,
    token: str | None = None,
    cert: tuple[Path, Path] | None = None,
) -> dict[str, Any]:
    """A one-context kubeconfig for ``user`` (bearer token or client certificate)."""
    credentials: dict[str, str] = {}
    if token is not None:
        credentials["token"] = token
    if cert is not None:
        credentials["client-certificate"] = str(cert[0])
        credentials["client-key"] = str(cert[1])
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "gpuportal-test", "cluster": {"server": server,
                                                             "certificate-authority": str(ca)}}],
        "users": [{"name": user, "user": credentials}],
        "contexts": [{"name": user, "context": {"cluster": "gpuportal-test", "user": user}}],
        "current-context": user,
    }  # fmt: skip


# --- processes --------------------------------------------------------------------------------


def _die_with_parent() -> None:
    """Runs in the child: SIGKILL it when pytest dies, even by SIGKILL (Linux only)."""
    if sys.platform.startswith("linux"):
        pr_set_pdeathsig = 1
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)


@dataclass
class Component:
    """One started process, in its own process group, logging to ``log``."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    def running(self) -> bool:
        return self.popen.poll() is None

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """SIGTERM the whole process group, SIGKILL whatever is left after ``grace_s``."""
        pgid = self.popen.pid  # start_new_session made it the group leader
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=grace_s)
        # Children of the leader may outlive it; the group id still reaches them.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=grace_s)


def start_component(
    name: str, argv: Sequence[str], log_dir: Path, env: Mapping[str, str] | None = None
) -> Component:
    log = log_dir / f"{name}.log"
    with log.open("ab") as out:
        popen = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent,
            # Keep proxies away: everything the control plane talks to is on loopback.
            env={**os.environ, "NO_PROXY": "*", "no_proxy": "*", **(env or {})},
        )
    return Component(name, popen, log)


def wait_until(
    component: Component,
    check: Callable[[], bool],
    what: str,
    timeout_s: float = READY_TIMEOUT_S,
) -> None:
    """Poll ``check`` until true; fail with the component's log tail if it dies or times out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not component.running():
            raise ClusterSetupError(
                f"{component.name} exited with code {component.popen.returncode} before {what}; "
                f"last lines of {component.log}:\n{log_tail(component.log)}"
            )
        with contextlib.suppress(OSError, ValueError):
            if check():
                return
        time.sleep(0.2)
    raise ClusterSetupError(
        f"{component.name} not ready ({what}) after {timeout_s:.0f} s; "
        f"last lines of {component.log}:\n{log_tail(component.log)}"
    )


def http_ok(url: str, context: ssl.SSLContext | None = None, token: str | None = None) -> bool:
    request = urllib.request.Request(url)
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    # An empty ProxyHandler: readiness probes go straight to loopback, whatever *_proxy says.
    opener = urllib.request.build_opener(
        urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context)
    )
    try:
        with opener.open(request, timeout=2) as response:
            return int(response.status) == 200
    except urllib.error.HTTPError:
        return False


# --- the cluster ------------------------------------------------------------------------------


@dataclass
class K8sCluster:
    """A running control plane. ``server`` is ``https://127.0.0.1:<port>``."""

    server: str
    ca_path: Path
    admin_kubeconfig: Path
    work_dir: Path
    bin_dir: Path
    components: list[Component] = field(default_factory=list)

    @property
    def log_dir(self) -> Path:
        return self.work_dir / "logs"

    def token_for(self, user: str) -> str:
        """Bearer token of ``admin`` or one of ``USERS``."""
        if user == ADMIN.name:
            return ADMIN.token
        try:
            return USERS[user].token
        except KeyError:
            known = ", ".join([ADMIN.name, *USERS])
            raise KeyError(f"unknown test user {user!r}; expected one of {known}") from None

    def kubeconfig_for(self, user: str) -> Path:
        """Path of a kubeconfig authenticating as ``user`` with its token."""
        path = self.work_dir / "kubeconfigs" / f"{user}.yaml"
        if not path.exists():
            path.parent.mkdir(exist_ok=True)
            config = kubeconfig(self.server, self.ca_path, user, token=self.token_for(user))
            path.write_text(yaml.safe_dump(config))
        return path

    def configure(self, config: Any, user: str = ADMIN.name) -> Any:
        """Point a ``kubernetes`` or ``kubernetes_asyncio`` ``Configuration`` at this cluster
        as ``user``; returns it.

        Sets the token under both key names: the sync client reads ``authorization`` or
        ``BearerToken``, ``kubernetes_asyncio`` only ``BearerToken`` (else it is anonymous).
        """
        token = self.token_for(user)
        config.host = self.server
        config.ssl_ca_cert = str(self.ca_path)
        config.api_key = {"BearerToken": token, "authorization": token}
        config.api_key_prefix = {"BearerToken": "Bearer", "authorization": "Bearer"}
        # Never route loopback traffic through a proxy from the environment.
        config.proxy = None
        return config

    def api_client(self, user: str = ADMIN.name) -> k8s_client.ApiClient:
        """A ``kubernetes.client.ApiClient`` acting as ``user`` (admin by default)."""
        return k8s_client.ApiClient(self.configure(k8s_client.Configuration(), user))

    def create_namespace(
        self, name: str, labels: Mapping[str, str] | None = None, timeout_s: float = 30.0
    ) -> None:
        """Create a namespace and wait for its ``default`` service account (pods need it)."""
        with self.api_client() as api:
            core = k8s_client.CoreV1Api(api)
            meta = k8s_client.V1ObjectMeta(name=name, labels=dict(labels or {}))
            core.create_namespace(k8s_client.V1Namespace(metadata=meta))
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                accounts = core.list_namespaced_service_account(name).items
                if any(a.metadata is not None and a.metadata.name == "default" for a in accounts):
                    return
                time.sleep(0.1)
        raise TimeoutError(
            f"namespace {name} has no 'default' service account after {timeout_s} s; "
            "is kube-controller-manager running? "
            f"log: {self.log_dir / 'kube-controller-manager.log'}"
        )

    def add_gpu_node(
        self, manifest: Mapping[str, Any], *, timeout_s: float = 30.0
    ) -> dict[str, Any]:
        """Create a fake node (``tests.support.gpu_nodes``) and wait until kwok marks it Ready."""
        name = manifest["metadata"]["name"]
        with self.api_client() as api:
            core = k8s_client.CoreV1Api(api)
            # The client takes plain dicts as bodies although its hints ask for models.
            core.create_node(cast(Any, dict(manifest)))
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                node = core.read_node(name)
                conditions = (node.status.conditions if node.status else None) or []
                if any(c.type == "Ready" and c.status == "True" for c in conditions):
                    return dict(api.sanitize_for_serialization(node))
                time.sleep(0.2)
        raise TimeoutError(
            f"node {name} not Ready after {timeout_s} s; does it carry the annotation "
            f"{KWOK_NODE_SELECTOR}? kwok log: {self.log_dir / 'kwok.log'}"
        )

    def stop(self) -> None:
        """Stop every component, newest first. Safe to call more than once."""
        while self.components:
            self.components.pop().stop()


def _write_yaml(path: Path, data: Mapping[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(dict(data)))
    return path


def start_cluster(
    work_dir: Path,
    bin_dir: Path,
    openssl: str,
    extra_flags: Mapping[str, Sequence[str]] | None = None,
) -> K8sCluster:
    """Start etcd, kube-apiserver, kube-controller-manager and kwok; stop them all on failure.

    ``extra_flags`` adds flags to components by name (``BINARIES``): a benchmark raises the
    controller manager's client rate limits, say, without changing the test suite's cluster.
    """
    unknown = set(extra_flags or {}) - set(BINARIES)
    if unknown:
        raise ClusterSetupError(f"flags for unknown components {sorted(unknown)}: {BINARIES}")
    log_dir = work_dir / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    pki = Pki(work_dir / "pki", openssl)
    pki.create_ca()
    serving = pki.issue("apiserver", "kube-apiserver", server=True)
    admin_cert = pki.issue("admin", ADMIN.name, orgs=ADMIN.groups)
    kcm_cert = pki.issue("kube-controller-manager", "system:kube-controller-manager")
    sa_private, sa_public = pki.service_account_keys()
    tokens = work_dir / "tokens.csv"
    tokens.write_text(
        "".join(
            f'{u.token},{u.name},uid-{u.name},"{",".join(u.groups)}"\n'
            for u in (ADMIN, *USERS.values())
        )
    )
    tokens.chmod(0o600)

    try:
        etcd_port, etcd_peer_port, api_port, kcm_port, kwok_port = (free_port() for _ in range(5))
    except OSError as e:
        raise ClusterSetupError(f"no free TCP port on {LOOPBACK}: {e}") from e
    server = f"https://{LOOPBACK}:{api_port}"
    admin_kubeconfig = _write_yaml(
        work_dir / "admin.kubeconfig",
        kubeconfig(server, pki.ca_cert, ADMIN.name, cert=admin_cert),
    )
    kcm_kubeconfig = _write_yaml(
        work_dir / "kube-controller-manager.kubeconfig",
        kubeconfig(server, pki.ca_cert, "system:kube-controller-manager", cert=kcm_cert),
    )
    cluster = K8sCluster(server, pki.ca_cert, admin_kubeconfig, work_dir, bin_dir)
    try:
        _start_all(cluster, pki, serving, tokens, (sa_private, sa_public), kcm_kubeconfig,
                   (etcd_port, etcd_peer_port, api_port, kcm_port, kwok_port),
                   extra_flags or {})  # fmt: skip
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _start_all(
    cluster: K8sCluster,
    pki: Pki,
    serving: tuple[Path, Path],
    tokens: Path,
    sa_keys: tuple[Path, Path],
    kcm_kubeconfig: Path,
    ports: tuple[int, int, int, int, int],
    extra: Mapping[str, Sequence[str]],
) -> None:
    etcd_port, etcd_peer_port, api_port, kcm_port, kwok_port = ports
    bins, logs, work = cluster.bin_dir, cluster.log_dir, cluster.work_dir
    etcd_url = f"http://{LOOPBACK}:{etcd_port}"
    peer_url = f"http://{LOOPBACK}:{etcd_peer_port}"
    etcd = start_component("etcd", [
        str(bins / "etcd"), "--name=gpuportal-test", f"--data-dir={work / 'etcd'}",
        f"--listen-client-urls={etcd_url}", f"--advertise-client-urls={etcd_url}",
        f"--listen-peer-urls={peer_url}", f"--initial-advertise-peer-urls={peer_url}",
        f"--initial-cluster=gpuportal-test={peer_url}",
        # Test data is thrown away: skipping fsync makes every write much cheaper.
        "--unsafe-no-fsync", "--log-level=warn", *extra.get("etcd", ()),
    ], logs)  # fmt: skip
    cluster.components.append(etcd)
    wait_until(etcd, lambda: http_ok(f"{etcd_url}/health"), "GET /health")

    sa_private, sa_public = sa_keys
    apiserver = start_component("kube-apiserver", [
        str(bins / "kube-apiserver"), f"--etcd-servers={etcd_url}",
        f"--bind-address={LOOPBACK}", f"--advertise-address={LOOPBACK}",
        f"--secure-port={api_port}",
        f"--tls-cert-file={serving[0]}", f"--tls-private-key-file={serving[1]}",
        f"--client-ca-file={pki.ca_cert}", f"--token-auth-file={tokens}",
        "--authorization-mode=Node,RBAC",
        "--enable-admission-plugins=NamespaceLifecycle,LimitRanger,ServiceAccount,PodSecurity,"
        "ResourceQuota,NodeRestriction",
        # Privileged pods are allowed cluster-wide so that Pod Security, not this flag, rejects
        # them in restricted namespaces.
        "--allow-privileged=true",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        f"--service-account-key-file={sa_public}",
        f"--service-account-signing-key-file={sa_private}",
        # scheduling.k8s.io/v1alpha1 serves the gang Workload objects the job backend writes.
        "--runtime-config=resource.k8s.io/v1=true,scheduling.k8s.io/v1alpha1=true",
        "--feature-gates=GenericWorkload=true",
        "--endpoint-reconciler-type=none", "--profiling=false",
        *extra.get("kube-apiserver", ()),
    ], logs)  # fmt: skip
    cluster.components.append(apiserver)
    ca = ssl.create_default_context(cafile=str(pki.ca_cert))
    wait_until(
        apiserver,
        lambda: http_ok(f"{cluster.server}/readyz", ca, ADMIN.token),
        f"GET {cluster.server}/readyz",
    )

    kcm = start_component("kube-controller-manager", [
        str(bins / "kube-controller-manager"), f"--kubeconfig={kcm_kubeconfig}",
        f"--authentication-kubeconfig={kcm_kubeconfig}",
        f"--authorization-kubeconfig={kcm_kubeconfig}",
        f"--bind-address={LOOPBACK}", f"--secure-port={kcm_port}",
        f"--cert-dir={work / 'kcm-certs'}",
        "--leader-elect=false", "--use-service-account-credentials=true",
        f"--root-ca-file={pki.ca_cert}", f"--service-account-private-key-file={sa_private}",
        f"--cluster-signing-cert-file={pki.ca_cert}", f"--cluster-signing-key-file={pki.ca_key}",
        # Fake nodes have no cloud and no IPAM; kwok assigns pod IPs itself.
        "--controllers=*,-nodeipam,-service-lb-controller,-cloud-node-lifecycle-controller",
        *extra.get("kube-controller-manager", ()),
    ], logs)  # fmt: skip
    cluster.components.append(kcm)
    insecure = ssl.create_default_context()
    # KCM serves its health endpoint with a self-signed certificate it makes in --cert-dir.
    insecure.check_hostname = False
    insecure.verify_mode = ssl.CERT_NONE
    wait_until(kcm, lambda: http_ok(f"https://{LOOPBACK}:{kcm_port}/healthz", insecure),
               "GET /healthz")  # fmt: skip

    # kwok also reads ~/.kwok/kwok.yaml when present; a private HOME keeps the user's out.
    kwok_home = work / "kwok-home"
    kwok_home.mkdir(exist_ok=True)
    stages = kwok_stages.write_derived(bins / KWOK_STAGES, work / KWOK_STAGES)
    kwok = start_component("kwok", [
        str(bins / "kwok"), f"--kubeconfig={cluster.admin_kubeconfig}",
        "--manage-all-nodes=false",
        f"--manage-nodes-with-annotation-selector={KWOK_NODE_SELECTOR}",
        f"--node-ip={LOOPBACK}", f"--cidr={POD_CIDR}",
        f"--server-address={LOOPBACK}:{kwok_port}", f"--config={stages}",
        *extra.get("kwok", ()),
    ], logs, env={"HOME": str(kwok_home)})  # fmt: skip
    cluster.components.append(kwok)
    wait_until(kwok, lambda: http_ok(f"http://{LOOPBACK}:{kwok_port}/healthz"), "GET /healthz")


@contextlib.contextmanager
def running_cluster(
    work_dir: Path, extra_flags: Mapping[str, Sequence[str]] | None = None
) -> Iterator[K8sCluster]:
    """Start a control plane for the duration of the ``with`` block (``start_cluster``)."""
    bin_dir = locate_binaries()
    openssl = require_tool("openssl")
    cluster = start_cluster(work_dir, bin_dir, openssl, extra_flags)
    # Also covers sessions that end without fixture teardown (e.g. a second Ctrl-C).
    atexit.register(cluster.stop)
    try:
        yield cluster
    finally:
        cluster.stop()
        atexit.unregister(cluster.stop)


_started_log_dirs: list[Path] = []


@pytest.fixture(scope="session")
def k8s_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[K8sCluster]:
    """The session's control plane (started on first use)."""
    work_dir = tmp_path_factory.mktemp("k8s")
    _started_log_dirs.append(work_dir / "logs")
    try:
        with running_cluster(work_dir) as cluster:
            yield cluster
    except ClusterSetupError as e:
        pytest.fail(f"k8s test cluster: {e}\n(logs: {work_dir / 'logs'})", pytrace=False)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int) -> None:
    """On a failing session, say where the control-plane logs are."""
    if exitstatus != 0 and _started_log_dirs:
        for log_dir in _started_log_dirs:
            terminalreporter.write_line(f"k8s control-plane logs: {log_dir}")
