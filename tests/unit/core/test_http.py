"""The HTTP transport and the dispatcher behind it, through ``httpx.ASGITransport`` (no server, no database)."""

from __future__ import annotations

import json
import logging
from typing import Any

import httpx
import pytest

from bettercompute import BetterCompute, Intercepted, Next
from bettercompute.modules.system import VersionInput
from bettercompute.testing import StaticIamDouble

from ._echo import EchoGroups, EchoModule, SayInput, calls
from .conftest import BYSTANDER, MEMBER, OTHER_TENANT, ROOT, make_compute

pytestmark = pytest.mark.anyio

URL = "/api/compute"


@pytest.fixture
def compute() -> BetterCompute:
    return make_compute(modules=[EchoModule()])


def _auth(credential: str) -> dict[str, str]:
    return {"authorization": f"Bearer {credential}", "content-type": "application/json"}


def _error(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["error"]["code"] == code
    assert "Traceback" not in response.text
    error: dict[str, Any] = body["error"]
    return error


async def test_a_method_answers_with_the_data_envelope(http: httpx.AsyncClient) -> None:
    response = await http.post(f"{URL}/system/version", headers=_auth(ROOT), json={})
    assert response.status_code == 200
    assert response.json()["data"]["version"] == "0.1.0"
    assert {"name": "echo", "version": "1.0.0"} in response.json()["data"]["modules"]


async def test_an_empty_body_is_an_empty_input(http: httpx.AsyncClient) -> None:
    response = await http.post(f"{URL}/system/whoami", headers={"authorization": f"Bearer {MEMBER}"})
    assert response.status_code == 200
    assert response.json()["data"]["principal_id"] == "alice"
    assert response.json()["data"]["is_root"] is False


async def test_malformed_json_is_400(http: httpx.AsyncClient) -> None:
    response = await http.post(f"{URL}/system/version", headers=_auth(ROOT), content=b"{nope")
    _error(response, 400, "INVALID_INPUT")


async def test_a_wrong_content_type_is_415(http: httpx.AsyncClient) -> None:
    headers = {"authorization": f"Bearer {ROOT}", "content-type": "text/plain"}
    response = await http.post(f"{URL}/system/version", headers=headers, content=b"{}")
    _error(response, 415, "INVALID_INPUT")


async def test_a_body_over_one_mib_is_413(http: httpx.AsyncClient) -> None:
    big = json.dumps({"tenant": "acme", "text": "x" * (1024 * 1024)}).encode()
    response = await http.post(f"{URL}/echo/say", headers=_auth(ROOT), content=big)
    error = _error(response, 413, "INVALID_INPUT")
    assert error["details"]["limit"] == 1024 * 1024


async def test_a_streamed_body_over_the_limit_is_413_without_a_length(http: httpx.AsyncClient) -> None:
    async def chunks() -> Any:
        for _ in range(20):
            yield b"x" * 65536

    response = await http.post(f"{URL}/echo/say", headers=_auth(ROOT), content=chunks())
    _error(response, 413, "INVALID_INPUT")


@pytest.mark.parametrize("path", ["/nope/version", "/system/nope", "/system", "/"])
async def test_an_unknown_group_or_method_is_404(http: httpx.AsyncClient, path: str) -> None:
    response = await http.post(f"{URL}{path}", headers=_auth(ROOT), json={})
    _error(response, 404, "NOT_FOUND")


async def test_a_get_on_a_method_is_405(http: httpx.AsyncClient) -> None:
    response = await http.get(f"{URL}/system/version", headers=_auth(ROOT))
    assert response.status_code == 405
    assert response.headers["allow"] == "POST"


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"authorization": "Basic cm9vdDpyb290"},
        {"authorization": "Bearer"},
        {"authorization": "Bearer not-a-known-credential"},
    ],
)
async def test_a_missing_or_garbled_credential_is_401(http: httpx.AsyncClient, headers: dict[str, str]) -> None:
    response = await http.post(f"{URL}/system/version", headers={**headers, "content-type": "application/json"})
    _error(response, 401, "UNAUTHENTICATED")
    assert response.headers["www-authenticate"].startswith("Bearer")


async def test_an_unknown_field_names_its_path(http: httpx.AsyncClient) -> None:
    response = await http.post(f"{URL}/echo/say", headers=_auth(ROOT), json={"tenant": "acme", "text": "hi", "x": 1})
    error = _error(response, 400, "INVALID_INPUT")
    assert error["details"]["path"] == "x"


async def test_a_caller_outside_the_tenant_is_denied_before_iam_decides(
    compute: BetterCompute, http: httpx.AsyncClient
) -> None:
    iam = compute.context.iam
    assert isinstance(iam, StaticIamDouble)
    calls.clear()
    response = await http.post(f"{URL}/echo/say", headers=_auth(OTHER_TENANT), json={"tenant": "acme", "text": "hi"})
    _error(response, 403, "ACCESS_DENIED")
    assert iam.decisions == []
    assert calls == []


