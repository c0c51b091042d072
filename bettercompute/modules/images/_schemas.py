"""Inputs and outputs of the ``images`` group.

An image is fetched by whoever boots it (a site's boot server, a VPS host) from its URL and checked against its
SHA-256. The rules below are enforced by the codec (``INVALID_INPUT`` at the field's path) and published in the
OpenAPI document; the URL's form and the rules between fields (what only a disk image may have) are plain checks
beside them.
"""

from __future__ import annotations

import datetime as dt
import posixpath
import urllib.parse
from typing import Any, Literal

import attrs

from bettercompute.fields import Entries, Integer, Text
from bettercompute.paging import PageInput

__all__ = [
    "MAX_CMDLINE",
    "MAX_PROVIDER_IMAGES",
    "DiskFormat",
    "GetImageInput",
    "Image",
    "ImageKind",
    "ListImagesInput",
    "ListImagesOutput",
    "RegisterImageInput",
    "url_problem",
]

ImageKind = Literal["kernel", "initrd", "disk"]
DiskFormat = Literal["raw", "qcow2"]

MAX_URL = 2048
MAX_CMDLINE = 1024
MAX_PROVIDER_IMAGES = 16
MAX_SIZE = 2**50
MAX_DISK_GIB = 1 << 20

_ID = Text(pattern=r"[A-Za-z0-9._-]{1,128}", reason="must be 1 to 128 of A-Z, a-z, 0-9, '.', '_' and '-'")
_NAME = Text(
    pattern=r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?",
    reason="must be a DNS label: 1 to 63 of a-z, 0-9 and '-', not starting or ending in '-'",
)
_SHA256 = Text(pattern=r"[0-9a-f]{64}", reason="must be 64 lower-case hex digits (a SHA-256)")
# Printable ASCII only: no space, no control character, nothing a terminal or a log could render misleadingly. A
# path with a space or a non-ASCII name is written percent-encoded.
_URL_TEXT = Text(
    pattern=r"[\x21-\x7e]{1,2048}",
    reason=f"must be an https, http or file URL of at most {MAX_URL} printable ASCII characters",
)
_SIZE = Integer(minimum=1, maximum=MAX_SIZE, reason="must be between 1 and 2**50 bytes")
_MIN_DISK = Integer(minimum=1, maximum=MAX_DISK_GIB, reason=f"must be between 1 and {MAX_DISK_GIB} GiB")
# The kernel command line is handed to a boot loader or a hypervisor as it is: printable ASCII and spaces only.
_CMDLINE = Text(
    pattern=r"[\x20-\x7e]{1,1024}", reason=f"must be 1 to {MAX_CMDLINE} printable ASCII characters (spaces allowed)"
)
_PROVIDER_IMAGES = Entries(
    key=Text(pattern=r"[a-z0-9-]{1,32}", reason="must be a provider name: 1 to 32 of a-z, 0-9 and '-'"),
    value=Text(
        pattern=r"[\x21-\x7e]([\x20-\x7e]{0,254}[\x21-\x7e])?",
        reason="must be 1 to 256 printable ASCII characters, not starting or ending in a space",
    ),
    max_entries=MAX_PROVIDER_IMAGES,
    reason=f"at most {MAX_PROVIDER_IMAGES} provider images",
)


def url_problem(url: str) -> str | None:
    """Why ``url`` cannot be an image's URL, or ``None``.

    Accepted: ``https://host[:port]/...`` and ``http://host[:port]/...`` without user information or fragment, and
    ``file:///absolute/path`` (no host, no query or fragment, no ``.`` or ``..`` segment, no percent-encoded NUL or
    slash). The path names a file on the machine that fetches the image, not on the control plane; a daemon is meant
    to read it only from the directories it is configured to serve images from.
    """
    if "\\" in url:
        return "may not contain a backslash"
    scheme, colon, rest = url.partition(":")
    if not colon:
        return "must be an https, http or file URL"
    if scheme not in ("https", "http", "file"):
        return "must use https, http or file (in lower case)"
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError:
        return "is not a valid URL"
    if scheme == "file":
        if not rest.startswith("///"):
            return "a file URL must be file:///absolute/path (no host, no relative path)"
        if parts.query or parts.fragment or "?" in url or "#" in url:
            return "a file URL may not have a query or a fragment"
        path = parts.path
        if path in ("", "/") or path.endswith("/"):
            return "a file URL must name a file"
        lowered = path.lower()
        if "%00" in lowered or "%2f" in lowered or "%5c" in lowered:
            return "a file URL may not encode a NUL, a slash or a backslash"
        segments = urllib.parse.unquote(path).split("/")[1:]
        if any(s in ("", ".", "..") for s in segments) or posixpath.normpath(path) != path:
            return "a file URL's path must be normal: no empty, '.' or '..' segment"
        return None
    if not rest.startswith("//") or not parts.hostname:
        return "an http or https URL must name a host"
    if "@" in parts.netloc or parts.username is not None or parts.password is not None:
        # The URL is stored and listed back in the clear: credentials in it would leak.
        return "may not carry a user name or password"
    if parts.fragment or "#" in url:
        return "may not have a fragment"
    del port
    return None


