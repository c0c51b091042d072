"""``load_config``: defaults < file < environment < flags, and a clear message for each kind of bad value."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import attrs
import pytest

from bettercompute import Options
from bettercompute_cli import Config, load_config
from bettercompute_cli._config import KEYS, ConfigError, parse_roles
from bettercompute_cli._runtime import Plan, build, build_serving, notifier_note, plan_roles, webhooks_note
from bettercompute_store_pg import PgNotifier

URL_FILE = "postgresql://postgres@db-from-file:5432/x"
URL_ENV = "postgresql://postgres@db-from-env:5432/x"


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "bettercompute.toml"
    path.write_text(text)
    return path


def _problems(path: Path | None = None, environ: dict[str, str] | None = None, **flags: object) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config(path, environ or {}, flags)
    return info.value.problems


def test_defaults_without_file_or_environment() -> None:
    assert load_config(None, {}) == Config(
        database_url=None,
        schema="bettercompute",
        host="127.0.0.1",
        port=3000,
        roles=("all",),
        pgbouncer=False,
        instance=None,
    )


def test_file_then_environment_then_flags(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        f"""
database_url = "{URL_FILE}"
schema = "from_file"
host = "10.0.0.1"
port = 4000
roles = ["api", "sinks"]
pgbouncer = true
instance = "file-1"
""",
    )
    from_file = load_config(path, {})
    assert from_file == Config(
        database_url=URL_FILE,
        schema="from_file",
        host="10.0.0.1",
        port=4000,
        roles=("api", "sinks"),
        pgbouncer=True,
        instance="file-1",
    )

    environ = {
        "BETTERCOMPUTE_DATABASE_URL": URL_ENV,
        "BETTERCOMPUTE_SCHEMA": "from_env",
        "BETTERCOMPUTE_PORT": "5000",
        "BETTERCOMPUTE_ROLES": "controllers,iam",
        "BETTERCOMPUTE_PGBOUNCER": "off",
    }
    from_env = load_config(path, environ)
    assert from_env.database_url == URL_ENV
    assert (from_env.schema, from_env.port, from_env.roles, from_env.pgbouncer) == (
        "from_env",
        5000,
        ("controllers", "iam"),
        False,
    )
    # Keys the environment does not set still come from the file.
    assert (from_env.host, from_env.instance) == ("10.0.0.1", "file-1")

    from_flags = load_config(path, environ, {"port": 6000, "roles": "api", "host": "10.0.0.9", "schema": None})
    assert (from_flags.port, from_flags.roles, from_flags.host) == (6000, ("api",), "10.0.0.9")
    assert from_flags.schema == "from_env"  # a flag left at None does not override


def test_the_config_file_can_come_from_the_environment(tmp_path: Path) -> None:
    path = _write(tmp_path, "port = 4100\n")
    assert load_config(None, {"BETTERCOMPUTE_CONFIG": str(path)}).port == 4100
    # An explicit path wins over the variable.
    other = tmp_path / "other.toml"
    other.write_text("port = 4200\n")
    assert load_config(other, {"BETTERCOMPUTE_CONFIG": str(path)}).port == 4200


def test_empty_environment_variables_count_as_unset(tmp_path: Path) -> None:
    path = _write(tmp_path, "port = 4300\n")
    config = load_config(path, {"BETTERCOMPUTE_PORT": "", "BETTERCOMPUTE_DATABASE_URL": "  "})
    assert config.port == 4300
    assert config.database_url is None


@pytest.mark.parametrize(
    ("value", "expected"),
    [("true", True), ("1", True), ("YES", True), ("on", True), ("false", False), ("0", False), ("no", False)],
)
def test_pgbouncer_from_the_environment(value: str, expected: bool) -> None:
    assert load_config(None, {"BETTERCOMPUTE_PGBOUNCER": value}).pgbouncer is expected


def test_unknown_key_names_the_key_and_the_file(tmp_path: Path) -> None:
    path = _write(tmp_path, "prot = 3000\n")
    [problem] = _problems(path)
    assert str(path) in problem
    assert "unknown key 'prot'" in problem
    assert all(key in problem for key in KEYS)


@pytest.mark.parametrize(
    ("toml", "needle"),
    [
        ('port = "3000"', "port must be a port number"),
        ("port = 0", "port must be a port number"),
        ("port = 65536", "port must be a port number"),
        ("port = true", "port must be a port number"),
        ('pgbouncer = "yes"', "pgbouncer must be true or false"),
        ("host = 1", "host must be a non-empty string"),
        ('roles = ["api", "gpu"]', "roles: unknown role(s) gpu"),
        ("roles = 3", "roles must be a list of role names"),
        ('schema = "Bad-Name"', "schema 'Bad-Name' must be a lower-case identifier"),
        ('schema = "pg_catalog"', "schema 'pg_catalog' must be a lower-case identifier"),
    ],
)
def test_wrong_values_in_the_file_name_the_key(tmp_path: Path, toml: str, needle: str) -> None:
    path = _write(tmp_path, toml + "\n")
    [problem] = _problems(path)
    assert problem.startswith(f"{path}: ")
    assert needle in problem


@pytest.mark.parametrize(
    ("name", "value", "needle"),
    [
        ("BETTERCOMPUTE_PORT", "abc", "BETTERCOMPUTE_PORT must be a port number from 1 to 65535, not 'abc'"),
        ("BETTERCOMPUTE_PORT", "-1", "BETTERCOMPUTE_PORT must be a port number"),
        ("BETTERCOMPUTE_PORT", "99999", "BETTERCOMPUTE_PORT must be a port number"),
        ("BETTERCOMPUTE_PGBOUNCER", "maybe", "BETTERCOMPUTE_PGBOUNCER must be true or false"),
        ("BETTERCOMPUTE_ROLES", "api,web", "BETTERCOMPUTE_ROLES: unknown role(s) web"),
        ("BETTERCOMPUTE_ROLES", " , ", "BETTERCOMPUTE_ROLES: no role given"),
    ],
)
def test_wrong_values_in_the_environment_name_the_variable(name: str, value: str, needle: str) -> None:
    [problem] = _problems(environ={name: value})
    assert needle in problem


def test_a_bad_flag_names_the_flag() -> None:
    [problem] = _problems(port=0)
    assert problem.startswith("--port must be a port number")


def test_a_bad_database_url_is_reported_without_its_password() -> None:
    [problem] = _problems(environ={"BETTERCOMPUTE_DATABASE_URL": "mysql://root:hunter2@db/x"})
    assert "BETTERCOMPUTE_DATABASE_URL must be a URL starting with postgresql://" in problem
    assert "hunter2" not in problem


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    path = _write(tmp_path, 'prot = 1\nport = "x"\n')
    problems = _problems(path, {"BETTERCOMPUTE_PGBOUNCER": "maybe"})
    assert len(problems) == 3


def test_unreadable_and_malformed_files(tmp_path: Path) -> None:
    [missing] = _problems(tmp_path / "nope.toml")
    assert "nope.toml: cannot be read" in missing
    [malformed] = _problems(_write(tmp_path, "port = \n"))
    assert "not valid TOML" in malformed


def test_the_database_url_stays_out_of_the_repr() -> None:
    config = load_config(None, {"BETTERCOMPUTE_DATABASE_URL": "postgresql://u:hunter2@db/x"})
    assert "hunter2" not in repr(config)


def test_roles_parse_from_a_string_or_a_list() -> None:
    assert parse_roles(" API , sinks,api ") == ("api", "sinks")
    assert parse_roles(["controllers", "iam"]) == ("controllers", "iam")
    with pytest.raises(ValueError, match="expected role names"):
        parse_roles([1])


def test_role_plans() -> None:
    workers = frozenset({"controllers", "scheduler", "sinks", "iam"})
    assert plan_roles(("all",)) == Plan(api=True, workers=workers)
    assert plan_roles(("api",)) == Plan(api=True, workers=frozenset())
    assert plan_roles(("sinks", "iam")) == Plan(api=False, workers=frozenset({"sinks", "iam"}))
    with pytest.raises(ConfigError, match="the gateway role needs trust_domain and gateway_address"):
        plan_roles(("api", "gateway"))
    identity = Config(
        trust_domain="compute.example", gateway_address="gw.example.com:7443", kms_key_file=Path("/k"), instance="a b"
    )
    # With the api in the process, the gateway uses the services in process (it has the KMS key).
    plan = plan_roles(("api", "gateway"), identity)
    assert plan.api is True and plan.gateway is not None and plan.gateway.remote is None
    assert (plan.gateway.port, plan.gateway.name) == (7443, "a-b")
    assert plan.gateway.hosts == ("gw.example.com", "localhost", "127.0.0.1", "::1")
    assert plan_roles(("all",), identity).gateway == plan.gateway
    assert plan_roles(("all",), Config()).gateway is None  # no node identity: no gateway in all
    assert plan.internal is None  # no internal_port: no listener for other gateways
    listening = attrs.evolve(identity, internal_port=7444, internal_host="10.0.0.2")
    assert plan_roles(("api",), listening).internal == ("10.0.0.2", 7444)
    assert plan_roles(("controllers",), listening).internal is None  # only an api process listens


def test_a_gateway_without_the_api_holds_no_kms_key_and_needs_the_internal_address(tmp_path: Path) -> None:
    edge = Config(
        trust_domain="compute.example",
        gateway_address="gw.example.com:7443",
        instance="edge-1",
        internal_address="api.internal:7444",
        gateway_token="bcgw_x",
        gateway_state_dir=tmp_path / "gw",
    )
    plan = plan_roles(("gateway",), edge)
    assert plan.api is False and plan.gateway is not None and plan.gateway.remote is not None
    remote = plan.gateway.remote
    assert (remote.addresses, remote.state_dir, remote.token) == ((("api.internal", 7444),), tmp_path / "gw", "bcgw_x")
    # Several api processes: the gateway goes on through another while one is down.
    both = plan_roles(("gateway",), attrs.evolve(edge, internal_address="api-1.internal:7444, api-2.internal:7445"))
    assert both.gateway is not None and both.gateway.remote is not None
    assert both.gateway.remote.addresses == (("api-1.internal", 7444), ("api-2.internal", 7445))
    assert "bcgw_x" not in repr(plan)  # the token is never shown
    with pytest.raises(ConfigError, match="holds no KMS key") as keyed:
        plan_roles(("gateway",), attrs.evolve(edge, kms_key_file=Path("/k")))
    assert "internal_address" not in str(keyed.value)
    with pytest.raises(ConfigError, match="kms_previous_key_file: a gateway without the api holds no KMS key"):
        plan_roles(("gateway",), attrs.evolve(edge, kms_previous_key_file=Path("/old")))
    with pytest.raises(ConfigError, match="set internal_address"):
        plan_roles(("gateway",), attrs.evolve(edge, internal_address=None))


CREDENTIAL = "bcak_0000000000000000." + "s" * 43


def test_the_central_iam_keys_from_file_environment_and_flag(tmp_path: Path) -> None:
    path = _write(tmp_path, f'iam_url = "http://iam-from-file:3000/"\niam_credential = "{CREDENTIAL}"\n')
    from_file = load_config(path, {})
    # A trailing slash is dropped, so the client's paths join cleanly.
    assert (from_file.iam_url, from_file.iam_credential) == ("http://iam-from-file:3000", CREDENTIAL)

    environ = {"BETTERCOMPUTE_IAM_URL": "https://iam-from-env", "BETTERCOMPUTE_IAM_CREDENTIAL": f" {CREDENTIAL}\n"}
    from_env = load_config(path, environ)
    assert (from_env.iam_url, from_env.iam_credential) == ("https://iam-from-env", CREDENTIAL)

    from_flag = load_config(path, environ, {"iam_url": "http://iam-from-flag:4000"})
    assert from_flag.iam_url == "http://iam-from-flag:4000"
    assert load_config(None, {}).iam_url is None


@pytest.mark.parametrize(
    ("environ", "present", "missing"),
    [
        ({"BETTERCOMPUTE_IAM_URL": "http://iam:3000"}, "iam_url", "iam_credential"),
        ({"BETTERCOMPUTE_IAM_CREDENTIAL": CREDENTIAL}, "iam_credential", "iam_url"),
    ],
)
def test_one_central_iam_key_without_the_other_names_both(environ: dict[str, str], present: str, missing: str) -> None:
    [problem] = _problems(environ=environ)
    assert problem.startswith(f"{present} is set but {missing} is not")
    assert "BETTERCOMPUTE_IAM_URL" in problem
    assert "BETTERCOMPUTE_IAM_CREDENTIAL" in problem
    assert CREDENTIAL not in problem


def test_the_iam_url_flag_without_a_credential_is_refused() -> None:
    [problem] = _problems(iam_url="http://iam:3000")
    assert "iam_url is set but iam_credential is not" in problem


@pytest.mark.parametrize(
    ("url", "needle"),
    [
        ("iam:3000", "must be an http:// or https:// URL"),
        ("ftp://iam", "must be an http:// or https:// URL"),
        ("http://", "must be an http:// or https:// URL"),
        ("http://iam:99999", "must be an http:// or https:// URL"),
        ("http://u:hunter2@iam", "must not hold a user or password"),
        ("http://iam/?x=1", "must not have a query or a fragment"),
    ],
)
def test_a_bad_iam_url_is_named(url: str, needle: str) -> None:
    [problem] = _problems(environ={"BETTERCOMPUTE_IAM_URL": url, "BETTERCOMPUTE_IAM_CREDENTIAL": CREDENTIAL})
    assert problem.startswith("BETTERCOMPUTE_IAM_URL ")
    assert needle in problem
    assert "hunter2" not in problem


def test_a_bad_iam_credential_is_reported_without_its_value(tmp_path: Path) -> None:
    path = _write(tmp_path, 'iam_url = "http://iam"\niam_credential = 12345\n')
    [problem] = _problems(path)
    assert problem == f"{path}: iam_credential must be a non-empty string"


def test_the_iam_credential_stays_out_of_the_repr() -> None:
    config = load_config(None, {"BETTERCOMPUTE_IAM_URL": "http://iam", "BETTERCOMPUTE_IAM_CREDENTIAL": CREDENTIAL})
    assert config.iam_credential == CREDENTIAL
    assert CREDENTIAL not in repr(config)
    assert "http://iam" in repr(config)


def test_the_kms_key_file_from_file_and_environment(tmp_path: Path) -> None:
    assert load_config(None, {}).kms_key_file is None
    path = _write(tmp_path, 'kms_key_file = "/etc/bettercompute/kms.key"\n')
    assert load_config(path, {}).kms_key_file == Path("/etc/bettercompute/kms.key")
    from_env = load_config(path, {"BETTERCOMPUTE_KMS_KEY_FILE": " ~/kms.key "})
    assert from_env.kms_key_file == Path("~/kms.key").expanduser()


@pytest.mark.parametrize("toml", ["kms_key_file = 3", 'kms_key_file = "  "'])
def test_a_bad_kms_key_file_names_the_key(tmp_path: Path, toml: str) -> None:
    path = _write(tmp_path, toml + "\n")
    [problem] = _problems(path)
    assert problem == f"{path}: kms_key_file must be a non-empty path"


def test_a_previous_kms_key_file_makes_a_ring_that_seals_with_the_new_key_and_opens_with_both(tmp_path: Path) -> None:
    import anyio

    from bettercompute import KmsRing, LocalKeyKms

    old, new = tmp_path / "old.key", tmp_path / "new.key"
    path = _write(tmp_path, f'kms_key_file = "{new}"\nkms_previous_key_file = "{old}"\n')
    config = load_config(path, {})
    assert config.kms_previous_key_file == old
    compute, _ = build(config, "postgresql://postgres@127.0.0.1:1/x")
    ring = compute.context.kms
    assert isinstance(ring, KmsRing)

    async def round_trips() -> None:
        sealed_before = await LocalKeyKms(old).encrypt(b"before", context="c")
        assert await ring.decrypt(sealed_before, context="c") == b"before"
        sealed_now = await ring.encrypt(b"now", context="c")
        assert await LocalKeyKms(new).decrypt(sealed_now, context="c") == b"now"

    anyio.run(round_trips)
    assert load_config(_write(tmp_path, f'kms_key_file = "{new}"\n'), {}).kms_previous_key_file is None


def test_a_kms_key_file_turns_webhooks_on_without_touching_the_file(tmp_path: Path) -> None:
    url = "postgresql://postgres@127.0.0.1:1/x"
    without, _ = build(load_config(None, {}), url)
    # The group is there either way; without a key file its calls say so, and nothing sends.
    assert without.registry.owner("webhooks") == "webhooks"
    assert "sinks/webhooks" not in [job.lease_name for job in without.jobs.all]
    key = tmp_path / "keys" / "kms.key"
    config = load_config(None, {"BETTERCOMPUTE_KMS_KEY_FILE": str(key)})
    for compute in (build(config, url)[0], build_serving(config, url)[0]):
        assert compute.registry.owner("webhooks") == "webhooks"
        assert "sinks/webhooks" in [job.lease_name for job in compute.jobs.all]
    assert not key.parent.exists()  # created on first use, not when composing


def test_the_trust_domain_and_gateway_address_come_together(tmp_path: Path) -> None:
    path = _write(tmp_path, 'trust_domain = "compute.example.com"\ngateway_address = "gw.example.com:443"\n')
    config = load_config(path, {})
    assert (config.trust_domain, config.gateway_address) == ("compute.example.com", "gw.example.com:443")
    with pytest.raises(ConfigError) as alone:
        load_config(None, {"BETTERCOMPUTE_TRUST_DOMAIN": "compute.example.com"})
    assert alone.value.problems == [
        "trust_domain is set but gateway_address is not: joining nodes needs both (the join command pins both)"
    ]
    with pytest.raises(ConfigError) as bad:
        load_config(None, {"BETTERCOMPUTE_TRUST_DOMAIN": "Not A Domain", "BETTERCOMPUTE_GATEWAY_ADDRESS": "gw"})
    assert bad.value.problems == [
        "BETTERCOMPUTE_TRUST_DOMAIN 'Not A Domain' must be a lower-case DNS name like compute.example.com",
        "BETTERCOMPUTE_GATEWAY_ADDRESS 'gw' must be host:port",
    ]


# --- lease TTL and notifier ----------------------------------------------------------------------------------------

LOCAL_URL = "postgresql://postgres@127.0.0.1:1/x"


def test_the_default_lease_ttl_is_the_libraries() -> None:
    assert dt.timedelta(seconds=load_config(None, {}).lease_ttl_seconds) == Options().lease_ttl


def test_the_lease_ttl_from_file_environment_and_decimals(tmp_path: Path) -> None:
    path = _write(tmp_path, "lease_ttl_seconds = 30\n")
    assert load_config(path, {}).lease_ttl_seconds == 30
    assert load_config(path, {"BETTERCOMPUTE_LEASE_TTL_SECONDS": " 2.5 "}).lease_ttl_seconds == 2.5
    assert load_config(_write(tmp_path, "lease_ttl_seconds = 1.5\n"), {}).lease_ttl_seconds == 1.5
    assert load_config(None, {"BETTERCOMPUTE_LEASE_TTL_SECONDS": "3600"}).lease_ttl_seconds == 3600


@pytest.mark.parametrize("value", ["0", "0.5", "3601", "-5", '"15"', "true", "nan", "inf"])
def test_a_bad_lease_ttl_in_the_file_names_the_key_and_the_range(tmp_path: Path, value: str) -> None:
    path = _write(tmp_path, f"lease_ttl_seconds = {value}\n")
    [problem] = _problems(path)
    assert problem.startswith(f"{path}: lease_ttl_seconds must be a number of seconds from 1 to 3600, not ")


@pytest.mark.parametrize("value", ["abc", "0", "0.99", "1e9", "nan", "inf", "15s"])
def test_a_bad_lease_ttl_in_the_environment_names_the_variable(value: str) -> None:
    [problem] = _problems(environ={"BETTERCOMPUTE_LEASE_TTL_SECONDS": value})
    assert problem == f"BETTERCOMPUTE_LEASE_TTL_SECONDS must be a number of seconds from 1 to 3600, not {value!r}"


def test_a_bad_notify_url_is_reported_without_its_password(tmp_path: Path) -> None:
    [problem] = _problems(environ={"BETTERCOMPUTE_NOTIFY_URL": "mysql://root:hunter2@db/x"})
    assert problem == "BETTERCOMPUTE_NOTIFY_URL must be a URL starting with postgresql://"
    config = load_config(None, {"BETTERCOMPUTE_NOTIFY_URL": "postgresql://u:hunter2@db-direct/x"})
    assert config.notify_url == "postgresql://u:hunter2@db-direct/x"
    assert "hunter2" not in repr(config)
    # One that passes the first look but cannot be parsed is refused when composing, naming the key only.
    unparsable = load_config(None, {"BETTERCOMPUTE_NOTIFY_URL": "postgresql://u:hunter2@db-direct:port/x"})
    with pytest.raises(ConfigError) as info:
        build_serving(unparsable, LOCAL_URL)
    assert info.value.problems == ["notify_url cannot be parsed as a PostgreSQL URL"]


def test_serve_and_dev_compose_the_notifier_and_the_lease_ttl() -> None:
    config = load_config(None, {"BETTERCOMPUTE_LEASE_TTL_SECONDS": "3", "BETTERCOMPUTE_SCHEMA": "bc_notify"})
    for compute in (build_serving(config, LOCAL_URL)[0], build(config, LOCAL_URL, notify=True)[0]):
        assert compute.options.lease_ttl == dt.timedelta(seconds=3)
        notifier = compute.options.notifier
        assert isinstance(notifier, PgNotifier)
        assert notifier.schema == "bc_notify"  # channels are per schema, like the tables
    # The one-shot commands (migrate, iam bootstrap) send no pokes, but keep the TTL.
    one_shot, _ = build(config, LOCAL_URL)
    assert one_shot.options.notifier is None
    assert one_shot.options.lease_ttl == dt.timedelta(seconds=3)


def test_behind_pgbouncer_only_a_notify_url_gives_a_notifier() -> None:
    pooled = load_config(None, {"BETTERCOMPUTE_PGBOUNCER": "true"})
    assert build_serving(pooled, LOCAL_URL)[0].options.notifier is None
    note = notifier_note(pooled)
    assert note is not None and "polling" in note and "notify_url" in note
    direct = load_config(None, {"BETTERCOMPUTE_PGBOUNCER": "true", "BETTERCOMPUTE_NOTIFY_URL": LOCAL_URL})
    assert isinstance(build_serving(direct, LOCAL_URL)[0].options.notifier, PgNotifier)
    assert notifier_note(direct) == "worker loops are woken by LISTEN/NOTIFY pokes over notify_url"
    assert notifier_note(load_config(None, {})) is None


@pytest.mark.parametrize(("value", "expected"), [("true", True), ("YES", True), ("1", True), ("off", False)])
def test_webhooks_allow_private_from_the_environment(value: str, expected: bool) -> None:
    config = load_config(None, {"BETTERCOMPUTE_WEBHOOKS_ALLOW_PRIVATE": value})
    assert config.webhooks_allow_private is expected


def test_webhooks_allow_private_from_the_file_and_overridden_by_the_environment(tmp_path: Path) -> None:
    assert load_config(None, {}).webhooks_allow_private is False
    path = _write(tmp_path, "webhooks_allow_private = true\n")
    assert load_config(path, {}).webhooks_allow_private is True
    assert load_config(path, {"BETTERCOMPUTE_WEBHOOKS_ALLOW_PRIVATE": "false"}).webhooks_allow_private is False


def test_a_bad_webhooks_allow_private_names_its_source(tmp_path: Path) -> None:
    [problem] = _problems(_write(tmp_path, 'webhooks_allow_private = "yes"\n'))
    assert "webhooks_allow_private must be true or false" in problem
    [problem] = _problems(None, {"BETTERCOMPUTE_WEBHOOKS_ALLOW_PRIVATE": "maybe"})
    assert problem.startswith("BETTERCOMPUTE_WEBHOOKS_ALLOW_PRIVATE must be true or false")


def test_dev_allows_loopback_webhooks_and_serve_only_with_the_setting() -> None:
    default = load_config(None, {})
    served = build_serving(default, LOCAL_URL)[0].options.webhooks
    assert (served.allow_private_destinations, served.allow_loopback_destinations) == (False, False)
    dev = build(default, LOCAL_URL, notify=True, loopback_webhooks=True)[0].options.webhooks
    assert (dev.allow_private_destinations, dev.allow_loopback_destinations) == (False, True)
    allowed = load_config(None, {"BETTERCOMPUTE_WEBHOOKS_ALLOW_PRIVATE": "true"})
    assert build_serving(allowed, LOCAL_URL)[0].options.webhooks.allow_private_destinations is True

    assert webhooks_note(default, dev=False) is None
    dev_note = webhooks_note(default, dev=True)
    assert dev_note is not None and "loopback" in dev_note and "webhooks_allow_private" in dev_note
    for dev_mode in (False, True):
        note = webhooks_note(allowed, dev=dev_mode)
        assert note is not None and "webhooks_allow_private is on" in note


def test_the_gateway_listens_where_its_keys_say_and_daemons_still_dial_the_address(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        'trust_domain = "compute.example"\ngateway_address = "gw.example.com:443"\nkms_key_file = "/k"\n'
        'gateway_host = "10.1.2.3"\n',
    )
    config = load_config(path, {"BETTERCOMPUTE_GATEWAY_PORT": "7443"})
    assert (config.gateway_host, config.gateway_port) == ("10.1.2.3", 7443)
    plan = plan_roles(("api", "gateway"), config).gateway
    assert plan is not None and (plan.listen_host, plan.port) == ("10.1.2.3", 7443)
    assert plan.hosts[0] == "gw.example.com"  # the certificate names what daemons dial
    flagged = load_config(path, {}, {"gateway_port": 9443, "gateway_host": "10.0.0.5"})
    assert (flagged.gateway_host, flagged.gateway_port) == ("10.0.0.5", 9443)
    unset = plan_roles(("api", "gateway"), load_config(path, {"BETTERCOMPUTE_GATEWAY_HOST": ""}))
    assert unset.gateway is not None and unset.gateway.port == 443


@pytest.mark.parametrize(
    "value",
    [
        "\uff10",
        "\uff17\uff14\uff14\uff13",
        "\u0667\u0664\u0664\u0663",
        "7443\u200f",
        "0",
        "65536",
        "-1",
        "74 43",
        "7443\x00",
    ],
)
def test_a_port_from_the_environment_takes_ascii_digits_in_range_only(value: str) -> None:
    for name in ("BETTERCOMPUTE_PORT", "BETTERCOMPUTE_GATEWAY_PORT"):
        problems = _problems(environ={name: value})
        assert len(problems) == 1 and name in problems[0], problems


def test_max_queued_from_the_file_the_environment_and_a_flag(tmp_path: Path) -> None:
    assert load_config(None, {}).max_queued is None  # Options then queues as many as max_in_flight
    path = _write(tmp_path, "max_queued = 32\n")
    assert load_config(path, {}).max_queued == 32
    assert load_config(path, {"BETTERCOMPUTE_MAX_QUEUED": "0"}).max_queued == 0
    assert load_config(path, {"BETTERCOMPUTE_MAX_QUEUED": "0"}, {"max_queued": 7}).max_queued == 7


@pytest.mark.parametrize(
    "text", ["max_queued = -1\n", "max_queued = 100001\n", 'max_queued = "8"\n', "max_queued = 1.5\n"]
)
def test_a_bad_max_queued_in_the_file_names_the_key(tmp_path: Path, text: str) -> None:
    [problem] = _problems(_write(tmp_path, text))
    assert "max_queued must be a whole number of requests from 0 to 100000" in problem


@pytest.mark.parametrize("value", ["-1", "many", "1e3", "\u0661\u0662", "100001", "true"])
def test_a_bad_max_queued_in_the_environment_names_the_variable(value: str) -> None:
    [problem] = _problems(None, {"BETTERCOMPUTE_MAX_QUEUED": value})
    assert problem.startswith("BETTERCOMPUTE_MAX_QUEUED must be a whole number of requests from 0 to 100000")


def test_serve_queues_as_max_queued_says() -> None:
    assert build(load_config(None, {}), LOCAL_URL)[0].max_queued == 9  # the default pool's cap: 10 less one
    config = load_config(None, {"BETTERCOMPUTE_MAX_QUEUED": "40"})
    assert build(config, LOCAL_URL)[0].max_queued == 40 and build_serving(config, LOCAL_URL)[0].max_queued == 40


def test_tunnel_keys_from_the_file_and_the_environment(tmp_path: Path) -> None:
    default = load_config(None, {})
    assert (default.tunnel_gateway, default.tunnel_streams_per_tenant, default.tunnel_bytes_per_second) == (
        None,
        16,
        8 * 1024 * 1024,
    )
    path = _write(tmp_path, 'tunnel_gateway = "tunnels.example.com:443"\ntunnel_streams_per_tenant = 4\n')
    loaded = load_config(path, {"BETTERCOMPUTE_TUNNEL_BYTES_PER_SECOND": "1048576"})
    assert loaded.tunnel_gateway == "tunnels.example.com:443"
    assert (loaded.tunnel_streams_per_tenant, loaded.tunnel_bytes_per_second) == (4, 1024 * 1024)
    bad = _write(tmp_path, 'tunnel_gateway = "no port"\ntunnel_streams_per_tenant = 0\ntunnel_bytes_per_second = 10\n')
    problems = _problems(bad)
    assert any("tunnel_gateway" in p for p in problems)
    assert any("tunnel_streams_per_tenant" in p for p in problems)
    assert any("tunnel_bytes_per_second" in p for p in problems)


def test_internal_address_takes_several_listeners_and_refuses_a_bad_one(tmp_path: Path) -> None:
    several = load_config(_write(tmp_path, 'internal_address = "a.internal:7444,b.internal:7445"\n'), {})
    assert several.internal_address == "a.internal:7444,b.internal:7445"
    for bad in ("a.internal:7444,b.internal", "a.internal:7444,,b.internal:7445", "a.internal:7444;b.internal:7445"):
        with pytest.raises(ConfigError, match="several separated by commas"):
            load_config(_write(tmp_path, f'internal_address = "{bad}"\n'), {})
