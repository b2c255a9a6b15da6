"""The core API of the cairn package: MemoryHarness over the Rust store, sync and asyncio."""

from __future__ import annotations

import asyncio
import gc
from datetime import datetime, timedelta, timezone

import pytest

import cairn
from cairn import CairnError, Conflict, InvalidInput, MemoryHarness, NotFound

MEMORY_KEYS = {
    "id",
    "kind",
    "thread",
    "role",
    "speaker",
    "content",
    "created_at",
    "metadata",
    "level",
    "summary",
}


def when(memory: dict) -> datetime:
    return datetime.fromisoformat(memory["created_at"])


def conversation(h: MemoryHarness, thread: str, texts: list, start: datetime) -> list:
    """Adds alternating user/assistant turns a minute apart; returns their ids."""
    return h.add_many(
        [
            {
                "content": t,
                "thread": thread,
                "role": "user" if i % 2 == 0 else "assistant",
                "created_at": start + timedelta(minutes=i),
            }
            for i, t in enumerate(texts)
        ]
    )


# -- writing and reading -----------------------------------------------------------------


def test_add_then_get_returns_every_field(harness, past):
    at = past(5)
    mid = harness.add(
        "I adopted a grey cat named Pixel.",
        thread="t1",
        role="user",
        speaker="Ana",
        metadata={"source": "chat", "n": 1, "tags": ["pets"]},
        created_at=at,
    )
    assert isinstance(mid, str) and mid
    m = harness.get(mid)
    assert set(m) >= MEMORY_KEYS
    assert m["id"] == mid
    assert m["kind"] == "conversational"
    assert m["thread"] == "t1"
    assert m["role"] == "user"
    assert m["speaker"] == "Ana"
    assert m["content"] == "I adopted a grey cat named Pixel."
    assert abs((when(m) - at).total_seconds()) < 1
    assert m["metadata"]["source"] == "chat"
    assert m["metadata"]["n"] == 1
    assert m["metadata"]["tags"] == ["pets"]
    assert m["level"] == 0
    assert m["summary"] is None


def test_kind_defaults_to_conversational_with_a_thread_and_knowledge_without(harness):
    turn = harness.get(harness.add("hello", thread="t"))
    fact = harness.get(harness.add("Water boils at 100 C at sea level."))
    assert turn["kind"] == "conversational"
    assert fact["kind"] == "knowledge" and fact["thread"] is None
    entity = harness.get(harness.add("Ana: a user", kind="entity", thread="t"))
    assert entity["kind"] == "entity" and entity["thread"] == "t"


def test_created_at_accepts_rfc3339_strings_and_refuses_naive_datetimes(harness):
    m = harness.get(harness.add("then", thread="t", created_at="2024-05-01T10:00:00Z"))
    assert when(m) == datetime(2024, 5, 1, 10, tzinfo=timezone.utc)
    with pytest.raises(InvalidInput):
        harness.add("naive", thread="t", created_at=datetime(2024, 5, 1, 10))
    with pytest.raises(InvalidInput):
        harness.add("bad", thread="t", created_at="yesterday")


def test_add_many_is_all_or_none(harness):
    ids = harness.add_many(
        [{"content": "one", "thread": "t", "role": "user"}, {"content": "two", "thread": "t"}]
    )
    assert len(ids) == 2 and len(set(ids)) == 2
    assert [m["content"] for m in harness.list(thread="t")] == ["one", "two"]
    with pytest.raises(InvalidInput):
        harness.add_many([{"content": "three", "thread": "t"}, {"content": "   ", "thread": "t"}])
    assert [m["content"] for m in harness.list(thread="t")] == ["one", "two"]
    assert harness.add_many([]) == []


def test_list_pages_oldest_first_and_filters(harness, past):
    ids = conversation(harness, "a", [f"turn {i}" for i in range(7)], past())
    harness.add("a fact", thread="a", kind="knowledge", created_at=past(100))
    harness.add("other thread", thread="b", created_at=past(1))
    page1 = harness.list(thread="a", kind="conversational", limit=4)
    page2 = harness.list(thread="a", kind="conversational", offset=4, limit=4)
    assert [m["id"] for m in page1 + page2] == ids
    assert [m["content"] for m in harness.list(thread="a", kind="knowledge")] == ["a fact"]
    both = harness.list(thread="a", kind=["conversational", "knowledge"])
    assert len(both) == 8 and both[-1]["content"] == "a fact"
    assert len(harness.list()) == 9
    assert len(harness.list(limit=3)) == 3
    with pytest.raises(InvalidInput):
        harness.list(kind="nonsense")


