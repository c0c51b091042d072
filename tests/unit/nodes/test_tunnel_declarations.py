"""How a control plane takes modules' ``tunnel_checks``, and what ``open_tunnel_in`` and the ticket format refuse
before anything is written."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import pytest

from bettercompute import (
    BetterCompute,
    Job,
    JoinSettings,
    LocalKeyKms,
    Options,
    TunnelRecord,
    better_compute,
    open_tunnel_in,
)
from bettercompute.errors import InvalidConfigError, InvalidInputError
from bettercompute.modules.nodes import NodesModule, parse_ticket
from bettercompute.ports import Identity, Migration, ResourceRef, Store
from bettercompute_iam import EmbeddedIam
from bettercompute_store_pg import PgStore


async def _check(store: Store, tunnel: TunnelRecord, now: dt.datetime) -> str | None:
    return None


@attrs.frozen(kw_only=True)
class Checking:
    tunnel_checks: Mapping[str, Any]
    name: str = "checking"
    version: str = "0.1.0"
    core_range: str = ">=0.1"
    groups: Sequence[Any] = ()
    actions: Sequence[str] = ()
    migrations: Mapping[str, Sequence[Migration]] = attrs.field(factory=dict)
    jobs: Sequence[Job] = ()

    async def start(self, context: Any) -> None:
        return None

    async def stop(self) -> None:
        return None


def _compute(tmp_path: Path | None, *modules: Any) -> BetterCompute:
    store = PgStore("postgresql://nobody@127.0.0.1:1/none")
    identity: dict[str, Any] = {}
    if tmp_path is not None:
        identity = {
            "join": JoinSettings(gateway_address="gw.example.com:443", trust_domain="example.com"),
            "kms": LocalKeyKms(tmp_path / "kms.key"),
        }
    return better_compute(Options(store=store, iam=EmbeddedIam(), modules=list(modules), **identity))


def test_a_modules_checks_join_the_identity_modules(tmp_path: Path) -> None:
    compute = _compute(tmp_path, Checking(tunnel_checks={"gadget": _check}))
    [identity] = [m for m in compute._modules if isinstance(m, NodesModule)]
    assert set(identity.tunnel_checks) == {"node", "gadget"}
    assert identity.tunnel_checks["gadget"] is _check


def test_misdeclared_checks_are_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidConfigError) as raised:
        _compute(tmp_path, Checking(tunnel_checks={"node": _check, "gadget": "not callable"}))
    problems = raised.value.details["problems"]
    assert any("checked by two modules" in p for p in problems)
    assert any("is not callable" in p for p in problems)
    with pytest.raises(InvalidConfigError) as raised:
        _compute(None, Checking(tunnel_checks={"gadget": _check}))
    assert any("need node identity" in p for p in raised.value.details["problems"])


def test_tickets_parse_only_in_their_one_shape() -> None:
    secret = "A" * 43
    assert parse_ticket(f"bctt_tn_{'0' * 20}.{secret}") == (f"tn_{'0' * 20}", secret)
    for text in ("", "bctt_", f"bcjt_tn_{'0' * 20}.{secret}", f"bctt_tn_{'0' * 20}.{secret}x", f"bctt_tn_1.{secret}"):
        assert parse_ticket(text) is None


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("host", "port", "resource"),
    [
        ("127.0.0.1", 0, ResourceRef(type="node", id="node_1")),
        ("127.0.0.1", 65536, ResourceRef(type="node", id="node_1")),
        ("bad host!", 22, ResourceRef(type="node", id="node_1")),
        ("127.0.0.1", 22, ResourceRef(type="node")),
    ],
)
async def test_open_tunnel_in_refuses_a_malformed_target_before_writing(
    host: str, port: int, resource: ResourceRef
) -> None:
    caller = Identity(
        principal_id="pr_1", principal_name="a", kind="user", tenant_id="tn_1", is_root=False, credential_id="c"
    )
    tx: Any = object()  # any use of the transaction would fail
    with pytest.raises(InvalidInputError):
        await open_tunnel_in(
            tx, tenant="tn_1", identity=caller, node_id="node_1", host=host, port=port, resource=resource, action="a"
        )
