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
