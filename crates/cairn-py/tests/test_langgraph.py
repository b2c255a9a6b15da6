"""The LangGraph store over Cairn (cairn.langgraph)."""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import TypedDict

import pytest
from langgraph.graph import START, StateGraph
from langgraph.runtime import Runtime
from langgraph.store.base import (
    BaseStore,
    GetOp,
    InvalidNamespaceError,
    Item,
    ListNamespacesOp,
    PutOp,
    SearchItem,
    SearchOp,
)

from cairn import MemoryHarness
from cairn.langgraph import CairnStore


@pytest.fixture
def store(harness):
    return CairnStore(harness)


def test_put_get_replace_delete(store, harness):
    assert isinstance(store, BaseStore)
    ns = ("users", "ana")
    store.put(ns, "home", {"text": "Ana lives in Lisbon.", "verified": True})
    item = store.get(ns, "home")
    assert isinstance(item, Item)
    assert item.namespace == ns and item.key == "home"
    assert item.value == {"text": "Ana lives in Lisbon.", "verified": True}
    assert isinstance(item.created_at, datetime) and item.created_at.tzinfo is not None
    assert item.created_at == item.updated_at

    # As a Cairn memory: a knowledge memory of thread "lg:users/ana", its text the content.
    [m] = harness.list(thread="lg:users/ana")
    assert m["kind"] == "knowledge"
    assert m["content"] == "Ana lives in Lisbon."
    assert m["metadata"]["lg_key"] == "home"
    assert m["metadata"]["lg_namespace"] == ["users", "ana"]

    store.put(ns, "home", {"text": "Ana moved to Porto."})
    again = store.get(ns, "home")
    assert again.value == {"text": "Ana moved to Porto."}
    assert again.created_at == item.created_at and again.updated_at > item.updated_at
    assert [m["content"] for m in harness.list(thread="lg:users/ana")] == ["Ana moved to Porto."]

    assert store.get(ns, "work") is None
    assert store.get(("users", "bob"), "home") is None
    store.delete(ns, "home")
    assert store.get(ns, "home") is None
    assert harness.list(thread="lg:users/ana") == []
    store.delete(ns, "home")  # deleting what is not there is fine


def test_delete_cascades_to_summaries(store, harness):
    ns = ("docs",)
    store.put(ns, "a", {"text": "alpha"})
    store.put(ns, "b", {"text": "beta"})
    ids = [m["id"] for m in harness.list(thread="lg:docs")]
    s = harness.add_summary("alpha and beta", ids, thread="lg:docs")
    store.delete(ns, "a")
    assert store.get(ns, "b").value == {"text": "beta"}
    assert [m["id"] for m in harness.list(thread="lg:docs", kind="summary")] == []
    with pytest.raises(KeyError):
        harness.get(s["id"])


def test_index_text(store, harness):
    store.put(("n",), "all", {"title": "Cats", "body": {"text": "They purr."}, "n": 3})
    store.put(("n",), "some", {"title": "Dogs", "body": "They bark."}, index=["body"])
    store.put(("n",), "none", {"title": "Fish"}, index=False)
    store.put(("n",), "numbers", {"n": 3})
    content = {m["metadata"]["lg_key"]: m["content"] for m in harness.list(thread="lg:n")}
    assert content == {
        "all": "Cats\nThey purr.",
        "some": "They bark.",
        "none": "none",
        "numbers": '{"n": 3}',
    }


def test_namespaces_map_to_threads_both_ways(store, harness):
    odd = ("a/b", "50%", "with space")
    store.put(odd, "k", {"v": 1})
    store.put(("a", "b"), "k", {"v": 2})
    assert store.thread_of(odd) == "lg:a%2Fb/50%25/with%20space"
    assert store.thread_of(("a", "b")) == "lg:a/b"
    assert store.namespace_of("lg:a%2Fb/50%25/with%20space") == odd
    assert store.namespace_of("chat-1") is None
    assert store.get(odd, "k").value == {"v": 1}
    assert store.get(("a", "b"), "k").value == {"v": 2}
    assert sorted(store.list_namespaces()) == sorted([odd, ("a", "b")])
    harness.add("a chat turn", thread="chat-1")  # not the store's
    assert "chat-1" in harness.threads() and len(store.list_namespaces()) == 2


def test_invalid_namespaces(store):
    with pytest.raises(InvalidNamespaceError):
        store.put(("a.b",), "k", {"v": 1})
    with pytest.raises(InvalidNamespaceError):
        store.put((), "k", {"v": 1})
    with pytest.raises(InvalidNamespaceError):
        store.batch([GetOp(("",), "k")])
    with pytest.raises(InvalidNamespaceError):
        store.put(("langgraph",), "k", {"v": 1})


