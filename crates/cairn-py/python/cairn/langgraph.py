"""A LangGraph store kept in Cairn (``pip install cairn-memory[langgraph]``).

``CairnStore`` is a ``langgraph.store.base.BaseStore``: compile a graph with
``builder.compile(store=CairnStore(MemoryHarness("memory.db")))`` and its nodes read and
write long-term memory (``runtime.store`` or a ``store`` parameter) that Cairn embeds and
searches with its hybrid (vector + keyword) search.

How it maps:

* A namespace is a Cairn thread: ``("users", "ana")`` is ``"lg:users/ana"``. In a label,
  ``%``, ``/``, white space and control characters are percent-encoded (``("a/b",)`` is
  ``"lg:a%2Fb"``), so every thread maps back to one namespace.
* An item is one ``knowledge`` memory of that thread. Its content is the item's text, what
  Cairn embeds and searches: the fields named by the put's ``index`` (LangGraph path syntax),
  else every string in the value, one per line; the key alone for ``index=False``. Its
  metadata holds ``lg_key``, ``lg_namespace``, ``lg_value`` (the value itself, returned as
  is), ``lg_created_at`` and ``lg_updated_at``.
* A put of an existing key writes the new memory, then deletes the old one (keeping its
  creation time); a put of ``None`` deletes it. Deleting cascades: summaries that cite the
  item go too.
* ``search`` with a query runs Cairn's hybrid search in each namespace under the prefix and
  merges the hits by score (reciprocal rank fusion scores: ranks within each namespace, so
  the merge across several namespaces is an approximation); without a query it lists items
  (namespaces in order, then in the order items were last written). ``filter`` is LangGraph's: equality on value
  fields, nested dicts, and ``$eq $ne $gt $gte $lt $lte``.
* ``list_namespaces`` reads Cairn's threads whose name starts with ``"lg:"``. A namespace
  exists while it holds an item.

Operations in a batch run in order, each seeing the ones before. Finding an item by key reads
its namespace's memories (Cairn has no index on metadata): fine for the thousands of items an
agent's namespace holds, not for millions. TTLs are not supported.
"""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Generator, Iterable
from datetime import datetime, timezone
from typing import Any, Optional
from urllib.parse import quote, unquote

from langgraph.store.base import (
    BaseStore,
    GetOp,
    InvalidNamespaceError,
    Item,
    ListNamespacesOp,
    MatchCondition,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
    get_text_at_path,
)

from . import MemoryHarness, NotFound
from ._sansio import arun, run

try:  # langgraph >= 1.2.20 or so; the same checks by hand before.
    from langgraph.store.base import validate_op_namespace as _validate_op_namespace
except ImportError:  # pragma: no cover - depends on the installed langgraph
    _validate_op_namespace = None

__all__ = ["CairnStore"]

# Memories read per `list` call when reading a namespace.
_PAGE = 500
# Most candidates a filtered query search asks Cairn for in each namespace.
_MAX_FILTER_CANDIDATES = 100


def _escape(label: str) -> str:
    return "".join(
        quote(c, safe="")
        if c in "%/" or c.isspace() or unicodedata.category(c).startswith("C")
        else c
        for c in label
    )


def _now() -> str:
    return datetime.now(timezone.utc).isoformat()


def _time(value: Any, fallback: str) -> datetime:
    try:
        t = datetime.fromisoformat(value if isinstance(value, str) else fallback)
    except ValueError:
        t = datetime.fromisoformat(fallback)
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)


def _strings(value: Any) -> list[str]:
    """Every string in a JSON value, depth first, in order."""
    if isinstance(value, str):
        return [value] if value.strip() else []
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, (list, tuple)):
        return [s for v in value for s in _strings(v)]
    return []


def _index_text(key: str, value: dict, index: Any) -> str:
    """The text Cairn embeds and searches for an item (never blank, as Cairn requires)."""
    if index is False:
        texts = [key]
    elif index:
        texts = [t for path in index for t in get_text_at_path(value, path) if t.strip()]
    else:
        texts = _strings(value)
    text = "\n".join(texts)
    return text if text.strip() else json.dumps(value, sort_keys=True, ensure_ascii=False)


def _matches_filter(value: dict, flt: Optional[dict]) -> bool:
    return not flt or all(_compare(value.get(k), v) for k, v in flt.items())


def _compare(item_value: Any, filter_value: Any) -> bool:
    """LangGraph's filter semantics (those of its InMemoryStore)."""
    if isinstance(filter_value, dict):
        if any(k.startswith("$") for k in filter_value):
            return all(_operator(item_value, op, v) for op, v in filter_value.items())
        return isinstance(item_value, dict) and all(
            _compare(item_value.get(k), v) for k, v in filter_value.items()
        )
    if isinstance(filter_value, (list, tuple)):
        return (
            isinstance(item_value, (list, tuple))
            and len(item_value) == len(filter_value)
            and all(_compare(a, b) for a, b in zip(item_value, filter_value))
        )
    return item_value == filter_value


