"""The in-process ``api`` and HTTP give the same result, or the same error code, for any call (Hypothesis)."""

from __future__ import annotations

from typing import Any

import anyio
import attrs
import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bettercompute import BetterCompute
from bettercompute._runtime.codec import encode
from bettercompute.errors import ComputeError
from bettercompute.modules.system import VersionInput, WhoamiInput
from tests.strategies import wrong_types

from ._echo import EchoModule, FailInput, SayInput
from .conftest import MEMBER, OTHER_TENANT, ROOT, make_compute

_credentials = st.sampled_from([ROOT, MEMBER, OTHER_TENANT, "bcak_unknown", None])
# Fields of the wrong type are generated on purpose: attrs does not check types, the dispatcher must.
_anything = wrong_types()
_inputs = st.one_of(
    st.builds(VersionInput),
    st.builds(WhoamiInput),
    st.builds(FailInput, reason=st.one_of(st.text(max_size=5), _anything)),
    st.builds(
        SayInput,
        tenant=st.one_of(st.sampled_from(["acme", "evil", "root"]), _anything),
        text=st.one_of(st.text(max_size=5), _anything),
        times=st.one_of(st.integers(0, 3), _anything),
    ),
)
_METHODS = {VersionInput: "system/version", WhoamiInput: "system/whoami", SayInput: "echo/say", FailInput: "echo/fail"}


def _raw(input: Any) -> dict[str, Any]:
    # What a careless client would send: the fields as they are, wrong types included.
    return {
        k: (encode(v) if isinstance(v, str | int | bool | list) or v is None else v)
        for k, v in attrs.asdict(input).items()
    }


async def _both(compute: BetterCompute, credential: str | None, input: Any) -> tuple[Any, Any]:
    path = _METHODS[type(input)]
    group, name = path.split("/")
    spec = compute.registry.group(group)
    assert spec is not None
    call = getattr(compute.api.group(spec), name)
    try:
        in_process: Any = ("ok", encode(await call(credential, input)))
    except ComputeError as exc:
        in_process = ("error", exc.code)
    headers = {"content-type": "application/json"}
    if credential is not None:
        headers["authorization"] = f"Bearer {credential}"
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=compute.asgi), base_url="http://t") as client:
        response = await client.post(f"/api/compute/{path}", headers=headers, json=_raw(input))
    body = response.json()
    over_http = ("ok", body["data"]) if "data" in body else ("error", body["error"]["code"])
    return in_process, over_http


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(credential=_credentials, input=_inputs)
def test_in_process_and_http_agree(credential: str | None, input: Any) -> None:
    compute = make_compute(modules=[EchoModule()])
    in_process, over_http = anyio.run(_both, compute, credential, input)
    assert in_process == over_http
