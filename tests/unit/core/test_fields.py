"""Field rules are one source: what the OpenAPI document publishes is what the codec enforces, for every field of every
registered input (all built-in modules and IAM), judged by a JSON Schema validator other than ours."""

from __future__ import annotations

import functools
import typing
from pathlib import Path
from typing import Any

import attrs
import jsonschema_rs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bettercompute import JoinSettings, LocalKeyKms, Options, better_compute
from bettercompute._runtime.openapi import openapi_document
from bettercompute.fields import Integer, Number, Rule, Text, rules_of
from bettercompute_iam import EmbeddedIam
from bettercompute_store_pg import PgStore
from tests.strategies import text_rule_candidates

from .conftest import UNREACHABLE


def _full_registry() -> Any:
    compute = better_compute(
        Options(
            store=PgStore(UNREACHABLE),
            iam=EmbeddedIam(),
            kms=LocalKeyKms(Path("/nonexistent/kms.key")),
            join=JoinSettings(gateway_address="gw.example:443", trust_domain="example.com"),
        )
    )
    return compute.registry


REGISTRY = _full_registry()
DOCUMENT = openapi_document(REGISTRY, "/api/compute")
SCHEMAS = DOCUMENT["components"]["schemas"]


def _inputs() -> list[type]:
    found: list[type] = []
    pending = [m.input for m in REGISTRY.methods()]
    while pending:
        cls = pending.pop()
        if cls in found:
            continue
        found.append(cls)
        for hint in typing.get_type_hints(cls).values():
            for part in (hint, *typing.get_args(hint)):
                if isinstance(part, type) and attrs.has(part):
                    pending.append(part)
    return found


FIELDS = [(cls, field, rule) for cls in _inputs() for field in attrs.fields(cls) for rule in rules_of(field)]


def _one_field_per_rule(kind: type) -> list[tuple[type, attrs.Attribute[Any], Any]]:
    """Of the fields whose rule is a ``kind``, the first with each distinct rule: the rule alone decides what a
    property below compares, and most rules (a tenant's, a name's) serve many inputs (117 text fields, 22 rules)."""
    first: dict[Any, tuple[type, attrs.Attribute[Any], Any]] = {}
    for found in FIELDS:
        if isinstance(found[2], kind):
            first.setdefault(found[2], found)
    return list(first.values())


def test_every_input_field_with_a_rule_is_found() -> None:
    # The control for the property below: the registry's rules are there to compare (pools, webhooks, secrets,
    # nodes, IAM), so the comparison cannot pass by comparing nothing.
    owners = {cls.__module__.split(".")[0] + ":" + cls.__name__ for cls, _, _ in FIELDS}
    assert {
        "bettercompute:CreatePoolInput",
        "bettercompute:CreateWebhookInput",
        "bettercompute:CreateSecretInput",
    } <= owners
    assert "bettercompute_iam:CreatePrincipalInput" in owners
    assert len(FIELDS) > 40


def test_the_document_carries_patterns_lengths_ranges_and_enums() -> None:
    pool = SCHEMAS["CreatePoolInput"]["properties"]
    assert pool["tenant"]["pattern"] == "^(?:[A-Za-z0-9._-]{1,128})$"
    assert pool["name"]["pattern"].startswith("^(?:[a-z0-9]")
    assert pool["pool_class"] == {"enum": ["gpu", "vps-host", "provider"]}
    checks = pool["acceptance_checks"]
    assert checks["maxItems"] == 32 and checks["uniqueItems"] is True and checks["items"]["maxLength"] == 128
    labels = pool["labels"]
    assert labels["maxProperties"] == 64 and "pattern" in labels["propertyNames"]
    assert "pattern" in labels["additionalProperties"]
    uses = SCHEMAS["CreateJoinTokenInput"]["properties"]["uses"]
    assert (uses["minimum"], uses["maximum"]) == (1, 10_000)
    renamed = SCHEMAS["UpdatePoolInput"]["properties"]["name"]["anyOf"]
    assert {"type": "null"} in renamed and any("pattern" in b for b in renamed)
    value = SCHEMAS["CreateSecretInput"]["properties"]["value"]
    assert (value["minLength"], value["maxLength"]) == (1, 64 * 1024)
    paged = SCHEMAS["ListDeliveriesInput"]["properties"]
    assert (paged["limit"]["minimum"], paged["limit"]["maximum"]) == (1, 1000)
    assert any("pattern" in b and b.get("maxLength") == 1024 for b in paged["cursor"]["anyOf"])
    assert "allOf" in SCHEMAS["CreateBindingInput"]
    # A body is required when a field is.
    operations = {op["post"]["operationId"]: op["post"] for op in DOCUMENT["paths"].values()}
    assert operations["pools.create"]["requestBody"]["required"] is True
    assert operations["system.version"]["requestBody"]["required"] is False


_TYPES = {Integer: "integer", Number: "number"}


# Made once a rule (a strategy made in every example is validated, and its regex compiled, in every example).
_candidates = functools.cache(text_rule_candidates)


@functools.cache
def _validator(rule: Rule) -> Any:
    return jsonschema_rs.Draft202012Validator({"type": _TYPES.get(type(rule), "string"), **rule.schema()})


@pytest.mark.parametrize(
    ("cls", "field", "rule"),
    _one_field_per_rule(Text),
    ids=lambda v: getattr(v, "__name__", getattr(v, "name", "")),
)
@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_a_text_rule_and_its_published_schema_agree(
    cls: type, field: attrs.Attribute[Any], rule: Text, data: st.DataObject
) -> None:
    value = data.draw(_candidates(rule))
    assert _validator(rule).is_valid(value) == (rule.problem(value) is None), (cls.__name__, field.name, value)


@pytest.mark.parametrize(
    ("cls", "field", "rule"),
    _one_field_per_rule(Integer),
    ids=lambda v: getattr(v, "__name__", getattr(v, "name", "")),
)
@given(value=st.integers(-(2**40), 2**40) | st.integers(-3, 3) | st.integers(10_000 - 2, 10_000 + 2))
def test_an_integer_rule_and_its_published_schema_agree(
    cls: type, field: attrs.Attribute[Any], rule: Integer, value: int
) -> None:
    try:
        rule(None, field, value)
        accepted = True
    except ValueError:
        accepted = False
    assert _validator(rule).is_valid(value) == accepted


NUMBER_FIELDS = _one_field_per_rule(Number)


def test_number_rules_are_found() -> None:
    # The control for the property below: quotas.set's GPU-hours is a Number rule.
    assert any(cls.__name__ == "SetQuotaInput" for cls, _, _ in NUMBER_FIELDS)


@pytest.mark.parametrize(
    ("cls", "field", "rule"), NUMBER_FIELDS, ids=lambda v: getattr(v, "__name__", getattr(v, "name", ""))
)
@given(
    value=st.floats(allow_nan=False, allow_infinity=False)
    | st.floats(-2.0, 2.0)
    | st.integers(-(2**40), 2**40)
    | st.sampled_from([0, -0.0, 744_000_000, 744_000_000.0001, 5e-324])
)
def test_a_number_rule_and_its_published_schema_agree(
    cls: type, field: attrs.Attribute[Any], rule: Number, value: float
) -> None:
    try:
        rule(None, field, value)
        accepted = True
    except ValueError:
        accepted = False
    assert _validator(rule).is_valid(value) == accepted, (cls.__name__, field.name, value)
