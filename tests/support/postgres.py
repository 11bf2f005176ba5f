"""A real PostgreSQL server for the tests, started once per session.

``postgres_server`` runs ``initdb`` in a temporary directory and starts ``postgres`` on
127.0.0.1 with a free port (as the unprivileged ``postgres`` user when the tests run as root,
since PostgreSQL refuses to run as root); it is stopped at exit and, on Linux, also when
pytest is killed (the parent-death signal). ``postgres_url`` gives each test a fresh, empty
database cloned from a template. ``db_url`` runs a test on SQLite and on PostgreSQL.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import itertools
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.support.ports import free_port

MISSING = (
    "PostgreSQL server not found: install the Debian package postgresql (scripts/bootstrap does)"
)
READY_TIMEOUT_S = 30.0
SUPERUSER = "portal"
TEMPLATE = "portal_template"


def find_bindir() -> Path | None:
    """The directory holding ``initdb`` and ``postgres``: pg_config's, Debian's, or PATH's."""
    candidates: list[Path] = []
    pg_config = shutil.which("pg_config")
    if pg_config:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run(
                [pg_config, "--bindir"], capture_output=True, text=True, timeout=10, check=True
            )
            candidates.append(Path(out.stdout.strip()))

    def major(p: Path) -> int:
        return int(p.parent.name) if p.parent.name.isdigit() else -1

    candidates += sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=major, reverse=True)
    initdb = shutil.which("initdb")
    if initdb:
        candidates.append(Path(initdb).parent)
    for c in candidates:
        if (c / "initdb").is_file() and (c / "postgres").is_file():
            return c
    return None


def _quit_with_parent() -> None:
    """Runs in the child after it took the ``postgres`` user: an immediate shutdown (SIGQUIT)
    when the thread that started it dies, even by SIGKILL, so a killed test run leaves no
    server behind (Linux only; elsewhere the ``atexit`` handler is all there is)."""
    if sys.platform.startswith("linux"):
        pr_set_pdeathsig = 1
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGQUIT)