def test_search_without_query_lists_and_filters(store):
    for i in range(6):
        store.put(("docs", "a"), f"d{i}", {"text": f"doc {i}", "n": i, "kind": "even" if i % 2 == 0 else "odd"})
    store.put(("docs", "b"), "x", {"text": "doc x", "n": 10, "kind": "even"})
    store.put(("other",), "y", {"text": "doc y", "n": 11, "kind": "even"})

    all_docs = store.search(("docs",), limit=100)
    assert [i.key for i in all_docs] == ["d0", "d1", "d2", "d3", "d4", "d5", "x"]
    assert all(isinstance(i, SearchItem) and i.score is None for i in all_docs)
    assert [i.key for i in store.search(("docs",), limit=2, offset=3)] == ["d3", "d4"]
    assert [i.key for i in store.search(("docs",), filter={"kind": "even"})] == ["d0", "d2", "d4", "x"]
    assert [i.key for i in store.search(("docs",), filter={"n": {"$gte": 4}})] == ["d4", "d5", "x"]
    assert [i.key for i in store.search(("docs",), filter={"n": {"$gt": 1, "$lt": 4}})] == ["d2", "d3"]
    assert [i.key for i in store.search(("docs",), filter={"kind": {"$ne": "even"}})] == ["d1", "d3", "d5"]
    assert [i.key for i in store.search((), filter={"n": 11})] == ["y"]
    assert store.search(("nothing",)) == []
    assert store.search(("docs",), limit=0) == []


def test_search_with_query_ranks_and_filters(store):
    ns = ("notes",)
    store.put(ns, "pizza", {"text": "Ana's favourite food is pizza margherita.", "tag": "food"})
    store.put(ns, "train", {"text": "The train to Porto leaves at nine.", "tag": "travel"})
    store.put(ns, "cat", {"text": "Ana's cat is called Pixel.", "tag": "pets"})
    store.put(("notes", "archive"), "pizza-old", {"text": "Pizza night was on Friday.", "tag": "food"})

    hits = store.search(ns, query="pizza", limit=10)
    assert hits[0].key in ("pizza", "pizza-old")
    assert {h.key for h in hits[:2]} == {"pizza", "pizza-old"}
    assert all(isinstance(h.score, float) for h in hits)
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    assert len({(h.namespace, h.key) for h in hits}) == len(hits)

    only_top = store.search(("notes", "archive"), query="pizza")
    assert [h.key for h in only_top] == ["pizza-old"]
    travel = store.search(ns, query="pizza", filter={"tag": "travel"})
    assert [h.key for h in travel] == ["train"]
    assert len(store.search(ns, query="pizza", limit=1)) == 1
    assert store.search(ns, query="pizza", limit=1, offset=1)[0].key == hits[1].key


def test_list_namespaces(store):
    for ns in [
        ("users", "ana", "prefs"),
        ("users", "ana", "facts"),
        ("users", "bob", "prefs"),
        ("docs", "v1"),
        ("docs", "v2"),
    ]:
        store.put(ns, "k", {"v": 1})
    assert store.list_namespaces() == [
        ("docs", "v1"),
        ("docs", "v2"),
        ("users", "ana", "facts"),
        ("users", "ana", "prefs"),
        ("users", "bob", "prefs"),
    ]
    assert store.list_namespaces(prefix=("users",)) == [
        ("users", "ana", "facts"),
        ("users", "ana", "prefs"),
        ("users", "bob", "prefs"),
    ]
    assert store.list_namespaces(suffix=("prefs",)) == [
        ("users", "ana", "prefs"),
        ("users", "bob", "prefs"),
    ]
    assert store.list_namespaces(prefix=("users", "*", "prefs")) == [
        ("users", "ana", "prefs"),
        ("users", "bob", "prefs"),
    ]
    assert store.list_namespaces(max_depth=2) == [
        ("docs", "v1"),
        ("docs", "v2"),
        ("users", "ana"),
        ("users", "bob"),
    ]
    assert store.list_namespaces(max_depth=1) == [("docs",), ("users",)]
    assert store.list_namespaces(limit=2, offset=1) == [("docs", "v2"), ("users", "ana", "facts")]
    assert store.list_namespaces(prefix=("users",), suffix=("facts",)) == [("users", "ana", "facts")]
    store.delete(("docs", "v1"), "k")
    assert ("docs", "v1") not in store.list_namespaces()