def _operator(value: Any, op: str, operand: Any) -> bool:
    if op == "$eq":
        return value == operand
    if op == "$ne":
        return value != operand
    if op not in ("$gt", "$gte", "$lt", "$lte"):
        raise ValueError(f"unsupported filter operator {op!r}")
    try:
        a, b = float(value), float(operand)
    except (TypeError, ValueError):
        return False
    return {"$gt": a > b, "$gte": a >= b, "$lt": a < b, "$lte": a <= b}[op]


def _matches_condition(condition: MatchCondition, namespace: tuple[str, ...]) -> bool:
    path = tuple(condition.path)
    if len(namespace) < len(path):
        return False
    if condition.match_type == "prefix":
        pairs = zip(namespace, path)
    elif condition.match_type == "suffix":
        pairs = zip(reversed(namespace), reversed(path))
    else:
        raise ValueError(f"unsupported match type {condition.match_type!r}")
    return all(p == "*" or n == p for n, p in pairs)


def _check_labels(namespace: tuple[str, ...]) -> None:
    for label in namespace:
        if not isinstance(label, str) or not label or "." in label or "\x00" in label:
            raise InvalidNamespaceError(f"invalid namespace label {label!r} in {namespace}")


def _validate(op: Op) -> None:
    if _validate_op_namespace is not None:
        _validate_op_namespace(op)
    elif isinstance(op, (GetOp, PutOp)):
        _check_labels(op.namespace)
    elif isinstance(op, SearchOp):
        _check_labels(op.namespace_prefix)
    if isinstance(op, PutOp) and not op.namespace:
        raise InvalidNamespaceError("namespace cannot be empty")


