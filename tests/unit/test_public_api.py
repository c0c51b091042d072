"""Each package's ``__all__`` is sorted, complete, and names only what exists; each has a version and py.typed."""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path
from types import ModuleType

import pytest

_ROOT = Path(__file__).resolve().parents[2]
# Every built-in module, in the core and in the store: what one exports is what the others may use.
MODULES = sorted(
    f"{package}.modules.{p.name}"
    for package in ("bettercompute", "bettercompute_store_pg")
    for p in (_ROOT / package / "modules").iterdir()
    if (p / "__init__.py").exists()
)
PACKAGES = [
    "bettercompute",
    "bettercompute.errors",
    "bettercompute.ports",
    "bettercompute.client",
    "bettercompute.testing",
    "bettercompute.fields",
    "bettercompute.paging",
    *MODULES,
    "bettercompute_daemon.identity",
    "bettercompute_store_pg",
    "bettercompute_iam",
    "bettercompute_cli",
    "bettercompute_proto",
    "bettercompute_gateway",
    "bettercompute_daemon",
    "bettercompute_metal",
    "bettercompute_vps",
]


def _isort_key(name: str) -> tuple[int, str]:
    # The order ruff keeps __all__ in (RUF022): CONSTANTS, then Classes, then everything else, each alphabetical.
    if name.isupper():
        return (0, name)
    if name[:1].isupper():
        return (1, name)
    return (2, name)


def _public_names(module: ModuleType) -> set[str]:
    names = set()
    for name, value in vars(module).items():
        if name.startswith("_") or inspect.ismodule(value):
            continue
        defined_in = getattr(value, "__module__", None)
        # Names imported from elsewhere (typing, attrs, ...) are not part of this module's surface.
        if defined_in is not None and not str(defined_in).startswith(module.__name__.split(".")[0]):
            continue
        names.add(name)
    return names


@pytest.mark.parametrize("name", PACKAGES)
def test_all_is_sorted_and_names_what_exists(name: str) -> None:
    module = importlib.import_module(name)
    exported = list(module.__all__)
    assert exported == sorted(exported, key=_isort_key)
    missing = [n for n in exported if not hasattr(module, n)]
    assert missing == []


@pytest.mark.parametrize("name", [p for p in PACKAGES if "." not in p])
def test_every_public_name_is_exported(name: str) -> None:
    module = importlib.import_module(name)
    assert _public_names(module) - set(module.__all__) == set()


@pytest.mark.parametrize("name", [p for p in PACKAGES if "." not in p])
def test_every_package_has_a_version_and_is_typed(name: str) -> None:
    module = importlib.import_module(name)
    assert isinstance(module.__version__, str) and module.__version__
    assert module.__file__ is not None
    assert (Path(module.__file__).parent / "py.typed").is_file()
