"""Schemathesis's per-operation phases on share 1 of the operations (see ``conftest.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import PER_OPERATION, run_schemathesis

pytestmark = [pytest.mark.pg, pytest.mark.e2e]


@pytest.mark.timeout(600)
def test_a_schemathesis_run_with_every_check_finds_nothing(served: tuple[str, str], tmp_path: Path) -> None:
    run_schemathesis(served, tmp_path, phases=PER_OPERATION, share=1)
