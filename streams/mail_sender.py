"""The transactional sender: claim due rows with a lease and a fencing token, call SES
SendEmail outside any transaction, record the outcome only where the token still matches.

Loop: wake on a doorbell (in-process after ingest, NOTIFY mail_due from any process) or every
`poll_s` (the sweeper: lost doorbells, delayed mail coming due, expired leases). Claim at most
as many rows as there are free call slots, so a claimed row waits for a slot, never for the
lease. Each call is paced by a GCRA limiter at `rate` (the transactional share of the SES
account's MaxSendRate, kept free by the campaign preflight), and runs in a thread (boto3 is
blocking) with SDK retries off. The claim also ends rows whose address is suppressed (bounce,
complaint, manual: sinks/sql/mail.sql claim_due_mail) without any call; they only show up here
as `suppressed` in the stats and the log. A claimed row whose address fails
`streams.rules.addresses.is_valid_email` ends `failed` ('invalid_address:<why>') without a call.

The duplicate window is one provider call: between SES accepting a mail and our
`mark_mail_sent` committing. A worker killed inside it leaves the row `sending`; at-least-once
templates are re-claimed when the lease ends (the mail may go twice), at-most-once ones become
`unknown` (it may never go). The lease must outlast the slowest call (`check_lease`), or a slow
— not dead — worker opens the same window: fencing keeps the row's state right, but cannot
recall a mail.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import psycopg

from flashsend import metrics
from sinks.mail_store import ClaimedMail, MailStore, StoreUnavailable, Transition
from sinks.ses import SesCallFailed, SesSender
from streams.rules.addresses import is_valid_email
from streams.rules.backoff import RetryPolicy, backoff_delay
from streams.rules.mail_logic import Decision, Delivery, Next, decide_after_call
from streams.rules.throttle import Gcra

log = logging.getLogger("flashsend.mail.sender")


@dataclass(frozen=True)
class MailSenderConfig:
    from_address: str
    configuration_set: str | None
    rate: float = 40.0
    burst: int = 10
    concurrency: int = 8
    lease_s: float = 30.0
    poll_s: float = 1.0
    retry: RetryPolicy = field(default_factory=lambda: RetryPolicy(5, base=1.0, cap=60.0))


@dataclass
class SenderStats:
    claimed: int = 0
    sent: int = 0
    retried: int = 0
    failed: int = 0
    unknown: int = 0
    cancelled: int = 0
    suppressed: int = 0  # ended at the claim: the address is on the suppression list
    invalid_address: int = 0  # ended before the call: streams.rules.addresses.is_valid_email
    fenced: int = 0
    expired: int = 0
    max_send_s: float = 0.0
    send_times: list[float] = field(default_factory=list)


class MailSender:
    def __init__(
        self,
        *,
        config: MailSenderConfig,
        store: MailStore,
        ses: SesSender,
        listen_dsn: str | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.config = config
        self.store = store
        self.ses = ses
        self.listen_dsn = listen_dsn
        self.rng = rng or random.Random()
        self.stats = SenderStats()
        self._limiter = Gcra(config.rate, burst=max(1, config.burst))
        self._executor = ThreadPoolExecutor(
            max_workers=config.concurrency, thread_name_prefix="ses-mail"
        )
        self._wake = asyncio.Event()
        self._inflight: set[asyncio.Task[None]] = set()
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False

    def wake(self) -> None:
        self._wake.set()

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self.run(), name="mail-sender"),
            asyncio.create_task(self._sweep_loop(), name="mail-sweeper"),
        ]
        if self.listen_dsn:
            self._tasks.append(asyncio.create_task(self._listen_loop(), name="mail-listen"))

    async def stop(self, grace_s: float = 10.0) -> None:
        """Stop claiming; let a claim in progress, then the calls in flight, finish and record
        their outcome. A claim cancelled at its COMMIT may still have committed: its mails
        would stay `sending` until the lease turns them unknown or sends them again."""
        self._stopping = True
        self._wake.set()
        deadline = time.monotonic() + grace_s
        claim_loop = self._tasks[:1]
        if claim_loop:
            await asyncio.wait(claim_loop, timeout=grace_s)
        if self._inflight:
            await asyncio.wait(set(self._inflight), timeout=max(0.0, deadline - time.monotonic()))
        for task in [*self._tasks, *self._inflight]:
            task.cancel()
        await asyncio.gather(*self._tasks, *self._inflight, return_exceptions=True)
        self._executor.shutdown(wait=False, cancel_futures=True)

    # ---- the claim loop -------------------------------------------------------------------

    async def run(self) -> None:
        """The claim loop; never dies quietly (a stopped sender would strand every mail)."""
        while not self._stopping:
            try:
                await self._claim_round()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("mail sender loop error; continuing")
                await asyncio.sleep(self.config.poll_s)

    async def _claim_round(self) -> None:
        if not self._stopping:
            free = self.config.concurrency - len(self._inflight)
            claimed: list[ClaimedMail] = []
            if free > 0:
                self._wake.clear()
                batch = await self._retry(self.store.claim_batch, free, self.config.lease_s)
                claimed = batch.mails
                self.stats.claimed += len(claimed)
                if batch.suppressed:
                    self._suppressed(batch.suppressed)
                for mail in claimed:
                    task = asyncio.create_task(self._send(mail), name=f"mail-{mail.id}")
                    self._inflight.add(task)
                    task.add_done_callback(self._call_done)
            if claimed and len(claimed) == free:
                await self._wait(self.config.poll_s)  # a slot frees -> wake
            elif not claimed:
                await self._wait(await self._idle_wait())

    def _suppressed(self, ended: list[tuple[Transition, str]]) -> None:
        """Rows the claim ended because their address is suppressed: no call was made. They
        took places in the claim's limit, so look again at once for more due rows."""
        self.stats.suppressed += len(ended)
        metrics.count_mail("suppressed", len(ended))
        for row, reason in ended:
            log.info(
                "mail dedupe_key=%s attempts=%s outcome=suppressed:%s status=%s (no call made)",
                row.dedupe_key,
                row.attempts,
                reason,
                row.status,
            )
        self._wake.set()

    def _call_done(self, task: asyncio.Task[None]) -> None:
        self._inflight.discard(task)
        self._wake.set()
        if not task.cancelled() and task.exception() is not None:
            log.error("mail call task failed", exc_info=task.exception())

    async def _idle_wait(self) -> float:
        """Until the next delayed mail is due, at most poll_s."""
        try:
            due = await self.store.next_due()
        except StoreUnavailable:
            return self.config.poll_s
        if due is None:
            return self.config.poll_s
        return min(self.config.poll_s, max(0.01, (due - datetime.now(UTC)).total_seconds()))

    async def _wait(self, timeout: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout)

    # ---- one mail -------------------------------------------------------------------------

    async def _send(self, mail: ClaimedMail) -> None:
        invalid = is_valid_email(mail.to_email)
        if invalid is not None:
            await self._invalid_address(mail, invalid)
            return
        delay = self._limiter.reserve(1, time.monotonic())
        if delay > 0:
            metrics.add_throttle_wait("mail", delay)
            await asyncio.sleep(delay)
        began = time.monotonic()
        loop = asyncio.get_running_loop()
        try:
            message_id = await loop.run_in_executor(self._executor, self._call, mail)
            decision = Decision(Next.SENT)
        except SesCallFailed as exc:
            message_id = None
            decision = decide_after_call(
                code=exc.code,
                http_status=exc.http_status,
                timed_out=exc.timed_out,
                delivery=Delivery(mail.delivery),
                send_errors=mail.send_errors,
                policy=self.config.retry,
                now=time.time(),
                rng=self.rng,
            )
        elapsed = time.monotonic() - began
        metrics.observe_ses_call("SendEmail", elapsed, decision.next.value)
        metrics.count_mail(decision.next.value)
        self._observe(mail, elapsed)
        done = await self._record(mail, decision, message_id)
        log.info(
            "mail dedupe_key=%s event_id=%s attempts=%s outcome=%s provider_id=%s %.3fs%s",
            mail.dedupe_key,
            mail.event_id,
            mail.token,
            decision.next,
            message_id,
            elapsed,
            "" if done else " (fenced: another worker owns the row now)",
        )

    async def _invalid_address(self, mail: ClaimedMail, why: str) -> None:
        """An address SES must not be given (one bad address must cost only its own mail):
        `failed` with 'invalid_address:<why>', EmailFailed to the order service, no call."""
        reason = f"invalid_address:{why}"
        done: Transition | None = await self._retry(
            self.store.transition,
            "mark_mail_invalid_address",
            {"id": mail.id, "token": mail.token, "error": reason},
            reason,
        )
        self.stats.invalid_address += 1
        metrics.count_mail("invalid_address")
        log.info(
            "mail dedupe_key=%s event_id=%s attempts=%s outcome=%s status=%s (no call made)",
            mail.dedupe_key,
            mail.event_id,
            mail.token,
            reason,
            done.status if done else "fenced",
        )

    def _call(self, mail: ClaimedMail) -> str:
        return self.ses.send_templated(
            from_address=self.config.from_address,
            to=mail.to_email,
            template=mail.template,
            data=mail.data,
            configuration_set=self.config.configuration_set,
            tags={"type": "transactional", "mail_id": str(mail.id), "attempt": str(mail.token)},
            headers={"X-Flashsend-Dedupe-Key": mail.dedupe_key},
        )

    def _observe(self, mail: ClaimedMail, elapsed: float) -> None:
        s = self.stats
        s.max_send_s = max(s.max_send_s, elapsed)
        s.send_times.append(elapsed)
        if len(s.send_times) > 10_000:
            del s.send_times[:5_000]
        if elapsed > self.config.lease_s:
            log.error(
                "ALERT send took %.1fs, longer than the %.0fs lease: mail %s may be sent twice; "
                "raise FLASHSEND_MAIL_LEASE_S",
                elapsed,
                self.config.lease_s,
                mail.dedupe_key,
            )

    async def _record(
        self, mail: ClaimedMail, decision: Decision, message_id: str | None
    ) -> Transition | None:
        base: dict[str, Any] = {"id": mail.id, "token": mail.token}
        if decision.next is Next.SENT:
            stmt, params = "mark_mail_sent", {**base, "message_id": message_id}
        elif decision.next is Next.RETRY:
            retry_at = datetime.fromtimestamp(decision.retry_at or time.time(), tz=UTC)
            stmt, params = (
                "mark_mail_retry",
                {
                    **base,
                    "retry_at": retry_at,
                    "count_error": 1 if decision.counts_as_error else 0,
                    "error": decision.reason,
                },
            )
        elif decision.next is Next.FAILED:
            stmt, params = "mark_mail_failed", {**base, "error": decision.reason}
        else:
            stmt, params = "mark_mail_unknown", {**base, "error": decision.reason}
        done: Transition | None = await self._retry(
            self.store.transition, stmt, params, decision.reason
        )
        s = self.stats
        if done is None:
            s.fenced += 1
        elif done.status == "cancelled":
            s.cancelled += 1
        elif done.status == "pending":
            s.retried += 1
            self._wake.set()
        else:
            setattr(s, done.status, getattr(s, done.status) + 1)
        return done

    # ---- sweeper and doorbell -------------------------------------------------------------

    async def _sweep_loop(self) -> None:
        while not self._stopping:
            await asyncio.sleep(self.config.poll_s)
            try:
                expired = await self.store.expire_leases()
            except Exception as exc:  # StoreUnavailable, or anything: the sweep must go on
                log.warning("sweep failed: %s", exc)
                continue
            if expired:
                self.stats.expired += len(expired)
                log.warning(
                    "lease expired for %d mail(s) -> unknown: %s",
                    len(expired),
                    [m.dedupe_key for m in expired[:10]],
                )
            self._wake.set()  # re-ring: lost doorbells and expired at-least-once leases

    async def _listen_loop(self) -> None:
        assert self.listen_dsn is not None
        failures = 0
        while not self._stopping:
            try:
                async with await psycopg.AsyncConnection.connect(
                    self.listen_dsn, autocommit=True
                ) as conn:
                    await conn.execute("LISTEN mail_due")
                    failures = 0
                    self._wake.set()  # anything that rang while we were not listening
                    async for _ in conn.notifies():
                        self._wake.set()
            except psycopg.Error as exc:
                failures += 1
                log.warning("LISTEN mail_due lost: %s", exc)
                await asyncio.sleep(
                    backoff_delay(min(failures, 8), base=0.2, cap=5.0, rng=self.rng)
                )

    async def _retry(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> Any:
        attempt = 0
        while True:
            try:
                return await fn(*args)
            except StoreUnavailable as exc:
                attempt += 1
                delay = backoff_delay(min(attempt, 10), base=0.1, cap=5.0, rng=self.rng)
                log.warning(
                    "%s failed (attempt %d), retrying in %.2fs: %s",
                    getattr(fn, "__name__", fn),
                    attempt,
                    delay,
                    exc,
                )
                await asyncio.sleep(delay)
