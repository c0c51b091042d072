"""compose_user_data, pick_instance_type and the EC2 adapter's inputs: what a workflow hands over before a launch."""

from __future__ import annotations

import email
import email.message

import botocore.exceptions
import pytest
import yaml

from bettercompute.errors import InvalidInputError
from bettercompute_vps import (
    MAX_USER_DATA_BYTES,
    PROVIDER_AUTH_FAILED,
    PROVIDER_IMAGE_NOT_FOUND,
    PROVIDER_INVALID,
    PROVIDER_NOT_FOUND,
    PROVIDER_QUOTA,
    PROVIDER_THROTTLED,
    PROVIDER_UNAVAILABLE,
    Ec2Adapter,
    Ec2Credentials,
    Ec2Settings,
    InstanceType,
    ProviderAdapter,
    ProviderError,
    compose_user_data,
    pick_instance_type,
)

KEY_A = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGx0ZXN0a2V5YWFhYWFhYWFhYWFhYWFhYWFhYWFhYWE platform@bc"
KEY_B = "ecdsa-sha2-nistp256 AAAAE2VjZHNhLXNoYTItbmlzdHAyNTYAAAAIbmlzdHAyNTY= tenant"
SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"


def _cloud_config(text: str) -> dict[str, object]:
    assert text.startswith("#cloud-config\n")
    loaded = yaml.safe_load(text)
    assert isinstance(loaded, dict)
    return loaded


def _parts(text: str) -> list[email.message.Message]:
    message = email.message_from_string(text)
    assert message.is_multipart()
    return [part for part in message.walk() if not part.is_multipart()]


def test_empty_user_data_becomes_a_cloud_config_with_the_keys_and_host_name() -> None:
    config = _cloud_config(compose_user_data("", [KEY_A], "vm-1.example.net"))
    assert config == {"hostname": "vm-1", "fqdn": "vm-1.example.net", "ssh_authorized_keys": [KEY_A]}


def test_a_tenant_cloud_config_keeps_its_own_keys_and_settings_and_gains_the_platform_keys() -> None:
    tenant = f"#cloud-config\npackages: [htop]\nssh_authorized_keys:\n  - {KEY_B}\n"
    config = _cloud_config(compose_user_data(tenant, [KEY_A, KEY_B], "vm-1"))
    assert config["packages"] == ["htop"]
    assert config["ssh_authorized_keys"] == [KEY_B, KEY_A]
    assert config["hostname"] == "vm-1"


def test_the_tenant_host_name_wins_over_the_platform_one() -> None:
    config = _cloud_config(compose_user_data("#cloud-config\nhostname: mine\n", [KEY_A], "vm-1"))
    assert config["hostname"] == "mine"
    assert "fqdn" not in config


def test_a_shell_script_travels_unchanged_next_to_the_platform_cloud_config() -> None:
    script = "#!/bin/sh\necho hello > /tmp/hello\n"
    parts = _parts(compose_user_data(script, [KEY_A], "vm-1"))
    assert [part.get_content_type() for part in parts] == ["text/cloud-config", "text/x-shellscript"]
    platform = parts[0].get_payload(decode=True)
    tenant = parts[1].get_payload(decode=True)
    assert isinstance(platform, bytes) and isinstance(tenant, bytes)
    assert _cloud_config(platform.decode()) == {"hostname": "vm-1", "ssh_authorized_keys": [KEY_A]}
    assert tenant.decode() == script


def test_nothing_but_the_keys_and_host_name_is_added() -> None:
    config = _cloud_config(compose_user_data("", [], "vm-1"))
    assert config == {"hostname": "vm-1"}


@pytest.mark.parametrize(
    ("user_data", "keys", "hostname", "path"),
    [
        ("#!/bin/sh\necho \x00\n", [KEY_A], "vm-1", "user_data"),
        ("#!/bin/sh\n" + "x" * MAX_USER_DATA_BYTES, [KEY_A], "vm-1", "user_data"),
        ("#cloud-config\n- a list\n", [KEY_A], "vm-1", "user_data"),
        ("#cloud-config\nkey: [unclosed\n", [KEY_A], "vm-1", "user_data"),
        ("just some words", [KEY_A], "vm-1", "user_data"),
        ("", [KEY_A + "\nssh-rsa AAAA injected"], "vm-1", "ssh_authorized_keys[0]"),
        ("", ["not a key"], "vm-1", "ssh_authorized_keys[0]"),
        ("", [KEY_A], "Bad_Host", "hostname"),
        ("", [KEY_A], "vm-1\nruncmd: [reboot]", "hostname"),
    ],
)
def test_bad_input_is_refused_with_the_field_named(user_data: str, keys: list[str], hostname: str, path: str) -> None:
    with pytest.raises(InvalidInputError) as caught:
        compose_user_data(user_data, keys, hostname)
    assert caught.value.details["path"] == path


