"""A light part of the package imports without the core: the package's public names load on first use."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests._timing import deadline


@pytest.mark.parametrize("module", ["bettercompute._runtime.shedding", "bettercompute.errors"])
def test_a_light_part_does_not_load_the_core(module: str) -> None:
    code = f"import json, sys, {module}; print(json.dumps(sorted(sys.modules)))"
    ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=deadline(60), check=True)
    loaded = set(json.loads(ran.stdout))
    assert "bettercompute._core" not in loaded and "sqlalchemy" not in loaded
