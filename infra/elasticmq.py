"""A real SQS-compatible server for the local stack: ElasticMQ, assembled from Maven Central.

`infra/elasticmq/pom.xml` pins the version; `mvn dependency:copy-dependencies` puts the jars in
the cache dir once, then the server runs as `java -cp libs/* org.elasticmq.server.Main` with a
generated config: loopback only, the stack's Region in its ARNs, and queues and messages kept
in the state dir (its H2 storage), so queued SES events survive `flashsend down` / `up` as
they would in SQS (`FLASHSEND_SQS_PERSIST=false`: in memory, about half the server's CPU per
message). It speaks the SQS JSON protocol of current boto3. It keeps no queue
`Policy` and no `MessageRetentionPeriod` (accepted, then dropped): docs/deliverability.md
says what that means for `flashsend aws apply` against it.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from flashsend.settings import Settings
from infra.errors import StackError
from infra.kafka import require_java
from infra.maven import copy_dependencies
from infra.process import ManagedProcess, port_open, require_free_port, wait_until

POM = Path(__file__).parent / "elasticmq" / "pom.xml"
ACCOUNT_ID = "000000000000"

LOGBACK = """\
<configuration>
  <appender name="STDOUT" class="ch.qos.logback.core.ConsoleAppender">
    <encoder><pattern>%d{HH:mm:ss.SSS} %-5level %logger{36} - %msg%n</pattern></encoder>
  </appender>
  <logger name="org.elasticmq" level="INFO"/>
  <root level="WARN"><appender-ref ref="STDOUT"/></root>
</configuration>
"""


def elasticmq_version() -> str:
    match = re.search(r"<elasticmq.version>([^<]+)</elasticmq.version>", POM.read_text())
    assert match, "infra/elasticmq/pom.xml must define elasticmq.version"
    return match.group(1)


def libs_dir(settings: Settings) -> Path:
    digest = hashlib.sha256(POM.read_bytes()).hexdigest()[:12]
    return settings.cache_dir / f"elasticmq-{elasticmq_version()}-{digest}" / "libs"


def ensure_jars(settings: Settings) -> Path:
    return copy_dependencies(POM, libs_dir(settings), "ElasticMQ")


def server_config(settings: Settings, home: Path) -> str:
    """HOCON for ElasticMQ (pure): loopback, our Region and account, storage under `home`."""
    port = settings.sqs_port
    persist = "true" if settings.sqs_persist else "false"
    return f"""\
include classpath("application.conf")
node-address {{ protocol = http, host = "127.0.0.1", port = {port}, context-path = "" }}
rest-sqs {{ enabled = true, bind-port = {port}, bind-hostname = "127.0.0.1", sqs-limits = strict }}
rest-stats {{ enabled = false }}
generate-node-address = false
aws {{ region = "{settings.ses_region}", accountId = "{ACCOUNT_ID}" }}
messages-storage {{ enabled = {persist}, uri = "jdbc:h2:{home / "messages"}" }}
"""


class ElasticMq:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.home = settings.state_dir / "sqs"
        self.process = ManagedProcess("sqs", settings.state_dir / "run")

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.settings.sqs_port}"

    def running(self) -> bool:
        return self.process.pid() is not None

    def ready(self) -> bool:
        if not port_open(self.settings.sqs_port):
            return False
        from producers.sqs_client import boto3_sqs

        try:
            boto3_sqs(self.settings, endpoint=self.endpoint, timeout=2.0).list_queues()
        except Exception:  # any failure means "not ready yet"
            return False
        return True

    def start(self, *, timeout: float = 90.0) -> float:
        """Start the server (no-op if running); return seconds until it answered."""
        if self.running():
            return 0.0
        java = require_java()
        libs = ensure_jars(self.settings)
        require_free_port(self.settings.sqs_port, "ElasticMQ (SQS)", "FLASHSEND_SQS_PORT")
        self.home.mkdir(parents=True, exist_ok=True)
        config = self.home / "elasticmq.conf"
        config.write_text(server_config(self.settings, self.home))
        (self.home / "logback.xml").write_text(LOGBACK)
        heap = self.settings.sqs_heap_mb
        self.process.start(
            [
                java,
                f"-Xmx{heap}m",
                "-XX:+UseSerialGC",
                "-Djava.awt.headless=true",
                f"-Dconfig.file={config}",
                f"-Dlogback.configurationFile={self.home / 'logback.xml'}",
                "-cp",
                f"{libs}/*",
                "org.elasticmq.server.Main",
            ]
        )
        try:
            return wait_until(
                self.ready,
                timeout=timeout,
                what="ElasticMQ (SQS)",
                alive=self.running,
                log=self.process.log_file,
            )
        except StackError:
            self.process.stop()
            raise

    def stop(self) -> bool:
        return self.process.stop(timeout=20)