def test_recent_returns_the_newest_turns_oldest_first(harness, past):
    conversation(harness, "t", [f"turn {i}" for i in range(10)], past())
    assert [m["content"] for m in harness.recent("t", 3)] == ["turn 7", "turn 8", "turn 9"]
    assert len(harness.recent("t", 50)) == 10
    assert harness.recent("nobody", 5) == []


# -- search ------------------------------------------------------------------------------


def test_search_modes_filters_and_scores(harness, past):
    conversation(
        harness,
        "t",
        [
            "The quarterly budget review is on Friday.",
            "Noted, I will prepare the spreadsheet.",
            "My grey cat Pixel knocked over a plant.",
            "Oh no, is the plant all right?",
        ],
        past(),
    )
    harness.add("Pixel is also the name of a phone.", thread="u")
    harness.add("Pixel art uses tiny squares.", kind="knowledge")

    kw = harness.search("spreadsheet", mode="keyword")
    assert kw and kw[0]["content"] == "Noted, I will prepare the spreadsheet."
    assert all(isinstance(h["score"], float) for h in kw)
    assert set(kw[0]) >= MEMORY_KEYS | {"score"}

    for mode in ("hybrid", "vector", "keyword"):
        hits = harness.search("Pixel", mode=mode, k=2)
        assert 0 < len(hits) <= 2, mode
        scores = [h["score"] for h in hits]
        assert scores == sorted(scores, reverse=True), mode

    in_t = harness.search("Pixel", thread="t")
    assert in_t and all(h["thread"] == "t" for h in in_t)
    assert in_t[0]["content"].startswith("My grey cat Pixel")
    knowledge = harness.search("Pixel", kind="knowledge")
    assert [h["content"] for h in knowledge] == ["Pixel art uses tiny squares."]
    several = harness.search("Pixel", kind=["knowledge", "conversational"], mode="keyword")
    assert len(several) == 3

    with pytest.raises(InvalidInput):
        harness.search("Pixel", mode="psychic")
    with pytest.raises(InvalidInput):
        harness.search("   ")


# -- summaries ---------------------------------------------------------------------------


def test_summaries_link_both_ways_and_expand(harness, past):
    ids = conversation(harness, "t", ["a1", "b1", "a2", "b2"], past())
    s1 = harness.add_summary("First exchange.", ids[:2], thread="t")
    s2 = harness.add_summary("Second exchange.", ids[2:], thread="t")
    top = harness.add_summary("The whole talk.", [s1["id"], s2["id"]], thread="t")

    assert s1["kind"] == "summary" and s1["level"] == 1 and top["level"] == 2
    assert s1["summary"]["source_ids"] == ids[:2]
    assert s1["summary"]["summary_type"] == "conversation"
    assert s1["summary"]["stale"] is False
    assert datetime.fromisoformat(s1["summary"]["time_range_start"]) == when(harness.get(ids[0]))
    assert datetime.fromisoformat(s1["summary"]["time_range_end"]) == when(harness.get(ids[1]))

    assert [m["id"] for m in harness.expand_summary(s1["id"])] == ids[:2]
    assert [m["id"] for m in harness.expand_summary(top["id"])] == [s1["id"], s2["id"]]
    assert [m["id"] for m in harness.expand_to_leaves(top["id"])] == ids
    assert [m["id"] for m in harness.summaries_of(ids[0])] == [s1["id"]]
    assert [m["id"] for m in harness.summaries_of(s2["id"])] == [top["id"]]
    assert harness.summaries_of(top["id"]) == []

    only_summaries = harness.search("exchange", min_level=1, mode="keyword")
    assert {h["id"] for h in only_summaries} == {s1["id"], s2["id"]}
    assert all(h["level"] >= 1 for h in harness.search("talk", min_level=2))

    with pytest.raises(InvalidInput):
        harness.add_summary("nothing", [], thread="t")
    with pytest.raises(InvalidInput):
        harness.expand_summary(ids[0])  # not a summary
    with pytest.raises(InvalidInput):
        harness.add_summary("wrong thread", ids[:2], thread="elsewhere")


