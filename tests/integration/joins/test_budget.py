"""A join's cost in round trips to PostgreSQL, the hot path's budget: the nonce, the token with its pool, then one
transaction of four round trips (BEGIN with the enroll, the certificate record, the projection with the token's
use, the audit row and the event with the COMMIT). A change that adds one fails here, whatever the machine's speed.
"""

from __future__ import annotations

import pytest

from bettercompute_daemon.identity import NodeKey

from .conftest import Fleet, claims

pytestmark = [pytest.mark.anyio, pytest.mark.pg]

ROUND_TRIPS = 6
CHECKOUTS = 3  # the nonce, the token and its pool, the transaction


async def test_a_join_costs_six_round_trips_on_three_checkouts(fleet: Fleet, monkeypatch: pytest.MonkeyPatch) -> None:
    # The CA re-reads its keys at most once a second; its clock stands still here, so a slow machine counts the same.
    monkeypatch.setattr(fleet.services.joins.ca, "_timer", lambda: 0.0)
    token = await fleet.token(uses=3)
    await fleet.join(token.token, hardware=claims("SN-WARM"))  # the CA's keys and the join key are read once
    for serial in ("SN-0001", "SN-0002"):
        key = NodeKey()
        csr_pem = key.csr_pem()
        hardware = claims(serial)
        sealed = await fleet.seal(token.token, csr_pem=csr_pem, hardware=hardware)
        usage = fleet.store.pool_usage
        trips, checkouts = usage.round_trips, usage.checkouts
        result = await fleet.services.join(sealed_token=sealed, csr_pem=csr_pem, claims=hardware)
        assert (usage.round_trips - trips, usage.checkouts - checkouts) == (ROUND_TRIPS, CHECKOUTS), serial
        assert result.node_id.startswith("node_")
