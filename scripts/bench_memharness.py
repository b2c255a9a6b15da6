"""memharness 1.0.4 on SQLite with precomputed vectors: add throughput and search latency.

The peer users come from, measured the way Cairn's `store_e2e` bench measures Cairn: the
same number of memories, 384-dimensional clustered unit vectors given directly (memharness's
`embedding_fn` looks each text's vector up in a table, so no model runs), k = 10.

memharness 1.0.4 needs Python >= 3.13:

    python3.13 -m venv /tmp/mhenv
    /tmp/mhenv/bin/pip install "memharness[langchain]==1.0.4" numpy
    /tmp/mhenv/bin/python scripts/bench_memharness.py --n 10000

Prints one Markdown table row per size.
"""

import argparse
import asyncio
import os
import statistics
import tempfile
import time

import numpy as np
from memharness import MemoryHarness


def clustered(rng, n, dim=384, clusters=500, sigma=0.06):
    centres = rng.standard_normal((clusters, dim)).astype(np.float32)
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    pick = rng.integers(0, clusters, n)
    v = centres[pick] + sigma * rng.standard_normal((n, dim)).astype(np.float32)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    return v


async def run(n, queries, seed):
    rng = np.random.default_rng(seed)
    base = clustered(rng, n)
    qv = clustered(rng, queries)
    table = {f"memory {i}": base[i].tolist() for i in range(n)}
    table.update({f"query {i}": qv[i].tolist() for i in range(queries)})

    def embed(text):
        return table[text]

    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "mh.db")
        mem = MemoryHarness(backend=f"sqlite:///{path}", embedding_fn=embed)
        await mem.connect()
        t = time.perf_counter()
        for i in range(n):
            await mem.add_conversational(f"t{i % 100}", "user", f"memory {i}")
        add_rate = n / (time.perf_counter() - t)
        lat = []
        for i in range(queries):
            t = time.perf_counter()
            hits = await mem.search(f"query {i}", k=10)
            lat.append((time.perf_counter() - t) * 1e3)
            assert len(hits) == 10
        await mem.disconnect()
    lat.sort()
    p50 = statistics.median(lat)
    p99 = lat[min(len(lat) - 1, round(0.99 * (len(lat) - 1)))]
    print(f"| memharness 1.0.4 (SQLite) | {n} | {add_rate:.0f} | {p50:.1f} / {p99:.1f} |")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", default="10000", help="comma-separated sizes")
    ap.add_argument("--queries", type=int, default=30)
    ap.add_argument("--seed", type=int, default=7)
    a = ap.parse_args()
    print("| store | memories | add (mem/s, one at a time) | search p50 / p99 (ms) |")
    print("|---|---:|---:|---:|")
    for n in [int(x) for x in a.n.split(",")]:
        asyncio.run(run(n, a.queries, a.seed))


if __name__ == "__main__":
    main()
