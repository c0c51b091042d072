"""The port a provider pool drives: launch, inspect, start, stop, resize and terminate VMs at a cloud provider.

A provider pool (``pool_class: "provider"``) runs tenants' VPS instances at a cloud provider through a workflow; the
workflow talks to the provider only through a ``ProviderAdapter``. The adapter makes exactly one attempt per call
(its SDK's own retries are off): the workflow owns retries, and ``ProviderError.retryable`` tells it which failures
are worth another try. A launch is made safe to retry by its ``client_token``.

This module also holds the two pure helpers a workflow needs before it launches: ``compose_user_data`` (the tenant's
user data plus the platform's SSH keys and host name, nothing else: no platform agent is ever put on a tenant's VM)
and ``pick_instance_type`` (the smallest catalog entry that fits a request).
"""

from __future__ import annotations

import email.mime.multipart
import email.mime.text
import re
from collections.abc import Mapping, Sequence
from typing import Any, Final, Protocol

import attrs
import yaml

from bettercompute.errors import InvalidInputError

__all__ = [
    "MAX_USER_DATA_BYTES",
    "PROVIDER_AUTH_FAILED",
    "PROVIDER_ERROR_CODES",
    "PROVIDER_IMAGE_NOT_FOUND",
    "PROVIDER_INVALID",
    "PROVIDER_NOT_FOUND",
    "PROVIDER_QUOTA",
    "PROVIDER_STATES",
    "PROVIDER_THROTTLED",
    "PROVIDER_UNAVAILABLE",
    "InstanceType",
    "LaunchRequest",
    "ProviderAdapter",
    "ProviderError",
    "ProviderInstance",
    "compose_user_data",
    "pick_instance_type",
]

PROVIDER_QUOTA: Final = "PROVIDER_QUOTA"
PROVIDER_IMAGE_NOT_FOUND: Final = "PROVIDER_IMAGE_NOT_FOUND"
PROVIDER_THROTTLED: Final = "PROVIDER_THROTTLED"
PROVIDER_AUTH_FAILED: Final = "PROVIDER_AUTH_FAILED"
PROVIDER_UNAVAILABLE: Final = "PROVIDER_UNAVAILABLE"
PROVIDER_INVALID: Final = "PROVIDER_INVALID"
PROVIDER_NOT_FOUND: Final = "PROVIDER_NOT_FOUND"
PROVIDER_ERROR_CODES: Final = frozenset(
    {
        PROVIDER_QUOTA,
        PROVIDER_IMAGE_NOT_FOUND,
        PROVIDER_THROTTLED,
        PROVIDER_AUTH_FAILED,
        PROVIDER_UNAVAILABLE,
        PROVIDER_INVALID,
        PROVIDER_NOT_FOUND,
    }
)
# EC2's names; an adapter for another provider translates its own states into these.
PROVIDER_STATES: Final = frozenset({"pending", "running", "stopping", "stopped", "shutting-down", "terminated"})

# EC2 refuses user data over 16 KiB (before base64), and so does this module, whatever the provider: a tenant's
# template that fits one provider fits them all.
MAX_USER_DATA_BYTES: Final = 16 * 1024
MAX_SSH_KEYS: Final = 64
MAX_SSH_KEY_CHARS: Final = 16 * 1024
_HOSTNAME = re.compile(r"(?=.{1,253}\Z)(?!-)[a-z0-9-]{1,63}(?<!-)(\.(?!-)[a-z0-9-]{1,63}(?<!-))*")
_SSH_KEY = re.compile(r"(ssh-|ecdsa-|sk-)[a-z0-9@.-]+ [A-Za-z0-9+/=]+( [\x20-\x7e]*)?")
# What cloud-init recognises at the start of a user-data part (its "starts with" handlers), with the MIME type the
# part gets when it travels inside a multipart next to the platform's cloud-config.
_PART_TYPES: Final = (
    ("#!", "text/x-shellscript"),
    ("#include", "text/x-include-url"),
    ("#cloud-boothook", "text/cloud-boothook"),
    ("#cloud-config-archive", "text/cloud-config-archive"),
    ("#part-handler", "text/part-handler"),
    ("## template: jinja", "text/jinja2"),
)


