"""The Redfish client against a real BMC emulator (sushy-tools): inventory, power, boot, credentials and trust."""

from __future__ import annotations

import base64
import json
import logging
import re
import ssl
import time
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from bettercompute_metal._redfish import RedfishClient
from bettercompute_metal._redfish_json import BMC_AUTH_FAILED, BMC_TLS_FAILED, BMC_UNREACHABLE, RedfishError
from bettercompute_metal._redfish_trust import BmcCredentials, BmcTls
from tests._timing import deadline

from ._bmc import Bmc, free_port, make_certificates

pytestmark = pytest.mark.anyio

RESET = "/Actions/ComputerSystem.Reset"


def client(bmc: Bmc, *, tls: BmcTls | None = None, password: str | None = None, timeout: float = 10.0) -> RedfishClient:
    credentials = BmcCredentials(bmc.username, bmc.password if password is None else password)
    return RedfishClient(bmc.url, credentials, tls or BmcTls(pin_sha256=bmc.pin_sha256), timeout)


def raw_system(bmc: Bmc) -> dict[str, Any]:
    """The system resource as the emulator serves it, read without the client under test."""
    context = ssl.create_default_context(cadata=bmc.ca_pem)
    with httpx.Client(verify=context, auth=(bmc.username, bmc.password), trust_env=False) as http:
        document: dict[str, Any] = http.get(f"{bmc.url}/redfish/v1/Systems/{bmc.system_uuid}").json()
    return document


def requests_logged(log: str) -> list[str]:
    """The request lines of the emulator's access log ("GET /redfish/v1/... HTTP/1.1")."""
    return re.findall(r'"(?:\x1b\[[0-9;]*m)*([A-Z]+ /\S* HTTP/1\.1)', log)


async def wait_for_power(bmc: RedfishClient, wanted: str) -> float:
    """Seconds until ``power_state()`` reads ``wanted`` (a change lands 1 to 11 s later; 30 s at most)."""
    started = time.monotonic()
    with anyio.fail_after(deadline(30)):
        while True:
            if await bmc.power_state() == wanted:
                return time.monotonic() - started
            await anyio.sleep(0.25)


async def test_inspect_reads_the_emulators_system(bmc: Bmc) -> None:
    async with client(bmc) as redfish:
        inventory = await redfish.inspect()
    served = raw_system(bmc)
    assert inventory.system_path == f"/redfish/v1/Systems/{bmc.system_uuid}"
    assert inventory.uuid == bmc.system_uuid == served["UUID"]
    assert inventory.name == bmc.system_name
    assert inventory.manufacturer == served["Manufacturer"]
    # The fake driver reports no serial number, model, CPU count or memory: the inventory says so rather than guess.
    assert inventory.serial_number is None and "SerialNumber" not in served
    assert inventory.model is None and "Model" not in served
    assert inventory.cpu_count is None and "Count" not in served["ProcessorSummary"]
    assert inventory.memory_gib is None and "TotalSystemMemoryGiB" not in served["MemorySummary"]
    assert inventory.power_state == served["PowerState"] == "Off"
    assert [nic.mac for nic in inventory.nics] == list(bmc.macs)
    assert [disk.size_bytes for disk in inventory.disks] == list(bmc.disk_bytes)
    assert inventory.boot.override_target == served["Boot"]["BootSourceOverrideTarget"]
    assert inventory.boot.mode == served["Boot"]["BootSourceOverrideMode"]
    assert "Pxe" in inventory.boot.allowed_targets
    document = inventory.to_json()
    assert json.loads(json.dumps(document)) == document
    assert document["nics"][0]["mac"] == bmc.macs[0]