def _url(_: Any, attribute: attrs.Attribute[Any], value: str) -> None:
    # After the Text rule (printable ASCII, length): the value is safe to reason about.
    problem = url_problem(value)
    if problem is not None:
        raise ValueError(problem, attribute, "<hidden>")


def _disk_only(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    # attrs runs validators once every field is set, so the kind is there to compare with.
    if value is not None and value != {} and instance.kind != "disk":
        raise ValueError(f"only a disk image has {attribute.name}", attribute, "<hidden>")


def _cmdline_kind(instance: Any, attribute: attrs.Attribute[Any], value: str | None) -> None:
    if value is not None and instance.kind == "initrd":
        raise ValueError("an initrd has no cmdline (give it with the kernel)", attribute, "<hidden>")


def _with_kernel(instance: Any, attribute: attrs.Attribute[Any], value: str | None) -> None:
    if value is not None and instance.kernel is None:
        raise ValueError("an initrd is booted with a kernel: give kernel too", attribute, "<hidden>")


@attrs.frozen(kw_only=True)
class RegisterImageInput:
    """An image to register in a tenant: a kernel, an initrd, or a disk image, fetched by URL and checked by SHA-256.

    Only a disk image has a ``format`` (``raw`` when left out), a ``min_disk_gib``, ``kernel`` and ``initrd`` (the ids
    of registered kernel and initrd images of the same tenant, for a disk booted by direct kernel boot) and
    ``provider_images`` (the provider's own image for the same system, by provider name: ``{"ec2": "ami-..."}``). An
    initrd without a kernel is refused; ``cmdline`` goes with a kernel or with a disk image.

    ``url`` is ``https``, ``http`` or ``file:///absolute/path``, a path on the machine that fetches the image (a
    daemon is meant to read it only from the directories it serves images from; see ``url_problem``). No user name
    or password in a URL: it is stored and listed in the clear.
    """

    tenant: str = attrs.field(validator=_ID)
    name: str = attrs.field(validator=_NAME)
    kind: ImageKind
    url: str = attrs.field(validator=attrs.validators.and_(_URL_TEXT, _url))
    sha256: str = attrs.field(validator=_SHA256)
    size: int | None = attrs.field(default=None, validator=_SIZE)
    format: DiskFormat | None = attrs.field(default=None, validator=_disk_only)
    min_disk_gib: int | None = attrs.field(default=None, validator=attrs.validators.and_(_MIN_DISK, _disk_only))
    kernel: str | None = attrs.field(default=None, validator=attrs.validators.and_(_ID, _disk_only))
    initrd: str | None = attrs.field(default=None, validator=attrs.validators.and_(_ID, _disk_only, _with_kernel))
    cmdline: str | None = attrs.field(default=None, validator=attrs.validators.and_(_CMDLINE, _cmdline_kind))
    provider_images: dict[str, str] = attrs.field(
        factory=dict, validator=attrs.validators.and_(_PROVIDER_IMAGES, _disk_only)
    )


@attrs.frozen(kw_only=True)
class Image:
    """A registered image. ``format`` is ``raw`` or ``qcow2`` for a disk image and null for a kernel or an initrd;
    ``created_by`` is the principal that registered it (null for images registered before it was recorded)."""

    id: str
    tenant: str
    name: str
    kind: ImageKind
    url: str
    sha256: str
    size: int | None
    format: DiskFormat | None
    min_disk_gib: int | None
    kernel_id: str | None
    initrd_id: str | None
    cmdline: str | None
    provider_images: dict[str, str]
    created_by: str | None
    created_at: dt.datetime


@attrs.frozen(kw_only=True)
class GetImageInput:
    """An image by id."""

    id: str = attrs.field(validator=_ID)


@attrs.frozen(kw_only=True)
class ListImagesInput(PageInput):
    """The tenant whose images to list."""

    tenant: str = attrs.field(validator=_ID)


@attrs.frozen(kw_only=True)
class ListImagesOutput:
    """A page of images, oldest first."""

    images: tuple[Image, ...]
    next_cursor: str | None