class ProviderError(Exception):
    """A call to the provider failed; ``code`` says how, ``retryable`` whether the same call may succeed later.

    Args:
        code: One of ``PROVIDER_QUOTA`` (a limit or no capacity), ``PROVIDER_IMAGE_NOT_FOUND``,
            ``PROVIDER_THROTTLED`` (too many requests), ``PROVIDER_AUTH_FAILED`` (the credentials are wrong or may
            not do this), ``PROVIDER_UNAVAILABLE`` (no answer, a timeout, a 5xx, a dropped connection: the call may
            or may not have happened), ``PROVIDER_INVALID`` (the provider refused the request as it is) and
            ``PROVIDER_NOT_FOUND`` (no such instance).
        message: One sentence for a person; never holds a credential.
        retryable: Whether the same call, unchanged, may succeed later.
        provider_code: The provider's own error code (``"RequestLimitExceeded"``), when it sent one.
        status: The HTTP status of the provider's answer, when there was one.
    """

    def __init__(
        self,
        code: str,
        message: str,
        *,
        retryable: bool = False,
        provider_code: str | None = None,
        status: int | None = None,
    ) -> None:
        if code not in PROVIDER_ERROR_CODES:
            raise ValueError(f"unknown provider error code {code!r}")
        super().__init__(message)
        self.code = code
        self.message = message
        self.retryable = retryable
        self.provider_code = provider_code
        self.status = status

    def __repr__(self) -> str:
        return (
            f"ProviderError({self.code!r}, {self.message!r}, retryable={self.retryable}, "
            f"provider_code={self.provider_code!r}, status={self.status})"
        )


def _str_mapping(value: Mapping[str, str]) -> Mapping[str, str]:
    return dict(value)


@attrs.frozen(kw_only=True)
class LaunchRequest:
    """One VM to launch.

    Attributes:
        client_token: The idempotency token: a launch retried with the same token never makes a second VM. Derive it
            from the platform's instance id and launch attempt, never at random per try.
        instance_type: The provider's instance type, e.g. ``"t3.micro"``.
        image: The provider's image id, e.g. ``"ami-0123..."``.
        user_data: Already composed (``compose_user_data``).
        name: The VM's ``Name`` tag.
        tags: More tags, e.g. ``{"bettercompute:instance": "inst_..", "bettercompute:tenant": ".."}``.
    """

    client_token: str
    instance_type: str
    image: str
    user_data: str
    name: str
    tags: Mapping[str, str] = attrs.field(factory=dict, converter=_str_mapping)


@attrs.frozen(kw_only=True)
class ProviderInstance:
    """A VM as the provider describes it.

    Attributes:
        id: The provider's id (``"i-0abc..."``).
        state: One of ``PROVIDER_STATES``.
        instance_type: Its current type.
        private_ip: Its address inside the provider's network, once it has one.
        public_ip: Its public address, if it has one (a stopped VM loses its automatic public address).
        client_token: The token it was launched with, when the provider reports it.
    """

    id: str
    state: str
    instance_type: str
    private_ip: str | None
    public_ip: str | None
    client_token: str | None = None


class ProviderAdapter(Protocol):
    """A provider's VMs, one call at a time; every method makes a single attempt and raises ``ProviderError``.

    Contract:
        - ``launch`` is idempotent by ``request.client_token``: after any failure (a timeout or a dropped connection
          included, where the VM may exist although the caller never heard), calling it again with the same request
          returns the VM made the first time, whatever its state, and never makes a second one. The same token with
          a different request is ``PROVIDER_INVALID`` or returns the first VM (what the provider does).
        - ``find`` returns the VM launched with a token, or None. ``describe`` returns None when the provider does
          not know the id: never launched, or terminated long enough ago to be forgotten. Providers are eventually
          consistent: right after ``launch`` either may still say None for a moment, so a workflow polls.
        - ``start`` and ``stop`` on a VM already there (or on its way) succeed; on an unknown id they raise
          ``PROVIDER_NOT_FOUND``.
        - ``resize`` is valid only while the VM is stopped (``PROVIDER_INVALID`` otherwise).
        - ``terminate`` of a VM that is gone or already terminated succeeds and does nothing.
        - ``aclose`` releases the adapter's connections; the adapter is not used after it.
    """

    async def launch(self, request: LaunchRequest) -> ProviderInstance: ...

    async def find(self, client_token: str) -> ProviderInstance | None: ...

    async def describe(self, provider_id: str) -> ProviderInstance | None: ...

    async def start(self, provider_id: str) -> None: ...

    async def stop(self, provider_id: str) -> None: ...

    async def resize(self, provider_id: str, instance_type: str) -> None: ...

    async def terminate(self, provider_id: str) -> None: ...

    async def aclose(self) -> None: ...


