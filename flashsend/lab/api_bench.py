"""`flashsend api bench --json`: the Campaign API's figures while a campaign sends at full
speed on the local stack.

- `get_campaign_ms`: GET /api/v1/campaigns/{id}, one request at a time (median, p99, max);
- `sse`: `listeners` event streams of the campaign held for `sse_seconds`: frames each
  received per second and the API process's CPU per listener per second (the API runs as its
  own process, `infra.api_service`, so its CPU is its own; one poller feeds them all);
- `pause_via_api_ms`: POST …/pause returned → the last recipient the SES stand-in accepted for
  the campaign (signed: negative when the last one went before the request returned), and
  from the moment it was sent, as `flashsend bench` measures the command line's pause.

It registers an audience and an admin key of its own (revoked at the end) and cancels its
campaign, whatever happens. Figures, not assertions: a busy machine gives other numbers.
"""

from __future__ import annotations

import contextlib
import statistics
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
import psutil
import psycopg

from flashsend.api.key_admin import create_key
from flashsend.errors import FlashsendError
from flashsend.lab.bench_campaign import audience_of
from flashsend.lab.bench_figures import pause_latency
from flashsend.lab.pause_latency import _settle, _wait_sending, check_clock
from flashsend.lab.run import StartedCampaigns, finish_run
from flashsend.lab.workers import WorkerPool, wait_joined
from flashsend.settings import Settings
from infra.api_service import ApiService
from infra.process import free_port
from infra.ses_standin.admin import SesStandinAdmin
from producers.campaign_ops import DEFAULT_HTML, DEFAULT_SUBJECT, DEFAULT_TEMPLATE, DEFAULT_TEXT
from sinks.api_key_store import ApiKeyStore
from sinks.audit_store import Actor
from sinks.ses import SesSender, make_client


@dataclass(frozen=True)
class ApiBenchOptions:
    users: int = 1_000_000
    workers: int = 2
    gets: int = 500
    listeners: int = 200
    sse_seconds: float = 10.0
    rate: float = 0.0  # the campaign's limit; 0: as fast as the account allows


def percentiles(values: list[float]) -> dict[str, float | int | None]:
    if not values:
        return {"median": None, "p99": None, "max": None, "n": 0}
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return {
        "median": round(statistics.median(ordered), 2),
        "p99": round(p99, 2),
        "max": round(ordered[-1], 2),
        "n": len(ordered),
    }


def _listen(url: str, headers: dict[str, str], seconds: float, frames: list[int]) -> None:
    count = 0
    deadline = time.monotonic() + seconds
    try:
        with (
            httpx.Client(headers=headers, timeout=30) as client,
            client.stream("GET", url) as response,
        ):
            for line in response.iter_lines():
                if line.startswith("data: "):
                    count += 1
                if time.monotonic() > deadline:
                    break
    finally:
        frames.append(count)


def _sse(service: ApiService, url: str, headers: dict[str, str], o: ApiBenchOptions) -> Any:
    pid = service.process.pid()
    process = psutil.Process(pid) if pid else None
    frames: list[int] = []
    threads = [
        threading.Thread(target=_listen, args=(url, headers, o.sse_seconds, frames), daemon=True)
        for _ in range(o.listeners)
    ]
    cpu_before = sum(process.cpu_times()[:2]) if process else 0.0
    began = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(o.sse_seconds + 30)
    elapsed = time.monotonic() - began
    cpu = (sum(process.cpu_times()[:2]) - cpu_before) if process else 0.0
    listeners = max(1, len(frames))
    return {
        "listeners": len(frames),
        "seconds": round(elapsed, 2),
        "frames_per_listener_per_s": round(sum(frames) / listeners / elapsed, 2),
        "api_cpu_s": round(cpu, 3),
        "api_cpu_us_per_listener_per_s": round(cpu / listeners / elapsed * 1e6, 1),
    }


def run_api_bench(
    settings: Settings, o: ApiBenchOptions, log: Callable[[str], None]
) -> dict[str, Any]:
    result: dict[str, Any] = {"users": o.users, "workers": o.workers, "rate": o.rate}
    started = StartedCampaigns(settings)
    suffix = uuid.uuid4().hex[:8]
    actor = Actor(f"cli:api-bench-{suffix}")
    # Its own API process (its CPU is measured), beside the one `flashsend up` runs.
    service = ApiService(
        settings.model_copy(update={"api_port": free_port()}), name=f"api-bench-{suffix}"
    )
    pool = WorkerPool(settings, settings.state_dir / f"logs-api-bench-{suffix}")
    ses = SesStandinAdmin(settings.ses_endpoint_url or "")
    failure: BaseException | None = None
    try:
        audience = f"api-bench-{suffix}"
        condition = audience_of(settings, o.users)
        with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
            ApiKeyStore(conn).add_audience(audience, condition, actor)
        SesSender(make_client(settings, timeout=10)).put_template(
            DEFAULT_TEMPLATE, DEFAULT_SUBJECT, DEFAULT_HTML, DEFAULT_TEXT
        )
        key, _ = create_key(settings, f"api-bench-{suffix}", "admin", None, actor)
        headers = {"Authorization": f"Bearer {key}"}
        service.start()
        pool.start(o.workers)
        wait_joined(settings, o.workers)
        result.update(check_clock(ses))
        with httpx.Client(base_url=service.endpoint, headers=headers, timeout=120) as api:
            made = api.post(
                "/api/v1/campaigns",
                json={"name": "api bench", "audience": audience, "rate": o.rate},
            )
            made.raise_for_status()
            cid = started.add(int(made.json()["id"]))
            log(f"api bench: campaign {cid}, ~{o.users:,} recipients, rate {o.rate or 'max'}")
            api.post(f"/api/v1/campaigns/{cid}/start").raise_for_status()
            if not _wait_sending(ses, cid, timeout=60.0):
                raise RuntimeError(f"campaign {cid} did not start sending within 60 s")
            times = []
            for _ in range(o.gets):
                began = time.perf_counter()
                api.get(f"/api/v1/campaigns/{cid}").raise_for_status()
                times.append((time.perf_counter() - began) * 1000)
            result["get_campaign_ms"] = percentiles(times)
            log(f"api bench: {o.listeners} listeners for {o.sse_seconds:g} s")
            url = f"{service.endpoint}/api/v1/campaigns/{cid}/events"
            result["sse"] = _sse(service, url, headers, o)
            if not _wait_sending(ses, cid, timeout=30.0):
                raise RuntimeError(f"campaign {cid} finished before the pause: give more --users")
            requested = time.time()
            api.post(f"/api/v1/campaigns/{cid}/pause").raise_for_status()
            returned = time.time()
            last, settled = _settle(ses, cid)
            latency = pause_latency(requested, returned, last)
            result["pause_via_api_ms"] = latency["from_return_ms"]
            result["pause_via_api_from_request_ms"] = latency["from_request_ms"]
            result["pause_request_ms"] = round((returned - requested) * 1000, 1)
            result["pause_settled"] = settled
            result["campaign_id"] = cid
    except BaseException as exc:
        failure = exc
    finally:
        pool.stop()
        service.stop()
        with (
            contextlib.suppress(FlashsendError, psycopg.Error),
            psycopg.connect(settings.pg_dsn, autocommit=True) as conn,
        ):
            ApiKeyStore(conn).revoke(f"api-bench-{suffix}", actor)  # none if never made
    return finish_run(result, started, failure, log)
