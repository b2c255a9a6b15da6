"""The cost of one API call from Python (the `cairn` package), beside the same calls from Rust
(`cargo bench -p cairn-harness --bench api_calls`): `add` one memory at a time, then `search`
(hybrid and vector, k = 10) at N memories, with the deterministic hash embedder (384
dimensions) so no model time hides the call's own. Sync calls, then the asyncio twins.

    scripts/setup-py.sh --install
    .cache/py-venv/bin/python scripts/bench_python.py [--n 10000]

Prints Markdown table rows.
"""

import argparse
import asyncio
import os
import statistics
import tempfile
import time

import cairn

TOPICS = [
    "the train to Porto",
    "my sister's wedding",
    "a bug in the parser",
    "sourdough that collapsed",
    "the quarterly budget",
    "a hiking trip in the Alps",
    "the new puppy",
    "learning Spanish",
]


def text(i):
    return (
        f"Message {i}: we talked again about {TOPICS[i % len(TOPICS)]} and what to do next "
        f"week, number {i * 7919 % 1000}."
    )


def pct(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, round((len(v) - 1) * p))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=10_000)
    n = ap.parse_args().n
    with tempfile.TemporaryDirectory() as d:
        m = cairn.MemoryHarness(os.path.join(d, "b.db"), embedder="hash", cache=False)
        t = time.perf_counter()
        for i in range(n):
            m.add(text(i), thread="bench", role="user")
        add_s = time.perf_counter() - t
        print("| store | memories | add (µs per call) | adds/s |")
        print("|---|---:|---:|---:|")
        print(f"| Python `MemoryHarness.add` | {n} | {add_s * 1e6 / n:.0f} | {n / add_s:.0f} |")
        print()
        print("| search (k = 10) | p50 ms | p99 ms |")
        print("|---|---:|---:|")
        for mode in ["hybrid", "vector"]:
            times = []
            for q in range(200):
                query = f"what about {TOPICS[q % len(TOPICS)]} again"
                t = time.perf_counter()
                hits = m.search(query, mode=mode, k=10)
                times.append((time.perf_counter() - t) * 1e3)
                assert hits
            print(f"| Python {mode} | {pct(times, 0.5):.3f} | {pct(times, 0.99):.3f} |")

        async def asearch():
            times = []
            for q in range(200):
                query = f"what about {TOPICS[q % len(TOPICS)]} again"
                t = time.perf_counter()
                await m.asearch(query, mode="hybrid", k=10)
                times.append((time.perf_counter() - t) * 1e3)
            return times

        times = asyncio.run(asearch())
        print(f"| Python hybrid (asyncio) | {pct(times, 0.5):.3f} | {pct(times, 0.99):.3f} |")


if __name__ == "__main__":
    main()
