"""The ``images`` group: register, list and get; every class of bad input refused at its field, with nothing
written; references to kernels and initrds checked by kind and tenant; replays by idempotency key."""

from __future__ import annotations

import json
from typing import Any

import pytest

from bettercompute.errors import ComputeError, ConflictError, InvalidInputError, NotFoundError
from bettercompute.modules.images import GetImageInput, Image, ListImagesInput, RegisterImageInput

from .conftest import Plane

pytestmark = [pytest.mark.anyio, pytest.mark.pg]

SHA = "0123456789abcdef" * 4


def _body(plane: Plane, **fields: Any) -> dict[str, Any]:
    return {
        "tenant": plane.acme,
        "name": "ubuntu",
        "kind": "disk",
        "url": "https://images.example.com/ubuntu.img",
        "sha256": SHA,
        **fields,
    }


async def _register(plane: Plane, name: str, kind: str, **fields: Any) -> Image:
    return await plane.images.register(
        plane.alice,
        RegisterImageInput(
            tenant=fields.pop("tenant", plane.acme),
            name=name,
            kind=kind,  # type: ignore[arg-type]  # a literal from the test's own parameters
            url=fields.pop("url", f"https://images.example.com/{name}"),
            sha256=SHA,
            **fields,
        ),
    )


# --- the happy paths --------------------------------------------------------------------------------------------


async def test_register_list_get(plane: Plane) -> None:
    kernel = await _register(plane, "vmlinuz", "kernel", cmdline="console=ttyS0 root=/dev/vda1", size=4096)
    initrd = await _register(plane, "initrd", "initrd", url="file:///var/lib/bcd/images/initrd.img")
    disk = await _register(
        plane,
        "ubuntu-24-04",
        "disk",
        size=3 << 30,
        min_disk_gib=10,
        kernel=kernel.id,
        initrd=initrd.id,
        cmdline="console=ttyS0",
        provider_images={"ec2": "ami-0123456789abcdef0", "gcp": "projects/ubuntu-os-cloud/global/images/x"},
    )
    qcow = await _register(plane, "debian", "disk", format="qcow2")
    assert kernel.kind == "kernel" and kernel.format is None and kernel.cmdline == "console=ttyS0 root=/dev/vda1"
    assert initrd.url == "file:///var/lib/bcd/images/initrd.img" and initrd.size is None
    assert disk.format == "raw", "a disk image is raw unless it says otherwise"
    assert (disk.kernel_id, disk.initrd_id, disk.min_disk_gib) == (kernel.id, initrd.id, 10)
    assert disk.provider_images == {"ec2": "ami-0123456789abcdef0", "gcp": "projects/ubuntu-os-cloud/global/images/x"}
    assert qcow.format == "qcow2" and qcow.provider_images == {}
    assert disk.created_by is not None and disk.id.startswith("img_")

    assert await plane.images.get(plane.alice, GetImageInput(id=disk.id)) == disk
    listed = await plane.images.list(plane.alice, ListImagesInput(tenant=plane.acme))
    assert listed.images == (kernel, initrd, disk, qcow) and listed.next_cursor is None
    first = await plane.images.list(plane.alice, ListImagesInput(tenant=plane.acme, limit=3))
    assert first.images == (kernel, initrd, disk) and first.next_cursor is not None
    rest = await plane.images.list(plane.alice, ListImagesInput(tenant=plane.acme, cursor=first.next_cursor))
    assert rest.images == (qcow,)
    # Over HTTP, the same image, field for field.
    got = await plane.post("images/get", {"id": disk.id})
    assert got.status_code == 200 and got.json()["data"]["provider_images"]["ec2"] == "ami-0123456789abcdef0"


async def test_a_name_is_unique_in_its_tenant_only(plane: Plane) -> None:
    await _register(plane, "os", "disk")
    with pytest.raises(ConflictError) as taken:
        await _register(plane, "os", "kernel")
    assert taken.value.details["path"] == "name"
    theirs = await plane.images.register(
        plane.mallory,
        RegisterImageInput(tenant=plane.globex, name="os", kind="disk", url="https://x.example/os", sha256=SHA),
    )
    assert theirs.tenant == plane.globex


