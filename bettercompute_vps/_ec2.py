"""The ``ProviderAdapter`` for Amazon EC2, on boto3.

boto3 blocks, so every call runs in a worker thread (at most ``MAX_THREADS`` at once per adapter) under an overall
deadline; botocore's own retries are off (one attempt per call, bounded connect and read timeouts), because the
workflow owns retries and must see each failure to decide. Every failure is a ``ProviderError``; the foreign
exception is translated in one place, ``_translate``.

Idempotent launch. ``launch`` first looks for an instance tagged ``bettercompute:client-token=<token>`` and returns it
if there is one; otherwise it calls RunInstances with that tag *and* ``ClientToken=<token>``:

- At the real EC2, ``ClientToken`` is the guarantee: RunInstances with a token it has already seen (in the same
  account and region) returns the instance it made the first time, without making another, even when two calls race
  or the first one's answer was lost; a token reused with other parameters is ``IdempotentParameterMismatch``
  (``PROVIDER_INVALID``). The tag lookup before it only saves a call, and may miss a very fresh instance (EC2's reads
  are eventually consistent), which the token then covers.
- moto (5.x, the test double) records ``ClientToken`` but ignores it: the same token twice makes two instances. There
  the tag lookup is the only guard. It holds for a retry that comes after the failed call has landed (the workflow's
  case: one launch at a time per instance, moto's reads are immediately consistent), not for two launches with one
  token running at the same moment.

The tag is written by RunInstances itself (``TagSpecifications``), so no instance exists without it.

Credentials arrive as a mapping decrypted by the control plane (``Ec2Credentials.from_secret``). They are never logged
and never appear in a ``repr`` or an error message: provider messages are cut short and have the secret scrubbed out
before they are used. No credential is read from the environment, from ``~/.aws`` or from an instance profile, and
``AWS_ENDPOINT_URL*`` variables cannot redirect the client.
"""

from __future__ import annotations

import functools
import logging
import re
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, TypeVar

import anyio
import anyio.to_thread
import attrs
import boto3.session
import botocore.config
import botocore.exceptions
import botocore.loaders
import botocore.parsers
import botocore.session

from bettercompute.errors import InvalidInputError

from ._provider import (
    PROVIDER_AUTH_FAILED,
    PROVIDER_IMAGE_NOT_FOUND,
    PROVIDER_INVALID,
    PROVIDER_NOT_FOUND,
    PROVIDER_QUOTA,
    PROVIDER_STATES,
    PROVIDER_THROTTLED,
    PROVIDER_UNAVAILABLE,
    LaunchRequest,
    ProviderError,
    ProviderInstance,
)

if TYPE_CHECKING:
    from mypy_boto3_ec2 import EC2Client
    from mypy_boto3_ec2.type_defs import InstanceTypeDef, RunInstancesRequestTypeDef, TagTypeDef

__all__ = ["CLIENT_TOKEN_TAG", "Ec2Adapter", "Ec2Credentials", "Ec2Settings"]

logger = logging.getLogger(__name__)
T = TypeVar("T")

CLIENT_TOKEN_TAG: Final = "bettercompute:client-token"  # noqa: S105 -- a tag key, not a secret
MAX_THREADS: Final = 8
MAX_PAGES: Final = 10
# EC2's limits: a ClientToken is at most 64 ASCII characters; an instance has at most 50 tags, keys up to 128
# characters and values up to 256; "aws:" keys are the provider's own.
MAX_CLIENT_TOKEN: Final = 64
MAX_TAGS: Final = 50
# Narrower than EC2's "any 64 ASCII characters": find() matches the token as a tag filter value, where * and ? are
# wildcards, so a token may hold neither (nor a backslash, their escape).
_CLIENT_TOKEN = re.compile(r"[A-Za-z0-9._:-]{1,64}")
_INSTANCE_ID = re.compile(r"i-[0-9a-f]{8,17}")
_REGION = re.compile(r"[a-z]{2}(-[a-z0-9]+){1,4}-[0-9]{1,2}")
_NAME_LIKE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/-]{0,254}")

