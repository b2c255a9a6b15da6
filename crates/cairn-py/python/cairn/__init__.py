"""Cairn: a hierarchical, vector-backed memory store for LLM agents, in-process.

Every memory is a row in SQLite with its embedding (the local all-MiniLM-L6-v2 model, fetched
on first use), indexed with HNSW; summaries over memories (and over summaries) link both ways,
so an agent works with a compressed context and drills down to the exact turns.

    import cairn
    mem = cairn.MemoryHarness("memory.db")
    mem.add("I adopted a grey cat named Pixel.", thread="t1", role="user", speaker="Ana")
    mem.search("pet", thread="t1")
    mem.assemble_context("t1", "What is my cat called?", budget=2000)["text"]

Every method has an asyncio twin prefixed with ``a`` (``await mem.aadd(...)``). The work runs
in Rust with the GIL released.
"""

from __future__ import annotations

import json
import os
from datetime import datetime
from typing import Any, Iterable, Optional, Union

from . import _cairn

__all__ = [
    "MemoryHarness",
    "CairnError",
    "NotFound",
    "InvalidInput",
    "Conflict",
    "StorageError",
    "EmbeddingError",
]


class CairnError(Exception):
    """A Cairn error; ``code`` says which kind."""

    code = "other"


class NotFound(CairnError, KeyError):
    """No memory with this id."""

    code = "not_found"


class InvalidInput(CairnError, ValueError):
    """Bad input; nothing was written."""

    code = "invalid_input"


class Conflict(CairnError):
    """The request conflicts with what is stored (a duplicate id, a memory still cited)."""

    code = "conflict"


class StorageError(CairnError):
    """The store failed (I/O, a full disk, ...); nothing was written."""

    code = "storage"


class EmbeddingError(CairnError):
    """The embedding model failed or is unavailable."""

    code = "embedding"


_ERRORS = {c.code: c for c in (NotFound, InvalidInput, Conflict, StorageError, EmbeddingError)}


def _error(e: Exception) -> CairnError:
    if len(e.args) >= 2:
        code, message = e.args[0], e.args[1]
    else:
        code, message = "other", str(e)
    err = _ERRORS.get(code, CairnError)(message)
    err.code = code
    return err


def _time(t: Union[str, datetime, None]) -> Optional[str]:
    if t is None or isinstance(t, str):
        return t
    if t.tzinfo is None:
        raise InvalidInput("created_at must be timezone-aware (or an RFC 3339 string)")
    return t.isoformat()


def conditions(where: Optional[dict]) -> Optional[list]:
    """Metadata conditions from a dict: ``{"user_id": "alice"}`` (equal), ``{"tag": ["a",
    "b"]}`` (one of), ``{"priority": {"gte": 2, "lt": 5}}`` (operators ``eq``, ``ne``,
    ``in``, ``gt``, ``gte``, ``lt``, ``lte``, ``exists``); all must hold."""
    if where is None:
        return None
    out = []
    for key, cond in where.items():
        if isinstance(cond, dict):
            out.append({"key": key, **cond})
        elif isinstance(cond, (list, tuple)):
            out.append({"key": key, "in": list(cond)})
        else:
            out.append({"key": key, "eq": cond})
    return out


def _forget_args(ids, thread, where, everything) -> dict:
    given = sum(x is not None for x in (ids, thread, where)) + bool(everything)
    if given != 1:
        raise InvalidInput("give exactly one of ids, thread, where or everything=True")
    return {"ids": ids, "thread": thread, "metadata": conditions(where), "everything": everything}


def _clean(args: dict) -> str:
    return json.dumps({k: v for k, v in args.items() if v is not None})


def _memory_args(content: str, kind, thread, role, speaker, metadata, created_at) -> dict:
    return {
        "content": content,
        "kind": kind,
        "thread": thread,
        "role": role,
        "speaker": speaker,
        "metadata": metadata,
        "created_at": _time(created_at),
    }