async def test_the_tenant_itself_and_root_get_through(http: httpx.AsyncClient) -> None:
    for credential, caller in ((MEMBER, "alice"), (ROOT, "root-admin")):
        response = await http.post(f"{URL}/echo/say", headers=_auth(credential), json={"tenant": "acme", "text": "a"})
        assert response.json() == {"data": {"text": "a", "caller": caller}}


async def test_a_principal_without_the_action_never_reaches_the_handler(
    compute: BetterCompute, http: httpx.AsyncClient
) -> None:
    # A method whose handler records every call it gets, asked for in the caller's own tenant: only the missing
    # action stands between the request and the handler.
    iam = compute.context.iam
    assert isinstance(iam, StaticIamDouble)
    calls.clear()
    body = {"tenant": "acme", "text": "let me in"}
    response = await http.post(f"{URL}/echo/say", headers=_auth(BYSTANDER), json=body)
    error = _error(response, 403, "ACCESS_DENIED")
    assert error["details"]["action"] == "compute:echo:say"
    assert calls == []
    assert iam.decisions == []
    # The same request from a member who holds the action does reach it.
    response = await http.post(f"{URL}/echo/say", headers=_auth(MEMBER), json=body)
    assert response.status_code == 200, response.text
    assert calls == ["let me in"]


async def test_an_unexpected_failure_is_500_without_its_text(
    http: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    response = await http.post(f"{URL}/echo/fail", headers=_auth(ROOT), json={})
    error = _error(response, 500, "INTERNAL")
    assert "SELECT" not in response.text and "bcak_" not in response.text
    assert error["details"]["request_id"]
    assert error["details"]["request_id"] in caplog.text
    assert "SELECT" not in caplog.text and "s3cr3t" not in caplog.text and "Traceback" not in caplog.text


async def test_the_database_being_unreachable_is_503_and_retryable(
    compute: BetterCompute, http: httpx.AsyncClient
) -> None:
    await compute.context.store.open()
    try:
        response = await http.post(f"{URL}/echo/ping", headers=_auth(ROOT), json={})
    finally:
        await compute.context.store.close()
    error = _error(response, 503, "UNAVAILABLE")
    assert error["retryable"] is True
    assert "127.0.0.1" not in response.text and "postgres" not in response.text.lower()


async def test_readyz_is_503_while_the_database_is_unreachable(http: httpx.AsyncClient) -> None:
    response = await http.get("/readyz")
    assert response.status_code == 503
    assert response.json()["checks"]["database"] is False


async def test_healthz_needs_nothing(http: httpx.AsyncClient) -> None:
    response = await http.get("/healthz")
    assert response.status_code == 200


async def test_openapi_lists_every_method(compute: BetterCompute, http: httpx.AsyncClient) -> None:
    response = await http.get(f"{URL}/openapi.json")
    assert response.status_code == 200
    document = response.json()
    assert document["openapi"].startswith("3.1")
    paths = set(document["paths"])
    assert paths == {f"{URL}{m.path}" for m in compute.registry.methods()}
    say = document["paths"][f"{URL}/echo/say"]["post"]
    assert say["x-action"] == "compute:echo:say" and say["x-access"] == "read" and "parameters" not in say
    fail = document["paths"][f"{URL}/echo/fail"]["post"]
    assert fail["x-mutates"] is True and fail["x-access"] == "manage"
    assert [p["name"] for p in fail["parameters"]] == ["Idempotency-Key"]
    assert document["components"]["schemas"]["SayInput"]["required"] == ["tenant", "text"]


async def test_in_process_api_is_typed_and_authorized(compute: BetterCompute) -> None:
    output = await compute.api.system.version(ROOT, VersionInput())
    assert output.version == "0.1.0"
    echo = EchoGroups(compute.api).echo
    said = await echo.say(MEMBER, SayInput(tenant="acme", text="hi", times=2))
    assert said.text == "hihi"


async def test_plugins_wrap_the_handler_after_authorization() -> None:
    seen: list[str] = []

    class Recorder:
        name = "recorder"
        core_range = ">=0.1"
        actions: tuple[str, ...] = ()

        async def intercept(self, intercepted: Intercepted, next: Next) -> Any:
            call = intercepted.call
            seen.append(f"{call.method.group}.{call.method.name}")
            return await next(intercepted)

    compute = make_compute(modules=[EchoModule()], plugins=[Recorder()])
    await EchoGroups(compute.api).echo.say(MEMBER, SayInput(tenant="acme", text="x"))
    with pytest.raises(Exception, match="outside this tenant"):
        await EchoGroups(compute.api).echo.say(OTHER_TENANT, SayInput(tenant="acme", text="x"))
    assert seen == ["echo.say"]


async def test_deeply_nested_json_is_400_not_500(http: httpx.AsyncClient) -> None:
    body = b"[" * 200_000 + b"]" * 200_000
    response = await http.post(f"{URL}/system/version", headers=_auth(ROOT), content=body)
    _error(response, 400, "INVALID_INPUT")


async def test_a_client_that_leaves_before_its_body_runs_nothing(compute: BetterCompute) -> None:
    calls.clear()
    sent: list[Any] = []
    messages = iter(
        [{"type": "http.request", "body": b'{"tenant": "acme",', "more_body": True}, {"type": "http.disconnect"}]
    )

    async def receive() -> Any:
        return next(messages)

    async def send(message: Any) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "method": "POST",
        "path": f"{URL}/echo/say",
        "headers": [(b"authorization", f"Bearer {ROOT}".encode()), (b"content-type", b"application/json")],
    }
    await compute.asgi(scope, receive, send)
    assert calls == [] and sent == []


