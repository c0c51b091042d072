"""Inputs and outputs of the ``instances`` and ``vps-pools`` groups."""

from __future__ import annotations

import datetime as dt
from typing import Any, Literal

import attrs

from bettercompute.fields import Integer, Items, Number, Text
from bettercompute.modules.pools import LABELS
from bettercompute.paging import PageInput

InstanceState = Literal["pending", "provisioning", "running", "stopped", "failed", "deleted"]
PowerState = Literal["running", "stopped"]

MAX_USER_DATA_BYTES = 16 * 1024
"""The largest user data, in bytes of UTF-8 (what cloud-init's NoCloud seed and EC2 both take comfortably)."""

_ID = Text(pattern=r"[A-Za-z0-9._-]{1,128}", reason="must be 1 to 128 of A-Z, a-z, 0-9, '.', '_' and '-'")
_NAME = Text(
    pattern=r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?",
    reason="must be a DNS label: 1 to 63 of a-z, 0-9 and '-', not starting or ending in '-'",
)
# An OpenSSH public key line: a key type, its base64 body and an optional printable ASCII comment; one line.
_SSH_KEY = Text(
    pattern=r"(ssh-(rsa|ed25519|dss)|ecdsa-sha2-nistp(256|384|521)|sk-(ssh-ed25519|ecdsa-sha2-nistp256)@openssh\.com)"
    r" [A-Za-z0-9+/]{16,8192}={0,3}( [\x20-\x7e]{0,256})?",
    reason="must be one OpenSSH public key line ('<type> <base64> [comment]', printable ASCII)",
)
_SSH_KEYS = Items(item=_SSH_KEY, max_items=32, unique=True, reason="must be at most 32 distinct keys")
_USER_DATA = Text(max_length=MAX_USER_DATA_BYTES, reason=f"must be at most {MAX_USER_DATA_BYTES} bytes")
_PORT = Integer(minimum=1, maximum=65535, reason="must be a TCP port, 1 to 65535")
_PORTS = Items(item=_PORT, max_items=16, unique=True, reason="must be at most 16 distinct TCP ports")
_VCPU = Integer(minimum=1, maximum=256, reason="must be between 1 and 256")
_MEMORY = Integer(minimum=128, maximum=4 * 1024 * 1024, reason="must be between 128 MiB and 4 TiB")
_DISK = Integer(minimum=1, maximum=65536, reason="must be between 1 and 65536 GiB")
_GPUS = Integer(minimum=0, maximum=16, reason="must be between 0 and 16")
_RATIO = Number(minimum=1.0, maximum=16.0, reason="must be between 1 and 16")
_LIMIT = Integer(minimum=0, maximum=1_000_000, reason="must be between 0 and 1000000")
_REGION = Text(pattern=r"[a-z0-9-]{1,32}", reason="must be 1 to 32 of a-z, 0-9 and '-'")
_ENDPOINT = Text(
    pattern=r"https?://[\x21-\x7e]{1,500}", reason="must be an http or https URL of printable ASCII characters"
)
_INSTANCE_TYPE = Text(pattern=r"[a-z0-9][a-z0-9.-]{0,62}", reason="must be an instance type name such as 't3.micro'")


def _utf8_size(instance: Any, attribute: attrs.Attribute[Any], value: str) -> None:
    # The limit is on what reaches the machine: bytes, not code points. NUL has no place in a seed or in EC2's user
    # data; the value is never quoted back (it may hold the tenant's secrets).
    if "\x00" in value:
        raise ValueError("must not contain a NUL character", attribute, "<hidden>")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise ValueError("must be valid Unicode text (no unpaired surrogate)", attribute, "<hidden>") from None
    if size > MAX_USER_DATA_BYTES:
        raise ValueError(f"must be at most {MAX_USER_DATA_BYTES} bytes of UTF-8", attribute, "<hidden>")


@attrs.frozen(kw_only=True)
class Size:
    """What an instance gets: virtual CPUs, memory in MiB, its disk in GiB and, on a pool that has them, whole GPUs
    passed through."""

    vcpu: int = attrs.field(validator=_VCPU)
    memory_mib: int = attrs.field(validator=_MEMORY)
    disk_gib: int = attrs.field(validator=_DISK)
    gpus: int = attrs.field(default=0, validator=_GPUS)


@attrs.frozen(kw_only=True)
class CreateInstanceInput:
    """An instance to run in a pool of class ``vps-host`` (on one of its nodes) or ``provider`` (at the provider).

    ``image_id`` names a registered disk image of the tenant (on a provider pool, the image must carry the provider's
    image id in ``provider_images``). ``hostname`` defaults to ``name``. ``ports`` are the TCP ports a tunnel may
    reach (``instances.tunnel``). ``user_data`` goes to cloud-init as it is, at most 16 KiB.
    """

    tenant: str = attrs.field(validator=_ID)
    pool_id: str = attrs.field(validator=_ID)
    name: str = attrs.field(validator=_NAME)
    size: Size
    image_id: str = attrs.field(validator=_ID)
    hostname: str | None = attrs.field(default=None, validator=_NAME)
    ssh_authorized_keys: tuple[str, ...] = attrs.field(default=(), validator=_SSH_KEYS)
    user_data: str = attrs.field(default="", validator=[_USER_DATA, _utf8_size], repr=False)
    ports: tuple[int, ...] = attrs.field(default=(22,), validator=_PORTS)
    labels: dict[str, str] = attrs.field(factory=dict, validator=LABELS)


