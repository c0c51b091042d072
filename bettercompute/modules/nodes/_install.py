"""What ``join-tokens.create`` hands an operator besides the join command: the CA pin, and the install script.

The CA pin is ``sha256:`` and the lowercase hex SHA-256 of the bundle's CA certificates in DER, sorted bytewise and
concatenated (for one CA, its SHA-256 fingerprint). ``bcd join --ca-pin`` fetches the bundle from the gateway and
trusts it only if it has this pin; ``bettercompute_daemon._pin`` computes the same (the tests hold them together).

The install script is POSIX ``sh``, run once as root on the machine to join (spec, join flow step 2). It writes the
pinned configuration, JoinService's public key included (``/etc/bcd/join.json``, mode 0600, the form ``bcd join
--config`` reads), makes sure ``bcd`` is there, installs the ``bcd`` systemd unit as the installed ``bcd`` prints it
(``bcd unit``), runs ``bcd join --config ... --token ...`` and then enables and starts ``bcd node``.

How ``bcd`` gets on the machine: a ``bcd`` already there is used (``BCD_BIN``, else the one on ``PATH``); otherwise
the script makes a virtual environment (``BCD_VENV``, ``/opt/bcd``; Python 3.11 or later) and installs
``bettercompute[daemon,nvml]`` of this control plane's version with pip (pip's own configuration, such as
``PIP_INDEX_URL`` for a mirror, applies), linking ``/usr/local/bin/bcd`` (``BCD_BIN_DIR``). The script holds the
token, a secret: it is in this one answer, never stored, and should be deleted once run.

Every value the script holds is single-quoted for ``sh`` (``shlex.quote``) and the configuration is JSON with
ASCII escapes, so no value can end its quotes, start a command or add a line, whatever it holds; upstream rules
(pool ids, the gateway address, the trust domain) already refuse anything of the kind.
"""

from __future__ import annotations

import hashlib
import json
import shlex

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from bettercompute._version import __version__

__all__ = ["bundle_pin", "install_script"]

_SCRIPT = """\
#!/bin/sh
# Joins this machine to a Better Compute pool. Made by join-tokens.create: it writes bcd's pinned configuration
# (gateway, trust domain, pool, JoinService's public key, CA pin), makes sure bcd is installed, installs its systemd
# unit, runs `bcd join`, then starts `bcd node`.
# It carries a one-time join token, a secret: run it once, as root, then delete it.
#
# Environment (all optional):
#   BCD_ETC=/etc/bcd                     where the pinned configuration goes (join.json, mode 0600)
#   BCD_STATE_DIR=/var/lib/bcd           bcd's state directory (its key and certificate)
#   BCD_SYSTEMD_DIR=/etc/systemd/system  where bcd.service goes
#   BCD_SKIP_SYSTEMCTL=1                 install the unit, but do not reload, enable or start it
#   BCD_BIN=/path/to/bcd                 the bcd to use; without it the one on PATH, and without that bcd of this
#                                        control plane's version is installed with pip into BCD_VENV (/opt/bcd)
#                                        and linked from BCD_BIN_DIR (/usr/local/bin)
#   BCD_FAKE_INVENTORY=/path/to/file     declare this machine's hardware (a machine without GPUs); reported as fake
set -eu
umask 077

BCD_ETC="${{BCD_ETC:-/etc/bcd}}"
BCD_STATE_DIR="${{BCD_STATE_DIR:-/var/lib/bcd}}"
BCD_SYSTEMD_DIR="${{BCD_SYSTEMD_DIR:-/etc/systemd/system}}"
BCD_VENV="${{BCD_VENV:-/opt/bcd}}"
BCD_BIN_DIR="${{BCD_BIN_DIR:-/usr/local/bin}}"
BCD_VERSION={version}
BCD_TOKEN={token}
BCD_CONFIG={config}

say() {{ printf 'bcd install: %s\\n' "$*" >&2; }}
fail() {{ say "$*"; exit 1; }}

if [ -z "${{BCD_BIN:-}}" ]; then
  BCD_BIN=$(command -v bcd 2>/dev/null || true)
fi
if [ -z "$BCD_BIN" ]; then
  command -v python3 >/dev/null 2>&1 || fail "bcd is not installed, and there is no python3 to install it with"
  say "installing bcd $BCD_VERSION into $BCD_VENV"
  python3 -m venv "$BCD_VENV" || fail "no virtual environment in $BCD_VENV (Debian: apt-get install python3-venv)"
  "$BCD_VENV/bin/python" -m pip install --quiet "bettercompute[daemon,nvml]==$BCD_VERSION" \\
    || fail "pip could not install bettercompute[daemon,nvml]==$BCD_VERSION"
  mkdir -p "$BCD_BIN_DIR"
  ln -sf "$BCD_VENV/bin/bcd" "$BCD_BIN_DIR/bcd"
  BCD_BIN="$BCD_VENV/bin/bcd"
fi
[ -x "$BCD_BIN" ] || fail "$BCD_BIN is not an executable bcd"

set -- --state-dir "$BCD_STATE_DIR"
if [ -n "${{BCD_FAKE_INVENTORY:-}}" ]; then
  set -- "$@" --fake-inventory "$BCD_FAKE_INVENTORY"
fi

mkdir -p "$BCD_ETC"
printf '%s\\n' "$BCD_CONFIG" > "$BCD_ETC/join.json.tmp"
chmod 600 "$BCD_ETC/join.json.tmp"
mv -f "$BCD_ETC/join.json.tmp" "$BCD_ETC/join.json"

mkdir -p "$BCD_SYSTEMD_DIR"
"$BCD_BIN" "$@" unit > "$BCD_SYSTEMD_DIR/bcd.service.tmp"
chmod 644 "$BCD_SYSTEMD_DIR/bcd.service.tmp"
mv -f "$BCD_SYSTEMD_DIR/bcd.service.tmp" "$BCD_SYSTEMD_DIR/bcd.service"

"$BCD_BIN" "$@" join --config "$BCD_ETC/join.json" --token "$BCD_TOKEN"

if [ "${{BCD_SKIP_SYSTEMCTL:-}}" = 1 ]; then
  say "joined; the unit is $BCD_SYSTEMD_DIR/bcd.service (systemctl skipped)"
else
  systemctl daemon-reload
  systemctl enable --now bcd.service
  say "joined; bcd node is running (systemctl status bcd)"
fi
"""


def bundle_pin(bundle_pem: str) -> str:
    """The CA pin of a PEM bundle (see the module docstring).

    Raises:
        ValueError: the bundle holds no certificate.
    """
    certificates = x509.load_pem_x509_certificates(bundle_pem.encode())
    ders = sorted(c.public_bytes(serialization.Encoding.DER) for c in certificates)
    return "sha256:" + hashlib.sha256(b"".join(ders)).hexdigest()


def install_script(
    *, token: str, gateway: str, trust_domain: str, pool_id: str | None, join_key: str, ca_pin: str
) -> str:
    """The install script for ``token`` with this pinned configuration (see the module docstring).

    Raises:
        ValueError: the token is not printable ASCII (a token ``new_token`` made always is).
    """
    if not (token.isascii() and token.isprintable()):
        raise ValueError("a join token is printable ASCII")
    config = {
        "gateway": gateway,
        "trust_domain": trust_domain,
        "pool": pool_id,
        "join_key": join_key,
        "ca_pin": ca_pin,
    }
    text = json.dumps(config, ensure_ascii=True, separators=(", ", ": "))
    return _SCRIPT.format(version=shlex.quote(__version__), token=shlex.quote(token), config=shlex.quote(text))