_CONFIG_EXTRA: Final[Mapping[str, Any]] = {"ignore_configured_endpoint_urls": True, "user_agent_appid": "bettercompute"}
_QUOTA_CODES: Final = frozenset({"InstanceLimitExceeded", "VcpuLimitExceeded", "InsufficientInstanceCapacity"})
_RETRYABLE_QUOTA_CODES: Final = frozenset({"InsufficientInstanceCapacity"})
_THROTTLE_CODES: Final = frozenset({"RequestLimitExceeded", "Throttling", "ThrottlingException"})
_AUTH_CODES: Final = frozenset(
    {
        "AuthFailure",
        "UnauthorizedOperation",
        "InvalidClientTokenId",
        "SignatureDoesNotMatch",
        "AccessDenied",
        "OptInRequired",
    }
)
_UNAVAILABLE_CODES: Final = frozenset({"InternalError", "InternalFailure", "ServiceUnavailable", "Unavailable"})


def _invalid(field: str, message: str) -> InvalidInputError:
    return InvalidInputError(message, details={"path": field})


def _optional_text(settings: Mapping[str, object], key: str) -> str | None:
    value = settings.get(key)
    if value is None or value == "":
        return None
    if not isinstance(value, str) or not _NAME_LIKE.fullmatch(value):
        raise _invalid(key, f"{key} must be an identifier such as the provider shows it.")
    return value


def _endpoint_url(value: object) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str) or len(value) > 2048 or not value.isascii() or not value.isprintable():
        raise _invalid("endpoint_url", "endpoint_url must be an http or https URL.")
    try:
        parts = urllib.parse.urlsplit(value)
        parts.port  # noqa: B018 -- reading it validates the port
    except ValueError:
        raise _invalid("endpoint_url", "endpoint_url is not a valid URL.") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise _invalid("endpoint_url", "endpoint_url must be an http or https URL with a host.")
    if parts.username is not None or parts.password is not None or parts.query or parts.fragment:
        raise _invalid("endpoint_url", "endpoint_url may have no user information, query or fragment.")
    return value


