"""The package on PostgreSQL: a `postgres://` URL opens the same API on the database, and
the same calls answer as on a SQLite file."""

from __future__ import annotations

from datetime import timedelta

import cairn


def script(h: cairn.MemoryHarness, start) -> list:
    """Writes, summarizes, consolidates and reads; returns what it observed."""
    seen = []
    topics = ["sailing", "bread", "chess", "violin", "tea"]
    ids = h.add_many(
        [
            {
                "content": f"Turn {i} is about {topics[i % 5]}, detail {i}.",
                "thread": "t",
                "role": "user" if i % 2 == 0 else "assistant",
                "speaker": "Ana" if i % 2 == 0 else "Bo",
                "created_at": start + timedelta(minutes=i),
            }
            for i in range(45)
        ]
    )
    s1 = h.add_summary("The first talk, about boats.", ids[:3], thread="t")
    seen.append((s1["level"], [m["content"] for m in h.expand_summary(s1["id"])]))
    seen.append([m["content"] for m in h.summaries_of(ids[0])])
    report = h.consolidate(older_than="1h", thread="t")
    seen.append((report["memories_covered"], report["summaries_per_level"]))
    # Vector scores agree to float precision (ties may come in either order); keyword
    # scores are each backend's BM25 over its own stemmer: the memories found must agree.
    hits = h.search("violin detail", k=4, mode="vector", thread="t")
    seen.append(sorted((round(x["score"], 4), x["content"]) for x in hits))
    for mode in ("keyword", "hybrid"):
        seen.append(sorted(x["content"] for x in h.search("violin", k=4, mode=mode, thread="t")))
    ctx = h.assemble_context("t", "What did Bo say about chess?", budget=300)
    seen.append(ctx["text"])
    seen.append([m["content"] for m in h.recent("t", 3)])
    stats = h.stats()["store"]
    seen.append((stats["total"], stats["by_kind"], stats["links"]))
    return seen


def test_a_postgres_url_answers_as_a_sqlite_file(pg_url, tmp_path, past):
    lite = cairn.MemoryHarness(str(tmp_path / "m.db"), embedder="hash")
    pg = cairn.MemoryHarness(pg_url + "?schema=py_same", embedder="hash")
    assert pg.path == pg_url + "?schema=py_same"
    start = past()
    assert script(lite, start) == script(pg, start)
    # A second handle on the same schema sees the first one's writes at once.
    again = cairn.MemoryHarness(pg_url + "?schema=py_same", embedder="hash")
    assert again.stats()["store"]["total"] == pg.stats()["store"]["total"]
    # Another schema is another store.
    other = cairn.MemoryHarness(pg_url + "?schema=py_other", embedder="hash")
    assert other.stats()["store"]["total"] == 0


def test_the_repr_of_a_postgres_store_leaves_out_the_password(pg_url):
    # The test server trusts local connections, so any password opens the store.
    url = pg_url.replace("://cairn@", "://cairn:s3cret@", 1) + "?schema=py_repr"
    assert "s3cret" in url
    h = cairn.MemoryHarness(url, embedder="hash")
    assert h.path == url
    assert "s3cret" not in repr(h)
    assert repr(h) == f"MemoryHarness({(pg_url + '?schema=py_repr')!r})"
