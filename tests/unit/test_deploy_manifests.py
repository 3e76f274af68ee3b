"""deploy/: every setting, probe path, command and budget the manifests use exists in the code,
and each role's settings pass the checks its process makes at start.

Each check is a function that returns the problems it finds. The tests run every check on
the manifests as shipped (no problem) and on a copy broken on purpose (the problem is
found), so a check that silently stops checking fails here too.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import io
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import yaml
from pydantic import SecretStr

from flashsend import deliverability, health
from flashsend.cli import stack
from flashsend.cli.entry import build_parser
from flashsend.scaling import LAG_METRIC, LagSource, lag_sources
from flashsend.settings import ENV_PREFIX, Settings, load_settings
from producers import unsubscribe_endpoint, webhook
from streams.mail_app import check_mail_settings

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"

Doc = dict[str, Any]
Check = Callable[[list[Doc]], list[str]]

# DSNs are plain strings in Settings but carry passwords.
SECRET_FIELDS = frozenset(
    {name for name, f in Settings.model_fields.items() if f.annotation is SecretStr}
    | {"pg_dsn", "orders_pg_dsn"}
)
# What each named container port serves: (liveness path, readiness path).
PROBE_PATHS = {
    "metrics": (health.LIVENESS_PATH, health.READINESS_PATH),  # flashsend.metrics' server
    "http": (webhook.HEALTH_PATH, webhook.HEALTH_PATH),  # the webhook's own server
    "api": (health.LIVENESS_PATH, health.READINESS_PATH),  # `flashsend api`'s own server
}
ANY_ADDRESS = ("0.0.0.0", "::")
# Every long-running role, as (command, role option) of its parsed command line.
ROLES = {
    ("worker", "campaign"),
    ("worker", "mail"),
    ("worker", "feedback"),
    ("relay", "orders"),
    ("webhook", None),
    ("api", None),
}


def env_name(field: str) -> str:
    """The variable Settings reads a field from: prefix + name (pydantic-settings matches
    names case-insensitively; no field has an alias, test_settings_fields_have_no_alias)."""
    return ENV_PREFIX + field.upper()


SETTING_NAMES = frozenset(env_name(name) for name in Settings.model_fields)


def load_docs() -> list[Doc]:
    docs: list[Doc] = []
    for path in sorted([*DEPLOY.rglob("*.yaml"), *DEPLOY.rglob("*.yml")]):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                doc["__file__"] = str(path.relative_to(ROOT))
                docs.append(doc)
    return docs


def of_kind(docs: list[Doc], kind: str) -> list[Doc]:
    return [d for d in docs if d.get("kind") == kind]


def named(docs: list[Doc], kind: str, name: str) -> Doc:
    found = [d for d in of_kind(docs, kind) if d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


def workloads(docs: list[Doc]) -> list[Doc]:
    return of_kind(docs, "Deployment") + of_kind(docs, "Job")


def containers(doc: Doc) -> list[Doc]:
    """Init containers first: they run first."""
    spec = doc["spec"]["template"]["spec"]
    return [*spec.get("initContainers", []), *spec.get("containers", [])]


def where(doc: Doc, container: Doc | None = None) -> str:
    name = f"{doc['__file__']}: {doc['kind']}/{doc['metadata']['name']}"
    return name if container is None else f"{name} container {container['name']}"


def source_values(docs: list[Doc], kind: str, name: str) -> dict[str, str] | None:
    found = [d for d in of_kind(docs, kind) if d["metadata"]["name"] == name]
    if len(found) != 1:
        return None
    doc = found[0]
    values = {k: str(v) for k, v in (doc.get("data") or {}).items()}
    if kind == "Secret":
        values = {k: base64.b64decode(v).decode() for k, v in values.items()}
        values.update({k: str(v) for k, v in (doc.get("stringData") or {}).items()})
    return values


def container_env(docs: list[Doc], container: Doc) -> tuple[dict[str, str], list[str]]:
    """The container's environment as Kubernetes builds it (envFrom, then env), and what
    cannot be resolved."""
    env: dict[str, str] = {}
    missing: list[str] = []
    for source in container.get("envFrom", []):
        for key, kind in (("configMapRef", "ConfigMap"), ("secretRef", "Secret")):
            if key in source:
                values = source_values(docs, kind, source[key]["name"])
                if values is None:
                    missing.append(f"envFrom {kind}/{source[key]['name']} not found")
                else:
                    env.update(values)
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = str(var["value"])
            continue
        ref = var.get("valueFrom", {})
        for key, kind in (("configMapKeyRef", "ConfigMap"), ("secretKeyRef", "Secret")):
            if key in ref:
                values = source_values(docs, kind, ref[key]["name"]) or {}
                if ref[key]["key"] not in values:
                    missing.append(f"{var['name']}: {kind}/{ref[key]['name']} has no key")
                else:
                    env[var["name"]] = values[ref[key]["key"]]
        if "fieldRef" in ref or "resourceFieldRef" in ref:
            env[var["name"]] = "from-the-pod"
    return env, missing


@contextlib.contextmanager
def environment(env: dict[str, str]) -> Iterator[None]:
    """Settings read from exactly `env`, as in the container."""
    with mock.patch.dict(os.environ, env, clear=True):
        yield


def container_settings(docs: list[Doc], container: Doc) -> Settings:
    env, _ = container_env(docs, container)
    with environment(env):
        return load_settings()


def parse_command(container: Doc) -> tuple[Any, str | None]:
    """The parsed command line, or None and argparse's complaint."""
    argv = [*container.get("command", []), *container.get("args", [])]
    if not argv or argv[0] != "flashsend":
        return None, f"runs {argv[:1]}, not flashsend"
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            args = build_parser().parse_args([str(a) for a in argv[1:]])
    except SystemExit:
        return None, stderr.getvalue().strip().splitlines()[-1]
    return args, None