@attrs.frozen(kw_only=True)
class Ec2Settings:
    """Where the adapter sends its calls and how it launches; nothing in here is secret.

    Attributes:
        region: The AWS region, e.g. ``"eu-west-1"``.
        endpoint_url: Another endpoint than AWS's public one (a VPC endpoint, or moto in tests).
        subnet_id: The subnet every VM is launched into (the account's default VPC when None).
        security_group_ids: The security groups every VM gets (the VPC's default when empty).
        key_name: An EC2 key pair to install (usually None: keys arrive through the user data).
        connect_timeout: Seconds to open a connection.
        read_timeout: Seconds to wait for an answer on an open connection.
        call_timeout: Seconds one call may take in all; past it the call is ``PROVIDER_UNAVAILABLE``.
    """

    region: str
    endpoint_url: str | None = None
    subnet_id: str | None = None
    security_group_ids: tuple[str, ...] = ()
    key_name: str | None = None
    connect_timeout: float = 5.0
    read_timeout: float = 30.0
    call_timeout: float = 45.0

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.region, str) or not _REGION.fullmatch(self.region):
            raise _invalid("region", "region must be an AWS region name such as eu-west-1.")
        _endpoint_url(self.endpoint_url)
        for name in ("connect_timeout", "read_timeout", "call_timeout"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not 0 < value <= 300:
                raise _invalid(name, f"{name} must be more than 0 and at most 300 seconds.")

    @classmethod
    def from_mapping(cls, settings: Mapping[str, object]) -> Ec2Settings:
        """Settings from a pool's configuration (``region``, ``endpoint_url``, ``subnet_id``, ...).

        Raises:
            InvalidInputError: A setting is missing, unknown or malformed; ``details["path"]`` names it.
        """
        known = {field.name for field in attrs.fields(cls)}
        unknown = sorted(str(key) for key in settings if key not in known)
        if unknown:
            raise _invalid(unknown[0], f"Unknown EC2 setting {unknown[0]!r}.")
        groups = settings.get("security_group_ids") or ()
        if isinstance(groups, str) or not isinstance(groups, Sequence):
            raise _invalid("security_group_ids", "security_group_ids must be a list of security group ids.")
        group_ids: list[str] = []
        for index, group in enumerate(groups):
            if not isinstance(group, str) or not _NAME_LIKE.fullmatch(group):
                raise _invalid(f"security_group_ids[{index}]", "A security group id must look like sg-0123abcd.")
            group_ids.append(group)
        timeouts: dict[str, float] = {}
        for name in ("connect_timeout", "read_timeout", "call_timeout"):
            value = settings.get(name)
            if value is not None:
                if not isinstance(value, int | float) or isinstance(value, bool):
                    raise _invalid(name, f"{name} must be a number of seconds.")
                timeouts[name] = float(value)
        region = settings.get("region")
        if not isinstance(region, str):
            raise _invalid("region", "region must be an AWS region name such as eu-west-1.")
        return cls(
            region=region,
            endpoint_url=_endpoint_url(settings.get("endpoint_url")),
            subnet_id=_optional_text(settings, "subnet_id"),
            security_group_ids=tuple(group_ids),
            key_name=_optional_text(settings, "key_name"),
            **timeouts,
        )


@attrs.frozen(kw_only=True, repr=False)
class Ec2Credentials:
    """An AWS access key. ``repr()`` shows the key id's last four characters only."""

    access_key_id: str
    secret_access_key: str
    session_token: str | None = None

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.access_key_id, str) or not re.fullmatch(r"[A-Z0-9]{16,128}", self.access_key_id):
            raise _invalid("access_key_id", "access_key_id must be an AWS access key id (letters and digits).")
        if not isinstance(self.secret_access_key, str) or not re.fullmatch(
            r"[\x21-\x7e]{1,256}", self.secret_access_key
        ):
            raise _invalid("secret_access_key", "secret_access_key must be 1 to 256 printable characters.")
        if self.session_token is not None and (
            not isinstance(self.session_token, str) or not re.fullmatch(r"[\x21-\x7e]{1,8192}", self.session_token)
        ):
            raise _invalid("session_token", "session_token must be printable characters.")

    @classmethod
    def from_secret(cls, secret: Mapping[str, object]) -> Ec2Credentials:
        """Credentials from a decrypted secret with ``access_key_id``, ``secret_access_key`` (and ``session_token``).

        Raises:
            InvalidInputError: A key is missing or malformed (the message never repeats a value).
        """
        access_key_id = secret.get("access_key_id")
        secret_access_key = secret.get("secret_access_key")
        session_token = secret.get("session_token")
        if not isinstance(access_key_id, str):
            raise _invalid("access_key_id", "The secret has no access_key_id.")
        if not isinstance(secret_access_key, str):
            raise _invalid("secret_access_key", "The secret has no secret_access_key.")
        if session_token is not None and not isinstance(session_token, str):
            raise _invalid("session_token", "session_token must be text.")
        return cls(access_key_id=access_key_id, secret_access_key=secret_access_key, session_token=session_token)

    def __repr__(self) -> str:
        return f"Ec2Credentials(access_key_id='...{self.access_key_id[-4:]}', secret_access_key='***')"

    __str__ = __repr__


def _instance(data: InstanceTypeDef) -> ProviderInstance:
    state = data.get("State", {}).get("Name", "")
    if state not in PROVIDER_STATES:
        raise ProviderError(PROVIDER_UNAVAILABLE, f"EC2 reported an unknown instance state {state[:32]!r}.")
    return ProviderInstance(
        id=data.get("InstanceId", ""),
        state=state,
        instance_type=data.get("InstanceType", ""),
        private_ip=data.get("PrivateIpAddress") or None,
        public_ip=data.get("PublicIpAddress") or None,
        client_token=data.get("ClientToken") or None,
    )


def _check_instance_id(provider_id: str) -> None:
    if not isinstance(provider_id, str) or not _INSTANCE_ID.fullmatch(provider_id):
        raise ProviderError(PROVIDER_INVALID, "An EC2 instance id looks like i-0123456789abcdef0.")


def _check_token(client_token: str) -> None:
    if not isinstance(client_token, str) or not _CLIENT_TOKEN.fullmatch(client_token):
        raise ProviderError(
            PROVIDER_INVALID,
            f"A client token must be 1 to {MAX_CLIENT_TOKEN} letters, digits, dots, colons, dashes or underscores.",
        )


