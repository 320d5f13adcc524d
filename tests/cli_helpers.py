"""Helpers of the CLI and MLflow tests: run `abps` in-process for its exit code, run it in a fresh
interpreter that kills itself after a chosen round checkpoint, a free loopback port, and a local
`mlflow server` started and stopped around a block (bounded in time)."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from cli.runs_cmd import stop_process_tree

MLFLOW = Path(sys.executable).with_name("mlflow")


def run_main(args: list[str]) -> int:
    """``abps ARGS`` in this process; its exit code (0 when it returns)."""
    from cli.app import main

    try:
        main(args)
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


def refused(argv: list[str], capsys: Any) -> str:
    """The one error line of an in-process ``abps ARGV`` that must exit 2 (asserted: one line
    starting ``error:``, no traceback)."""
    import pytest

    from cli.app import main

    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and err.startswith("error: ") and "\n" not in err and "Traceback" not in err, err
    return err


# `abps` in a fresh interpreter; right after its ABPS_KILL_AFTER-th round checkpoint of a run under
# way is on disk it sends itself SIGKILL: a hard stop at a chosen round, with no race between a
# polling test and a fast run
_KILLED_ABPS = """
import os, signal, sys
from federation.run import checkpoint
from cli.app import main

_save, _after, _n = checkpoint.save, int(os.environ["ABPS_KILL_AFTER"]), [0]
_sig = int(os.environ.get("ABPS_KILL_SIGNAL", signal.SIGKILL))

def save(path, payload):
    _save(path, payload)
    if payload["current"] is not None:
        _n[0] += 1
        if _n[0] >= _after:
            os.kill(os.getpid(), _sig)

checkpoint.save = save
sys.argv = ["abps", *sys.argv[1:]]
main()
"""


def run_killed(args: list[str], cwd: Path, kill_after: int, env: dict[str, str] | None = None,
               sig: int = 9) -> subprocess.CompletedProcess:
    """``abps ARGS`` sent signal ``sig`` (default SIGKILL) by itself right after its
    ``kill_after``-th round checkpoint (one whose ``current`` run is under way); the finished
    process (return code ``-SIGKILL`` when killed)."""
    import os

    return subprocess.run([sys.executable, "-c", _KILLED_ABPS, *args], cwd=cwd,
                          env={**(env or os.environ), "ABPS_KILL_AFTER": str(kill_after), "ABPS_KILL_SIGNAL": str(sig)},
                          capture_output=True, text=True)


def stop_at_first_checkpoint(monkeypatch, run) -> None:
    """Call ``run()`` so that it stops (KeyboardInterrupt) right after writing its first round
    checkpoint, as a Ctrl-C would."""
    import pytest

    from federation.run import checkpoint

    real = checkpoint.save

    def save_then_stop(path, payload):
        real(path, payload)
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(checkpoint, "save", save_then_stop)
        with pytest.raises(KeyboardInterrupt):
            run()


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def mlflow_server(store_uri: str, folder: Path, extra: tuple[str, ...] = (), wait_s: float = 180.0) -> Iterator[str]:
    """A `mlflow server` on a free loopback port over ``store_uri`` (log in ``folder/server.log``),
    yielding its base URL once ``/health`` answers; its process group is stopped after the block.
    ``wait_s`` guards against a hang; it is not a timing assertion."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log_path = folder / "server.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([str(MLFLOW), "server", "--backend-store-uri", store_uri, *extra, "--host",
                                 "127.0.0.1", "--port", str(port), "--workers", "1"],
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=folder)
        try:
            deadline = time.monotonic() + wait_s
            while True:
                try:
                    with urllib.request.urlopen(f"{base}/health", timeout=2) as r:
                        if r.status == 200:
                            break
                except (urllib.error.URLError, ConnectionError, OSError):
                    pass
                assert proc.poll() is None, log_path.read_text()[-2000:]
                assert time.monotonic() < deadline, f"mlflow server did not answer within {wait_s:.0f} s"
                time.sleep(0.5)
            yield base
        finally:
            stop_process_tree(proc.pid, timeout_s=20)  # the server, its uvicorn and job workers
            proc.wait(timeout=5)
    assert proc.poll() is not None
