"""``RegisterImageInput`` through the codec: whatever a client sends is either refused as ``INVALID_INPUT`` at a
field of the input, or an image whose every rule holds (a URL a daemon may fetch, no credentials in it, the disk-only
fields on disk images only)."""

from __future__ import annotations

import urllib.parse
from typing import Any

import attrs
from hypothesis import given, settings
from hypothesis import strategies as st

from bettercompute._runtime.codec import decode, storable
from bettercompute.errors import InvalidInputError
from bettercompute.modules.images import RegisterImageInput, url_problem
from tests.strategies import hostile_text, json_bodies

FIELDS = {f.name for f in attrs.fields(RegisterImageInput)}

_URLS = st.one_of(
    st.sampled_from(
        [
            "https://images.example.com/a.img",
            "http://10.0.0.1:8080/a.img",
            "file:///srv/images/a.img",
            "file:relative.img",
            "javascript:alert(1)",
            "https://u:p@x.example/a",
            "file:///a/../b",
        ]
    ),
    st.builds(
        "{}{}{}".format,
        st.sampled_from(["https://", "http://", "file://", "file:///", "file:", "HTTP://", "", "ftp://"]),
        st.sampled_from(["", "user@", "user:pw@", "@", "x.example", "[::1]", "x.example:70000"]),
        st.one_of(hostile_text(), st.from_regex(r"(/[a-z.%0-9]{0,8}){0,4}([?#][a-z=]{0,4})?", fullmatch=True)),
    ),
)
ANCHORS = {
    "tenant": st.just("acme"),
    "name": st.from_regex(r"[a-z][a-z0-9-]{0,10}", fullmatch=True),
    "url": _URLS,
    "sha256": st.just("a" * 64),
    "kernel": st.just("img_0123456789abcdef"),
    "initrd": st.just("img_0123456789abcdef"),
    "cmdline": st.sampled_from(["console=ttyS0", "quiet splash", "a\nb"]),
}


def _holds(image: RegisterImageInput) -> None:
    url = image.url
    assert url_problem(url) is None
    assert url.isascii() and url.isprintable() and " " not in url and len(url) <= 2048
    parts = urllib.parse.urlsplit(url)
    assert parts.scheme in ("https", "http", "file")
    if parts.scheme == "file":
        # No '..' segment: a name that merely holds two dots ('user@..') goes nowhere, as url_problem documents.
        segments = urllib.parse.unquote(parts.path).split("/")
        assert url.startswith("file:///") and parts.netloc == "" and ".." not in segments
    else:
        assert parts.hostname and "@" not in parts.netloc and not parts.fragment
    for field in ("tenant", "name", "url", "sha256", "kernel", "initrd", "cmdline"):
        value = getattr(image, field)
        assert value is None or (storable(value) and value.isascii()), field
    if image.kind != "disk":
        assert image.format is None and image.min_disk_gib is None and image.kernel is None
        assert image.initrd is None and dict(image.provider_images) == {}
    if image.initrd is not None:
        assert image.kernel is not None
    if image.cmdline is not None:
        assert image.kind != "initrd" and len(image.cmdline) <= 1024
    assert len(image.provider_images) <= 16
    for key, value in image.provider_images.items():
        assert key.isascii() and 1 <= len(key) <= 32 and value.isascii() and 1 <= len(value) <= 256


@settings(max_examples=400, deadline=None)
@given(body=json_bodies(RegisterImageInput, ANCHORS) | json_bodies(RegisterImageInput, ANCHORS, junk=True))
def test_a_body_is_refused_at_one_of_its_fields_or_keeps_every_rule(body: dict[str, Any]) -> None:
    try:
        image = decode(RegisterImageInput, body)
    except InvalidInputError as refused:
        head = refused.details["path"].split(".")[0]
        # A field of the input, or (quoted, perhaps cut short) a field the input does not have.
        assert head in FIELDS or set(body) - FIELDS, refused.details
        return
    _holds(image)


@settings(max_examples=400, deadline=None)
@given(url=_URLS)
def test_a_url_is_accepted_only_in_a_form_a_daemon_may_fetch(url: str) -> None:
    body = {"tenant": "acme", "name": "a", "kind": "disk", "url": url, "sha256": "a" * 64}
    try:
        image = decode(RegisterImageInput, body)
    except InvalidInputError as refused:
        assert refused.details["path"] == "url"
        return
    _holds(image)