@attrs.frozen(kw_only=True)
class Instance:
    """An instance: where it runs, what it was asked to be (``power``, ``size``) and what it is (``state``, with the
    current ``step`` and the machine-readable ``reason`` of a wait or a failure)."""

    id: str
    tenant: str
    pool_id: str
    pool_class: str
    name: str
    hostname: str
    state: InstanceState
    step: str | None
    reason: str | None
    message: str | None
    power: PowerState
    size: Size
    image_id: str
    ports: tuple[int, ...]
    labels: dict[str, str]
    node_id: str | None
    provider_id: str | None
    instance_type: str | None
    addresses: tuple[str, ...]
    ssh_authorized_keys: int
    user_data_bytes: int
    created_at: dt.datetime
    updated_at: dt.datetime
    deleted_at: dt.datetime | None


@attrs.frozen(kw_only=True)
class InstanceInput:
    """An instance by id."""

    id: str = attrs.field(validator=_ID)


@attrs.frozen(kw_only=True)
class ResizeInput:
    """A new size for an instance. A disk only grows. On a hosted pool the new size is placed on the instance's node
    (``NO_CAPACITY`` when it does not fit there) and the instance restarts with it; at a provider it is stopped,
    changed and started again."""

    id: str = attrs.field(validator=_ID)
    size: Size


@attrs.frozen(kw_only=True)
class ListInstancesInput(PageInput):
    """The tenant whose instances to list (optionally one pool's; deleted ones only when asked)."""

    tenant: str = attrs.field(validator=_ID)
    pool_id: str | None = attrs.field(default=None, validator=_ID)
    include_deleted: bool = False


@attrs.frozen(kw_only=True)
class ListInstancesOutput:
    """A page of instances, oldest first."""

    instances: tuple[Instance, ...]
    next_cursor: str | None


@attrs.frozen(kw_only=True)
class Console:
    """The tail of an instance's serial console, as its node last reported it (at most 16 KiB)."""

    id: str
    text: str
    updated_at: dt.datetime | None


@attrs.frozen(kw_only=True)
class UsageInput:
    """A tenant's instance usage in a window (at most 366 days), optionally of one pool."""

    tenant: str = attrs.field(validator=_ID)
    start: dt.datetime
    end: dt.datetime
    pool_id: str | None = attrs.field(default=None, validator=_ID)


@attrs.frozen(kw_only=True)
class PoolUsage:
    """What a tenant's instances held in one pool over the window."""

    pool_id: str
    vcpu_hours: float
    memory_gib_hours: float
    disk_gib_hours: float
    gpu_hours: float


@attrs.frozen(kw_only=True)
class Usage:
    """A tenant's instance usage per pool over ``[start, end)``, from the instances' bookings."""

    tenant: str
    start: dt.datetime
    end: dt.datetime
    pools: tuple[PoolUsage, ...]


@attrs.frozen(kw_only=True)
class TunnelInput:
    """A tunnel to one of an instance's ``ports``."""

    id: str = attrs.field(validator=_ID)
    port: int = attrs.field(validator=_PORT)


# --- vps-pools ----------------------------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class InstanceType:
    """A provider instance type the pool may launch, and what it holds."""

    name: str = attrs.field(validator=_INSTANCE_TYPE)
    vcpu: int = attrs.field(validator=_VCPU)
    memory_mib: int = attrs.field(validator=_MEMORY)
    gpus: int = attrs.field(default=0, validator=_GPUS)


@attrs.frozen(kw_only=True)
class ProviderInput:
    """Where a provider pool launches instances. ``credentials_secret`` names a secret of the pool's tenant scoped
    to the pool (``secrets.create`` with scope ``pool:<id>``) whose value is a JSON object such as
    ``{"access_key_id": ..., "secret_access_key": ...}``; the pool keeps the name, never the value."""

    kind: Literal["ec2"]
    region: str = attrs.field(validator=_REGION)
    credentials_secret: str = attrs.field(validator=_ID)
    instance_types: tuple[InstanceType, ...] = attrs.field(
        validator=attrs.validators.max_len(64),
    )
    endpoint_url: str | None = attrs.field(default=None, validator=_ENDPOINT)
    subnet_id: str | None = attrs.field(default=None, validator=_ID)


@attrs.frozen(kw_only=True)
class ConfigureVpsPoolInput:
    """How a ``vps-host`` or ``provider`` pool runs instances.

    On a hosted pool, the ratios allow overcommit (1 = none, the default): a node with 8 CPUs and ``cpu_ratio`` 2
    takes 16 vCPUs of instances. Quotas apply to each tenant's instances in the pool (unset = unlimited). A provider
    pool needs ``provider``.
    """

    pool_id: str = attrs.field(validator=_ID)
    cpu_ratio: float = attrs.field(default=1.0, validator=_RATIO)
    memory_ratio: float = attrs.field(default=1.0, validator=_RATIO)
    max_instances: int | None = attrs.field(default=None, validator=_LIMIT)
    max_vcpu: int | None = attrs.field(default=None, validator=_LIMIT)
    max_memory_mib: int | None = attrs.field(
        default=None, validator=Integer(minimum=0, maximum=2**40, reason="must be between 0 and 2**40")
    )
    provider: ProviderInput | None = None


@attrs.frozen(kw_only=True)
class VpsPool:
    """A pool's VPS settings (a provider's credentials appear by secret name only)."""

    pool_id: str
    tenant: str
    pool_class: str
    cpu_ratio: float
    memory_ratio: float
    max_instances: int | None
    max_vcpu: int | None
    max_memory_mib: int | None
    provider: ProviderInput | None
    updated_at: dt.datetime


@attrs.frozen(kw_only=True)
class GetVpsPoolInput:
    """A pool's VPS settings by pool id."""

    pool_id: str = attrs.field(validator=_ID)
