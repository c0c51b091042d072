"""The Redfish client against a scripted HTTPS server: BMCs that misbehave, and one richer than the emulator.

Every server here is real (TLS on loopback, requests read off the socket); only its answers are written by the test.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from bettercompute.errors import InvalidInputError
from bettercompute_metal._redfish import RedfishClient
from bettercompute_metal._redfish_json import (
    BMC_AUTH_FAILED,
    BMC_BAD_RESPONSE,
    BMC_ERROR,
    BMC_NOT_FOUND,
    BMC_TLS_FAILED,
    BMC_UNREACHABLE,
    MAX_BODY_BYTES,
    RedfishError,
)
from bettercompute_metal._redfish_trust import BmcCredentials, BmcTls

from ._fake_bmc import FakeBmc, Reply, serve_fake_bmc

pytestmark = pytest.mark.anyio

PASSWORD = "Fake-Bmc-Secret-93f1"
CREDENTIALS = BmcCredentials("root", PASSWORD)
SYSTEM = "/redfish/v1/Systems/1"
ROOT = Reply({"@odata.id": "/redfish/v1", "Systems": {"@odata.id": "/redfish/v1/Systems"}})
SYSTEMS = Reply({"Members": [{"@odata.id": SYSTEM}]})


def system(**fields: Any) -> Reply:
    return Reply({"@odata.id": SYSTEM, "Id": "1", "UUID": "4c4c4544-0042-3010-8057-b4c04f4d3732", **fields})


def routes(**paths: Reply) -> dict[str, Reply]:
    """The service root and systems collection, plus ``paths`` (keyword ``system`` is the system resource)."""
    table = {"/redfish/v1": ROOT, "/redfish/v1/Systems": SYSTEMS}
    for name, reply in paths.items():
        table[SYSTEM if name == "system" else name] = reply
    return table


async def inspect(fake: FakeBmc, *, seconds: float = 5.0, tls: BmcTls | None = None) -> Any:
    assert fake.certs is not None
    async with RedfishClient(fake.url, CREDENTIALS, tls or BmcTls(pin_sha256=fake.certs.pin_sha256), seconds) as bmc:
        return await bmc.inspect()


async def failure(fake: FakeBmc, **kwargs: Any) -> RedfishError:
    with pytest.raises(RedfishError) as raised:
        await inspect(fake, **kwargs)
    error = raised.value
    assert PASSWORD not in str(error) and PASSWORD not in repr(error)
    return error


async def test_a_richer_bmc_fills_every_field_and_gets_the_exact_requests(tmp_path: Path) -> None:
    table = routes(
        system=system(
            SerialNumber="SN-7731",
            Manufacturer="Contoso",
            Model="GPU Server 8X",
            PowerState="On",
            ProcessorSummary={"Count": 2, "Model": "Contoso CPU 64-core"},
            MemorySummary={"TotalSystemMemoryGiB": 1024},
            Processors={"@odata.id": f"{SYSTEM}/Processors"},
            EthernetInterfaces={"@odata.id": f"{SYSTEM}/EthernetInterfaces"},
            SimpleStorage={"@odata.id": f"{SYSTEM}/SimpleStorage"},
            Boot={
                "BootSourceOverrideTarget": "None",
                "BootSourceOverrideEnabled": "Disabled",
                "BootOrder": ["Boot0001"],
            },
            Actions={
                "#ComputerSystem.Reset": {
                    "target": f"{SYSTEM}/Actions/ComputerSystem.Reset",
                    "ResetType@Redfish.AllowableValues": ["On", "ForceOff", "PowerCycle"],
                }
            },
        ),
        **{
            f"{SYSTEM}/Processors": Reply({"Members": [{"@odata.id": f"{SYSTEM}/Processors/{n}"} for n in "12g"]}),
            f"{SYSTEM}/Processors/1": Reply({"ProcessorType": "CPU", "TotalCores": 64, "Model": "Contoso CPU"}),
            f"{SYSTEM}/Processors/2": Reply({"ProcessorType": "CPU", "TotalCores": 64, "Model": "Contoso CPU"}),
            f"{SYSTEM}/Processors/g": Reply({"ProcessorType": "GPU", "TotalCores": 16896, "Model": "Big GPU"}),
            f"{SYSTEM}/EthernetInterfaces": Reply(
                {"Members": [{"@odata.id": f"{SYSTEM}/EthernetInterfaces/{n}"} for n in ("a", "b")]}
            ),
            f"{SYSTEM}/EthernetInterfaces/a": Reply({"Id": "a", "MACAddress": "B4-96-91-0A-0B-0C"}),
            f"{SYSTEM}/EthernetInterfaces/b": Reply({"Id": "b", "MACAddress": "", "PermanentMACAddress": None}),
            f"{SYSTEM}/SimpleStorage": Reply({"Members": [{"@odata.id": f"{SYSTEM}/SimpleStorage/0"}]}),
            f"{SYSTEM}/SimpleStorage/0": Reply(
                {
                    "Id": "0",
                    "Devices": [
                        {"Name": "NVMe 0", "CapacityBytes": 3840755982336, "Model": "Contoso NVMe"},
                        {"Name": "Bay 2", "Status": {"State": "Absent"}},
                    ],
                }
            ),
            f"{SYSTEM}/Actions/ComputerSystem.Reset": Reply(b"", 204),
        },
    )
    with serve_fake_bmc(tmp_path, table) as fake:
        inventory = await inspect(fake)
        assert fake.certs is not None
        async with RedfishClient(fake.url, CREDENTIALS, BmcTls(pin_sha256=fake.certs.pin_sha256)) as bmc:
            await bmc.set_boot_once("Pxe")
            await bmc.power("cycle")
            await bmc.power("on")  # already on: nothing sent
            await bmc.power("reset")
    assert (inventory.serial_number, inventory.manufacturer, inventory.model) == ("SN-7731", "Contoso", "GPU Server 8X")
    assert (inventory.cpu_count, inventory.cpu_cores, inventory.cpu_model) == (2, 128, "Contoso CPU 64-core")
    assert inventory.memory_gib == 1024.0
    assert [(nic.id, nic.mac) for nic in inventory.nics] == [("a", "b4:96:91:0a:0b:0c"), ("b", None)]
    assert [(disk.id, disk.size_bytes) for disk in inventory.disks] == [("0/0", 3840755982336)]
    assert inventory.boot.boot_order == ("Boot0001",)
    writes = [(r.method, r.path, json.loads(r.body)) for r in fake.requests if r.method != "GET"]
    assert writes == [
        ("PATCH", SYSTEM, {"Boot": {"BootSourceOverrideTarget": "Pxe", "BootSourceOverrideEnabled": "Once"}}),
        ("POST", f"{SYSTEM}/Actions/ComputerSystem.Reset", {"ResetType": "PowerCycle"}),
        ("POST", f"{SYSTEM}/Actions/ComputerSystem.Reset", {"ResetType": "ForceRestart"}),
    ]
    # The service root was each client's first request, and the only one without credentials.
    assert [r.path for r in fake.requests if "Authorization" not in r.headers] == ["/redfish/v1", "/redfish/v1"]


async def test_a_pin_mismatch_sends_not_one_request(tmp_path: Path) -> None:
    with serve_fake_bmc(tmp_path, routes(system=system())) as fake:
        error = await failure(fake, tls=BmcTls(pin_sha256="00" * 32))
        assert error.reason == BMC_TLS_FAILED
        assert fake.connections >= 1  # the client did connect and shake hands...
        assert fake.requests == []  # ...and sent nothing after: no request, no Authorization header


async def test_a_ca_checks_the_host_name_and_a_pin_does_not(tmp_path: Path) -> None:
    with serve_fake_bmc(tmp_path, routes(system=system()), names=("bmc.example.test",)) as fake:
        assert fake.certs is not None
        error = await failure(fake, tls=BmcTls(ca_pem=fake.certs.ca_pem))
        assert error.reason == BMC_TLS_FAILED and "127.0.0.1" in error.message
        assert fake.requests == []
        assert (await inspect(fake)).uuid == "4c4c4544-0042-3010-8057-b4c04f4d3732"


BAD: Mapping[str, Mapping[str, Reply]] = {
    "html": routes(system=Reply(b"<html><body>Login</body></html>")),
    "a JSON list": routes(system=Reply([1, 2, 3])),
    "NaN": routes(system=Reply(b'{"UUID": NaN}')),
    "a UUID that is a number": routes(system=system(UUID=12345)),
    "Members that is a string": routes(**{"/redfish/v1/Systems": Reply({"Members": "everything"})}),
    "a member without a path": routes(**{"/redfish/v1/Systems": Reply({"Members": [{"Id": 1}]})}),
    "a link to another host": routes(
        **{"/redfish/v1/Systems": Reply({"Members": [{"@odata.id": "https://evil.example/redfish/v1/Systems/1"}]})}
    ),
    "a link climbing out": routes(
        **{"/redfish/v1/Systems": Reply({"Members": [{"@odata.id": "/redfish/v1/../../etc/passwd"}]})}
    ),
    "a negative disk": routes(
        system=system(SimpleStorage={"@odata.id": f"{SYSTEM}/SimpleStorage"}),
        **{
            f"{SYSTEM}/SimpleStorage": Reply({"Members": [{"@odata.id": f"{SYSTEM}/SimpleStorage/0"}]}),
            f"{SYSTEM}/SimpleStorage/0": Reply({"Devices": [{"CapacityBytes": -1}]}),
        },
    ),
    "deep JSON": routes(system=Reply(b"[" * 100_000 + b"]" * 100_000)),
    "JSON deeper than the limit": routes(system=Reply(json.loads("[" * 40 + "]" * 40))),
    "a body too large": routes(system=Reply(b" " * (MAX_BODY_BYTES + 1))),
    "a body too large, with no length": routes(system=Reply(b" " * (MAX_BODY_BYTES + 1), length=False)),
    "a length that lies": routes(system=Reply(b"{}", headers={"Content-Length": "10000000"}, length=False)),
    "a compressed body": routes(system=Reply(b"\x1f\x8b" + b"\x00" * 20, headers={"Content-Encoding": "gzip"})),
}


@pytest.mark.parametrize("case", list(BAD))
async def test_a_malformed_answer_is_a_bad_response(tmp_path: Path, case: str) -> None:
    with serve_fake_bmc(tmp_path, BAD[case]) as fake:
        error = await failure(fake)
        assert error.reason == BMC_BAD_RESPONSE, error
        assert not error.retryable
        # A refused link is never followed: every request went to this server, under /redfish/v1, with no "..".
        assert all(r.path.startswith("/redfish/v1") and ".." not in r.path for r in fake.requests)
        assert {r.headers["Host"] for r in fake.requests} == {fake.url.removeprefix("https://")}


async def test_error_statuses(tmp_path: Path) -> None:
    echoed = {"error": {"message": "the service is restarting"}}
    cases = {
        "forbidden": (Reply({}, 403), BMC_AUTH_FAILED, False),
        "gone": (Reply({}, 404), BMC_NOT_FOUND, False),
        "redirect": (Reply(b"", 302, headers={"Location": "https://evil.example/"}), BMC_ERROR, False),
        "server error": (Reply(echoed, 500), BMC_ERROR, True),
        "busy": (Reply({}, 429), BMC_ERROR, True),
        "bad request": (Reply({}, 400), BMC_ERROR, False),
    }
    for name, (reply, reason, retryable) in cases.items():
        with serve_fake_bmc(tmp_path / name, routes(system=reply)) as fake:
            error = await failure(fake)
        assert (error.reason, error.retryable, error.status) == (reason, retryable, reply.status), name
        assert len(error.message) < 400 and "\x1b" not in error.message and "\n" not in error.message
        assert "evil.example" not in {r.headers.get("Host") for r in fake.requests}


async def test_a_server_error_message_is_excerpted_without_secrets(tmp_path: Path) -> None:
    echoed = {"error": {"message": f"bad login root:{PASSWORD}\x1b[31m\n" + "x" * 500}}
    with serve_fake_bmc(tmp_path, routes(system=Reply(echoed, 500))) as fake:
        error = await failure(fake)
    assert error.message.startswith("The BMC answered 500 to GET /redfish/v1/Systems/1: bad login root:*** ")
    assert error.message.endswith("...")


async def test_no_system_is_not_found(tmp_path: Path) -> None:
    with serve_fake_bmc(tmp_path, {"/redfish/v1": ROOT, "/redfish/v1/Systems": Reply({"Members": []})}) as fake:
        error = await failure(fake)
    assert error.reason == BMC_NOT_FOUND


async def test_a_body_dripped_slowly_times_out_as_a_whole(tmp_path: Path) -> None:
    # Each byte comes well within httpx's read timeout; the client's deadline covers the whole request.
    with serve_fake_bmc(tmp_path, routes(system=Reply(system().payload(), drip=0.05))) as fake:
        started = time.monotonic()
        error = await failure(fake, seconds=1.0)
    assert error.reason == BMC_UNREACHABLE and error.retryable
    assert time.monotonic() - started < 3


async def test_plain_http_only_when_allowed(tmp_path: Path) -> None:
    with serve_fake_bmc(tmp_path, routes(system=system()), plain=True) as fake:
        with pytest.raises(InvalidInputError) as refused:
            RedfishClient(fake.url, CREDENTIALS, None)
        assert refused.value.details == {"field": "url"}
        async with RedfishClient(fake.url, CREDENTIALS, None, allow_plain_http=True) as bmc:
            assert (await bmc.inspect()).uuid == "4c4c4544-0042-3010-8057-b4c04f4d3732"


async def test_tls_against_a_plain_server_fails_as_tls(tmp_path: Path) -> None:
    with serve_fake_bmc(tmp_path, routes(system=system()), plain=True) as fake:
        url = fake.url.replace("http://", "https://")
        with pytest.raises(RedfishError) as raised:
            async with RedfishClient(url, CREDENTIALS, BmcTls(pin_sha256="00" * 32), 3.0) as bmc:
                await bmc.inspect()
    assert raised.value.reason == BMC_TLS_FAILED
    assert fake.requests == []
