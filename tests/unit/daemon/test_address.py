"""The gateway address ``bcd`` dials: ``host:port`` with an ASCII port in range, nothing else."""

from __future__ import annotations

import pytest

from bettercompute_daemon._agent import DaemonError, split_address


@pytest.mark.parametrize(
    ("address", "expected"),
    [("127.0.0.1:7443", ("127.0.0.1", 7443)), ("[::1]:443", ("::1", 443)), ("gw.example.com:1", ("gw.example.com", 1))],
)
def test_addresses_with_a_port(address: str, expected: tuple[str, int]) -> None:
    assert split_address(address) == expected


@pytest.mark.parametrize(
    "address",
    [
        "gw",
        "gw:",
        ":443",
        "gw:0",
        "gw:65536",
        "gw:-1",
        "gw:\uff14\uff14\uff13",  # full-width digits
        "gw:\u0664\u0664\u0663",  # Arabic-Indic digits
        "gw:44\u200f3",  # a bidirectional mark
        "gw:443\x00",
    ],
)
def test_anything_else_is_refused(address: str) -> None:
    with pytest.raises(DaemonError):
        split_address(address)
