"""The embedded IAM's own options are checked when it is built: a bad one is INVALID_CONFIG, never a TypeError."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from bettercompute.errors import InvalidConfigError
from bettercompute_iam import EmbeddedIam


@pytest.mark.parametrize(
    ("options", "problems"),
    [
        ({"cache_ttl": dt.timedelta(seconds=-1)}, ["iam.cache_ttl"]),
        ({"cache_ttl": 30}, ["iam.cache_ttl"]),
        ({"cache_ttl": None}, ["iam.cache_ttl"]),
        ({"cache_size": 0}, ["iam.cache_size"]),
        ({"cache_size": True}, ["iam.cache_size"]),
        ({"cache_size": 1.5}, ["iam.cache_size"]),
        ({"cache_ttl": "30s", "cache_size": -1}, ["iam.cache_ttl", "iam.cache_size"]),
    ],
)
def test_bad_cache_options_are_invalid_config(options: dict[str, Any], problems: list[str]) -> None:
    with pytest.raises(InvalidConfigError) as info:
        EmbeddedIam(**options)
    listed = info.value.details["problems"]
    assert [p.split(":")[0] for p in listed] == problems


def test_a_zero_ttl_is_allowed() -> None:
    EmbeddedIam(cache_ttl=dt.timedelta(0), cache_size=1)
