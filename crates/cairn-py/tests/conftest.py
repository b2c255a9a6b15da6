"""Shared fixtures of the cairn package's tests (run by scripts/test-python.sh)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

import cairn


@pytest.fixture
def harness(tmp_path):
    """A fresh store with the hash embedder: deterministic, fast, no meaning (for logic)."""
    return cairn.MemoryHarness(str(tmp_path / "memory.db"), embedder="hash")


@pytest.fixture
def past():
    """`past(minutes)`: an aware datetime that many minutes after a moment two days ago."""
    start = datetime.now(timezone.utc) - timedelta(days=2)
    return lambda minutes=0: start + timedelta(minutes=minutes)


@pytest.fixture(scope="session")
def pg_url():
    """A throwaway PostgreSQL 16 + pgvector server on 127.0.0.1 for this test session: the
    binaries `scripts/setup-postgres.sh` provisions (from PyPI's pgserver wheel), `initdb` in
    a temporary directory, run as `postgres` (or `nobody`) when the tests run as root. Yields
    its `postgres://` URL; stopped and removed afterwards."""
    import os
    import shutil
    import socket
    import subprocess
    import tempfile
    import time
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    install = os.environ.get("CAIRN_PG_INSTALL") or subprocess.run(
        [str(root / "scripts" / "setup-postgres.sh")], check=True, capture_output=True, text=True
    ).stdout.strip().splitlines()[-1]
    install = Path(install)
    user = None
    if os.geteuid() == 0:
        has_postgres = subprocess.run(["id", "postgres"], capture_output=True).returncode == 0
        user = "postgres" if has_postgres else "nobody"

    def as_user(*cmd):
        return (["runuser", "-u", user, "--"] if user else []) + [str(c) for c in cmd]

    def reachable(d: Path) -> bool:
        return subprocess.run(as_user("test", "-x", d / "bin" / "postgres")).returncode == 0

    if user and not reachable(install):
        # The checkout sits where that user cannot reach: a copy in the temporary directory
        # (the same one the Rust tests make), the libraries beside the binaries included.
        tree = install.parents[1]
        copy = Path(tempfile.gettempdir()) / "cairn-pgserver-0.1.4"
        if not reachable(copy / install.relative_to(tree)):
            partial = Path(tempfile.gettempdir()) / f"cairn-pgserver-py-{os.getpid()}"
            subprocess.run(["cp", "-a", str(tree), str(partial)], check=True)
            subprocess.run(["chmod", "-R", "a+rX", str(partial)], check=True)
            try:
                partial.rename(copy)
            except OSError:
                shutil.rmtree(partial, ignore_errors=True)
        install = copy / install.relative_to(tree)
    bin_dir = install / "bin"
    work = Path(tempfile.mkdtemp(prefix="cairn-pg-py-"))
    if user:
        shutil.chown(work, user)
    data = work / "data"
    subprocess.run(
        as_user(bin_dir / "initdb", "-D", data, "-U", "cairn", "--auth=trust", "-E", "UTF8",
                "--locale=C", "-N"),
        check=True, capture_output=True,
    )
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    subprocess.run(
        as_user(bin_dir / "pg_ctl", "-D", data, "-l", work / "log", "-w", "-o",
                f"-p {port} -k {work} -c listen_addresses=127.0.0.1 -c fsync=off", "start"),
        check=True, capture_output=True,
    )
    try:
        for _ in range(100):
            ready = subprocess.run(
                as_user(bin_dir / "pg_isready", "-h", "127.0.0.1", "-p", port), capture_output=True
            )
            if ready.returncode == 0:
                break
            time.sleep(0.1)
        yield f"postgres://cairn@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run(as_user(bin_dir / "pg_ctl", "-D", data, "-m", "fast", "stop"),
                       capture_output=True)
        shutil.rmtree(work, ignore_errors=True)