async def test_another_tenants_image_is_not_theirs_to_read(plane: Plane) -> None:
    mine = await _register(plane, "private", "disk")
    answers = []
    for image_id in (mine.id, "img_0000000000000000"):
        with pytest.raises(ComputeError) as refused:
            await plane.images.get(plane.mallory, GetImageInput(id=image_id))
        answers.append((refused.value.code, refused.value.message))
    # Someone else's image and no image at all are told apart by nothing.
    assert answers[0] == answers[1]
    with pytest.raises(ComputeError) as listed:
        await plane.images.list(plane.mallory, ListImagesInput(tenant=plane.acme))
    assert listed.value.code == "ACCESS_DENIED"
    assert (await plane.images.list(plane.mallory, ListImagesInput(tenant=plane.globex))).images == ()


async def test_a_replay_by_idempotency_key_registers_once(plane: Plane) -> None:
    request = RegisterImageInput(tenant=plane.acme, name="replayed", kind="disk", url="https://x.example/a", sha256=SHA)
    first = await plane.images.register(plane.alice, request, idempotency_key="img-1")
    again = await plane.images.register(plane.alice, request, idempotency_key="img-1")
    assert again == first
    other = RegisterImageInput(tenant=plane.acme, name="other", kind="disk", url="https://x.example/b", sha256=SHA)
    with pytest.raises(ConflictError) as reused:
        await plane.images.register(plane.alice, other, idempotency_key="img-1")
    assert reused.value.details["reason"] == "idempotency_key_reused"
    assert [i.name for i in (await plane.images.list(plane.alice, ListImagesInput(tenant=plane.acme))).images] == [
        "replayed"
    ]


# --- references to kernels and initrds --------------------------------------------------------------------------


async def test_kernel_and_initrd_references_are_checked_and_nothing_is_written_on_refusal(plane: Plane) -> None:
    kernel = await _register(plane, "vmlinuz", "kernel")
    initrd = await _register(plane, "initrd", "initrd")
    theirs = await plane.images.register(
        plane.mallory,
        RegisterImageInput(tenant=plane.globex, name="k", kind="kernel", url="https://x.example/k", sha256=SHA),
    )
    before = (await plane.count("images"), await plane.count("audit"))
    cases: list[tuple[dict[str, Any], type[ComputeError], str]] = [
        ({"kernel": initrd.id}, InvalidInputError, "kernel"),
        ({"kernel": kernel.id, "initrd": kernel.id}, InvalidInputError, "initrd"),
        ({"kernel": "img_0000000000000000"}, NotFoundError, "kernel"),
        ({"kernel": kernel.id, "initrd": "img_0000000000000000"}, NotFoundError, "initrd"),
        ({"kernel": theirs.id}, NotFoundError, "kernel"),
    ]
    for fields, error, path in cases:
        with pytest.raises(error) as refused:
            await plane.images.register(plane.alice, RegisterImageInput(**_body(plane, **fields)))
        assert refused.value.details["path"] == path, fields
        # Whose image it was is not said: another tenant's kernel reads as no kernel.
        assert theirs.id not in refused.value.message
    assert (await plane.count("images"), await plane.count("audit")) == before
    made = await plane.images.register(plane.alice, RegisterImageInput(**_body(plane, kernel=kernel.id)))
    assert made.kernel_id == kernel.id and made.initrd_id is None


async def test_an_unknown_tenant_is_not_found_and_nothing_is_written(plane: Plane) -> None:
    before = await plane.count("images")
    answer = await plane.post("images/register", _body(plane, tenant="tn_nobody"), credential=plane.root)
    assert answer.status_code == 404 and answer.json()["error"]["details"]["path"] == "tenant"
    assert await plane.count("images") == before


# --- bad input, over HTTP, field by field -----------------------------------------------------------------------

