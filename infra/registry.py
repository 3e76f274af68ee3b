"""A real schema registry for the local stack: Apicurio Registry, Confluent API under
`/apis/ccompat/v7`, loopback only, global compatibility BACKWARD.

Its storage is PostgreSQL (Apicurio's SQL storage; database `registry_database` on the stack's
server, created at start): schema ids must outlive a restart of the stack, because Kafka keeps
records that carry them. With in-memory storage a down/up renumbered the schemas and old
records decoded against the wrong schema or not at all.

`infra/registry/pom.xml` pins the version; `mvn dependency:copy-dependencies` fetches the
runnable archive (~160 MB) from Maven Central once into the cache dir, where it is unpacked
once; then the registry runs as `java -jar quarkus-run.jar`.

Apicurio 3.3.x is compiled for Java 21 (class file 65): it does not start on Java 17, the
default here. The newest JDK >= 21 found under /usr/lib/jvm (or `java` on PATH) is used, or
the one named by FLASHSEND_REGISTRY_JAVA. Kafka keeps running on the default Java 17.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tarfile
import urllib.error
import urllib.request
from pathlib import Path

from psycopg.conninfo import conninfo_to_dict

from flashsend.settings import Settings
from infra.errors import PrerequisiteMissing, StackError
from infra.process import ManagedProcess, free_port, port_open, require_free_port, wait_until

POM = Path(__file__).parent / "registry" / "pom.xml"
MIN_JAVA = 21
CCOMPAT_PATH = "/apis/ccompat/v7"


def registry_version() -> str:
    match = re.search(r"<apicurio.version>([^<]+)</apicurio.version>", POM.read_text())
    assert match, "infra/registry/pom.xml must define apicurio.version"
    return match.group(1)


def app_dir(settings: Settings) -> Path:
    digest = hashlib.sha256(POM.read_bytes()).hexdigest()[:12]
    return settings.cache_dir / f"apicurio-{registry_version()}-{digest}"


def java_major(java: str) -> int | None:
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30).stderr
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r'version "(\d+)', out)
    return int(match.group(1)) if match else None


def find_java(configured: str = "") -> str:
    """A java >= 21: the configured one, else the newest under /usr/lib/jvm or on PATH."""
    if configured:
        major = java_major(configured)
        if major is None or major < MIN_JAVA:
            raise PrerequisiteMissing(
                f"FLASHSEND_REGISTRY_JAVA={configured} is not a java >= {MIN_JAVA} (found "
                f"{major}); Apicurio Registry {registry_version()} needs Java {MIN_JAVA}"
            )
        return configured
    candidates = [str(p) for p in sorted(Path("/usr/lib/jvm").glob("*/bin/java"))]
    on_path = shutil.which("java")
    if on_path:
        candidates.append(on_path)
    found = [(major, java) for java in candidates if (major := java_major(java)) is not None]
    usable = sorted((m, j) for m, j in found if m >= MIN_JAVA)
    if not usable:
        seen = ", ".join(f"{j} ({m})" for m, j in found) or "none"
        raise PrerequisiteMissing(
            f"the schema registry (Apicurio {registry_version()}) needs Java >= {MIN_JAVA}; "
            f"found: {seen}. Install a JDK 21+ and set FLASHSEND_REGISTRY_JAVA to its java, or "
            "leave 'registry' out of FLASHSEND_LOCAL_SERVICES (the mock:// registry is used)"
        )
    return usable[-1][1]


def ensure_app(settings: Settings) -> Path:
    """Fetch and unpack the registry once; later calls are a file check. Returns the run jar."""
    home = app_dir(settings)
    jar = home / "app" / "quarkus-run.jar"
    if (home / ".complete").exists() and jar.exists():
        return jar
    mvn = shutil.which("mvn")
    if mvn is None:
        raise PrerequisiteMissing("mvn not found: install Maven (e.g. apt-get install maven)")
    download = home / "download"
    download.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        [
            mvn,
            "-q",
            "-B",
            "-f",
            str(POM),
            "dependency:copy-dependencies",
            f"-DoutputDirectory={download}",
        ],
        capture_output=True,
        text=True,
    )
    archives = sorted(download.glob("apicurio-registry-app-*.tar.gz"))
    if proc.returncode != 0 or not archives:
        detail = (proc.stdout + proc.stderr).strip().splitlines()
        hint = next((line for line in detail if "ERROR" in line), detail[-1] if detail else "")
        raise StackError(
            f"could not fetch Apicurio Registry {registry_version()} from Maven Central: "
            f"{hint.strip() or 'no archive'}"
        )
    target = home / "app"
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    with tarfile.open(archives[-1]) as tar:
        tar.extractall(target, filter="data")
    if not jar.exists():
        raise StackError(f"the registry archive has no quarkus-run.jar: {archives[-1]}")
    archives[-1].unlink()  # 160 MB: the unpacked app is all we need
    (home / ".complete").write_text(registry_version())
    return jar


def datasource(settings: Settings) -> tuple[str, str, str]:
    """(JDBC URL, user, password) of the registry's database on the stack's PostgreSQL."""
    info = conninfo_to_dict(settings.pg_dsn_for(settings.registry_database))
    host = str(info.get("host") or "127.0.0.1")
    port = str(info.get("port") or 5432)
    url = f"jdbc:postgresql://{host}:{port}/{settings.registry_database}"
    return url, str(info.get("user") or "postgres"), str(info.get("password") or "")


def ensure_database(settings: Settings) -> bool:
    """CREATE DATABASE registry_database if missing (Apicurio creates its tables itself)."""
    import psycopg
    from psycopg import sql

    name = settings.registry_database
    with psycopg.connect(settings.pg_dsn_for("postgres"), autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
            return False
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return True


class SchemaRegistry:
    """The local registry as a managed process (same pattern as the SES stand-in)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.process = ManagedProcess("registry", settings.state_dir / "run")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.settings.registry_port}{CCOMPAT_PATH}"

    def running(self) -> bool:
        return self.process.pid() is not None

    def ready(self) -> bool:
        if not port_open(self.settings.registry_port):
            return False
        try:
            with urllib.request.urlopen(f"{self.url}/config", timeout=2) as resp:
                return bool(json.loads(resp.read()).get("compatibilityLevel"))
        except (OSError, urllib.error.URLError, ValueError):
            return False

    def command(self, java: str, jar: Path) -> list[str]:
        s = self.settings
        props = {
            "quarkus.http.host": "127.0.0.1",
            "quarkus.http.port": str(s.registry_port),
            # The management interface (health, metrics) needs a port of its own; any free one.
            "quarkus.management.host": "127.0.0.1",
            "quarkus.management.port": str(free_port()),
            "quarkus.http.access-log.enabled": "false",
            "apicurio.rules.global.compatibility": "BACKWARD",
            "apicurio.storage.kind": "sql",
            "apicurio.storage.sql.kind": "postgresql",
            "apicurio.datasource.url": datasource(s)[0],
            "apicurio.datasource.username": datasource(s)[1],
            # Apicurio's default pool holds 20 connections open; a local registry needs few.
            "apicurio.datasource.jdbc.initial-size": "1",
            "apicurio.datasource.jdbc.min-size": "1",
            "apicurio.datasource.jdbc.max-size": "8",
        }
        heap = s.registry_heap_mb
        return [
            java,
            f"-Xms{min(heap, 128)}m",
            f"-Xmx{heap}m",
            "-XX:+UseSerialGC",  # two cores shared by everything: no parallel GC threads
            "-XX:TieredStopAtLevel=1",  # faster start; the registry is not on the hot path
            *(f"-D{k}={v}" for k, v in props.items()),
            "-jar",
            str(jar),
        ]

    def start(self, *, timeout: float = 120.0) -> float:
        """Start the registry (no-op if running); return seconds until it answered."""
        if self.running():
            return 0.0
        java = find_java(self.settings.registry_java)
        jar = ensure_app(self.settings)
        require_free_port(self.settings.registry_port, "schema registry", "FLASHSEND_REGISTRY_PORT")
        try:
            ensure_database(self.settings)
        except Exception as exc:  # psycopg: one line, the registry cannot start without it
            raise StackError(
                f"the schema registry stores its data in PostgreSQL ({self.settings.pg_dsn}), "
                f"which is not usable: {exc}"
            ) from exc
        # The password goes through the environment, not the command line (`ps` shows that).
        env = {**os.environ, "APICURIO_DATASOURCE_PASSWORD": datasource(self.settings)[2]}
        self.process.start(self.command(java, jar), env=env, cwd=jar.parent)
        try:
            return wait_until(
                self.ready,
                timeout=timeout,
                what="schema registry",
                alive=self.running,
                log=self.process.log_file,
            )
        except StackError:
            self.process.stop()
            raise

    def stop(self) -> bool:
        return self.process.stop(timeout=20)