def role_of(args: Any) -> tuple[str, str | None]:
    return args.command, getattr(args, "role", None) or getattr(args, "outbox", None)


# ---- checks ------------------------------------------------------------------------------


def settings_problems(docs: list[Doc]) -> list[str]:
    """Every FLASHSEND_* name is a Settings field, secrets sit in a Secret, and every
    container's environment loads into Settings with its metrics port open to the kubelet."""
    problems: list[str] = []
    for doc in of_kind(docs, "ConfigMap") + of_kind(docs, "Secret"):
        keys = {**(doc.get("data") or {}), **(doc.get("stringData") or {})}
        for key in keys:
            if key.startswith(ENV_PREFIX) and key not in SETTING_NAMES:
                problems.append(f"{where(doc)}: {key} is not a setting")
            if doc["kind"] == "ConfigMap" and key in {env_name(f) for f in SECRET_FIELDS}:
                problems.append(f"{where(doc)}: {key} is a secret, keep it in a Secret")
    for doc in workloads(docs):
        for container in containers(doc):
            _, missing = container_env(docs, container)
            problems += [f"{where(doc, container)}: {m}" for m in missing]
            for var in container.get("env", []):
                if var["name"].startswith(ENV_PREFIX) and var["name"] not in SETTING_NAMES:
                    problems.append(f"{where(doc, container)}: {var['name']} is not a setting")
            try:
                settings = container_settings(docs, container)
            except Exception as exc:  # a value the container would refuse at start
                problems.append(f"{where(doc, container)}: settings do not load: {exc}")
                continue
            if doc["kind"] != "Deployment":
                continue
            ports = {p.get("name"): p["containerPort"] for p in container.get("ports", [])}
            scrape = doc["spec"]["template"]["metadata"].get("annotations", {})
            if "api" in ports:  # `flashsend api` serves /metrics on its own port
                if scrape.get("prometheus.io/port") != str(ports["api"]):
                    problems.append(f"{where(doc)}: prometheus.io/port is not the API's port")
                continue
            if settings.metrics_host != "0.0.0.0":
                problems.append(
                    f"{where(doc, container)}: FLASHSEND_METRICS_HOST is "
                    f"{settings.metrics_host}: the kubelet cannot reach the probes"
                )
            if ports.get("metrics") != settings.metrics_port:
                problems.append(
                    f"{where(doc, container)}: FLASHSEND_METRICS_PORT {settings.metrics_port} "
                    f"is not its 'metrics' containerPort {ports.get('metrics')}"
                )
            if scrape.get("prometheus.io/port") != str(settings.metrics_port):
                problems.append(f"{where(doc)}: prometheus.io/port is not the metrics port")
    return problems