def test_delete_policies(harness, past):
    ids = conversation(harness, "t", ["q", "a", "q2", "a2"], past())
    s = harness.add_summary("Summary.", ids[:2], thread="t")

    with pytest.raises(Conflict):
        harness.delete(ids[0])  # restrict: still cited
    assert harness.get(ids[0])

    r = harness.delete(ids[1], policy="detach")
    assert r["deleted"] == [ids[1]]
    assert r["detached"] == [s["id"]]
    assert harness.get(s["id"])["summary"]["source_ids"] == [ids[0]]

    r = harness.delete(ids[0], policy="cascade")
    assert set(r["deleted"]) == {ids[0], s["id"]}
    for gone in (ids[0], ids[1], s["id"]):
        with pytest.raises(NotFound):
            harness.get(gone)

    assert harness.delete(ids[2]) == {"deleted": [ids[2]], "detached": []}
    with pytest.raises(NotFound):
        harness.delete(ids[2])
    with pytest.raises(InvalidInput):
        harness.delete(ids[3], policy="sometimes")


def test_delete_thread_and_threads(harness, past):
    ids = conversation(harness, "t", ["q", "a", "q2", "a2"], past())
    harness.add_summary("Summary.", ids[:2], thread="t")
    harness.add("a fact of t", thread="t", kind="knowledge")
    harness.add("keep me", thread="u")
    harness.add("no thread")
    assert harness.threads() == ["t", "u"]
    assert harness.delete_thread("t") == 6
    assert harness.threads() == ["u"]
    assert harness.list(thread="t") == []
    assert len(harness.list()) == 2
    assert harness.delete_thread("t") == 0


# -- errors ------------------------------------------------------------------------------


def test_exception_types(harness):
    assert issubclass(NotFound, KeyError) and issubclass(NotFound, CairnError)
    assert issubclass(InvalidInput, ValueError) and issubclass(InvalidInput, CairnError)
    assert issubclass(Conflict, CairnError)
    assert issubclass(cairn.StorageError, CairnError)
    assert issubclass(cairn.EmbeddingError, CairnError)
    assert issubclass(CairnError, Exception)

    mid = harness.add("soon gone", thread="t")
    harness.delete(mid)
    with pytest.raises(KeyError) as e:  # a plain `except KeyError` catches it
        harness.get(mid)
    assert isinstance(e.value, NotFound) and e.value.code == "not_found"

    bad_inputs = [
        lambda: harness.add("   ", thread="t"),  # blank content
        lambda: harness.add("x", kind="feelings"),  # unknown kind
        lambda: harness.add("x", kind="summary"),  # summaries have their own call
        lambda: harness.add("x", thread="t", role="narrator"),  # unknown role
        lambda: harness.add("x", thread=" padded "),  # bad thread id
        lambda: harness.add("x", metadata=["not", "a", "dict"]),
        lambda: harness.get("not-an-id"),
        lambda: harness.consolidate(older_than="soonish"),
    ]
    for bad in bad_inputs:
        with pytest.raises(ValueError) as e:
            bad()
        assert isinstance(e.value, InvalidInput) and e.value.code == "invalid_input"
        assert str(e.value)  # says what is wrong


def test_unknown_embedder_is_invalid_input(tmp_path):
    with pytest.raises(InvalidInput):
        MemoryHarness(str(tmp_path / "m.db"), embedder="word2vec")


def test_a_store_reopens_with_its_data(tmp_path):
    path = str(tmp_path / "memory.db")
    h = MemoryHarness(path, embedder="hash")
    mid = h.add("persisted", thread="t")
    del h
    h2 = MemoryHarness(path, embedder="hash")
    assert h2.get(mid)["content"] == "persisted"
    assert h2.search("persisted", mode="keyword")[0]["id"] == mid
    assert repr(h2) == f"MemoryHarness({path!r})"