def test_a_result_over_the_limit_is_refused_even_when_the_input_fits() -> None:
    script = "#!/bin/sh\n" + "#" * (MAX_USER_DATA_BYTES - 200)
    with pytest.raises(InvalidInputError, match="with the platform's keys"):
        compose_user_data(script, [KEY_A], "vm-1")


CATALOG = {
    "t3.micro": InstanceType(vcpu=2, memory_mib=1024),
    "t3.small": InstanceType(vcpu=2, memory_mib=2048),
    "t3.large": InstanceType(vcpu=2, memory_mib=8192),
    "m5.xlarge": InstanceType(vcpu=4, memory_mib=16384),
    "g5.xlarge": InstanceType(vcpu=4, memory_mib=16384, gpus=1),
    "p4d.24xlarge": InstanceType(vcpu=96, memory_mib=1179648, gpus=8),
}


@pytest.mark.parametrize(
    ("vcpu", "memory_mib", "gpus", "expected"),
    [
        (1, 512, 0, "t3.micro"),
        (2, 1500, 0, "t3.small"),
        (2, 4096, 0, "t3.large"),
        (3, 1024, 0, "m5.xlarge"),
        (4, 16384, 0, "m5.xlarge"),  # the GPU type of the same size is not picked for a CPU request
        (1, 512, 1, "g5.xlarge"),
        (8, 1024, 1, "p4d.24xlarge"),
        (128, 1024, 0, None),
        (1, 512, 16, None),
    ],
)
def test_pick_instance_type_takes_the_smallest_that_fits(
    vcpu: int, memory_mib: int, gpus: int, expected: str | None
) -> None:
    assert pick_instance_type(CATALOG, vcpu=vcpu, memory_mib=memory_mib, gpus=gpus) == expected
    assert pick_instance_type(dict(reversed(CATALOG.items())), vcpu=vcpu, memory_mib=memory_mib, gpus=gpus) == expected


def test_pick_instance_type_on_an_empty_catalog_is_none() -> None:
    assert pick_instance_type({}, vcpu=1, memory_mib=1, gpus=0) is None


def test_instance_type_refuses_nonsense() -> None:
    with pytest.raises(ValueError, match="vcpu"):
        InstanceType(vcpu=0, memory_mib=1)
    with pytest.raises(ValueError, match="gpus"):
        InstanceType(vcpu=1, memory_mib=1, gpus=-1)


def test_the_secret_key_is_in_no_repr() -> None:
    credentials = Ec2Credentials.from_secret({"access_key_id": "AKIAIOSFODNN7EXAMPLE", "secret_access_key": SECRET})
    adapter = Ec2Adapter(Ec2Settings(region="eu-west-1"), credentials)
    for text in (repr(credentials), str(credentials), repr(adapter), str(adapter)):
        assert SECRET not in text
        assert "AKIAIOSFODNN7EXAMPLE" not in text


def test_a_malformed_secret_is_refused_without_repeating_it() -> None:
    with pytest.raises(InvalidInputError) as caught:
        Ec2Credentials.from_secret({"access_key_id": "AKIAIOSFODNN7EXAMPLE", "secret_access_key": SECRET + " \n"})
    assert SECRET not in str(caught.value)
    assert caught.value.details["path"] == "secret_access_key"


@pytest.mark.parametrize(
    ("settings", "path"),
    [
        ({}, "region"),
        ({"region": "mars"}, "region"),
        ({"region": "eu-west-1", "endpoint_url": "ftp://x"}, "endpoint_url"),
        ({"region": "eu-west-1", "endpoint_url": "https://user:pw@ec2.example"}, "endpoint_url"),
        ({"region": "eu-west-1", "security_group_ids": "sg-1"}, "security_group_ids"),
        ({"region": "eu-west-1", "read_timeout": 0}, "read_timeout"),
        ({"region": "eu-west-1", "colour": "blue"}, "colour"),
    ],
)
def test_settings_are_checked(settings: dict[str, object], path: str) -> None:
    with pytest.raises(InvalidInputError) as caught:
        Ec2Settings.from_mapping(settings)
    assert caught.value.details["path"] == path


def test_settings_from_a_mapping() -> None:
    settings = Ec2Settings.from_mapping(
        {"region": "eu-west-1", "endpoint_url": "http://127.0.0.1:5000", "security_group_ids": ["sg-0abc1234"]}
    )
    assert settings.security_group_ids == ("sg-0abc1234",)
    assert settings.endpoint_url == "http://127.0.0.1:5000"