class MemoryHarness:
    """A Cairn store: a SQLite file, or a PostgreSQL URL (``postgres://user@host/db``,
    optionally ``?schema=NAME``). ``embedder`` is ``"minilm"`` (the local model) or
    ``"hash"`` (deterministic and meaningless: for tests of logic)."""

    def __init__(self, path: str, *, embedder: str = "minilm", cache: bool = True) -> None:
        path = os.fspath(path)
        # A file path is made absolute: the store stays the file it was opened as if the
        # process changes directory. A PostgreSQL URL is passed as it is.
        if not path.startswith(("postgres://", "postgresql://")):
            path = os.path.abspath(path)
        try:
            self._h = _cairn.Harness(path, embedder, cache)
        except _cairn.Error as e:
            raise _error(e) from None
        self.path = path

    def _call(self, method: str, **args: Any) -> Any:
        try:
            return json.loads(self._h.call(method, _clean(args)))
        except _cairn.Error as e:
            raise _error(e) from None

    async def _acall(self, method: str, **args: Any) -> Any:
        try:
            return json.loads(await self._h.acall(method, _clean(args)))
        except _cairn.Error as e:
            raise _error(e) from None

    # -- writing --------------------------------------------------------------------------

    def add(self, content: str, *, kind: Optional[str] = None, thread: Optional[str] = None,
            role: Optional[str] = None, speaker: Optional[str] = None,
            metadata: Optional[dict] = None, created_at: Union[str, datetime, None] = None,
            key: Optional[str] = None, expires_at: Union[str, datetime, None] = None,
            supersedes: Optional[str] = None,
            valid_from: Union[str, datetime, None] = None) -> str:
        """Adds a memory; returns its id. ``kind`` defaults to conversational with a thread,
        knowledge without. With ``key``, adding the same memory again returns the stored
        one (retries never duplicate); other content under the key is a ``Conflict``.
        ``expires_at`` hides it from reads from then on (consolidation deletes it);
        ``supersedes`` names the earlier fact it replaces (kept as history)."""
        return self._call("add", key=key, expires_at=_time(expires_at), supersedes=supersedes,
                          valid_from=_time(valid_from),
                          **_memory_args(content, kind, thread, role, speaker, metadata, created_at))

    async def aadd(self, content: str, *, kind: Optional[str] = None, thread: Optional[str] = None,
                   role: Optional[str] = None, speaker: Optional[str] = None,
                   metadata: Optional[dict] = None,
                   created_at: Union[str, datetime, None] = None, key: Optional[str] = None) -> str:
        return await self._acall("add", key=key,
                                 **_memory_args(content, kind, thread, role, speaker, metadata, created_at))

    @staticmethod
    def _batch(memories: Iterable[dict]) -> list:
        out = []
        for m in memories:
            m = dict(m)
            if "created_at" in m:
                m["created_at"] = _time(m["created_at"])
            out.append({k: v for k, v in m.items() if v is not None})
        return out

    def add_many(self, memories: Iterable[dict]) -> list:
        """Adds memories (dicts with add's keywords and ``content``), all or none."""
        return self._call("add_many", memories=self._batch(memories))

    async def aadd_many(self, memories: Iterable[dict]) -> list:
        return await self._acall("add_many", memories=self._batch(memories))

    def add_summary(self, content: str, source_ids: list, *, thread: Optional[str] = None) -> dict:
        """Writes a summary of ``source_ids`` (in that order), linked both ways."""
        return self._call("add_summary", content=content, source_ids=list(source_ids), thread=thread)

    async def aadd_summary(self, content: str, source_ids: list, *, thread: Optional[str] = None) -> dict:
        return await self._acall("add_summary", content=content, source_ids=list(source_ids), thread=thread)

    def delete(self, id: str, *, policy: str = "restrict") -> dict:
        """Deletes a memory: restrict (refused while a summary cites it), cascade or detach."""
        return self._call("delete", id=id, policy=policy)

    async def adelete(self, id: str, *, policy: str = "restrict") -> dict:
        return await self._acall("delete", id=id, policy=policy)

    def delete_thread(self, thread: str) -> int:
        """Deletes every memory and summary of a thread; returns how many."""
        return self._call("delete_thread", thread=thread)

    async def adelete_thread(self, thread: str) -> int:
        return await self._acall("delete_thread", thread=thread)

    def consolidate(self, *, older_than: str = "1h", thread: Optional[str] = None,
                    chunk_size: Optional[int] = None, fanout: Optional[int] = None) -> dict:
        """Summarizes memories older than ``older_than`` (90s, 30m, 2h, 7d) in chunks, then
        rolls summaries up a level."""
        return self._call("consolidate", older_than=older_than, thread=thread,
                          chunk_size=chunk_size, fanout=fanout)

    async def aconsolidate(self, *, older_than: str = "1h", thread: Optional[str] = None,
                           chunk_size: Optional[int] = None, fanout: Optional[int] = None) -> dict:
        return await self._acall("consolidate", older_than=older_than, thread=thread,
                                 chunk_size=chunk_size, fanout=fanout)

    # -- reading --------------------------------------------------------------------------

    def get(self, id: str) -> dict:
        """One memory; raises NotFound."""
        return self._call("get", id=id)

    async def aget(self, id: str) -> dict:
        return await self._acall("get", id=id)

    def list(self, *, thread: Optional[str] = None, kind: Union[str, list, None] = None,
             offset: int = 0, limit: int = 100) -> list:
        """Memories, oldest first, a page at a time."""
        return self._call("list", thread=thread, kind=kind, offset=offset, limit=limit)

    async def alist(self, *, thread: Optional[str] = None, kind: Union[str, list, None] = None,
                    offset: int = 0, limit: int = 100) -> list:
        return await self._acall("list", thread=thread, kind=kind, offset=offset, limit=limit)

    def recent(self, thread: str, limit: int = 20) -> list:
        """The newest ``limit`` turns of a thread, oldest first."""
        return self._call("recent", thread=thread, limit=limit)

    async def arecent(self, thread: str, limit: int = 20) -> list:
        return await self._acall("recent", thread=thread, limit=limit)

    def expand_summary(self, id: str) -> list:
        """A summary's sources, in order."""
        return self._call("expand_summary", id=id)

    async def aexpand_summary(self, id: str) -> list:
        return await self._acall("expand_summary", id=id)

    def expand_to_leaves(self, id: str) -> list:
        """Every raw memory under a summary, in time order."""
        return self._call("expand_to_leaves", id=id)

    async def aexpand_to_leaves(self, id: str) -> list:
        return await self._acall("expand_to_leaves", id=id)

    def summaries_of(self, id: str) -> list:
        """The summaries that cite a memory (its back-links)."""
        return self._call("summaries_of", id=id)

    async def asummaries_of(self, id: str) -> list:
        return await self._acall("summaries_of", id=id)

    def ancestors(self, id: str) -> list:
        """Every summary above a memory, nearest first."""
        return self._call("ancestors", id=id)

    async def aancestors(self, id: str) -> list:
        return await self._acall("ancestors", id=id)

    def search(self, query: str, *, k: Optional[int] = None, mode: str = "hybrid",
               thread: Optional[str] = None, kind: Union[str, list, None] = None,
               min_level: Optional[int] = None, max_level: Optional[int] = None,
               where: Optional[dict] = None, as_of: Union[str, datetime, None] = None,
               history: bool = False, half_life: Optional[str] = None) -> list:
        """Hybrid (default), vector or keyword search; each hit is a memory with its
        ``score``. ``where`` filters on metadata (see :func:`conditions`); ``as_of`` reads
        the facts that held then, ``history`` superseded ones too; ``half_life`` (``"30d"``)
        decays scores with age."""
        return self._call("search", query=query, k=k, mode=mode, thread=thread, kind=kind,
                          min_level=min_level, max_level=max_level, metadata=conditions(where),
                          as_of=_time(as_of), history=history, half_life=half_life)

    def history(self, id: str) -> list:
        """Every version of a fact (what it superseded and what superseded it), oldest
        first, each with ``valid_from`` / ``valid_to``."""
        return self._call("history", id=id)

    async def ahistory(self, id: str) -> list:
        return await self._acall("history", id=id)

    async def asearch(self, query: str, *, k: Optional[int] = None, mode: str = "hybrid",
                      thread: Optional[str] = None, kind: Union[str, list, None] = None,
                      min_level: Optional[int] = None, max_level: Optional[int] = None,
                      where: Optional[dict] = None) -> list:
        return await self._acall("search", query=query, k=k, mode=mode, thread=thread, kind=kind,
                                 min_level=min_level, max_level=max_level,
                                 metadata=conditions(where))

    def upsert(self, content: str, *, key: str, kind: Optional[str] = None,
               thread: Optional[str] = None, role: Optional[str] = None,
               speaker: Optional[str] = None, metadata: Optional[dict] = None,
               created_at: Union[str, datetime, None] = None) -> dict:
        """Adds the memory stored under ``key`` or updates it in place; returns
        ``{"memory": ..., "outcome": "inserted" | "unchanged" | "metadata_updated" |
        "content_updated"}``."""
        args = _memory_args(content, kind, thread, role, speaker, metadata, created_at)
        return self._call("upsert", key=key, **args)

    async def aupsert(self, content: str, *, key: str, kind: Optional[str] = None,
                      thread: Optional[str] = None, role: Optional[str] = None,
                      speaker: Optional[str] = None, metadata: Optional[dict] = None,
                      created_at: Union[str, datetime, None] = None) -> dict:
        args = _memory_args(content, kind, thread, role, speaker, metadata, created_at)
        return await self._acall("upsert", key=key, **args)

    def patch_metadata(self, id: str, metadata: dict) -> dict:
        """Merges ``metadata`` into a memory's (``None`` removes a field), without
        re-embedding it; returns the memory."""
        return self._call("patch_metadata", id=id, metadata=metadata)

    async def apatch_metadata(self, id: str, metadata: dict) -> dict:
        return await self._acall("patch_metadata", id=id, metadata=metadata)

    def list_page(self, *, thread: Optional[str] = None, kind: Union[str, list, None] = None,
                  where: Optional[dict] = None, cursor: Optional[str] = None,
                  limit: int = 100) -> dict:
        """One page of memories, oldest first: ``{"items": [...], "next": cursor or None}``;
        pass ``next`` back as ``cursor`` for the following page."""
        return self._call("list_page", thread=thread, kind=kind, metadata=conditions(where),
                          cursor=cursor, limit=limit)

    async def alist_page(self, *, thread: Optional[str] = None,
                         kind: Union[str, list, None] = None, where: Optional[dict] = None,
                         cursor: Optional[str] = None, limit: int = 100) -> dict:
        return await self._acall("list_page", thread=thread, kind=kind,
                                 metadata=conditions(where), cursor=cursor, limit=limit)

    def forget(self, *, ids: Optional[list] = None, thread: Optional[str] = None,
               where: Optional[dict] = None, everything: bool = False) -> dict:
        """Forgets memories (give one of ``ids``, ``thread``, ``where`` or
        ``everything=True``): they are deleted, the summaries built on them are rewritten
        from what remains, and their cached embeddings are dropped. ``erased`` in the
        result says whether a SQLite store's files were scrubbed of their bytes too."""
        return self._call("forget", **_forget_args(ids, thread, where, everything))

    async def aforget(self, *, ids: Optional[list] = None, thread: Optional[str] = None,
                      where: Optional[dict] = None, everything: bool = False) -> dict:
        return await self._acall("forget", **_forget_args(ids, thread, where, everything))

    def assemble_context(self, thread: str, query: str, *, budget: int = 2000,
                         knowledge: bool = False, scope: Optional[list] = None,
                         scope_where: Optional[dict] = None) -> dict:
        """The context for ``query`` in ``thread`` within ``budget`` tokens: summaries,
        recalled turns, recent turns (``items``), as ``text`` and as chat ``messages``.
        A recalled item's ``repeats`` lists the other turns that said the same words (id,
        date, metadata), on other days and up to four a day with its own: the text is
        shown once, with their days.
        ``scope`` (other threads) and ``scope_where`` (metadata, such as a user id) add
        related memories from beyond the thread."""
        return self._call("assemble_context", thread=thread, query=query, budget=budget,
                          knowledge=knowledge, scope=scope, scope_metadata=conditions(scope_where))

    async def aassemble_context(self, thread: str, query: str, *, budget: int = 2000,
                                knowledge: bool = False, scope: Optional[list] = None,
                                scope_where: Optional[dict] = None) -> dict:
        return await self._acall("assemble_context", thread=thread, query=query, budget=budget,
                                 knowledge=knowledge, scope=scope,
                                 scope_metadata=conditions(scope_where))

    def threads(self) -> list:
        """Every thread id."""
        return self._call("threads")

    async def athreads(self) -> list:
        return await self._acall("threads")

    def stats(self) -> dict:
        """Counts and index health."""
        return self._call("stats")

    async def astats(self) -> dict:
        return await self._acall("stats")

    def count_tokens(self, text: str) -> int:
        """Tokens of ``text`` (cl100k_base)."""
        return self._call("count_tokens", text=text)

    def __repr__(self) -> str:
        return f"MemoryHarness({_cairn.display_location(self.path)!r})"
