"""Generate ``bettercompute_proto._generated`` from ``protos/``, or check that the committed code is what the
pinned compiler makes from them (``make protos``, ``make check-protos``; CI runs the check in ``make test``).

    python -m bettercompute_proto._regenerate           # write bettercompute_proto/_generated
    python -m bettercompute_proto._regenerate --check   # exit 1, with a diff, when it drifted

The compiler is betterproto2's plugin for ``protoc`` (``grpcio-tools``), pinned in the ``dev`` extra to the same
minor version as the ``betterproto2`` runtime. The plugin formats its output with ruff; so that a newer ruff does not
read as drift, the check formats both sides with the ruff installed now before comparing them.
"""

from __future__ import annotations

import argparse
import difflib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTOS = ROOT / "protos"
TARGET = Path(__file__).resolve().parent / "_generated"
OPTIONS = "client_generation=async,server_generation=async"


def generate(out: Path) -> None:
    """Run protoc with the betterproto2 plugin over every ``.proto`` under ``protos/`` into ``out``."""
    sources = sorted(str(p.relative_to(PROTOS)) for p in PROTOS.rglob("*.proto"))
    if not sources:
        raise SystemExit(f"no .proto files under {PROTOS}")
    # The plugin is the console script next to this interpreter; protoc finds it on PATH.
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    command = [
        sys.executable,
        "-m",
        "grpc_tools.protoc",
        f"-I{PROTOS}",
        f"--python_betterproto2_out={out}",
        f"--python_betterproto2_opt={OPTIONS}",
        *sources,
    ]
    done = subprocess.run(command, cwd=PROTOS, env=env, capture_output=True, text=True, check=False)  # noqa: S603
    if done.returncode != 0:
        raise SystemExit(f"protoc failed:\n{done.stderr}")


def files(tree: Path) -> dict[str, str]:
    """Every file under ``tree`` by relative path (caches left out)."""
    return {
        str(p.relative_to(tree)): p.read_text()
        for p in sorted(tree.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


def formatted(tree: Path) -> dict[str, str]:
    """The files of ``tree`` after ``ruff format`` (run on a copy)."""
    with tempfile.TemporaryDirectory() as scratch:
        copy = Path(scratch) / "tree"
        shutil.copytree(tree, copy, ignore=shutil.ignore_patterns("__pycache__"))
        ruff = Path(sys.executable).parent / "ruff"
        subprocess.run(  # noqa: S603
            [str(ruff if ruff.exists() else "ruff"), "format", "--quiet", "--no-cache", "--isolated", str(copy)],
            check=True,
        )
        return files(copy)


def check() -> int:
    """0 when the committed code is what the compiler makes now, else 1 with the differences on stderr."""
    with tempfile.TemporaryDirectory() as scratch:
        fresh = Path(scratch) / "fresh"
        fresh.mkdir()
        generate(fresh)
        want = formatted(fresh)
    have = formatted(TARGET) if TARGET.is_dir() else {}
    if want == have:
        print("bettercompute_proto/_generated matches protos/")
        return 0
    for name in sorted(set(want) | set(have)):
        if want.get(name) != have.get(name):
            diff = difflib.unified_diff(
                have.get(name, "").splitlines(keepends=True),
                want.get(name, "").splitlines(keepends=True),
                f"committed/{name}",
                f"generated/{name}",
            )
            sys.stderr.writelines(list(diff)[:200])
    print(
        "bettercompute_proto/_generated differs from what protos/ generate: run `make protos` and commit the result",
        file=sys.stderr,
    )
    return 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    args = parser.parse_args()
    if args.check:
        raise SystemExit(check())
    with tempfile.TemporaryDirectory() as scratch:
        fresh = Path(scratch) / "fresh"
        fresh.mkdir()
        generate(fresh)
        if TARGET.exists():
            shutil.rmtree(TARGET)
        shutil.copytree(fresh, TARGET)
    print(f"wrote {TARGET.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