def test_a_relative_path_is_the_file_where_the_store_was_opened(tmp_path, monkeypatch):
    # The path names a file when the store opens; the process changing directory later
    # must not move the store (its later connections, its index snapshot) elsewhere.
    (tmp_path / "here").mkdir()
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "here")
    h = MemoryHarness("memory.db", embedder="hash")
    mid = h.add("written here", thread="t")
    monkeypatch.chdir(tmp_path / "elsewhere")
    h.add("written later", thread="t")
    assert [m["content"] for m in h.list(thread="t")] == ["written here", "written later"]
    assert h.get(mid)["content"] == "written here"
    del h
    gc.collect()
    assert list((tmp_path / "elsewhere").iterdir()) == []


# -- context, consolidation, tokens, stats -----------------------------------------------


def test_assemble_context_shape(harness, past):
    texts = [f"Turn {i}: we talked about topic number {i} at length." for i in range(30)]
    conversation(harness, "t", texts, past())
    ctx = harness.assemble_context("t", "topic number 3", budget=300)
    assert set(ctx) >= {"items", "tokens", "budget", "text", "messages"}
    assert ctx["budget"] == 300
    assert 0 < ctx["tokens"] <= 300
    sections = [i["section"] for i in ctx["items"]]
    assert set(sections) <= {"summary", "related", "recalled", "recent"}
    assert sections[-1] == "recent"
    assert sections.index("recent") == len(sections) - sections.count("recent")  # recent last
    for item in ctx["items"]:
        assert {"id", "kind", "role", "content", "created_at", "section", "tokens"} <= set(item)
        assert item["tokens"] > 0
    assert ctx["items"][-1]["content"] == texts[-1]
    assert all(set(m) == {"role", "content"} for m in ctx["messages"])
    assert ctx["messages"][-1]["role"] == "assistant"
    assert texts[-1] in ctx["text"]
    assert harness.assemble_context("t", "", budget=300)["items"]  # no query: recent turns
    assert harness.assemble_context("nobody", "anything", budget=300)["items"] == []


def test_assemble_context_folds_repeated_texts(harness):
    # The same words on three days: one recalled line, the other two days as its repeats.
    start = datetime.now(timezone.utc) - timedelta(days=30)
    said = "Reminder: the plumber comes on Thursday morning."
    ids = []
    for day in range(3):
        ids += conversation(
            harness,
            "t",
            [said, f"Day {day}: the weather was mild."],
            start + timedelta(days=day),
        )
    conversation(
        harness, "t", ["Good night.", "Sleep well.", "See you.", "Bye."], start + timedelta(days=10)
    )
    ctx = harness.assemble_context("t", "When does the plumber come?", budget=400)
    lines = [i for i in ctx["items"] if i["section"] == "recalled" and i["content"] == said]
    assert len(lines) == 1, ctx["text"]
    line = lines[0]
    assert len(line["repeats"]) == 2
    named = {line["id"]} | {r["id"] for r in line["repeats"]}
    assert named == {ids[0], ids[2], ids[4]}
    days = sorted(
        datetime.fromisoformat(t[:10])
        for t in [line["created_at"]] + [r["created_at"] for r in line["repeats"]]
    )
    # Under one header naming the three days: the first in full, the others by month, with
    # their year when it is not the first's: "[2024-03-01; also on Mar 2,3]", or
    # "[2024-03-31; also on Apr 1,2]", or "[2024-12-31; also on 2025: Jan 1,2]".
    month = "Jan Feb Mar Apr May Jun Jul Aug Sep Oct Nov Dec".split()
    also, last = "", None
    for d in days[1:]:
        if last is not None and (d.year, d.month) == (last.year, last.month):
            also += f",{d.day}"
        else:
            if last is not None:
                also += "; " if d.year != last.year else ", "
            if d.year != days[0].year and (last is None or d.year != last.year):
                also += f"{d.year}: "
            also += f"{month[d.month - 1]} {d.day}"
        last = d
    assert f"[{days[0]:%Y-%m-%d}; also on {also}]\n{said}\n" in ctx["text"], ctx["text"]
    assert all(i["repeats"] == [] for i in ctx["items"] if i is not line)