def startup_problems(docs: list[Doc]) -> list[str]:
    """Each role's settings pass the checks its process makes before it starts, and the mail
    workers together stay within the transactional reserve (each checks only its own rate)."""
    problems: list[str] = []
    mail_rate = 0.0
    reserve = None
    for doc in of_kind(docs, "Deployment"):
        for container in containers(doc):
            args, _ = parse_command(container)
            if args is None:
                continue
            settings = container_settings(docs, container)
            command, role = role_of(args)
            try:
                deliverability.check_separation(settings)
                if (command, role) == ("worker", "mail"):
                    check_mail_settings(settings)
                    mail_rate += doc["spec"].get("replicas", 1) * settings.mail_rate
                    reserve = settings.transactional_reserve
                if (command, role) == ("worker", "feedback"):
                    deliverability.thresholds(settings)
            except Exception as exc:  # what the process would refuse at its start
                problems.append(f"{where(doc, container)}: refused at start: {exc}")
    if reserve is not None and mail_rate > reserve:
        problems.append(
            f"mail workers send up to {mail_rate:g}/s together, above the transactional "
            f"reserve {reserve:g}/s that campaigns leave free"
        )
    return problems


def probe_problems(docs: list[Doc]) -> list[str]:
    """Every probe asks a path the code serves on the port it names, the webhook listens on
    every address, each Service reaches a named port of its pods, and the Ingress routes only
    paths the webhook serves, over TLS."""
    problems: list[str] = []
    for doc in of_kind(docs, "Deployment"):
        for container in containers(doc):
            ports = {p.get("name"): p["containerPort"] for p in container.get("ports", [])}
            # A startup probe, where there is one, asks what the liveness probe asks.
            for index, probe in ((0, "livenessProbe"), (1, "readinessProbe"), (0, "startupProbe")):
                get = container.get(probe, {}).get("httpGet")
                if get is None:
                    if probe != "startupProbe":
                        problems.append(f"{where(doc, container)}: no {probe} httpGet")
                    continue
                port = get.get("port")
                if port not in ports or port not in PROBE_PATHS:
                    problems.append(f"{where(doc, container)}: {probe} port {port!r} unknown")
                    continue
                if get.get("path") != PROBE_PATHS[port][index]:
                    problems.append(
                        f"{where(doc, container)}: {probe} asks {get.get('path')} on {port}, "
                        f"which serves {PROBE_PATHS[port][index]} for that"
                    )
                if port == "api":  # `flashsend api --port` serves its own probes
                    args, _ = parse_command(container)
                    if args is None or args.command != "api" or args.port != ports["api"]:
                        problems.append(
                            f"{where(doc, container)}: {probe} asks the API's port, but "
                            "the container does not run `flashsend api --port` on it"
                        )
                    elif args.host not in ANY_ADDRESS:
                        problems.append(
                            f"{where(doc, container)}: the API listens on {args.host}, out "
                            "of the kubelet's and Service's reach"
                        )
                if port == "http":  # only the webhook serves /health, on its --port
                    args, _ = parse_command(container)
                    if args is None or args.command != "webhook" or args.port != ports["http"]:
                        problems.append(
                            f"{where(doc, container)}: {probe} asks the webhook's port, but "
                            "the container does not run `flashsend webhook --port` on it"
                        )
                    elif args.host not in ANY_ADDRESS:
                        problems.append(
                            f"{where(doc, container)}: the webhook listens on "
                            f"{args.host}, out of the kubelet's and Service's reach"
                        )
    for service in of_kind(docs, "Service"):
        chosen = [
            d
            for d in of_kind(docs, "Deployment")
            if service["spec"]["selector"].items()
            <= d["spec"]["template"]["metadata"].get("labels", {}).items()
        ]
        named_ports = {p.get("name") for d in chosen for c in containers(d) for p in c["ports"]}
        for port in service["spec"]["ports"]:
            if not chosen or port["targetPort"] not in named_ports:
                problems.append(
                    f"{where(service)}: no pod it selects has port {port['targetPort']}"
                )
    for ingress in of_kind(docs, "Ingress"):
        for rule in ingress["spec"].get("rules", []):
            for path in rule.get("http", {}).get("paths", []):
                served = (
                    path["path"] == deliverability.SNS_PATH
                    if path.get("pathType") == "Exact"
                    else path["path"].rstrip("/") + "/" == unsubscribe_endpoint.PATH_PREFIX
                )
                if not served:
                    problems.append(f"{where(ingress)}: the webhook serves no {path['path']}")
                service = path["backend"]["service"]["name"]
                if service not in {s["metadata"]["name"] for s in of_kind(docs, "Service")}:
                    problems.append(f"{where(ingress)}: no Service {service}")
        if not ingress["spec"].get("tls"):
            problems.append(f"{where(ingress)}: no TLS (SNS posts over https only)")
    return problems