def _positive(instance: Any, attribute: attrs.Attribute[int], value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{attribute.name} must be a positive integer")


def _not_negative(instance: Any, attribute: attrs.Attribute[int], value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{attribute.name} must be a non-negative integer")


@attrs.frozen(kw_only=True)
class InstanceType:
    """What one of a provider's instance types offers."""

    vcpu: int = attrs.field(validator=_positive)
    memory_mib: int = attrs.field(validator=_positive)
    gpus: int = attrs.field(default=0, validator=_not_negative)


def pick_instance_type(catalog: Mapping[str, InstanceType], *, vcpu: int, memory_mib: int, gpus: int) -> str | None:
    """The name of the smallest catalog entry with at least ``vcpu``, ``memory_mib`` and ``gpus``, or None.

    Smallest means fewest GPUs first (a CPU request never lands on a GPU type while a CPU type fits), then fewest
    vCPUs, then least memory; the name breaks a tie, so the answer does not depend on the catalog's order.
    """
    fitting = [
        (kind.gpus, kind.vcpu, kind.memory_mib, name)
        for name, kind in catalog.items()
        if kind.vcpu >= vcpu and kind.memory_mib >= memory_mib and kind.gpus >= gpus
    ]
    return min(fitting)[3] if fitting else None


def _invalid(field: str, message: str) -> InvalidInputError:
    return InvalidInputError(message, details={"path": field})


def _check_inputs(user_data: str, ssh_authorized_keys: Sequence[str], hostname: str) -> tuple[str, ...]:
    if not isinstance(user_data, str):
        raise _invalid("user_data", "The user data must be text.")
    if len(user_data.encode("utf-8", "surrogatepass")) > MAX_USER_DATA_BYTES:
        raise _invalid("user_data", f"The user data is larger than {MAX_USER_DATA_BYTES} bytes.")
    if "\x00" in user_data:
        raise _invalid("user_data", "The user data may not contain a NUL character.")
    try:
        user_data.encode("utf-8")
    except UnicodeEncodeError:
        raise _invalid("user_data", "The user data is not valid Unicode text.") from None
    if isinstance(ssh_authorized_keys, str) or len(ssh_authorized_keys) > MAX_SSH_KEYS:
        raise _invalid("ssh_authorized_keys", f"Give a list of at most {MAX_SSH_KEYS} SSH public keys.")
    keys: list[str] = []
    for index, key in enumerate(ssh_authorized_keys):
        text = key.strip() if isinstance(key, str) else ""
        if len(text) > MAX_SSH_KEY_CHARS or not _SSH_KEY.fullmatch(text):
            raise _invalid(
                f"ssh_authorized_keys[{index}]",
                "An SSH public key must be one line: its type, its base64 body and an optional comment.",
            )
        if text not in keys:
            keys.append(text)
    if not isinstance(hostname, str) or not _HOSTNAME.fullmatch(hostname):
        raise _invalid("hostname", "The host name must be a lower-case DNS name.")
    return tuple(keys)


def _platform_config(keys: tuple[str, ...], hostname: str) -> dict[str, Any]:
    config: dict[str, Any] = {"hostname": hostname.partition(".")[0]}
    if "." in hostname:
        config["fqdn"] = hostname
    if keys:
        config["ssh_authorized_keys"] = list(keys)
    return config


def _dump_cloud_config(config: Mapping[str, Any]) -> str:
    return "#cloud-config\n" + yaml.safe_dump(dict(config), sort_keys=False, allow_unicode=True, width=4096)


def _merge_cloud_config(user_data: str, keys: tuple[str, ...], hostname: str) -> str:
    try:
        tenant = yaml.safe_load(user_data)
    except (yaml.YAMLError, RecursionError):
        raise _invalid("user_data", "The user data starts with #cloud-config but is not valid YAML.") from None
    if tenant is None:
        tenant = {}
    if not isinstance(tenant, dict):
        raise _invalid("user_data", "The user data's #cloud-config must be a YAML mapping.")
    merged = dict(tenant)
    # The tenant's own host name wins: it is their VM. Their keys stay, and the platform's are added after them.
    if "hostname" not in merged and "fqdn" not in merged:
        merged.update({k: v for k, v in _platform_config((), hostname).items() if k in ("hostname", "fqdn")})
    existing = merged.get("ssh_authorized_keys", [])
    if not isinstance(existing, list):
        raise _invalid("user_data", "The user data's ssh_authorized_keys must be a list.")
    merged["ssh_authorized_keys"] = existing + [key for key in keys if key not in existing]
    if not merged["ssh_authorized_keys"]:
        del merged["ssh_authorized_keys"]
    return _dump_cloud_config(merged)


def _part(text: str, subtype: str) -> email.mime.text.MIMEText:
    # ASCII travels as 7bit; anything else as base64 (a third larger), which the size check after composing counts.
    return email.mime.text.MIMEText(text, subtype, "us-ascii" if text.isascii() else "utf-8")


def _multipart(user_data: str, keys: tuple[str, ...], hostname: str) -> str:
    first_line = user_data.lstrip().partition("\n")[0]
    subtype = next((kind for prefix, kind in _PART_TYPES if first_line.startswith(prefix)), None)
    if subtype is None:
        raise _invalid(
            "user_data",
            "The user data must be empty or start with #cloud-config, #! (a script), #include, #cloud-boothook,"
            " #cloud-config-archive, #part-handler or ## template: jinja.",
        )
    message = email.mime.multipart.MIMEMultipart()
    platform = _part(_dump_cloud_config(_platform_config(keys, hostname)), "cloud-config")
    platform.add_header("Content-Disposition", "attachment", filename="bettercompute.cfg")
    tenant = _part(user_data, subtype.partition("/")[2])
    tenant.add_header("Content-Disposition", "attachment", filename="user-data")
    message.attach(platform)
    message.attach(tenant)
    return message.as_string()


def compose_user_data(user_data: str, ssh_authorized_keys: Sequence[str], hostname: str) -> str:
    """The user data a VM boots with: the tenant's, plus the platform's SSH keys and host name.

    When ``user_data`` is empty or a ``#cloud-config``, the keys and the host name are merged into one cloud-config
    (the tenant's own ``ssh_authorized_keys`` are kept, and their ``hostname`` or ``fqdn``, if they set one, wins).
    Any other kind cloud-init knows (a ``#!`` script, ``#include``, ...) travels unchanged as the second part of a
    MIME multipart whose first part is the platform's cloud-config. Nothing else is added: no agent, no package.

    Raises:
        InvalidInputError: The user data is larger than ``MAX_USER_DATA_BYTES`` or has a NUL character, is a
            cloud-config that is not a YAML mapping, or is of no kind cloud-init knows; a key is not one line of an
            SSH public key; the host name is not a DNS name; or the result is larger than ``MAX_USER_DATA_BYTES``.
    """
    keys = _check_inputs(user_data, ssh_authorized_keys, hostname)
    if not user_data.strip():
        result = _dump_cloud_config(_platform_config(keys, hostname))
    elif user_data.lstrip().startswith("#cloud-config") and not user_data.lstrip().startswith("#cloud-config-"):
        result = _merge_cloud_config(user_data, keys, hostname)
    else:
        result = _multipart(user_data, keys, hostname)
    if len(result.encode("utf-8")) > MAX_USER_DATA_BYTES:
        raise _invalid(
            "user_data", f"The user data with the platform's keys is larger than {MAX_USER_DATA_BYTES} bytes."
        )
    return result
