#!/usr/bin/env python3
"""Write cost of the speaker index (schema 4) at the SQL level.

Builds the `memories` table and its indexes from the migrations in
crates/cairn-store/src/schema.rs, once at schema 3 and once at schema 4, and inserts the
same rows into each (a 1,536-byte embedding, metadata with a `speaker`, the FTS5 row, 1,000
rows per transaction, WAL, synchronous=NORMAL), alternating the two, several runs. Only
SQLite is measured: no HNSW insert, no model.

    python3 scripts/bench_speaker_index.py [--rows 30000] [--runs 5]

Standard library only (the sqlite3 module's SQLite, not the bundled one of rusqlite).
"""

import argparse
import json
import os
import random
import re
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path

SCHEMA = Path(__file__).resolve().parent.parent / "crates/cairn-store/src/schema.rs"


def migrations():
    return re.findall(r'r#"(.*?)"#', SCHEMA.read_text(), re.S)


def run(version, rows, seed, workdir):
    path = Path(workdir) / f"schema{version}.db"
    for suffix in ("", "-wal", "-shm"):
        Path(str(path) + suffix).unlink(missing_ok=True)
    c = sqlite3.connect(path, isolation_level=None)
    c.execute("pragma journal_mode=wal")
    c.execute("pragma synchronous=normal")
    for sql in migrations()[:version]:
        c.executescript(sql)
    rnd = random.Random(seed)
    blob = rnd.randbytes(1536)
    start = time.perf_counter()
    for first in range(0, rows, 1000):
        c.execute("begin")
        for i in range(first, min(first + 1000, rows)):
            thread = f"t{i % 100}"
            meta = json.dumps({"speaker": f"Speaker {i % 2} of {thread}", "dia_id": f"D{i}"})
            content = f"Speaker {i % 2}: memory {i} is about topic {rnd.randrange(500)}"
            cur = c.execute(
                "insert into memories (id, vid, kind, thread_id, role, content, created_at,"
                " metadata, model_id, embedding) values (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (rnd.randbytes(16), i + 1, "conversational", thread, "user", content,
                 1_700_000_000_000_000 + i, meta, "bench", blob),
            )
            c.execute("insert into memories_fts (rowid, content) values (?, ?)",
                      (cur.lastrowid, content))
        c.execute("commit")
    took = time.perf_counter() - start
    c.close()
    return rows / took


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=30_000)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    print(f"SQLite {sqlite3.sqlite_version}, {args.rows} rows per run, {args.runs} runs")
    got = {3: [], 4: []}
    with tempfile.TemporaryDirectory() as workdir:
        for r in range(args.runs):
            for version in (3, 4):
                got[version].append(run(version, args.rows, r, workdir))
    print("| schema | rows/s per run | median |")
    print("|---|---|---:|")
    for version, rates in got.items():
        runs = ", ".join(f"{x:,.0f}" for x in rates)
        print(f"| {version} | {runs} | {statistics.median(rates):,.0f} |")
    ratios = [b / a for a, b in zip(got[3], got[4])]
    print(f"schema 4 / schema 3, run by run: {', '.join(f'{x:.2f}' for x in ratios)};"
          f" median {statistics.median(ratios):.2f}")


if __name__ == "__main__":
    main()