BAD_INPUTS: list[tuple[str, dict[str, Any], str]] = [
    # Text PostgreSQL and UTF-8 cannot carry, and text that reads other than it is.
    ("NUL in the name", {"name": "ubu\x00ntu"}, "name"),
    ("NUL in the URL", {"url": "https://x.example/a\x00b"}, "url"),
    ("NUL in the cmdline", {"cmdline": "quiet\x00"}, "cmdline"),
    ("NUL in a provider image", {"provider_images": {"ec2": "ami-\x00"}}, "provider_images.ec2"),
    ("right-to-left override in the name", {"name": "ubuntu\u202egpj"}, "name"),
    ("left-to-right mark in the name", {"name": "\u200eubuntu"}, "name"),
    ("bidi mark in the URL", {"url": "https://x.example/\u202etxt.img"}, "url"),
    ("bidi mark in the cmdline", {"cmdline": "root=\u2066/dev/sda"}, "cmdline"),
    ("bidi mark in a provider image", {"provider_images": {"ec2": "ami-\u202e1"}}, "provider_images"),
    ("full-width name", {"name": "\uff55buntu"}, "name"),
    ("upper-case name", {"name": "Ubuntu"}, "name"),
    ("empty name", {"name": ""}, "name"),
    # Checksums and sizes.
    ("short sha256", {"sha256": "abc"}, "sha256"),
    ("upper-case sha256", {"sha256": SHA.upper()}, "sha256"),
    ("sha256 with a prefix", {"sha256": "sha256:" + SHA}, "sha256"),
    ("non-hex sha256", {"sha256": "g" * 64}, "sha256"),
    ("negative size", {"size": -1}, "size"),
    ("zero size", {"size": 0}, "size"),
    ("huge size", {"size": 2**63}, "size"),
    ("fractional size", {"size": 1.5}, "size"),
    ("size as text", {"size": "100"}, "size"),
    ("zero min_disk_gib", {"min_disk_gib": 0}, "min_disk_gib"),
    ("negative min_disk_gib", {"min_disk_gib": -10}, "min_disk_gib"),
    ("huge min_disk_gib", {"min_disk_gib": 2**40}, "min_disk_gib"),
    ("unknown format", {"format": "vmdk"}, "format"),
    ("unknown kind", {"kind": "iso"}, "kind"),
    # URLs: schemes, forms, credentials.
    ("relative file URL", {"url": "file:relative/path.img"}, "url"),
    ("file URL with one slash", {"url": "file:/abs/path.img"}, "url"),
    ("file URL with a host", {"url": "file://fileserver/images/a.img"}, "url"),
    ("file URL with dot-dot", {"url": "file:///var/lib/images/../../etc/shadow"}, "url"),
    ("file URL with encoded dot-dot", {"url": "file:///var/lib/images/%2e%2e/shadow"}, "url"),
    ("file URL with an encoded NUL", {"url": "file:///var/lib/images/a%00.img"}, "url"),
    ("file URL with an encoded slash", {"url": "file:///var/lib/images%2fa.img"}, "url"),
    ("file URL of a directory", {"url": "file:///var/lib/images/"}, "url"),
    ("file URL of the root", {"url": "file:///"}, "url"),
    ("file URL with a query", {"url": "file:///a.img?x=1"}, "url"),
    ("javascript URL", {"url": "javascript:alert(1)"}, "url"),
    ("data URL", {"url": "data:text/plain;base64,AAAA"}, "url"),
    ("ftp URL", {"url": "ftp://x.example/a.img"}, "url"),
    ("upper-case scheme", {"url": "HTTPS://x.example/a.img"}, "url"),
    ("no scheme", {"url": "x.example/a.img"}, "url"),
    ("scheme-relative URL", {"url": "//x.example/a.img"}, "url"),
    ("no host", {"url": "https:///a.img"}, "url"),
    ("http without slashes", {"url": "http:x.example/a.img"}, "url"),
    ("user and password in the URL", {"url": "https://user:secret@x.example/a.img"}, "url"),
    ("user in the URL", {"url": "https://user@x.example/a.img"}, "url"),
    ("empty userinfo in the URL", {"url": "https://@x.example/a.img"}, "url"),
    ("fragment", {"url": "https://x.example/a.img#top"}, "url"),
    ("space in the URL", {"url": "https://x.example/a b.img"}, "url"),
    ("newline in the URL", {"url": "https://x.example/a.img\r\nX-Injected: 1"}, "url"),
    ("non-ASCII host", {"url": "https://ex\u0430mple.com/a.img"}, "url"),
    ("backslash", {"url": "https://x.example\\@evil.example/a.img"}, "url"),
    ("bad port", {"url": "https://x.example:99999/a.img"}, "url"),
    ("too long a URL", {"url": "https://x.example/" + "a" * 2048}, "url"),
    # The kernel command line and provider images.
    ("too long a cmdline", {"cmdline": "a" * 1025}, "cmdline"),
    ("newline in the cmdline", {"cmdline": "quiet\ninit=/bin/sh"}, "cmdline"),
    ("tab in the cmdline", {"cmdline": "quiet\tsplash"}, "cmdline"),
    ("empty cmdline", {"cmdline": ""}, "cmdline"),
    ("too many provider images", {"provider_images": {f"p{i}": "x" for i in range(17)}}, "provider_images"),
    ("upper-case provider", {"provider_images": {"EC2": "ami-1"}}, "provider_images"),
    ("too long a provider name", {"provider_images": {"p" * 33: "x"}}, "provider_images"),
    ("provider name with a dot", {"provider_images": {"ec2.eu": "ami-1"}}, "provider_images"),
    ("empty provider image", {"provider_images": {"ec2": ""}}, "provider_images"),
    ("too long a provider image", {"provider_images": {"ec2": "a" * 257}}, "provider_images"),
    ("provider image starting with a space", {"provider_images": {"ec2": " ami-1"}}, "provider_images"),
    ("provider image that is not text", {"provider_images": {"ec2": 7}}, "provider_images.ec2"),
    ("provider images that are a list", {"provider_images": ["ec2"]}, "provider_images"),
    # What only a disk image has.
    ("format of a kernel", {"kind": "kernel", "format": "raw"}, "format"),
    ("min_disk_gib of an initrd", {"kind": "initrd", "min_disk_gib": 1}, "min_disk_gib"),
    ("kernel of a kernel", {"kind": "kernel", "kernel": "img_0000000000000000"}, "kernel"),
    ("provider images of a kernel", {"kind": "kernel", "provider_images": {"ec2": "ami-1"}}, "provider_images"),
    ("cmdline of an initrd", {"kind": "initrd", "cmdline": "quiet"}, "cmdline"),
    ("initrd without a kernel", {"initrd": "img_0000000000000000"}, "initrd"),
    # The rest of the body.
    ("unknown field", {"checksum": SHA}, "checksum"),
    ("bad tenant", {"tenant": "acme corp"}, "tenant"),
]