def test_consolidate_summarizes_old_turns(harness, past):
    conversation(harness, "t", [f"Old turn {i} about gardening." for i in range(15)], past())
    harness.add("A new turn.", thread="t", role="user")
    report = harness.consolidate(older_than="1h", chunk_size=5, fanout=3)
    assert report["failures"] == 0
    summaries = harness.list(thread="t", kind="summary")
    assert sorted(report["summaries"]) == sorted(m["id"] for m in summaries)
    assert sorted(m["level"] for m in summaries) == [1, 1, 1, 2]
    assert all(m["summary"]["source_ids"] for m in summaries)
    top = next(m for m in summaries if m["level"] == 2)
    assert len(harness.expand_to_leaves(top["id"])) == 15
    # Nothing was lost: every old turn is still there, under a summary.
    assert len(harness.list(thread="t", kind="conversational")) == 16
    # Again: nothing new to do.
    assert harness.consolidate(older_than="1h", chunk_size=5, fanout=3)["summaries"] == []
    # Summaries get 5% of the budget: at 2,000 tokens there is room for one.
    ctx = harness.assemble_context("t", "gardening", budget=2000)
    assert "summary" in {i["section"] for i in ctx["items"]}


def test_consolidate_accepts_every_chunk_size_the_core_does(harness, past):
    # The core takes chunk_size in 2..=1000.
    conversation(harness, "t", [f"Old turn {i}." for i in range(6)], past())
    report = harness.consolidate(older_than="1h", chunk_size=2, fanout=10)
    assert len(report["summaries"]) == 3


def test_count_tokens_and_stats(harness):
    assert harness.count_tokens("hello world") == 2
    assert harness.count_tokens("") == 0
    harness.add("one", thread="t")
    stats = harness.stats()
    assert isinstance(stats, dict) and stats


# -- asyncio -----------------------------------------------------------------------------


def test_async_methods(harness, past):
    async def main():
        ids = await asyncio.gather(*(harness.aadd(f"async turn {i}", thread="t") for i in range(5)))
        more = await harness.aadd_many([{"content": "batch one", "thread": "t", "role": "user"}])
        got = await harness.aget(ids[0])
        listed = await harness.alist(thread="t")
        recent = await harness.arecent("t", 2)
        hits = await harness.asearch("batch", mode="keyword")
        s = await harness.aadd_summary("Async summary.", ids[:2], thread="t")
        sources = await harness.aexpand_summary(s["id"])
        leaves = await harness.aexpand_to_leaves(s["id"])
        parents = await harness.asummaries_of(ids[0])
        ctx = await harness.aassemble_context("t", "turn", budget=500)
        threads = await harness.athreads()
        stats = await harness.astats()
        report = await harness.aconsolidate(older_than="1h")
        deleted = await harness.adelete(ids[4])
        with pytest.raises(NotFound):
            await harness.aget(ids[4])
        with pytest.raises(InvalidInput):
            await harness.aadd("  ", thread="t")
        n = await harness.adelete_thread("t")
        return locals()

    r = asyncio.run(main())
    assert len(set(r["ids"])) == 5 and len(r["more"]) == 1
    assert r["got"]["content"] == "async turn 0"
    assert len(r["listed"]) == 6
    assert len(r["recent"]) == 2 and r["recent"][-1]["content"] == "batch one"
    assert r["hits"][0]["content"] == "batch one"
    assert [m["id"] for m in r["sources"]] == r["ids"][:2]
    # (in time order: the concurrent adds may have landed in either order)
    assert sorted(m["id"] for m in r["leaves"]) == sorted(r["ids"][:2])
    assert [m["id"] for m in r["parents"]] == [r["s"]["id"]]
    assert r["ctx"]["items"] and r["ctx"]["tokens"] <= 500
    assert r["threads"] == ["t"]
    assert isinstance(r["stats"], dict)
    assert r["report"]["summaries"] == []  # nothing is an hour old
    assert r["deleted"]["deleted"] == [r["ids"][4]]
    assert r["n"] == 6
    assert harness.threads() == []


# -- the real model ----------------------------------------------------------------------