class CairnStore(BaseStore):
    """A LangGraph ``BaseStore`` over a Cairn ``MemoryHarness`` (see the module's doc).

    ``thread_prefix`` (default ``"lg:"``) starts the name of every thread the store uses;
    stores with different prefixes on one Cairn file do not see each other's items.
    """

    supports_ttl = False

    def __init__(self, harness: MemoryHarness, *, thread_prefix: str = "lg:") -> None:
        if not thread_prefix:
            raise ValueError("thread_prefix must not be empty")
        self.harness = harness
        self.thread_prefix = thread_prefix

    def __repr__(self) -> str:
        return f"CairnStore({self.harness!r})"

    # -- namespaces <-> threads -----------------------------------------------------------

    def thread_of(self, namespace: tuple[str, ...]) -> str:
        """The Cairn thread of a namespace."""
        return self.thread_prefix + "/".join(_escape(label) for label in namespace)

    def namespace_of(self, thread: str) -> Optional[tuple[str, ...]]:
        """The namespace of a Cairn thread; None for a thread that is not the store's."""
        if not thread.startswith(self.thread_prefix) or thread == self.thread_prefix:
            return None
        return tuple(unquote(p) for p in thread[len(self.thread_prefix):].split("/"))

    # -- batches --------------------------------------------------------------------------

    # Each operation is written once, as a generator of harness calls (see `_sansio`):
    # `batch` runs them with the harness's sync methods, `abatch` with its asyncio ones.

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        return [run(self.harness, self._op(op)) for op in ops]

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        return [await arun(self.harness, self._op(op)) for op in ops]

    def _op(self, op: Op) -> Generator:
        _validate(op)
        if isinstance(op, GetOp):
            return self._get(op)
        if isinstance(op, PutOp):
            return self._put(op)
        if isinstance(op, SearchOp):
            return self._search(op)
        if isinstance(op, ListNamespacesOp):
            return self._list_namespaces(op)
        raise ValueError(f"unknown operation {type(op).__name__}")

    # -- the operations -------------------------------------------------------------------

    def _memories(self, thread: str) -> Generator:
        """The store's memories of a thread, one per key (the newest, should a put have left
        two), oldest first."""
        by_key: dict[str, dict] = {}
        offset = 0
        while True:
            page = yield "list", {
                "thread": thread,
                "kind": "knowledge",
                "offset": offset,
                "limit": _PAGE,
            }
            for m in page:
                key = (m.get("metadata") or {}).get("lg_key")
                if isinstance(key, str):
                    by_key.pop(key, None)
                    by_key[key] = m
            if len(page) < _PAGE:
                return by_key
            offset += len(page)

    def _copies(self, thread: str, key: str) -> Generator:
        """Every memory of a key in a thread, oldest first (one, unless a put was cut short)."""
        out = []
        offset = 0
        while True:
            page = yield "list", {
                "thread": thread,
                "kind": "knowledge",
                "offset": offset,
                "limit": _PAGE,
            }
            out.extend(m for m in page if (m.get("metadata") or {}).get("lg_key") == key)
            if len(page) < _PAGE:
                return out
            offset += len(page)

    def _item(self, memory: dict, score: Any = ...) -> Item:
        md = memory["metadata"]
        namespace = self.namespace_of(memory["thread"]) or tuple(md.get("lg_namespace") or ())
        created = _time(md.get("lg_created_at"), memory["created_at"])
        updated = _time(md.get("lg_updated_at"), memory["created_at"])
        value = md.get("lg_value")
        value = value if isinstance(value, dict) else {}
        if score is ...:
            return Item(
                value=value,
                key=md["lg_key"],
                namespace=namespace,
                created_at=created,
                updated_at=updated,
            )
        return SearchItem(
            namespace=namespace,
            key=md["lg_key"],
            value=value,
            created_at=created,
            updated_at=updated,
            score=score,
        )

    def _get(self, op: GetOp) -> Generator:
        copies = yield from self._copies(self.thread_of(op.namespace), op.key)
        return self._item(copies[-1]) if copies else None

    def _put(self, op: PutOp) -> Generator:
        thread = self.thread_of(op.namespace)
        copies = yield from self._copies(thread, op.key)
        if op.value is not None:
            value = dict(op.value)
            now = _now()
            created = (copies[-1]["metadata"].get("lg_created_at") if copies else None) or now
            # The new memory first, then the old ones go: a put cut short leaves two copies
            # (reads take the newest), never none.
            yield "add", {
                "content": _index_text(op.key, value, op.index),
                "kind": "knowledge",
                "thread": thread,
                "metadata": {
                    "lg_key": op.key,
                    "lg_namespace": list(op.namespace),
                    "lg_value": value,
                    "lg_created_at": created,
                    "lg_updated_at": now,
                },
            }
        for m in copies:
            try:
                yield "delete", {"id": m["id"], "policy": "cascade"}
            except NotFound:  # pragma: no cover - deleted meanwhile
                pass
        return None

    def _threads(self, prefix: tuple[str, ...]) -> Generator:
        """The store's threads whose namespace starts with `prefix`, by namespace."""
        threads = yield "threads", {}
        found = []
        for t in threads:
            ns = self.namespace_of(t)
            if ns is not None and ns[: len(prefix)] == tuple(prefix):
                found.append((ns, t))
        return sorted(found)

    def _search(self, op: SearchOp) -> Generator:
        threads = yield from self._threads(op.namespace_prefix)
        need = op.offset + op.limit
        if need <= 0 or not threads:
            return []
        if op.query and op.query.strip():
            # A filter is applied to Cairn's hits, so a filtered search asks for more of them
            # (five times as many, up to 100 a namespace) lest the filter leave fewer than
            # `limit`; more than that many non-matching items ranked above the matches can
            # still make it return fewer.
            k = need if not op.filter else max(need, min(need * 5, _MAX_FILTER_CANDIDATES))
            hits: list[tuple[float, tuple[str, ...], str, dict]] = []
            for ns, thread in threads:
                found = yield "search", {
                    "query": op.query,
                    "k": k,
                    "mode": "hybrid",
                    "thread": thread,
                    "kind": "knowledge",
                }
                for m in found:
                    md = m.get("metadata") or {}
                    if not isinstance(md.get("lg_key"), str):
                        continue
                    if _matches_filter(md.get("lg_value") or {}, op.filter):
                        hits.append((-float(m["score"]), ns, md["lg_key"], m))
            hits.sort(key=lambda h: h[:3])
            seen = set()
            out = []
            for neg_score, ns, key, m in hits:
                if (ns, key) in seen:
                    continue
                seen.add((ns, key))
                out.append(self._item(m, -neg_score))
            return out[op.offset : need]
        out = []
        for _, thread in threads:
            memories = yield from self._memories(thread)
            for m in memories.values():
                if _matches_filter(m["metadata"].get("lg_value") or {}, op.filter):
                    out.append(self._item(m, None))
            if len(out) >= need:
                break
        return out[op.offset : need]

    def _list_namespaces(self, op: ListNamespacesOp) -> Generator:
        threads = yield from self._threads(())
        namespaces = [ns for ns, _ in threads]
        if op.match_conditions:
            namespaces = [
                ns
                for ns in namespaces
                if all(_matches_condition(c, ns) for c in op.match_conditions)
            ]
        if op.max_depth is not None:
            namespaces = [ns[: op.max_depth] for ns in namespaces]
        namespaces = sorted(set(namespaces))
        return namespaces[op.offset : op.offset + op.limit]