# JSON can spell what UTF-8 and PostgreSQL cannot hold: a NUL, and unpaired surrogates through \u escapes.
@pytest.mark.parametrize(
    ("body", "path"),
    [
        (b'{"tenant": "acme", "text": "a\\u0000b"}', "text"),
        (b'{"tenant": "acme", "text": "a\\ud800"}', "text"),
        (b'{"tenant": "acme", "text": "\\udfff\\ud800"}', "text"),
        (b'{"tenant": "acme", "text": "hi", "\\ud800": 1}', ""),
        (b'{"tenant": "acme", "text": "hi", "\\u0000": 1}', ""),
    ],
)
async def test_unstorable_text_is_400_naming_its_path(http: httpx.AsyncClient, body: bytes, path: str) -> None:
    calls.clear()
    response = await http.post(f"{URL}/echo/say", headers=_auth(ROOT), content=body)
    error = _error(response, 400, "INVALID_INPUT")
    assert error["details"]["path"] == path
    assert calls == []


@pytest.mark.parametrize("credential", ["root\x00x", "ro\u00e9t", "root credential", "root\x7f"])
async def test_a_credential_that_is_not_visible_ascii_is_401(compute: BetterCompute, credential: str) -> None:
    # httpx refuses such header values itself, so the ASGI scope is built by hand, as a lenient server passes it on.
    sent: list[Any] = []
    scope = {
        "type": "http",
        "method": "POST",
        "path": f"{URL}/system/version",
        "headers": [(b"authorization", f"Bearer {credential}".encode("latin-1"))],
    }

    async def receive() -> Any:
        return {"type": "http.request", "body": b""}

    async def send(message: Any) -> None:
        sent.append(message)

    await compute.asgi(scope, receive, send)
    assert sent[0]["status"] == 401
    assert json.loads(sent[1]["body"])["error"]["code"] == "UNAUTHENTICATED"


@pytest.mark.parametrize("header", ["authorization", "content-type", "content-length"])
async def test_a_header_given_twice_is_400(http: httpx.AsyncClient, header: str) -> None:
    calls.clear()
    values = {
        "authorization": [f"Bearer {ROOT}", f"Bearer {MEMBER}"],
        "content-type": ["application/json", "application/json"],
        "content-length": ["29", "29"],
    }[header]
    headers = [(name, value) for name, value in _auth(ROOT).items() if name != header]
    headers += [(header, value) for value in values]
    body = b'{"tenant": "acme", "text": "x"}'[: 29 if header == "content-length" else None]
    response = await http.post(f"{URL}/echo/say", headers=headers, content=body)
    error = _error(response, 400, "INVALID_INPUT")
    assert error["details"]["header"] == header
    assert calls == []


async def test_the_same_credential_twice_is_still_400(http: httpx.AsyncClient) -> None:
    headers = [("authorization", f"Bearer {ROOT}"), ("authorization", f"Bearer {ROOT}")]
    _error(await http.post(f"{URL}/system/version", headers=headers), 400, "INVALID_INPUT")


@pytest.mark.parametrize(
    "path",
    [
        "/system%2Fversion",
        "/system%2fversion",
        "/system%252Fversion",
        "/system%25252fversion",
        "%2Fsystem/version",
        "/system/%76ersion",
        "/system/version%2F",
    ],
)
async def test_an_escaped_method_path_is_404(http: httpx.AsyncClient, path: str) -> None:
    response = await http.post(f"{URL}{path}", headers=_auth(ROOT), json={})
    _error(response, 404, "NOT_FOUND")
    # The control: the same request spelled plainly is served.
    assert (await http.post(f"{URL}/system/version", headers=_auth(ROOT), json={})).status_code == 200


async def test_an_exception_inside_the_asgi_app_is_a_500_envelope_never_raised(
    compute: BetterCompute, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    sent: list[Any] = []

    async def receive() -> Any:
        raise RuntimeError("the body held 's3cr3t'")

    async def send(message: Any) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": f"{URL}/system/version", "headers": []}
    await compute.asgi(scope, receive, send)
    assert sent[0]["status"] == 500
    assert json.loads(sent[1]["body"])["error"]["code"] == "INTERNAL"
    assert "RuntimeError" in caplog.text and "s3cr3t" not in caplog.text


async def test_a_send_that_fails_after_the_response_started_is_not_raised(compute: BetterCompute) -> None:
    sent: list[Any] = []

    async def receive() -> Any:
        return {"type": "http.request", "body": b""}

    async def send(message: Any) -> None:
        sent.append(message)
        if message["type"] == "http.response.body":
            raise OSError("the client went away")

    scope = {"type": "http", "method": "GET", "path": f"{URL}/nope", "headers": []}
    await compute.asgi(scope, receive, send)
    # One response start only: nothing tries to answer a second time on a response already under way.
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
