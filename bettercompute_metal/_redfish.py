"""A Redfish client for one machine's BMC: what the machine is, its power, and the device it boots from next.

The client speaks plain Redfish over httpx rather than through sushy: the requests it needs are a handful of GETs, one
POST and one PATCH, and httpx is already a core dependency, so the metal module adds nothing to the dependency list.

How the BMC is trusted (a CA, or a certificate pinned inside the TLS handshake) is ``_redfish_trust``'s; how its
answers are read as hostile input, and the ``RedfishError`` every failure becomes, ``_redfish_json``'s; its
inventory, ``_redfish_inventory``'s. Here: the transport (one request at a time, capped, never redirected, the
pin proven before credentials go anywhere), power and the one-time boot device.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import re
import ssl
from collections.abc import Mapping
from types import TracebackType
from typing import Any, Final, Literal, Self

import anyio
import httpx

from bettercompute_metal._redfish_inventory import BmcInventory, InventoryReader
from bettercompute_metal._redfish_json import (
    BMC_AUTH_FAILED,
    BMC_ERROR,
    BMC_NOT_FOUND,
    BMC_TLS_FAILED,
    BMC_UNREACHABLE,
    MAX_BODY_BYTES,
    RedfishError,
    bad_response,
    decode,
    excerpt,
    json_object,
    link,
    members,
    optional_object,
    safe_path,
    text_field,
    texts_field,
)
from bettercompute_metal._redfish_trust import (
    ROOT,
    BmcCredentials,
    BmcTls,
    PinMismatchError,
    PinnedSSLObject,
    invalid_input,
    parse_bmc_url,
)

__all__ = ["PowerAction", "RedfishClient"]

logger = logging.getLogger(__name__)

PowerAction = Literal["on", "off", "shutdown", "reset", "cycle"]
_RESET_TYPE: Final[Mapping[str, str]] = {
    "on": "On",
    "off": "ForceOff",
    "shutdown": "GracefulShutdown",
    "reset": "ForceRestart",
}
# The power state each action leaves behind when it has landed; an action already there is not sent again (many BMCs
# answer "On" on a machine that is on with an error).
_SETTLED: Final[Mapping[str, str]] = {"on": "On", "off": "Off", "shutdown": "Off"}
_BOOT_TARGET = re.compile(r"[A-Za-z][A-Za-z0-9]{0,31}")


class RedfishClient:
    """A client for one BMC; use it as an async context manager (``async with RedfishClient(...) as bmc``).

    Each request must complete, body included, within ``timeout`` seconds. The first request made (lazily, by the
    first method called) is a GET of the service root without credentials: it finds the systems collection and, with
    a pinned certificate, confirms the pin was checked on that connection before credentials go anywhere.

    Args:
        url: The BMC's URL; see ``parse_bmc_url``.
        credentials: The BMC account.
        tls: How the BMC's certificate is trusted; required for ``https`` (ignored for ``http``).
        timeout: Seconds each request may take, connection included.
        allow_plain_http: Accept an ``http://`` URL (tests only: credentials would cross the network in the clear).

    Raises:
        InvalidInputError: The URL, the credentials or the trust are not acceptable.
    """

    def __init__(
        self,
        url: str,
        credentials: BmcCredentials,
        tls: BmcTls | None,
        timeout: float = 10.0,
        *,
        allow_plain_http: bool = False,
    ) -> None:
        self.origin = parse_bmc_url(url, allow_plain_http=allow_plain_http)
        if not isinstance(credentials, BmcCredentials):
            raise invalid_input("credentials", "The BMC's credentials must be BmcCredentials.")
        self._https = self.origin.startswith("https://")
        if self._https and not isinstance(tls, BmcTls):
            raise invalid_input("tls", "An https BMC needs a CA or a certificate pin to trust.")
        if not 0 < timeout <= 300:
            raise invalid_input("timeout", "The BMC timeout must be more than 0 and at most 300 seconds.")
        self._tls = tls if self._https else None
        self._timeout = float(timeout)
        self._auth = httpx.BasicAuth(credentials.username, credentials.password)
        # What must never appear in a message: the password, and the header value that carries it.
        token = base64.b64encode(f"{credentials.username}:{credentials.password}".encode()).decode()
        self._secrets = (credentials.password, token)
        self._client: httpx.AsyncClient | None = None
        self._systems_path: str | None = None
        self._system_path: str | None = None

    async def __aenter__(self) -> Self:
        self._client = httpx.AsyncClient(
            verify=self._tls.ssl_context() if self._tls is not None else True,
            timeout=httpx.Timeout(self._timeout),
            follow_redirects=False,
            trust_env=False,  # no proxy, .netrc or SSL_CERT_FILE from the environment decides where credentials go
            headers={"Accept": "application/json", "Accept-Encoding": "identity", "OData-Version": "4.0"},
            limits=httpx.Limits(max_connections=4, max_keepalive_connections=2),
        )
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def __repr__(self) -> str:
        return f"RedfishClient({self.origin!r})"

    # -- the operations ------------------------------------------------------------------------------------------

    async def inspect(self) -> BmcInventory:
        """The first computer system's identity, power state, processors, memory, NICs, disks and boot settings.

        Raises:
            RedfishError: With the reasons listed on the class; ``BMC_NOT_FOUND`` when the BMC lists no system.
        """
        path = await self._system()
        return await InventoryReader(self._get, self._get_optional).read(path)

    async def power_state(self) -> str:
        """The system's ``PowerState`` (``On``, ``Off``, ``PoweringOn``, ``PoweringOff``, ...)."""
        system = json_object(await self._get(await self._system()), "system")
        state = text_field(system, "PowerState", "system")
        if state is None:
            raise bad_response("The BMC's system reports no PowerState.")
        return state

    async def power(self, action: PowerAction, *, settle_timeout: float = 60.0, poll_interval: float = 1.0) -> None:
        """Ask the BMC to change the system's power; this returns once the BMC accepted, not once it has landed.

        ``on`` (``On``), ``off`` (``ForceOff``) and ``shutdown`` (``GracefulShutdown``) send nothing when the system is
        already in that state. ``reset`` is ``ForceRestart``. ``cycle`` uses the BMC's ``PowerCycle`` when it offers
        one; otherwise a system that is off is turned on, and one that is on is forced off, waited for (up to
        ``settle_timeout`` seconds, reading every ``poll_interval``) and turned on.

        Raises:
            InvalidInputError: ``action`` is not one of the five.
            RedfishError: The BMC refused or could not be reached; ``BMC_UNREACHABLE`` (retryable) when a cycle's
                power-off did not land in time.
        """
        if action not in ("on", "off", "shutdown", "reset", "cycle"):
            raise invalid_input("action", "The power action must be one of on, off, shutdown, reset and cycle.")
        path = await self._system()
        system = json_object(await self._get(path), "system")
        state = text_field(system, "PowerState", "system")
        target, allowed = self._reset_action(system, path)
        if action == "cycle":
            if "PowerCycle" in allowed:
                await self._post(target, {"ResetType": "PowerCycle"})
                return
            if state == "On":
                await self._post(target, {"ResetType": "ForceOff"})
                await self._wait_for_power("Off", settle_timeout, poll_interval)
            await self._post(target, {"ResetType": "On"})
            return
        if _SETTLED.get(action) == state:
            logger.debug("BMC %s: power %s skipped, the system is already %s", self.origin, action, state)
            return
        await self._post(target, {"ResetType": _RESET_TYPE[action]})

    async def set_boot_once(self, target: str = "Pxe") -> None:
        """Boot the system once from ``target`` (a Redfish ``BootSourceOverrideTarget``: ``Pxe``, ``Hdd``, ``Cd``...).

        Raises:
            InvalidInputError: ``target`` is not a plain Redfish name.
            RedfishError: The BMC refused the change or could not be reached.
        """
        if not isinstance(target, str) or not _BOOT_TARGET.fullmatch(target):
            raise invalid_input("target", "The boot target must be a Redfish boot source name such as Pxe.")
        path = await self._system()
        await self._send(
            "PATCH", path, {"Boot": {"BootSourceOverrideTarget": target, "BootSourceOverrideEnabled": "Once"}}
        )

    # -- the steps -----------------------------------------------------------------------------------------------

    async def _system(self) -> str:
        if self._system_path is not None:
            return self._system_path
        systems_path = await self._service_root()
        systems = members(json_object(await self._get(systems_path), "systems collection"), "systems")
        if not systems:
            raise RedfishError(BMC_NOT_FOUND, "The BMC lists no computer system.")
        self._system_path = systems[0]
        return self._system_path

    def _reset_action(self, system: Mapping[str, Any], path: str) -> tuple[str, tuple[str, ...]]:
        actions = optional_object(system, "Actions", "system")
        reset = optional_object(actions, "#ComputerSystem.Reset", "system's Actions")
        target_value = reset.get("target")
        target = (
            safe_path(target_value, "ComputerSystem.Reset")
            if target_value is not None
            else f"{path}/Actions/ComputerSystem.Reset"
        )
        return target, texts_field(reset, "ResetType@Redfish.AllowableValues", "ComputerSystem.Reset")

    async def _wait_for_power(self, wanted: str, settle_timeout: float, poll_interval: float) -> None:
        with anyio.move_on_after(settle_timeout):
            while True:
                if await self.power_state() == wanted:
                    return
                await anyio.sleep(poll_interval)
        raise RedfishError(
            BMC_UNREACHABLE, f"The system's power did not become {wanted} within {settle_timeout:g} s.", retryable=True
        )

    # -- the wire ------------------------------------------------------------------------------------------------

    async def _get(self, path: str) -> Any:
        return await self._send("GET", path, None)

    async def _get_optional(self, path: str) -> Any:
        """A resource the system links to but the BMC may not implement: None for 404 or 501."""
        try:
            return await self._get(path)
        except RedfishError as error:
            if error.reason == BMC_NOT_FOUND or error.status == 501:
                logger.debug("BMC %s: %s is not there (%s)", self.origin, path, error.status)
                return None
            raise

    async def _post(self, path: str, body: Mapping[str, Any]) -> None:
        await self._send("POST", path, body)

    async def _send(self, method: str, path: str, body: Mapping[str, Any] | None, *, credentials: bool = True) -> Any:
        """Send one request and return its JSON body (None when empty), or raise the matching ``RedfishError``."""
        client = self._client
        if client is None:
            raise RuntimeError("RedfishClient is used outside its 'async with' block")
        what = f"{method} {path}"
        url = httpx.URL(self.origin).copy_with(raw_path=path.encode("ascii"))
        if credentials and self._systems_path is None:
            await self._service_root()
        try:
            with anyio.fail_after(self._timeout):
                async with client.stream(method, url, json=body, auth=self._auth if credentials else None) as response:
                    self._check_peer(response)
                    status = response.status_code
                    raw = await self._read(response, what)
        except TimeoutError:
            raise RedfishError(
                BMC_UNREACHABLE, f"The BMC did not answer {what} within {self._timeout:g} s.", retryable=True
            ) from None
        except httpx.HTTPError as error:
            raise self._transport_error(error, what) from None
        logger.debug("BMC %s: %s -> %s", self.origin, what, status)
        if 200 <= status < 300:
            return decode(raw, what) if raw.strip() else None
        raise self._status_error(status, raw, what)

    async def _service_root(self) -> str:
        """The systems collection's path, from the service root (fetched once).

        The service root needs no credentials, and it is always this client's first request: with a pin,
        ``_check_peer`` proves on it that connections go through the pinning handshake before any credential is sent.
        """
        if self._systems_path is None:
            root = json_object(await self._send("GET", ROOT, None, credentials=False), "service root")
            self._systems_path = link(root, "Systems", "service root") or f"{ROOT}/Systems"
        return self._systems_path

    def _check_peer(self, response: httpx.Response) -> None:
        if not self._https or self._tls is None or self._tls.pin_sha256 is None:
            return
        stream = response.extensions.get("network_stream")
        ssl_object = stream.get_extra_info("ssl_object") if stream is not None else None
        der = ssl_object.getpeercert(binary_form=True) if isinstance(ssl_object, ssl.SSLObject) else None
        if (
            not isinstance(ssl_object, PinnedSSLObject)
            or der is None
            or not hmac.compare_digest(hashlib.sha256(der).hexdigest(), self._tls.pin_sha256)
        ):
            raise RedfishError(
                BMC_TLS_FAILED, "The connection to the BMC was not checked against the certificate pin; refusing it."
            )

    async def _read(self, response: httpx.Response, what: str) -> bytes:
        encoding = response.headers.get("content-encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):
            raise bad_response(f"The BMC compressed its answer to {what} although it was asked not to.")
        declared = response.headers.get("content-length")
        if declared is not None and declared.strip().isdigit() and int(declared) > MAX_BODY_BYTES:
            raise bad_response(f"The BMC's answer to {what} is larger than {MAX_BODY_BYTES} bytes.")
        chunks: list[bytes] = []
        size = 0
        async for chunk in response.aiter_raw():
            size += len(chunk)
            if size > MAX_BODY_BYTES:
                raise bad_response(f"The BMC's answer to {what} is larger than {MAX_BODY_BYTES} bytes.")
            chunks.append(chunk)
        return b"".join(chunks)

    def _transport_error(self, error: httpx.HTTPError, what: str) -> RedfishError:
        cause: BaseException | None = error
        while cause is not None:
            if isinstance(cause, PinMismatchError):
                return RedfishError(
                    BMC_TLS_FAILED,
                    # The presented certificate's hash is not shown: a caller who may enroll any URL would learn
                    # the certificates of hosts the control plane reaches, and then pin them.
                    f"The BMC at {self.origin} presented a certificate that does not match the pin; nothing was"
                    " sent to it.",
                )
            if isinstance(cause, ssl.SSLCertVerificationError):
                reason = excerpt(str(cause.verify_message or cause.reason or "not trusted"), ())
                return RedfishError(BMC_TLS_FAILED, f"The BMC's certificate at {self.origin} did not verify: {reason}.")
            if isinstance(cause, ssl.SSLError) and not isinstance(cause, ssl.SSLEOFError | ssl.SSLZeroReturnError):
                reason = excerpt(str(cause.reason or cause.__class__.__name__), ())
                return RedfishError(
                    BMC_TLS_FAILED, f"The TLS handshake with the BMC at {self.origin} failed: {reason}."
                )
            cause = cause.__cause__ or cause.__context__
        if isinstance(error, httpx.TimeoutException):
            return RedfishError(
                BMC_UNREACHABLE, f"The BMC did not answer {what} within {self._timeout:g} s.", retryable=True
            )
        if isinstance(error, httpx.RemoteProtocolError | httpx.DecodingError):
            return bad_response(f"The BMC's answer to {what} is not valid HTTP.")
        if isinstance(error, httpx.TransportError):
            detail = excerpt(str(error), self._secrets) or type(error).__name__
            return RedfishError(
                BMC_UNREACHABLE, f"The BMC at {self.origin} could not be reached: {detail}.", retryable=True
            )
        return RedfishError(BMC_ERROR, f"The request {what} to the BMC failed: {type(error).__name__}.")

    def _status_error(self, status: int, raw: bytes, what: str) -> RedfishError:
        if status in (401, 403):
            return RedfishError(
                BMC_AUTH_FAILED, f"The BMC refused the credentials ({status} on {what}).", status=status
            )
        if status == 404:
            return RedfishError(BMC_NOT_FOUND, f"The BMC has no {what.partition(' ')[2]} (404).", status=status)
        if 300 <= status < 400:
            return RedfishError(
                BMC_ERROR, f"The BMC redirected {what} ({status}); redirects are not followed.", status=status
            )
        said = self._said(raw)
        return RedfishError(
            BMC_ERROR,
            f"The BMC answered {status} to {what}" + (f": {said}" if said else "."),
            retryable=status >= 500 or status == 429,
            status=status,
        )

    def _said(self, raw: bytes) -> str:
        """A short, cleaned excerpt of a Redfish error body's message (never the body as sent)."""
        try:
            body = json.loads(raw[:16384])
        except (ValueError, RecursionError):
            return ""
        if not isinstance(body, dict) or not isinstance(body.get("error"), dict):
            return ""
        error = body["error"]
        message = error.get("message")
        info = error.get("@Message.ExtendedInfo")
        if isinstance(info, list) and info and isinstance(info[0], dict) and isinstance(info[0].get("Message"), str):
            message = info[0]["Message"]
        return excerpt(message, self._secrets) if isinstance(message, str) else ""
