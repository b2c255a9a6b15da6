"""Drives operations written once for both the sync and the asyncio API.

An operation is a generator that yields ``(method, kwargs)`` for a ``MemoryHarness`` and gets
the answer back (or the exception raised, thrown in where it yielded); what it returns is the
operation's result. ``run`` calls the harness's sync methods, ``arun`` awaits its ``a``-prefixed
twins.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any


def run(harness: Any, gen: Generator) -> Any:
    try:
        method, kwargs = next(gen)
        while True:
            try:
                answer = getattr(harness, method)(**kwargs)
            except Exception as e:  # noqa: BLE001 - handed to the operation
                method, kwargs = gen.throw(e)
            else:
                method, kwargs = gen.send(answer)
    except StopIteration as done:
        return done.value


async def arun(harness: Any, gen: Generator) -> Any:
    try:
        method, kwargs = next(gen)
        while True:
            try:
                answer = await getattr(harness, "a" + method)(**kwargs)
            except Exception as e:  # noqa: BLE001 - handed to the operation
                method, kwargs = gen.throw(e)
            else:
                method, kwargs = gen.send(answer)
    except StopIteration as done:
        return done.value