async def test_power_changes_land_and_an_action_already_in_place_is_not_sent(bmc: Bmc) -> None:
    system = f"/redfish/v1/Systems/{bmc.system_uuid}"
    async with client(bmc) as redfish:
        await redfish.power("on")
        took_on = await wait_for_power(redfish, "On")
        posts = requests_logged(bmc.log()).count(f"POST {system}{RESET} HTTP/1.1")
        await redfish.power("on")  # already on: nothing is sent
        assert requests_logged(bmc.log()).count(f"POST {system}{RESET} HTTP/1.1") == posts == 1
        await redfish.power("off")
        took_off = await wait_for_power(redfish, "Off")
        # From off, a cycle (the emulator offers no PowerCycle) is a plain power-on.
        await redfish.power("cycle")
        took_cycle = await wait_for_power(redfish, "On")
        # The emulator shows a restart as off at once, then on again later.
        await redfish.power("reset")
        assert await redfish.power_state() == "Off"
    assert requests_logged(bmc.log()).count(f"POST {system}{RESET} HTTP/1.1") == 4
    assert max(took_on, took_off, took_cycle) < 13  # 1 to 11 s, plus the emulator's whole-second rounding and a poll


async def test_boot_once_from_pxe_is_what_the_system_then_reports(bmc: Bmc) -> None:
    assert raw_system(bmc)["Boot"]["BootSourceOverrideTarget"] != "Pxe"
    async with client(bmc) as redfish:
        await redfish.set_boot_once("Pxe")
        inventory = await redfish.inspect()
    assert inventory.boot.override_target == "Pxe"
    assert raw_system(bmc)["Boot"]["BootSourceOverrideTarget"] == "Pxe"


async def test_a_wrong_password_is_refused_and_never_shown(bmc: Bmc, caplog: pytest.LogCaptureFixture) -> None:
    wrong = "Wrong-Secret-1b7c"
    token = base64.b64encode(f"{bmc.username}:{wrong}".encode()).decode()
    caplog.set_level(logging.DEBUG)
    credentials = BmcCredentials(bmc.username, wrong)
    with pytest.raises(RedfishError) as raised:
        async with RedfishClient(bmc.url, credentials, BmcTls(pin_sha256=bmc.pin_sha256)) as redfish:
            await redfish.inspect()
    error = raised.value
    assert error.reason == BMC_AUTH_FAILED and error.status == 401 and not error.retryable
    for text in (str(error), repr(error), caplog.text, repr(credentials), str(credentials), repr(redfish)):
        assert wrong not in text
        assert token not in text
    assert bmc.password not in caplog.text


async def test_a_closed_port_is_unreachable_at_once() -> None:
    url = f"https://127.0.0.1:{free_port()}"
    started = time.monotonic()
    with pytest.raises(RedfishError) as raised:
        async with RedfishClient(url, BmcCredentials("admin", "pw"), BmcTls(pin_sha256="ab" * 32), 2.0) as redfish:
            await redfish.power_state()
    assert raised.value.reason == BMC_UNREACHABLE and raised.value.retryable
    assert time.monotonic() - started < 2.0


async def test_a_certificate_other_than_the_pinned_one_gets_no_request(bmc: Bmc, tmp_path: Path) -> None:
    other = make_certificates(tmp_path / "other")
    before = len(requests_logged(bmc.log()))
    with pytest.raises(RedfishError) as raised:
        async with client(bmc, tls=BmcTls(pin_sha256=other.pin_sha256)) as redfish:
            await redfish.inspect()
    assert raised.value.reason == BMC_TLS_FAILED and not raised.value.retryable
    assert bmc.pin_sha256 not in raised.value.message  # the presented certificate is not described to the caller
    # Not one HTTP request reached the emulator: the handshake ended before any was written.
    assert len(requests_logged(bmc.log())) == before


async def test_a_ca_verifies_the_chain_and_a_wrong_ca_is_refused(bmc: Bmc, tmp_path: Path) -> None:
    async with client(bmc, tls=BmcTls(ca_pem=bmc.ca_pem)) as redfish:
        assert (await redfish.inspect()).uuid == bmc.system_uuid
    other = make_certificates(tmp_path / "other")
    before = len(requests_logged(bmc.log()))
    with pytest.raises(RedfishError) as raised:
        async with client(bmc, tls=BmcTls(ca_pem=other.ca_pem)) as redfish:
            await redfish.inspect()
    assert raised.value.reason == BMC_TLS_FAILED and not raised.value.retryable
    assert len(requests_logged(bmc.log())) == before
