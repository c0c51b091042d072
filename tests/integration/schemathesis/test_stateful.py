"""Schemathesis's stateful phase, which chains operations by the document's links, on every operation; and the
check that the per-operation shares cover every operation (see ``conftest.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import SHARES, run_schemathesis

pytestmark = [pytest.mark.pg, pytest.mark.e2e]


@pytest.mark.timeout(600)
def test_a_stateful_schemathesis_run_with_every_check_finds_nothing(served: tuple[str, str], tmp_path: Path) -> None:
    run_schemathesis(served, tmp_path, phases="stateful", share=None)


def test_every_share_of_the_operations_has_its_file() -> None:
    files = sorted(path.name for path in Path(__file__).parent.glob("test_operations_*.py"))
    assert files == [f"test_operations_{k}.py" for k in range(SHARES)]
