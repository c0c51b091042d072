"""``better-compute tunnel`` stops on Ctrl-C whichever of its threads the kernel hands the signal to.

A signal sent to a process goes to any one of its threads that does not block it. Once a connection has asked for a
tunnel, the command has a second thread (the one that made the HTTP call), idle; a SIGINT handed to that thread
used to leave the event loop asleep in its poll, and the command ran on until killed. Here the signal is sent to
that thread on purpose (``tgkill``), so the case does not depend on luck.
"""

from __future__ import annotations

import ctypes
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests._timing import deadline

_SYS_TGKILL = 234  # x86-64


def _other_thread(pid: int) -> int:
    ends = time.monotonic() + deadline(20)
    while True:
        others = [int(t) for t in os.listdir(f"/proc/{pid}/task") if int(t) != pid]
        if others:
            return others[0]
        assert time.monotonic() < ends, "the command never started a second thread"
        time.sleep(0.05)


@pytest.mark.skipif(not sys.platform.startswith("linux") or os.uname().machine != "x86_64", reason="tgkill on x86-64")
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_to_the_idle_second_thread_stops_the_command(tmp_path: Path, sig: signal.Signals) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BETTERCOMPUTE_") and k != "TOKEN"}
    env.update(XDG_CONFIG_HOME=str(tmp_path), PYTHONFAULTHANDLER="1")
    command = [str(Path(sys.executable).with_name("better-compute")), "tunnel", "node_0123456789abcdef"]
    command += ["--port", "22", "--local", "0", "--server", "http://127.0.0.1:9", "--token", "bcak_a.b"]
    with (tmp_path / "err").open("w+") as err:
        process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=err)
        try:
            ends = time.monotonic() + deadline(30)
            while not (found := re.search(r"127\.0\.0\.1:(\d+) ->", (tmp_path / "err").read_text())):
                assert process.poll() is None and time.monotonic() < ends, (tmp_path / "err").read_text()
                time.sleep(0.05)
            # A connection asks for a tunnel (the server is not there: "no tunnel"), through a thread that stays.
            with socket.create_connection(("127.0.0.1", int(found.group(1))), timeout=deadline(10)) as conn:
                conn.settimeout(deadline(20))
                assert conn.recv(1) == b""  # the command closes it once the call failed
            thread = _other_thread(process.pid)
            assert ctypes.CDLL(None, use_errno=True).syscall(_SYS_TGKILL, process.pid, thread, sig) == 0
            try:
                status = process.wait(timeout=deadline(15))
            except subprocess.TimeoutExpired:
                process.send_signal(signal.SIGABRT)
                process.wait(timeout=deadline(10))
                raise AssertionError(f"still running after {sig.name}:\n{(tmp_path / 'err').read_text()}") from None
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    text = (tmp_path / "err").read_text()
    assert status == 0 and "no tunnel" in text and text.rstrip().endswith("stopped"), text
    assert "Traceback" not in text