@dataclass
class PostgresServer:
    """A running server; ``url(db)`` is an SQLAlchemy URL for one of its databases."""

    bindir: Path
    root: Path
    port: int = 0
    process: subprocess.Popen[bytes] | None = None
    _user: dict[str, Any] = field(default_factory=dict)
    _settings: list[str] = field(default_factory=list)
    _counter: itertools.count[int] = field(default_factory=itertools.count)

    @property
    def log(self) -> Path:
        return self.root / "postgres.log"

    def url(self, database: str) -> str:
        return f"postgresql+psycopg://{SUPERUSER}@127.0.0.1:{self.port}/{database}"

    def start(self, *, durable: bool = False) -> None:
        """initdb and start. ``durable=False`` turns fsync off: fast, fine for throwaway data."""
        if os.geteuid() == 0:
            try:
                pw = pwd.getpwnam("postgres")
            except KeyError:
                raise RuntimeError(
                    "PostgreSQL refuses to run as root and there is no 'postgres' user to run "
                    "it as: install the Debian package postgresql (scripts/bootstrap does)"
                ) from None
            self._user = {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": []}
            os.chown(self.root, pw.pw_uid, pw.pw_gid)
        env = {**os.environ, "LC_ALL": "C", "PGTZ": "UTC"}
        data = self.root / "data"
        self._run(
            [
                str(self.bindir / "initdb"),
                "-D",
                str(data),
                "-U",
                SUPERUSER,
                "--auth=trust",
                "--encoding=UTF8",
                "--locale=C",
                "--no-sync",
            ],
            env,
        )
        settings = ["-c", "timezone=UTC", "-c", "max_connections=200"]
        if not durable:
            settings += ["-c", "fsync=off", "-c", "full_page_writes=off"]
        self._settings = settings
        for _attempt in range(3):
            self.port = free_port()
            if self._launch(data, env):
                return
            self.stop()  # most likely another process took the port meanwhile
        raise RuntimeError(f"PostgreSQL did not start; its log:\n{self._log_tail()}")

    def restart(self) -> None:
        """Start the stopped server again on its data and port (an outage ends)."""
        env = {**os.environ, "LC_ALL": "C", "PGTZ": "UTC"}
        if not self._launch(self.root / "data", env):
            raise RuntimeError(f"PostgreSQL did not restart; its log:\n{self._log_tail()}")

    def _launch(self, data: Path, env: dict[str, str]) -> bool:
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [
                    str(self.bindir / "postgres"),
                    "-D",
                    str(data),
                    "-h",
                    "127.0.0.1",
                    "-p",
                    str(self.port),
                    "-k",
                    str(self.root),
                    *self._settings,
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                preexec_fn=_quit_with_parent,
                **self._user,
            )
        return self._wait_ready()

    def _run(self, argv: list[str], env: dict[str, str]) -> None:
        result = subprocess.run(argv, capture_output=True, text=True, env=env, **self._user)
        if result.returncode != 0:
            output = result.stdout + result.stderr
            raise RuntimeError(f"{Path(argv[0]).name} failed ({result.returncode}):\n{output}")

    def _wait_ready(self) -> bool:
        import psycopg

        assert self.process is not None
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                return False
            try:
                with psycopg.connect(self._dsn("postgres"), connect_timeout=2):
                    return True
            except psycopg.OperationalError:
                time.sleep(0.05)
        return False

    def _log_tail(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-4000:]
        except OSError:
            return "(no log)"

    def _dsn(self, database: str) -> str:
        return f"host=127.0.0.1 port={self.port} user={SUPERUSER} dbname={database}"

    def execute(self, sql: str, database: str = "postgres") -> None:
        """Run one statement outside a transaction (CREATE/DROP DATABASE need that)."""
        import psycopg

        with psycopg.connect(self._dsn(database), autocommit=True) as conn:
            conn.execute(sql.encode())

    def create_database(self, prefix: str = "test") -> str:
        """A fresh, empty database cloned from the template; returns its name."""
        name = f"{prefix}_{os.getpid()}_{next(self._counter)}"
        self.execute(f'CREATE DATABASE "{name}" TEMPLATE "{TEMPLATE}" STRATEGY FILE_COPY')
        return name

    def drop_database(self, name: str) -> None:
        self.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def stop(self) -> None:
        """Immediate shutdown (SIGQUIT: the data is thrown away, so no checkpoint), then
        SIGKILL if it lingers; idempotent."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGQUIT)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=15)


def start_server(*, durable: bool = False) -> PostgresServer:
    """Start a throwaway server with an empty template database; stopped at exit at the latest.

    Raises:
        RuntimeError: the binaries are missing or the server does not come up.
    """
    bindir = find_bindir()
    if bindir is None:
        raise RuntimeError(MISSING)
    root = Path(tempfile.mkdtemp(prefix="gpuportal-pg-"))
    server = PostgresServer(bindir=bindir, root=root)

    def cleanup() -> None:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)

    atexit.register(cleanup)
    try:
        server.start(durable=durable)
        server.execute(f'CREATE DATABASE "{TEMPLATE}"')
    except BaseException:
        cleanup()
        raise
    return server


def stop_server(server: PostgresServer) -> None:
    server.stop()
    shutil.rmtree(server.root, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """One PostgreSQL server for the whole session."""
    try:
        server = start_server()
    except RuntimeError as err:
        pytest.fail(str(err), pytrace=False)
    try:
        yield server
    finally:
        stop_server(server)


@pytest.fixture
def postgres_url(postgres_server: PostgresServer) -> Iterator[str]:
    """A fresh, empty database for one test, dropped afterwards (open connections included)."""
    name = postgres_server.create_database()
    try:
        yield postgres_server.url(name)
    finally:
        postgres_server.drop_database(name)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty database URL: a SQLite file, then a PostgreSQL database."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'portal.db'}"
    url: str = request.getfixturevalue("postgres_url")
    return url