def command_problems(docs: list[Doc]) -> list[str]:
    """Every container runs a real `flashsend` subcommand with real flags, and every
    long-running role has its Deployment."""
    problems: list[str] = []
    roles: set[tuple[str, str | None]] = set()
    for doc in workloads(docs):
        for container in containers(doc):
            args, error = parse_command(container)
            if args is None:
                problems.append(f"{where(doc, container)}: {error}")
            elif doc["kind"] == "Deployment":
                roles.add(role_of(args))
    problems += [f"no Deployment runs {role}" for role in sorted(ROLES - roles, key=str)]
    return problems


def deployment_problems(docs: list[Doc]) -> list[str]:
    """Every Deployment has both probes, requests and limits, and exactly one
    PodDisruptionBudget that selects its pods and no other Deployment's; a worker's grace
    covers its shutdown; a read-only root keeps the state dir on a volume."""
    problems: list[str] = []
    deployments = of_kind(docs, "Deployment")
    budgets = of_kind(docs, "PodDisruptionBudget")

    def selects(budget: Doc, deployment: Doc) -> bool:
        labels = deployment["spec"]["template"]["metadata"].get("labels", {})
        wanted = budget["spec"].get("selector", {}).get("matchLabels", {})
        return bool(wanted) and wanted.items() <= labels.items()

    for doc in deployments:
        spec = doc["spec"]["template"]["spec"]
        labels = doc["spec"]["template"]["metadata"].get("labels", {})
        if not doc["spec"]["selector"]["matchLabels"].items() <= labels.items():
            problems.append(f"{where(doc)}: its selector does not match its pods")
        for container in containers(doc):
            for probe in ("livenessProbe", "readinessProbe"):
                if probe not in container:
                    problems.append(f"{where(doc, container)}: no {probe}")
            resources = container.get("resources", {})
            for kind in ("requests", "limits"):
                if not {"cpu", "memory"} <= set(resources.get(kind, {})):
                    problems.append(f"{where(doc, container)}: no cpu and memory {kind}")
            args, _ = parse_command(container)
            if args is None or args.command != "worker":
                continue
            settings = container_settings(docs, container)
            grace = spec.get("terminationGracePeriodSeconds", 30)
            if grace <= settings.worker_shutdown_grace_s:
                problems.append(
                    f"{where(doc)}: terminationGracePeriodSeconds {grace} does not exceed the "
                    f"worker's shutdown grace {settings.worker_shutdown_grace_s:g} s"
                )
            if container.get("securityContext", {}).get("readOnlyRootFilesystem"):
                mounts = [Path(m["mountPath"]) for m in container.get("volumeMounts", [])]
                if not any(settings.state_dir.is_relative_to(m) for m in mounts):
                    problems.append(
                        f"{where(doc, container)}: read-only root, and the state dir "
                        f"{settings.state_dir} (Faust's work dir) is on no volume"
                    )
        mine = [b for b in budgets if selects(b, doc)]
        if len(mine) != 1:
            problems.append(f"{where(doc)}: {len(mine)} PodDisruptionBudgets select it")
    for budget in budgets:
        chosen = [d for d in deployments if selects(budget, d)]
        if len(chosen) != 1:
            problems.append(f"{where(budget)}: selects {len(chosen)} Deployments")
    return problems


