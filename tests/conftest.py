"""Fixtures for every test: the anyio backend, the PostgreSQL URL, and the per-test timeout scaled by SLOW."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest
from hypothesis import settings

from tests._timing import SLOW, deadline

DATABASE_URL_ENV = "BETTERCOMPUTE_DATABASE_URL"

# Hypothesis's deadline (200 ms an example unless a test sets one) measures the machine's load, not the code: with
# the test files on more workers than cores, and other runs on the same two cores, an example that takes 0.1 ms has
# waited 340 ms for a core and failed as "unreliable timings". No test asserts a duration through it (those that
# matter set their own), and pytest-timeout still ends a test that hangs. Example counts stay each test's own.
settings.register_profile("suite", deadline=None)
settings.load_profile("suite")


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    """Run ``pytest.mark.anyio`` tests on asyncio (the backend psycopg and SQLAlchemy support)."""
    return "asyncio"


@pytest.fixture(scope="session")
def database_url() -> Iterator[str]:
    """``BETTERCOMPUTE_DATABASE_URL`` when set, else an embedded PostgreSQL server started for the session."""
    url = os.environ.get(DATABASE_URL_ENV, "").strip()
    if url:
        yield url
        return
    # Imported here so that tests which never touch PostgreSQL do not need the pg extra.
    from bettercompute_store_pg import EmbeddedPostgres

    with EmbeddedPostgres() as server:
        yield server.url


# What hands the database URL on (to subprocesses, proxies, PgBouncer, a second server) runs in the embedded phase:
# there a URL that loses its password or host fails only against the embedded server. Of the CLI's files, those that
# start ``serve``, ``dev`` or ``migrate`` with the URL; the files that then only drive client commands against the
# served plane (every command ``dev`` prints, webhooks, served groups, the install script) hand it on the same way
# and run in the main phase only.
_HANDS_THE_URL_ON = (
    "tests/integration/cli/test_admin_commands.py",
    "tests/integration/cli/test_central_iam.py",
    "tests/integration/cli/test_dev_node.py",
    "tests/integration/cli/test_dev_reservation.py",
    "tests/integration/cli/test_metrics.py",
    "tests/integration/cli/test_nodes_end_to_end.py",
    "tests/integration/cli/test_notifier.py",
    "tests/integration/cli/test_serve.py",
    "tests/integration/cli/test_tunnel_end_to_end.py",
    "tests/integration/cli/test_worker_roles.py",
    "tests/integration/docs/",
    "tests/integration/core/test_database_outage.py",
    "tests/integration/core/test_database_blip.py",
    "tests/integration/core/test_control_plane.py",
    "tests/integration/core/test_lifespan.py",
    "tests/integration/store_pg/",
    "tests/integration/iam_conformance/",
    "tests/unit/cli/",
    "tests/integration/worker/test_processes.py",
    "tests/integration/workflows/test_processes.py",
    "tests/integration/examples/test_custom_deployment.py",
)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--fixture-cover",
        action="store_true",
        help="run the directories that hand the database URL on, plus the fewest other tests that use every fixture",
    )


def _fixtures(item: pytest.Item) -> set[tuple[str, str]]:
    """The fixtures ``item`` sets up that reach the database URL (``database_url``, or a fixture built on it), each
    named by its function: one imported into a second conftest is the same fixture. A fixture that never sees the
    URL (a VM image, a LAN, a parameter) works the same in both phases and does not call for a test of its own."""
    info = getattr(item, "_fixtureinfo", None)  # pytest keeps the resolved definitions here, on test functions
    if info is None:
        return set()
    defs = {name: found for name, found in info.name2fixturedefs.items() if found}
    reaches: dict[str, bool] = {}

    def reach(name: str) -> bool:
        if name not in reaches:
            reaches[name] = False  # guards a cycle; a fixture overriding its namesake reads the overridden one below
            uses = {used for fixture in defs.get(name, ()) for used in fixture.argnames if used != name}
            reaches[name] = name == "database_url" or any(reach(used) for used in uses)
        return reaches[name]

    return {(defs[name][-1].func.__module__, defs[name][-1].func.__qualname__) for name in defs if reach(name)}


# The files that take longest, longest first, as measured (wall time of a whole `make test` on two cores; a process
# killed mid-launch waits out its claim, a VM boots under TCG, the CLI's subprocesses, worker processes): with the
# files spread over workers (``make test``), one that starts last runs on alone after every other worker has
# finished, so the longest go first. The other files follow, those with the most tests first.
_START_FIRST = (
    "tests/integration/vps/test_provider_crash.py",
    "tests/integration/cli/test_dev_commands.py",
    "tests/integration/vps/test_hosted_vm.py",
    "tests/integration/sim/test_sim.py",
    "tests/integration/site/test_bare_metal.py",
    "tests/integration/workflows/test_processes.py",
    "tests/integration/gateway/test_renewal.py",
    "tests/integration/worker/test_processes.py",
    "tests/integration/vm/test_qemu_runtime.py",
    "tests/integration/docs/test_quickstart.py",
    "tests/integration/cli/test_webhooks.py",
    "tests/unit/core/test_fields.py",
    "tests/integration/mcp/test_transports.py",
    "tests/integration/cli/test_client_commands.py",
    "tests/integration/cli/test_install_script.py",
    "tests/integration/vps/test_ec2.py",
    "tests/integration/schemathesis/test_operations_",
    "tests/integration/cli/test_served_groups.py",
    "tests/integration/metal/test_commission.py",
    "tests/integration/examples/test_custom_deployment.py",
    "tests/integration/webhooks/test_poison.py",
    "tests/integration/cli/test_worker_roles.py",
    "tests/integration/iam_matrix/",
    "tests/integration/site/test_pxe_boot.py",
    "tests/integration/store_pg/test_pgbouncer.py",
    "tests/integration/vps/test_provider.py",
    "tests/integration/cli/",
    "tests/integration/metal/test_redfish.py",
    "tests/integration/store_pg/test_conformance.py",
    "tests/integration/core/test_database_blip.py",
)


def pytest_configure(config: pytest.Config) -> None:
    # The tests press Ctrl-C (SIGINT) on commands as a terminal would. A test run started as a background job
    # (`make test &` in a script) inherits SIGINT ignored, and so would every command it starts: none would stop.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    # pytest-xdist would otherwise reorder the files by their number of tests, undoing the order given below.
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def _scale_timeout(item: pytest.Item) -> None:
    """Stretch pytest-timeout's limit for ``item`` (its ``timeout`` mark's, else the configured one) by ``SLOW``."""
    marker = item.get_closest_marker("timeout")
    if marker is not None:
        if not marker.args:
            return  # a mark with keywords only: left as written
        seconds: object = marker.args[0]
    else:
        # pytest-timeout's own order: --timeout, then PYTEST_TIMEOUT, then the ini's timeout.
        config = item.config
        seconds = config.getoption("timeout", None) or os.environ.get("PYTEST_TIMEOUT") or config.getini("timeout")
    if seconds in (None, "", 0, "0"):
        return  # no limit to stretch
    # The mark added first is the one pytest-timeout reads (get_closest_marker: the item's own marks, first first).
    item.add_marker(pytest.mark.timeout(deadline(float(str(seconds)))), append=False)


def _start_rank(item: pytest.Item, tests_in_file: dict[str, int]) -> tuple[int, int]:
    path = item.nodeid.partition("::")[0]
    for rank, prefix in enumerate(_START_FIRST):
        if path.startswith(prefix):
            return rank, 0
    return len(_START_FIRST), -tests_in_file[path]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Long files first; with ``--fixture-cover``, keep a subset that still sets up every fixture at least once.

    The reliability run (``tests/reliability``, marker ``reliability``) is a phase of its own: it restarts its own
    PostgreSQL server and takes both cores for minutes, so it runs only when ``-m`` names it
    (``make test-reliability``)."""
    if "reliability" not in (config.getoption("markexpr") or ""):
        slow = [item for item in items if item.get_closest_marker("reliability") is not None]
        if slow:
            config.hook.pytest_deselected(items=slow)
            items[:] = [item for item in items if item.get_closest_marker("reliability") is None]
    if SLOW != 1:
        for item in items:
            _scale_timeout(item)
    tests_in_file: dict[str, int] = {}
    for item in items:
        path = item.nodeid.partition("::")[0]
        tests_in_file[path] = tests_in_file.get(path, 0) + 1
    items.sort(key=lambda item: _start_rank(item, tests_in_file))  # stable: the order within a file stays
    if not config.getoption("--fixture-cover"):
        return
    covered: set[tuple[str, str]] = set()
    keep: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    # The long files last: a fixture that a short test also sets up is covered by the short one.
    by_cost = sorted(
        items, key=lambda it: (not it.nodeid.startswith(_HANDS_THE_URL_ON), -_start_rank(it, tests_in_file)[0])
    )
    for item in by_cost:
        names = _fixtures(item)
        if item.nodeid.startswith(_HANDS_THE_URL_ON) or not names <= covered:
            keep.append(item)
            covered |= names
        else:
            dropped.append(item)
    config.hook.pytest_deselected(items=dropped)
    kept = set(keep)
    items[:] = [item for item in items if item in kept]
