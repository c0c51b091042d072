"""The reliability run's load: reservations over HTTP against the api processes, and the webhook receiver.

It runs in a thread with its own event loop, so the test's own waiting (subprocesses, SQL) never stalls it. Every
reservation carries an ``Idempotency-Key`` and a label with the same key; a request that fails without an answer
(a connection refused or cut, a timeout, ``UNAVAILABLE``, ``INTERNAL``) is sent again with the same key to the
other api process, as a client behind a load balancer would, until it gets an answer. What clients were told is
what the database must hold afterwards.
"""

from __future__ import annotations

import asyncio
import collections
import datetime as dt
import json
import re
import threading
import time
from collections.abc import Sequence
from typing import Any

import attrs
import httpx

from bench.worker import Receiver
from tests._timing import deadline

__all__ = ["Load", "Told"]

_RETRIED = frozenset({"UNAVAILABLE", "INTERNAL", "connect", "timeout", "http"})
_RESERVATION_ID = re.compile(r"rsv_[0-9a-z]+")


@attrs.define(kw_only=True)
class Told:
    """What the client was finally told for one key: a reservation id, or a definite refusal's code."""

    key: str
    reservation: str | None = None
    code: str | None = None
    tries: int = 0


class Load:
    def __init__(self) -> None:
        self._urls: list[str] = []
        self._credential = self._tenant = self._pool = ""
        self._pause = 0.0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="load", daemon=True)
        self._stop: asyncio.Event | None = None
        self._client: httpx.AsyncClient | None = None
        self._tasks: list[asyncio.Future[Any]] = []
        self.receiver = Receiver()
        self.receiver_url = ""
        self.told: dict[str, Told] = {}
        self.requests = 0
        self.codes: collections.Counter[str] = collections.Counter()
        # (monotonic time, code) of every answer that was not a success, to find the outage's burst afterwards.
        self.failures: list[tuple[float, str]] = []
        self.successes: list[float] = []

    # --- control, from the test's thread ---------------------------------------------------------------------

    def start_receiver(self) -> str:
        self._thread.start()
        self.receiver_url = self._run(self.receiver.start())
        return self.receiver_url

    def start(
        self, api_urls: Sequence[str], credential: str, tenant: str, pool_id: str, *, callers: int, pause: float
    ) -> None:
        """``callers`` concurrent callers, each sending its next reservation ``pause`` seconds after an answer."""
        self._urls = list(api_urls)
        self._credential, self._tenant, self._pool, self._pause = credential, tenant, pool_id, pause

        async def begin() -> None:
            self._stop = asyncio.Event()
            self._client = httpx.AsyncClient(timeout=httpx.Timeout(10.0, connect=2.0))
            self._tasks = [asyncio.ensure_future(self._caller(self._client, i)) for i in range(callers)]

        self._run(begin())

    def stop(self, within: float = 120) -> None:
        """Stop sending new keys; wait for every key under way to get its answer."""

        async def end() -> None:
            assert self._stop is not None
            self._stop.set()
            try:
                await asyncio.wait_for(asyncio.gather(*self._tasks), deadline(within))
            finally:
                if self._client is not None:
                    await self._client.aclose()

        self._run(end(), within + 5)

    def close(self) -> None:
        async def shut() -> None:
            await self.receiver.stop()
            if self._client is not None:
                await self._client.aclose()
            tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        if self._thread.is_alive():
            self._run(shut())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
        if not self._thread.is_alive():
            self._loop.close()

    def webhook_reservations(self, event_type: str) -> set[str]:
        """Reservation ids of the ``event_type`` events the receiver got (a delivery seen twice counts once)."""
        found: set[str] = set()
        for _, _, body in list(self.receiver.received):
            try:
                event = json.loads(body)
            except ValueError:
                continue
            if isinstance(event, dict) and event.get("type") == event_type:
                found.update(_RESERVATION_ID.findall(json.dumps(event.get("data"))))
        return found

    def _run(self, coro: Any, timeout: float = 30) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    # --- the callers -------------------------------------------------------------------------------------------

    async def _caller(self, client: httpx.AsyncClient, index: int) -> None:
        assert self._stop is not None
        n = 0
        while not self._stop.is_set():
            n += 1
            key = f"rel-{index}-{n}"
            await self._reserve(client, key, index + n)
            await asyncio.sleep(self._pause)

    async def _reserve(self, client: httpx.AsyncClient, key: str, turn: int) -> None:
        told = self.told[key] = Told(key=key)
        # Most reservations are for later (placed, then left), every tenth starts now for a minute (placed, bound
        # to its nodes, then ended): a week of hourly slots holds far more than the run sends.
        now = dt.datetime.now(dt.UTC).replace(microsecond=0)
        start = now if turn % 10 == 0 else now + dt.timedelta(hours=1 + turn % 150)
        body = {
            "tenant": self._tenant,
            "pool_id": self._pool,
            "gpus": 1,
            "start_at": start.isoformat(),
            "duration": "PT1M" if turn % 10 == 0 else "PT1H",
            "labels": {"rk": key},
        }
        headers = {"authorization": f"Bearer {self._credential}", "idempotency-key": key}
        ends = time.monotonic() + deadline(150)
        while True:
            url = self._urls[(turn + told.tries) % len(self._urls)]
            told.tries += 1
            self.requests += 1
            code = await self._send(client, url, body, headers, told)
            if code is None:
                self.successes.append(time.monotonic())
                return
            self.codes[code] += 1
            self.failures.append((time.monotonic(), code))
            if code not in _RETRIED:
                told.code = code
                return
            if time.monotonic() > ends:
                told.code = f"gave up after {code}"
                return
            await asyncio.sleep(0.25)

    async def _send(
        self, client: httpx.AsyncClient, url: str, body: dict[str, Any], headers: dict[str, str], told: Told
    ) -> str | None:
        try:
            response = await client.post(f"{url}/api/compute/reservations/create", json=body, headers=headers)
        except httpx.TimeoutException:
            return "timeout"
        except httpx.TransportError:
            return "connect"
        try:
            answer = response.json()
        except ValueError:
            return "http"  # not the JSON envelope: counted apart (there must be none)
        if response.status_code == 200 and isinstance(answer, dict) and "data" in answer:
            told.reservation = str(answer["data"]["id"])
            self.codes["OK"] += 1
            return None
        error = answer.get("error") if isinstance(answer, dict) else None
        return str(error.get("code")) if isinstance(error, dict) else "http"