def migration_problems(docs: list[Doc]) -> list[str]:
    """A Job applies the migrations (`flashsend migrate`) before anything else it runs."""
    for job in of_kind(docs, "Job"):
        first = containers(job)[:1]
        if first:
            args, _ = parse_command(first[0])
            if args is not None and args.func is stack.cmd_migrate:
                return []
    return ["no Job runs `flashsend migrate` first"]


WORKER_ROLES = ("campaign", "mail", "feedback")
_LABEL = re.compile(r'(\w+)="([^"]*)"')


def worker_role(docs: list[Doc], name: str) -> tuple[str, Settings] | None:
    """The role `flashsend worker --role` of Deployment `name`, and its container's settings."""
    found = [d for d in of_kind(docs, "Deployment") if d["metadata"]["name"] == name]
    if len(found) != 1:
        return None
    container = containers(found[0])[0]
    args, _ = parse_command(container)
    if args is None or args.command != "worker":
        return None
    return args.role, container_settings(docs, container)


def expected_max(role: str, settings: Settings, source: LagSource) -> int:
    """The partitions of the role's topic; for mail workers no more than the transactional
    reserve holds (each sends up to FLASHSEND_MAIL_RATE)."""
    if role == "mail" and settings.mail_rate > 0:
        return min(source.partitions, int(settings.transactional_reserve // settings.mail_rate))
    return source.partitions


def lag_query_problems(where_: str, labels: dict[str, str], source: LagSource) -> list[str]:
    problems: list[str] = []
    if labels.get("group") != source.store_group:
        problems.append(f"{where_}: group {labels.get('group')!r} is not {source.store_group!r}")
    if labels.get("topic") != source.topic:
        problems.append(f"{where_}: topic {labels.get('topic')!r} is not {source.topic!r}")
    return problems


def scaling_problems(docs: list[Doc]) -> list[str]:
    """Each worker role has one KEDA ScaledObject, min 1 and max its topic's partitions
    (mail: within the transactional reserve), on its consumer group's lag where that lag
    is: the broker's for a group that commits there (kafka scaler: the group, topic and
    brokers the code uses), else the workers' own flashsend_consumer_lag (prometheus
    scaler). The HorizontalPodAutoscaler example reads that metric with the same labels."""
    problems: list[str] = []
    scaled: dict[str, int] = {}
    for doc in of_kind(docs, "ScaledObject") + of_kind(docs, "HorizontalPodAutoscaler"):
        spec = doc["spec"]
        target = spec["scaleTargetRef"]["name"]
        found = worker_role(docs, target)
        if found is None:
            problems.append(f"{where(doc)}: {target} is no worker Deployment")
            continue
        role, settings = found
        source = lag_sources(settings)[role]
        keda = doc["kind"] == "ScaledObject"
        if keda:
            scaled[role] = scaled.get(role, 0) + 1
        low = spec.get("minReplicaCount" if keda else "minReplicas")
        high = spec.get("maxReplicaCount" if keda else "maxReplicas")
        if low != 1:
            problems.append(f"{where(doc)}: min replicas {low}, not 1")
        if high != expected_max(role, settings, source):
            problems.append(
                f"{where(doc)}: max replicas {high}, not "
                f"{expected_max(role, settings, source)} (partitions of {source.topic})"
            )
        for trigger in spec.get("triggers", []) if keda else []:
            meta = trigger.get("metadata", {})
            if trigger["type"] == "kafka":
                if not source.commits_to_broker:
                    problems.append(
                        f"{where(doc)}: group {source.kafka_group} commits nothing to the "
                        "broker: its broker lag never falls"
                    )
                for key, want in (
                    ("consumerGroup", source.kafka_group),
                    ("topic", source.topic),
                    ("bootstrapServers", settings.kafka_bootstrap),
                ):
                    if meta.get(key) != want:
                        problems.append(f"{where(doc)}: {key} {meta.get(key)!r}, not {want!r}")
            elif trigger["type"] == "prometheus":
                query_text = str(meta.get("query", ""))
                if LAG_METRIC + "{" not in query_text:
                    problems.append(f"{where(doc)}: the query reads no {LAG_METRIC}")
                labels = dict(_LABEL.findall(query_text.split(LAG_METRIC, 1)[-1]))
                problems += lag_query_problems(where(doc), labels, source)
            else:
                problems.append(f"{where(doc)}: trigger {trigger['type']} reads no lag")
        for metric in [] if keda else spec.get("metrics", []):
            external = metric.get("external", {}).get("metric", {})
            if external.get("name") != LAG_METRIC:
                problems.append(f"{where(doc)}: metric {external.get('name')!r} is not exported")
            labels = external.get("selector", {}).get("matchLabels", {})
            problems += lag_query_problems(where(doc), labels, source)
    for role in WORKER_ROLES:
        if scaled.get(role) != 1:
            problems.append(f"worker role {role}: {scaled.get(role, 0)} ScaledObjects")
    return problems


CHECKS: dict[str, Check] = {
    "settings": settings_problems,
    "startup": startup_problems,
    "probes": probe_problems,
    "commands": command_problems,
    "deployments": deployment_problems,
    "migrations": migration_problems,
    "scaling": scaling_problems,
}


@pytest.fixture(scope="module")
def docs() -> list[Doc]:
    return load_docs()


def test_the_manifests_are_there(docs: list[Doc]) -> None:
    assert len(of_kind(docs, "Deployment")) >= len(ROLES)
    assert of_kind(docs, "ConfigMap") and of_kind(docs, "Secret") and of_kind(docs, "Job")


def test_settings_fields_have_no_alias() -> None:
    # env_name() derives variable names as pydantic-settings does only without aliases.
    aliased = [n for n, f in Settings.model_fields.items() if f.alias or f.validation_alias]
    assert aliased == []
    assert Settings.model_config.get("env_prefix") == ENV_PREFIX


@pytest.mark.parametrize("check", CHECKS)
def test_the_manifests_pass(docs: list[Doc], check: str) -> None:
    assert CHECKS[check](docs) == []


# ---- each check finds a broken copy ------------------------------------------------------


def campaign(docs: list[Doc]) -> Doc:
    return containers(named(docs, "Deployment", "campaign-worker"))[0]


def config(docs: list[Doc]) -> dict[str, str]:
    data: dict[str, str] = named(docs, "ConfigMap", "flashsend-config")["data"]
    return data


def secret(docs: list[Doc]) -> dict[str, str]:
    data: dict[str, str] = named(docs, "Secret", "flashsend-secrets")["stringData"]
    return data


def pod(docs: list[Doc], kind: str, name: str) -> Doc:
    spec: Doc = named(docs, kind, name)["spec"]["template"]["spec"]
    return spec


def http_get(docs: list[Doc], probe: str) -> Doc:
    get: Doc = campaign(docs)[probe]["httpGet"]
    return get


def ingress_paths(docs: list[Doc]) -> list[Doc]:
    paths: list[Doc] = named(docs, "Ingress", "webhook")["spec"]["rules"][0]["http"]["paths"]
    return paths


def set_command(docs: list[Doc], *argv: str) -> None:
    campaign(docs)["command"] = list(argv)


def move_secret_to_config(docs: list[Doc]) -> None:
    config(docs)["FLASHSEND_UNSUBSCRIBE_KEYS"] = secret(docs).pop("FLASHSEND_UNSUBSCRIBE_KEYS")


def drop_budget(docs: list[Doc]) -> None:
    docs.remove(named(docs, "PodDisruptionBudget", "campaign-worker"))


def budget_for_all(docs: list[Doc]) -> None:
    selector = named(docs, "PodDisruptionBudget", "campaign-worker")["spec"]["selector"]
    del selector["matchLabels"]["app.kubernetes.io/component"]


def migrate_second(docs: list[Doc]) -> None:
    spec = pod(docs, "Job", "flashsend-migrate")
    spec["containers"] = [*spec.pop("initContainers"), *spec["containers"]][::-1]


def unmount_state(docs: list[Doc]) -> None:
    container = campaign(docs)
    container["volumeMounts"] = [m for m in container["volumeMounts"] if m["name"] != "state"]


PARTITION_TYPO = {"name": "FLASHSEND_PARTITION", "value": "3"}
METRICS_ON_LOOPBACK = {"FLASHSEND_METRICS_HOST": "127.0.0.1"}
ONE_CONFIGURATION_SET = {"FLASHSEND_TRANSACTIONAL_CONFIGURATION_SET": "marketing"}
BAD_THRESHOLD = {"FLASHSEND_FEEDBACK_COMPLAINT_THRESHOLD": "1.5"}


def scaled(docs: list[Doc], name: str) -> Doc:
    spec: Doc = named(docs, "ScaledObject", name)["spec"]
    return spec


def trigger(docs: list[Doc], name: str) -> Doc:
    meta: Doc = scaled(docs, name)["triggers"][0]["metadata"]
    return meta


def kafka_for_feedback(docs: list[Doc]) -> None:
    scaled(docs, "feedback-worker")["triggers"] = copy.deepcopy(
        scaled(docs, "mail-worker")["triggers"]
    )
    trigger(docs, "feedback-worker").update(consumerGroup="flashsend-feedback", topic="mail.events")


def hpa_metric(docs: list[Doc]) -> Doc:
    metric: Doc = named(docs, "HorizontalPodAutoscaler", "feedback-worker")["spec"]["metrics"][0]
    return metric["external"]["metric"]  # type: ignore[no-any-return]


MUTATIONS: list[tuple[str, str, Callable[[list[Doc]], None]]] = [
    ("settings", "unknown name", lambda d: config(d).update({"FLASHSEND_NO_SUCH": "1"})),
    ("settings", "unknown name in env", lambda d: campaign(d)["env"].append(PARTITION_TYPO)),
    ("settings", "bad value", lambda d: config(d).update({"FLASHSEND_PARTITIONS": "many"})),
    ("settings", "secret in ConfigMap", move_secret_to_config),
    ("settings", "loopback metrics", lambda d: config(d).update(METRICS_ON_LOOPBACK)),
    ("settings", "metrics port", lambda d: config(d).update({"FLASHSEND_METRICS_PORT": "9"})),
    ("settings", "missing Secret", lambda d: d.remove(named(d, "Secret", "flashsend-secrets"))),
    ("startup", "mail over reserve", lambda d: config(d).update({"FLASHSEND_MAIL_RATE": "40"})),
    ("startup", "one config set", lambda d: config(d).update(ONE_CONFIGURATION_SET)),
    ("startup", "bad threshold", lambda d: config(d).update(BAD_THRESHOLD)),
    ("probes", "liveness path", lambda d: http_get(d, "livenessProbe").update(path="/health")),
    ("probes", "readiness path", lambda d: http_get(d, "readinessProbe").update(path="/healthz")),
    ("probes", "startup path", lambda d: http_get(d, "startupProbe").update(path="/readyz")),
    ("probes", "unnamed port", lambda d: http_get(d, "livenessProbe").update(port="web")),
    (
        "probes",
        "webhook port",
        lambda d: pod(d, "Deployment", "webhook")["containers"][0].update(
            command=["flashsend", "webhook", "--port", "8081"]
        ),
    ),
    ("probes", "ingress path", lambda d: ingress_paths(d)[1].update(path="/unsubscribe")),
    (
        "probes",
        "webhook on loopback",
        lambda d: pod(d, "Deployment", "webhook")["containers"][0]["command"].__setitem__(
            3, "127.0.0.1"
        ),
    ),
    (
        "probes",
        "service port",
        lambda d: named(d, "Service", "webhook")["spec"]["ports"][0].update(targetPort="web"),
    ),
    ("probes", "no tls", lambda d: named(d, "Ingress", "webhook")["spec"].pop("tls")),
    (
        "probes",
        "api on loopback",
        lambda d: pod(d, "Deployment", "api")["containers"][0]["command"].__setitem__(
            3, "127.0.0.1"
        ),
    ),
    (
        "probes",
        "api port",
        lambda d: pod(d, "Deployment", "api")["containers"][0]["command"].__setitem__(5, "9"),
    ),
    (
        "settings",
        "api scrape port",
        lambda d: named(d, "Deployment", "api")["spec"]["template"]["metadata"][
            "annotations"
        ].update({"prometheus.io/port": "9102"}),
    ),
    ("commands", "bad role", lambda d: set_command(d, "flashsend", "worker", "--role", "sender")),
    ("commands", "bad flag", lambda d: set_command(d, "flashsend", "worker", "--threads", "4")),
    ("commands", "bad subcommand", lambda d: set_command(d, "flashsend", "workers")),
    ("commands", "not flashsend", lambda d: set_command(d, "python", "-m", "flashsend")),
    ("commands", "role missing", lambda d: set_command(d, "flashsend", "worker", "--role", "mail")),
    ("deployments", "no readiness", lambda d: campaign(d).pop("readinessProbe")),
    ("deployments", "no limits", lambda d: campaign(d)["resources"].pop("limits")),
    ("deployments", "no requests", lambda d: campaign(d)["resources"]["requests"].clear()),
    ("deployments", "no budget", drop_budget),
    ("deployments", "budget over every role", budget_for_all),
    (
        "deployments",
        "short grace",
        lambda d: pod(d, "Deployment", "campaign-worker").update(terminationGracePeriodSeconds=20),
    ),
    ("deployments", "state dir on read-only root", unmount_state),
    (
        "migrations",
        "no migrate",
        lambda d: pod(d, "Job", "flashsend-migrate").pop("initContainers"),
    ),
    ("migrations", "migrate after another step", migrate_second),
    ("scaling", "wrong group", lambda d: trigger(d, "campaign-worker").update(consumerGroup="x")),
    (
        "scaling",
        "store group at broker",
        lambda d: trigger(d, "campaign-worker").update(consumerGroup="flashsend-sender"),
    ),
    ("scaling", "wrong topic", lambda d: trigger(d, "mail-worker").update(topic="mail.events")),
    (
        "scaling",
        "wrong brokers",
        lambda d: trigger(d, "mail-worker").update(bootstrapServers="kafka:9092"),
    ),
    ("scaling", "kafka lag of feedback", kafka_for_feedback),
    (
        "scaling",
        "metric typo",
        lambda d: trigger(d, "feedback-worker").update(
            query='sum(flashsend_consumer_lags{group="flashsend-feedback", topic="mail.events"})'
        ),
    ),
    (
        "scaling",
        "label typo",
        lambda d: trigger(d, "feedback-worker").update(
            query='sum(flashsend_consumer_lag{group="flashsend", topic="mail.events"})'
        ),
    ),
    (
        "scaling",
        "max over partitions",
        lambda d: scaled(d, "campaign-worker").update(maxReplicaCount=48),
    ),
    ("scaling", "mail over reserve", lambda d: scaled(d, "mail-worker").update(maxReplicaCount=3)),
    ("scaling", "min zero", lambda d: scaled(d, "feedback-worker").update(minReplicaCount=0)),
    ("scaling", "role unscaled", lambda d: d.remove(named(d, "ScaledObject", "mail-worker"))),
    ("scaling", "hpa metric", lambda d: hpa_metric(d).update(name="flashsend_lag")),
    (
        "scaling",
        "hpa labels",
        lambda d: hpa_metric(d)["selector"]["matchLabels"].update(topic="order.events"),
    ),
    (
        "scaling",
        "not a worker",
        lambda d: scaled(d, "feedback-worker")["scaleTargetRef"].update(name="webhook"),
    ),
]


@pytest.mark.parametrize(
    ("check", "mutate"),
    [(check, mutate) for check, _, mutate in MUTATIONS],
    ids=[f"{check}-{what}" for check, what, _ in MUTATIONS],
)
def test_each_check_finds_a_broken_copy(
    docs: list[Doc], check: str, mutate: Callable[[list[Doc]], None]
) -> None:
    broken = copy.deepcopy(docs)
    mutate(broken)
    assert CHECKS[check](broken) != []