@pytest.mark.parametrize(("fields", "path"), [(f, p) for _, f, p in BAD_INPUTS], ids=[n for n, _, _ in BAD_INPUTS])
async def test_bad_input_is_refused_at_its_field_and_nothing_is_written(
    plane: Plane, fields: dict[str, Any], path: str
) -> None:
    before = (await plane.count("images"), await plane.count("audit"))
    answer = await plane.post("images/register", _body(plane, **fields))
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["code"] == "INVALID_INPUT" and error["details"]["path"] == path, error
    # Nothing of a secret or a control character comes back.
    assert "secret" not in answer.text and "\u202e" not in answer.text and "\x00" not in error["message"]
    assert (await plane.count("images"), await plane.count("audit")) == before


@pytest.mark.parametrize(
    "raw",
    [
        '"ubuntu\\ud800"',  # an unpaired high surrogate
        '"\\udc00ubuntu"',  # an unpaired low surrogate
    ],
)
async def test_unpaired_surrogates_are_refused(plane: Plane, raw: str) -> None:
    body = json.dumps(_body(plane)).replace('"ubuntu"', raw)
    answer = await plane.post_raw("images/register", body.encode())
    assert answer.status_code == 400
    assert answer.json()["error"]["details"]["path"] == "name"
    assert await plane.count("images") == 0


async def test_urls_that_are_accepted(plane: Plane) -> None:
    good = [
        "https://images.example.com/ubuntu-24.04.img",
        "http://10.0.0.1:8080/images/a.img?token=abc",
        "https://[2001:db8::1]/a.img",
        "file:///var/lib/bcd/images/ubuntu%2024.04.img",
        "file:///srv/a.img",
    ]
    for index, url in enumerate(good):
        image = await plane.images.register(plane.alice, RegisterImageInput(**_body(plane, name=f"i{index}", url=url)))
        assert image.url == url
