"""The example webhook receiver (``examples/webhook_receiver``) served by uvicorn on loopback, receiving a real
control plane's deliveries: it accepts them once each and refuses what is not signed with its secret."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest

from bettercompute.modules.webhooks import standard_headers
from examples.webhook_receiver import Inbox, make_app

from ..cli.conftest import free_port
from ..webhooks.conftest import open_hooks
from ._serve import serving

pytestmark = [pytest.mark.anyio, pytest.mark.pg]


async def test_the_example_receiver_accepts_real_deliveries_once_and_refuses_forgeries(
    database_url: str, fresh_schema: str, tmp_path: Path
) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}/hooks/bettercompute"
    async with open_hooks(database_url, fresh_schema, tmp_path / "kms.key") as hooks:
        _, secret = await hooks.subscribe(url, "reservation.*")
        inbox = Inbox()
        async with serving(make_app(secret, inbox), port):
            for n in range(3):
                await hooks.publish("reservation.placed", f"rsv_{n}", n=n)
            await hooks.publish("node.adopted", "node_1")  # not subscribed: never sent
            await hooks.pump(lambda: len(inbox.events) >= 3)
            assert sorted(e["data"]["n"] for e in inbox.events) == [0, 1, 2]
            assert {e["type"] for e in inbox.events} == {"reservation.placed"}
            assert inbox.refused == 0

            async with httpx.AsyncClient() as client:
                body = json.dumps({"id": "evt_again", "type": "reservation.placed", "data": {"n": 9}}).encode()
                signed = standard_headers([secret], "evt_again", int(time.time()), body)
                for _ in range(2):  # a retry of one event: handled once
                    answer = await client.post(url, content=body, headers=signed)
                    assert answer.status_code == 204
                assert (len(inbox.events), inbox.duplicates) == (4, 1)
                forged = await client.post(url, content=body.replace(b"9", b"8"), headers=signed)
                assert forged.status_code == 400 and forged.json() == {"error": "mismatch"}
                unsigned = await client.post(url, content=body)
                assert unsigned.status_code == 400 and unsigned.json() == {"error": "missing"}
            assert (len(inbox.events), inbox.refused) == (4, 2)