def _tags(request: LaunchRequest) -> list[TagTypeDef]:
    tags: list[TagTypeDef] = [
        {"Key": "Name", "Value": request.name},
        {"Key": CLIENT_TOKEN_TAG, "Value": request.client_token},
    ]
    for key, value in request.tags.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise ProviderError(PROVIDER_INVALID, "Tag keys and values must be text.")
        if key in ("Name", CLIENT_TOKEN_TAG) or key.lower().startswith("aws:"):
            raise ProviderError(PROVIDER_INVALID, f"The tag {key[:128]!r} is reserved.")
        tags.append({"Key": key, "Value": value})
    if len(tags) > MAX_TAGS:
        raise ProviderError(PROVIDER_INVALID, f"An EC2 instance may have at most {MAX_TAGS} tags.")
    for tag in tags:
        if not 1 <= len(tag["Key"]) <= 128 or len(tag["Value"]) > 256:
            raise ProviderError(PROVIDER_INVALID, "A tag key must be 1 to 128 characters and its value at most 256.")
    return tags


class Ec2Adapter:
    """A ``ProviderAdapter`` for one AWS account and region.

    Args:
        settings: Region, endpoint, network placement and timeouts.
        credentials: The access key; see ``Ec2Credentials.from_secret``.

    Every method raises ``ProviderError`` (see ``ProviderAdapter`` for the contract), and nothing else for a failure
    at the provider.
    """

    def __init__(self, settings: Ec2Settings, credentials: Ec2Credentials) -> None:
        if not isinstance(credentials, Ec2Credentials):
            raise _invalid("credentials", "The EC2 credentials must be Ec2Credentials.")
        self.settings = settings
        self._credentials = credentials
        self._secrets = tuple(s for s in (credentials.secret_access_key, credentials.session_token) if s)
        self._limiter = anyio.CapacityLimiter(MAX_THREADS)
        self._client_lock = anyio.Lock()
        self._client: EC2Client | None = None
        self._closed = False

    @classmethod
    def from_config(cls, settings: Mapping[str, object], secret: Mapping[str, object]) -> Ec2Adapter:
        """An adapter from a pool's settings and its decrypted secret.

        Raises:
            InvalidInputError: A setting or the secret is missing or malformed.
        """
        return cls(Ec2Settings.from_mapping(settings), Ec2Credentials.from_secret(secret))

    def __repr__(self) -> str:
        endpoint = f", endpoint_url={self.settings.endpoint_url!r}" if self.settings.endpoint_url else ""
        return f"Ec2Adapter(region={self.settings.region!r}{endpoint})"

    # -- the port ------------------------------------------------------------------------------------------------

    async def launch(self, request: LaunchRequest) -> ProviderInstance:
        _check_token(request.client_token)
        tags = _tags(request)
        existing = await self.find(request.client_token)
        if existing is not None:
            return existing
        params: RunInstancesRequestTypeDef = {
            "ImageId": request.image,
            "InstanceType": request.instance_type,  # type: ignore[typeddict-item]  # any type the account offers
            "MinCount": 1,
            "MaxCount": 1,
            "ClientToken": request.client_token,
            "UserData": request.user_data,  # boto3 base64-encodes it
            "TagSpecifications": [{"ResourceType": "instance", "Tags": tags}],
            # IMDSv2 only: a process in the VM that can be tricked into a GET cannot read the instance's role.
            "MetadataOptions": {"HttpTokens": "required", "HttpEndpoint": "enabled"},
        }
        if self.settings.subnet_id:
            params["SubnetId"] = self.settings.subnet_id
        if self.settings.security_group_ids:
            params["SecurityGroupIds"] = list(self.settings.security_group_ids)
        if self.settings.key_name:
            params["KeyName"] = self.settings.key_name
        client = await self._ec2()
        response = await self._call("RunInstances", functools.partial(client.run_instances, **params))
        instances = response.get("Instances", [])
        if len(instances) != 1:
            raise ProviderError(PROVIDER_UNAVAILABLE, f"EC2 answered RunInstances with {len(instances)} instances.")
        launched = _instance(instances[0])
        logger.info(
            "launched EC2 instance %s (%s) for token %s", launched.id, launched.instance_type, request.client_token
        )
        return launched

    async def find(self, client_token: str) -> ProviderInstance | None:
        _check_token(client_token)
        found = await self._describe_many(
            Filters=[{"Name": f"tag:{CLIENT_TOKEN_TAG}", "Values": [client_token]}],
        )
        if not found:
            return None
        # Only a test double ignores ClientToken and could have made two; the first one launched is the answer.
        found.sort(key=lambda item: (str(item.get("LaunchTime", "")), item.get("InstanceId", "")))
        return _instance(found[0])

    async def describe(self, provider_id: str) -> ProviderInstance | None:
        _check_instance_id(provider_id)
        try:
            found = await self._describe_many(InstanceIds=[provider_id])
        except ProviderError as error:
            if error.code == PROVIDER_NOT_FOUND:
                return None
            raise
        return _instance(found[0]) if found else None

    async def start(self, provider_id: str) -> None:
        _check_instance_id(provider_id)
        client = await self._ec2()
        await self._call("StartInstances", functools.partial(client.start_instances, InstanceIds=[provider_id]))

    async def stop(self, provider_id: str) -> None:
        _check_instance_id(provider_id)
        client = await self._ec2()
        await self._call("StopInstances", functools.partial(client.stop_instances, InstanceIds=[provider_id]))

    async def resize(self, provider_id: str, instance_type: str) -> None:
        _check_instance_id(provider_id)
        if not isinstance(instance_type, str) or not _NAME_LIKE.fullmatch(instance_type):
            raise ProviderError(PROVIDER_INVALID, "An instance type looks like t3.micro.")
        # EC2 itself refuses a running instance (IncorrectInstanceState); asking first gives the same answer on a
        # test double that does not check, and a clearer message.
        current = await self.describe(provider_id)
        if current is None:
            raise ProviderError(PROVIDER_NOT_FOUND, f"EC2 has no instance {provider_id}.")
        if current.state != "stopped":
            raise ProviderError(
                PROVIDER_INVALID, f"The instance {provider_id} is {current.state}; it can be resized only when stopped."
            )
        if current.instance_type == instance_type:
            return
        client = await self._ec2()
        await self._call(
            "ModifyInstanceAttribute",
            functools.partial(
                client.modify_instance_attribute, InstanceId=provider_id, InstanceType={"Value": instance_type}
            ),
        )

    async def terminate(self, provider_id: str) -> None:
        _check_instance_id(provider_id)
        client = await self._ec2()
        try:
            await self._call(
                "TerminateInstances", functools.partial(client.terminate_instances, InstanceIds=[provider_id])
            )
        except ProviderError as error:
            if error.code != PROVIDER_NOT_FOUND:
                raise

    async def aclose(self) -> None:
        async with self._client_lock:
            self._closed = True
            client, self._client = self._client, None
        if client is not None:
            await anyio.to_thread.run_sync(client.close, limiter=self._limiter)

    # -- the plumbing --------------------------------------------------------------------------------------------

    async def _ec2(self) -> EC2Client:
        async with self._client_lock:
            if self._closed:
                raise RuntimeError("Ec2Adapter is used after aclose()")
            if self._client is None:
                # Loading the service model reads files, so the client is made in a worker thread too.
                self._client = await anyio.to_thread.run_sync(self._make_client, limiter=self._limiter)
            return self._client

    def _make_client(self) -> EC2Client:
        settings = self.settings
        core = botocore.session.Session()
        core.register_component("data_loader", _shared_loader())
        session = boto3.session.Session(
            aws_access_key_id=self._credentials.access_key_id,
            aws_secret_access_key=self._credentials.secret_access_key,
            aws_session_token=self._credentials.session_token,
            region_name=settings.region,
            botocore_session=core,
        )
        config = botocore.config.Config(
            connect_timeout=settings.connect_timeout,
            read_timeout=settings.read_timeout,
            # One attempt: the workflow decides about retries, and must not wait through botocore's backoff.
            retries={"total_max_attempts": 1, "mode": "standard"},
            max_pool_connections=MAX_THREADS,
            # No AWS_ENDPOINT_URL* variable or config file picks where the credentials go. (Passed as a mapping:
            # botocore has both options, its stubs do not list them yet.)
            **_CONFIG_EXTRA,
        )
        return session.client("ec2", endpoint_url=settings.endpoint_url, config=config)

    async def _describe_many(self, **kwargs: Any) -> list[InstanceTypeDef]:
        client = await self._ec2()
        found: list[InstanceTypeDef] = []
        next_token: str | None = None
        for _ in range(MAX_PAGES):
            page_args = dict(kwargs, NextToken=next_token) if next_token else kwargs
            page = await self._call("DescribeInstances", functools.partial(client.describe_instances, **page_args))
            for reservation in page.get("Reservations", []):
                found.extend(reservation.get("Instances", []))
            next_token = page.get("NextToken")
            if not next_token:
                break
        return found

    async def _call(self, operation: str, call: Callable[[], T]) -> T:
        try:
            with anyio.fail_after(self.settings.call_timeout):
                # abandon_on_cancel: a deadline ends the wait at once; the thread itself ends at botocore's timeouts.
                return await anyio.to_thread.run_sync(call, abandon_on_cancel=True, limiter=self._limiter)
        except TimeoutError:
            raise ProviderError(
                PROVIDER_UNAVAILABLE,
                f"EC2 did not answer {operation} within {self.settings.call_timeout:g} s.",
                retryable=True,
            ) from None
        except (
            botocore.exceptions.ClientError,
            botocore.exceptions.BotoCoreError,
            botocore.parsers.ResponseParserError,
        ) as error:
            raise self._translate(error, operation) from error

    def _excerpt(self, text: str) -> str:
        """At most 200 printable characters of what EC2 or botocore said, with every secret replaced."""
        for secret in self._secrets:
            text = text.replace(secret, "***")
        text = "".join(char if char.isprintable() else " " for char in text)
        return text[:200]

    def _translate(self, error: Exception, operation: str) -> ProviderError:
        if isinstance(error, botocore.exceptions.ClientError):
            details = error.response.get("Error", {})
            code = str(details.get("Code", "") or "")[:64]
            said = self._excerpt(str(details.get("Message", "") or ""))
            status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            message = f"EC2 refused {operation} ({code or status})" + (f": {said}" if said else ".")
            kind, retryable = _classify(code, status)
            return ProviderError(kind, message, retryable=retryable, provider_code=code or None, status=status)
        if isinstance(error, botocore.exceptions.ConnectTimeoutError | botocore.exceptions.ReadTimeoutError):
            return ProviderError(PROVIDER_UNAVAILABLE, f"EC2 did not answer {operation} in time.", retryable=True)
        if isinstance(error, botocore.exceptions.HTTPClientError | botocore.exceptions.ConnectionError):
            # Includes a connection closed before the answer: the call may have happened, which a retry with the
            # same client token covers.
            detail = self._excerpt(str(error)) or type(error).__name__
            return ProviderError(
                PROVIDER_UNAVAILABLE, f"EC2 could not be reached for {operation}: {detail}", retryable=True
            )
        if isinstance(error, botocore.parsers.ResponseParserError):
            return ProviderError(
                PROVIDER_UNAVAILABLE, f"EC2's answer to {operation} could not be read.", retryable=True
            )
        if isinstance(error, botocore.exceptions.NoCredentialsError | botocore.exceptions.PartialCredentialsError):
            return ProviderError(PROVIDER_AUTH_FAILED, "No usable EC2 credentials were given.")
        if isinstance(error, botocore.exceptions.ParamValidationError):
            return ProviderError(PROVIDER_INVALID, f"The {operation} request is not valid: {self._excerpt(str(error))}")
        return ProviderError(PROVIDER_INVALID, f"The {operation} call failed: {type(error).__name__}.")


def _classify(code: str, status: int | None) -> tuple[str, bool]:
    """The ``ProviderError`` code and whether it is retryable, from EC2's error code and HTTP status."""
    if code in _QUOTA_CODES:
        return PROVIDER_QUOTA, code in _RETRYABLE_QUOTA_CODES
    if code.startswith("InvalidAMIID."):
        return PROVIDER_IMAGE_NOT_FOUND, False
    if code in _THROTTLE_CODES:
        return PROVIDER_THROTTLED, True
    if code in _AUTH_CODES:
        return PROVIDER_AUTH_FAILED, False
    if code == "InvalidInstanceID.NotFound":
        return PROVIDER_NOT_FOUND, False
    if code in _UNAVAILABLE_CODES or (status is not None and status >= 500):
        return PROVIDER_UNAVAILABLE, True
    return PROVIDER_INVALID, False


@functools.cache
def _shared_loader() -> botocore.loaders.Loader:
    """One loader of botocore's service models for every adapter of the process: a session's own would parse EC2's
    model (megabytes of JSON) again for each adapter, about 0.15 s of CPU and its memory each time; shared, a client
    costs 0.02 s. The loader only reads files and caches what it parsed."""
    return botocore.loaders.create_loader()