def test_batch_runs_operations_in_order(store):
    results = store.batch(
        [
            GetOp(("b",), "k"),
            PutOp(("b",), "k", {"text": "first"}),
            GetOp(("b",), "k"),
            PutOp(("b",), "k", {"text": "second"}),
            SearchOp(("b",)),
            ListNamespacesOp(),
            PutOp(("b",), "k", None),
            GetOp(("b",), "k"),
        ]
    )
    assert results[0] is None and results[1] is None
    assert results[2].value == {"text": "first"}
    assert [i.value for i in results[4]] == [{"text": "second"}]
    assert results[5] == [("b",)]
    assert results[7] is None


def test_async_store(store):
    async def main():
        await store.aput(("u",), "k", {"text": "async value", "n": 1})
        got = await store.aget(("u",), "k")
        found = await store.asearch(("u",), query="async")
        listed = await store.asearch(("u",), filter={"n": 1})
        namespaces = await store.alist_namespaces()
        await store.adelete(("u",), "k")
        return got, found, listed, namespaces, await store.aget(("u",), "k")

    got, found, listed, namespaces, gone = asyncio.run(main())
    assert got.value == {"text": "async value", "n": 1}
    assert [i.key for i in found] == ["k"] and [i.key for i in listed] == ["k"]
    assert namespaces == [("u",)]
    assert gone is None


def test_items_persist_across_reopening(tmp_path):
    path = str(tmp_path / "memory.db")
    CairnStore(MemoryHarness(path, embedder="hash")).put(("p",), "k", {"text": "kept"})
    assert CairnStore(MemoryHarness(path, embedder="hash")).get(("p",), "k").value == {"text": "kept"}


def test_ttl_is_not_supported(store):
    with pytest.raises(NotImplementedError):
        store.put(("t",), "k", {"v": 1}, ttl=5)


# -- in a graph --------------------------------------------------------------------------


class State(TypedDict, total=False):
    user: str
    fact: str
    recalled: list


def remember(state: State, *, store: BaseStore) -> dict:
    """Stores the run's fact (if any) under the user; returns every fact stored so far."""
    ns = ("users", state["user"], "facts")
    if state.get("fact"):
        store.put(ns, f"fact-{len(store.search(ns, limit=1000))}", {"text": state["fact"]})
    return {"recalled": [i.value["text"] for i in store.search(ns, limit=1000)]}


def recall(state: State, runtime: Runtime) -> dict:
    """Reads through the runtime instead: the best fact for a question."""
    hits = runtime.store.search(("users", state["user"], "facts"), query="Lisbon", limit=1)
    return {"recalled": state["recalled"] + [f"best: {h.value['text']}" for h in hits]}


def build(store: BaseStore):
    builder = StateGraph(State)
    builder.add_node("remember", remember)
    builder.add_node("recall", recall)
    builder.add_edge(START, "remember")
    builder.add_edge("remember", "recall")
    return builder.compile(store=store)


def test_graph_runs_share_memory_through_the_store(tmp_path):
    path = str(tmp_path / "memory.db")
    graph = build(CairnStore(MemoryHarness(path, embedder="hash")))
    first = graph.invoke({"user": "ana", "fact": "Ana lives in Lisbon."})
    assert first["recalled"] == ["Ana lives in Lisbon.", "best: Ana lives in Lisbon."]
    second = graph.invoke({"user": "ana", "fact": "Ana has a cat."})
    assert second["recalled"][:2] == ["Ana lives in Lisbon.", "Ana has a cat."]
    assert second["recalled"][2] == "best: Ana lives in Lisbon."
    # Another process (here: another harness on the file) sees what the runs wrote.
    third = build(CairnStore(MemoryHarness(path, embedder="hash"))).invoke({"user": "ana"})
    assert third["recalled"][:2] == ["Ana lives in Lisbon.", "Ana has a cat."]
    assert build(CairnStore(MemoryHarness(path, embedder="hash"))).invoke({"user": "bob"})[
        "recalled"
    ] == []


def test_graph_async(tmp_path):
    async def main():
        graph = build(CairnStore(MemoryHarness(str(tmp_path / "m.db"), embedder="hash")))
        await graph.ainvoke({"user": "ana", "fact": "Ana lives in Lisbon."})
        return await graph.ainvoke({"user": "ana"})

    assert asyncio.run(main())["recalled"] == ["Ana lives in Lisbon.", "best: Ana lives in Lisbon."]