def test_minilm_search_finds_by_meaning(tmp_path):
    h = MemoryHarness(str(tmp_path / "memory.db"))  # the local all-MiniLM-L6-v2
    h.add_many(
        [
            {"content": "The quarterly budget review moved to Friday.", "thread": "t", "role": "user"},
            {"content": "I adopted a grey cat named Pixel last week.", "thread": "t", "role": "user"},
            {"content": "My train to Porto leaves at 9 tomorrow.", "thread": "t", "role": "user"},
            {"content": "Remember to water the tomatoes.", "thread": "t", "role": "user"},
        ]
    )
    hits = h.search("pet", mode="vector", thread="t")
    assert hits[0]["content"] == "I adopted a grey cat named Pixel last week."
    hits = h.search("animal companion", thread="t")  # hybrid: no word in common
    assert hits[0]["content"] == "I adopted a grey cat named Pixel last week."


# -- keys, metadata filters, paging, forgetting ----------------------------------------------


def test_keys_make_adds_idempotent_and_upsert_updates(harness):
    a = harness.add("Lives in Lisbon", key="ana/home", metadata={"user_id": "ana"})
    assert harness.add("Lives in Lisbon", key="ana/home", metadata={"user_id": "ana"}) == a
    with pytest.raises(Conflict):
        harness.add("Lives in Porto", key="ana/home")
    up = harness.upsert("Lives in Porto", key="ana/home", metadata={"user_id": "ana"})
    assert up["outcome"] == "content_updated" and up["memory"]["id"] == a
    assert harness.upsert("Lives in Porto", key="ana/home", metadata={"user_id": "ana"})["outcome"] == "unchanged"
    m = harness.patch_metadata(a, {"verified": True, "user_id": None})
    assert m["metadata"] == {"verified": True}
    with pytest.raises(NotFound):
        harness.patch_metadata("01a227ce-dfe3-728a-a928-cb93de8d7ae9", {})
    assert harness.stats()["store"]["total"] == 1


def test_where_filters_paging_and_forget(harness, past):
    for i in range(7):
        harness.add(f"note {i} about the garden", thread="g", created_at=past(i),
                    metadata={"user_id": "bo" if i % 2 else "ana", "n": i})
    hits = harness.search("garden", k=10, where={"user_id": "bo", "n": {"gte": 3}})
    assert sorted(h["metadata"]["n"] for h in hits) == [3, 5]
    assert len(harness.search("garden", k=10, where={"n": [0, 6]})) == 2
    with pytest.raises(InvalidInput):
        harness.search("garden", where={"n": {"gte": [1]}})
    seen, cursor = [], None
    while True:
        page = harness.list_page(thread="g", limit=3, cursor=cursor)
        seen += [m["metadata"]["n"] for m in page["items"]]
        cursor = page["next"]
        if cursor is None:
            break
    assert seen == list(range(7))
    ctx = harness.assemble_context("other", "garden", scope_where={"user_id": "ana"})
    assert any(i["section"] == "related" for i in ctx["items"])
    r = harness.forget(where={"user_id": "bo"})
    assert len(r["deleted"]) == 3
    assert r["erased"] is True  # nothing else reads the file: scrubbed
    assert all(h["metadata"]["user_id"] == "ana" for h in harness.search("garden", k=10))
    with pytest.raises(InvalidInput):
        harness.forget()
    assert len(asyncio.run(harness.aforget(thread="g"))["deleted"]) == 4
    assert harness.stats()["store"]["total"] == 0


def test_expiry_supersedes_history_and_decay(harness, past):
    old = harness.add("The office is on Main Street", created_at=past(0))
    new = harness.add("The office is on Harbour Road", created_at=past(60), supersedes=old)
    assert [h["id"] for h in harness.search("office street road", mode="keyword")] == [new]
    assert {h["id"] for h in harness.search("office street road", mode="keyword", history=True)} == {old, new}
    assert [h["id"] for h in harness.search("office street road", mode="keyword", as_of=past(30))] == [old]
    versions = harness.history(new)
    assert [v["id"] for v in versions] == [old, new]
    assert versions[0]["valid_to"] and versions[1]["supersedes"] == old
    with pytest.raises(Conflict):
        harness.add("elsewhere", supersedes=old)
    gone = harness.add("a note that expired", expires_at=past(1))
    assert harness.get(gone)["expires_at"]
    assert all(h["id"] != gone for h in harness.search("note expired", mode="keyword"))
    assert harness.search("office road", mode="keyword", half_life="30d")[0]["id"] == new