def test_the_ec2_adapter_satisfies_the_port() -> None:
    # mypy checks the assignment structurally; the loop checks every method of the port exists at run time.
    adapter: ProviderAdapter = Ec2Adapter(
        Ec2Settings(region="eu-west-1"), Ec2Credentials(access_key_id="AKIAEXAMPLE0000000", secret_access_key=SECRET)
    )
    assert all(callable(getattr(adapter, name)) for name in ProviderAdapter.__dict__ if not name.startswith("_"))


def test_provider_error_knows_its_codes() -> None:
    error = ProviderError(PROVIDER_THROTTLED, "slow down", retryable=True, provider_code="RequestLimitExceeded")
    assert "RequestLimitExceeded" in repr(error)
    with pytest.raises(ValueError, match="unknown provider error code"):
        ProviderError("SOMETHING", "no")


def _client_error(code: str, status: int, message: str = "") -> botocore.exceptions.ClientError:
    return botocore.exceptions.ClientError(
        {"Error": {"Code": code, "Message": message}, "ResponseMetadata": {"HTTPStatusCode": status}},  # type: ignore[typeddict-item]  # the stubs want every metadata key
        "RunInstances",
    )


@pytest.mark.parametrize(
    ("code", "status", "expected", "retryable"),
    [
        ("InstanceLimitExceeded", 400, PROVIDER_QUOTA, False),
        ("VcpuLimitExceeded", 400, PROVIDER_QUOTA, False),
        ("InsufficientInstanceCapacity", 500, PROVIDER_QUOTA, True),
        ("InvalidAMIID.NotFound", 400, PROVIDER_IMAGE_NOT_FOUND, False),
        ("InvalidAMIID.Malformed", 400, PROVIDER_IMAGE_NOT_FOUND, False),
        ("RequestLimitExceeded", 503, PROVIDER_THROTTLED, True),
        ("Throttling", 400, PROVIDER_THROTTLED, True),
        ("ThrottlingException", 400, PROVIDER_THROTTLED, True),
        ("AuthFailure", 401, PROVIDER_AUTH_FAILED, False),
        ("UnauthorizedOperation", 403, PROVIDER_AUTH_FAILED, False),
        ("InvalidClientTokenId", 403, PROVIDER_AUTH_FAILED, False),
        ("SignatureDoesNotMatch", 403, PROVIDER_AUTH_FAILED, False),
        ("InvalidInstanceID.NotFound", 400, PROVIDER_NOT_FOUND, False),
        ("InternalError", 500, PROVIDER_UNAVAILABLE, True),
        ("SomethingNew", 502, PROVIDER_UNAVAILABLE, True),
        ("IncorrectInstanceState", 400, PROVIDER_INVALID, False),
        ("IdempotentParameterMismatch", 400, PROVIDER_INVALID, False),
    ],
)
def test_ec2_errors_map_to_provider_codes(code: str, status: int, expected: str, retryable: bool) -> None:
    adapter = Ec2Adapter(
        Ec2Settings(region="eu-west-1"), Ec2Credentials(access_key_id="AKIAEXAMPLE0000000", secret_access_key=SECRET)
    )
    error = adapter._translate(_client_error(code, status, "it went wrong"), "RunInstances")
    assert (error.code, error.retryable, error.provider_code, error.status) == (expected, retryable, code, status)
    assert "it went wrong" in error.message


def test_a_provider_message_that_echoes_the_secret_is_scrubbed() -> None:
    adapter = Ec2Adapter(
        Ec2Settings(region="eu-west-1"), Ec2Credentials(access_key_id="AKIAEXAMPLE0000000", secret_access_key=SECRET)
    )
    error = adapter._translate(_client_error("AuthFailure", 401, f"key {SECRET} rejected\x1b[31m"), "DescribeInstances")
    assert SECRET not in error.message and SECRET not in repr(error)
    assert "\x1b" not in error.message
    closed = adapter._translate(
        botocore.exceptions.EndpointConnectionError(endpoint_url=f"https://ec2.example/{SECRET}"), "DescribeInstances"
    )
    assert closed.code == PROVIDER_UNAVAILABLE and closed.retryable and SECRET not in closed.message


@pytest.mark.anyio
@pytest.mark.parametrize("token", ["", "a*", "a?b", "has space", "x" * 65, "back\\slash"])
async def test_a_client_token_that_could_match_others_is_refused(token: str) -> None:
    adapter = Ec2Adapter(
        Ec2Settings(region="eu-west-1"), Ec2Credentials(access_key_id="AKIAEXAMPLE0000000", secret_access_key=SECRET)
    )
    with pytest.raises(ProviderError) as caught:
        await adapter.find(token)
    assert caught.value.code == PROVIDER_INVALID
