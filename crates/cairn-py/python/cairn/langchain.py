"""LangChain chat histories kept in Cairn (``pip install cairn-memory[langchain]``).

``CairnChatMessageHistory`` stores a conversation's messages as the turns of one Cairn thread,
so they are searchable, summarized by consolidation and assembled into contexts like any other
turns. ``CairnSummaryBufferChatMessageHistory`` reads the same thread back as a moving summary
plus the recent turns within a token budget (``MemoryHarness.assemble_context``): unlike
LangChain's summary buffer memory, nothing is dropped, and every summary expands back to its
turns.

    from cairn import MemoryHarness
    from cairn.langchain import CairnChatMessageHistory

    history = CairnChatMessageHistory(MemoryHarness("memory.db"), "chat-1")
    history.add_user_message("I adopted a cat named Pixel.")
    history.add_ai_message("Congratulations! How old is Pixel?")
    history.messages  # [HumanMessage(...), AIMessage(...)]

A message is stored with its text as the turn's content (what is embedded and searched) and
the rest of it (id, name, tool calls, additional kwargs, ...) in the turn's metadata under
``"lc"``, so it reads back as it was written. Turns written by other means (Rust, the CLI, the
server, ``MemoryHarness.add``) read back by their role: user → ``HumanMessage``, assistant →
``AIMessage``, system → ``SystemMessage``, tool → ``ToolMessage`` (its ``tool_call_id`` from the
turn's metadata ``"tool_call_id"``, else the turn's id), with the turn's speaker as ``name``
and its Cairn id as ``id``.
"""

from __future__ import annotations

import json
from collections.abc import Generator, Sequence
from typing import Any, Optional

from langchain_core.chat_history import BaseChatMessageHistory
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    ChatMessage,
    FunctionMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
    messages_from_dict,
)

from . import MemoryHarness
from ._sansio import arun, run

__all__ = ["CairnChatMessageHistory", "CairnSummaryBufferChatMessageHistory"]

# Turns read per `list` call when reading a whole thread.
_PAGE = 500

# LangChain message class -> Cairn role (chunks are subclasses of their message class).
_ROLE_OF_CLASS = (
    (HumanMessage, "user"),
    (AIMessage, "assistant"),
    (SystemMessage, "system"),
    (ToolMessage, "tool"),
    (FunctionMessage, "tool"),
)
# A ChatMessage's free-form role -> Cairn role.
_ROLE_OF_CHAT_ROLE = {
    "user": "user",
    "human": "user",
    "assistant": "assistant",
    "ai": "assistant",
    "system": "system",
    "developer": "system",
    "tool": "tool",
    "function": "tool",
}
# Metadata keys of a stored message.
_LC = "lc"  # {"type": ..., "data": {...}}: the message without its content
_LC_CONTENT = "lc_content"  # the content, when the turn's text is not it (blocks, empty)


def _role(message: BaseMessage) -> Optional[str]:
    if isinstance(message, ChatMessage):
        return _ROLE_OF_CHAT_ROLE.get(message.role.lower())
    return next((role for cls, role in _ROLE_OF_CLASS if isinstance(message, cls)), None)


def _text(message: BaseMessage) -> str:
    """The text Cairn stores (and embeds) for a message; never blank, as Cairn requires."""
    text = message.text
    if text.strip():
        return text
    calls = getattr(message, "tool_calls", None) or []
    if calls:
        return "\n".join(
            f"[tool call] {c.get('name')}({json.dumps(c.get('args'), ensure_ascii=False, default=str)})"
            for c in calls
        )
    return f"[{message.type} message without text]"


def _jsonable(value: Any) -> Any:
    """A JSON-safe copy (what is not JSON becomes its str)."""
    return json.loads(json.dumps(value, ensure_ascii=False, default=str))


def _memory_of(message: BaseMessage, speaker_names: dict) -> dict:
    """The `add_many` entry for a message."""
    if not isinstance(message, BaseMessage):
        raise TypeError(f"expected a langchain BaseMessage, not {type(message).__name__}")
    role = _role(message)
    text = _text(message)
    data = message.model_dump()
    content = data.pop("content")
    data.pop("type", None)
    # Defaults need not be stored: messages_from_dict fills them in.
    data = {k: v for k, v in data.items() if v not in (None, {}, [], "")}
    metadata: dict[str, Any] = {_LC: _jsonable({"type": message.type, "data": data})}
    if content != text:
        metadata[_LC_CONTENT] = _jsonable(content)
    tool_call_id = getattr(message, "tool_call_id", None)
    if tool_call_id:
        metadata["tool_call_id"] = tool_call_id
    speaker = message.name or speaker_names.get(role) or speaker_names.get(message.type)
    return {
        "content": text,
        "kind": "conversational",
        "role": role,
        "speaker": speaker,
        "metadata": metadata,
    }


def _message_of(memory: dict) -> BaseMessage:
    """The LangChain message of a Cairn turn (a memory dict or an assembled-context item)."""
    metadata = memory.get("metadata") or {}
    stored = metadata.get(_LC)
    if isinstance(stored, dict) and isinstance(stored.get("data"), dict):
        data = dict(stored["data"])
        data["content"] = metadata.get(_LC_CONTENT, memory["content"])
        try:
            return messages_from_dict([{"type": stored.get("type"), "data": data}])[0]
        except Exception:  # noqa: BLE001 - not a message type this LangChain knows: by role
            pass
    role = memory.get("role")
    content = memory["content"]
    extra: dict[str, Any] = {"id": memory.get("id")}
    if memory.get("speaker"):
        extra["name"] = memory["speaker"]
    if role == "user":
        return HumanMessage(content=content, **extra)
    if role == "assistant":
        return AIMessage(content=content, **extra)
    if role == "tool":
        tool_call_id = metadata.get("tool_call_id") or memory.get("id") or ""
        return ToolMessage(content=content, tool_call_id=str(tool_call_id), **extra)
    if role == "system":
        return SystemMessage(content=content, **extra)
    return ChatMessage(content=content, role=role or "unknown", **extra)


class CairnChatMessageHistory(BaseChatMessageHistory):
    """The messages of one Cairn thread, oldest first.

    ``speaker_names`` maps a role (``"user"``, ``"assistant"``, ``"system"``, ``"tool"``) or a
    LangChain message type (``"human"``, ``"ai"``, ...) to the speaker stored with its turns (a
    message's own ``name`` wins); Cairn recalls turns by speaker name ("what did Ana say
    about...").

    ``add_messages`` stores a batch in one transaction (all or none); ``clear`` deletes the
    thread: every turn and every summary of it.
    """

    def __init__(
        self,
        harness: MemoryHarness,
        thread: str,
        *,
        speaker_names: Optional[dict] = None,
    ) -> None:
        super().__init__()
        self.harness = harness
        self.thread = thread
        self.speaker_names = dict(speaker_names or {})

    # Reading and writing are written once, as generators of harness calls (see `_sansio`),
    # run with the harness's sync methods or its asyncio ones.

    def _run(self, gen: Generator) -> Any:
        return run(self.harness, gen)

    async def _arun(self, gen: Generator) -> Any:
        return await arun(self.harness, gen)

    def _read(self) -> Generator:
        out: list[BaseMessage] = []
        offset = 0
        while True:
            page = yield "list", {
                "thread": self.thread,
                "kind": "conversational",
                "offset": offset,
                "limit": _PAGE,
            }
            out.extend(_message_of(m) for m in page)
            if len(page) < _PAGE:
                return out
            offset += len(page)

    def _write(self, messages: Sequence[BaseMessage]) -> Generator:
        batch = []
        for m in messages:
            entry = _memory_of(m, self.speaker_names)
            entry["thread"] = self.thread
            batch.append(entry)
        if batch:
            yield "add_many", {"memories": batch}

    def _clear(self) -> Generator:
        yield "delete_thread", {"thread": self.thread}

    @property
    def messages(self) -> list[BaseMessage]:  # type: ignore[override]
        """Every message of the thread, oldest first."""
        return self._run(self._read())

    async def aget_messages(self) -> list[BaseMessage]:
        return await self._arun(self._read())

    def add_messages(self, messages: Sequence[BaseMessage]) -> None:
        self._run(self._write(list(messages)))

    async def aadd_messages(self, messages: Sequence[BaseMessage]) -> None:
        await self._arun(self._write(list(messages)))

    def clear(self) -> None:
        self._run(self._clear())

    async def aclear(self) -> None:
        await self._arun(self._clear())

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.harness!r}, {self.thread!r})"


class CairnSummaryBufferChatMessageHistory(CairnChatMessageHistory):
    """A thread read as its moving summary plus its recent turns, within ``budget`` tokens.

    ``messages`` is ``MemoryHarness.assemble_context(thread, query, budget=budget)`` as chat
    messages: one ``SystemMessage`` with the summaries of older turns (and the older turns
    recalled for the query), then the recent turns as they were written. The query is
    ``query`` if given, else the text of the thread's latest user turn. Writing is the plain
    history's: every turn stays in Cairn, and ``consolidate`` (or the consolidation cron) is
    what writes the summaries.
    """

    # How many of the newest turns are looked at for the latest user turn.
    _QUERY_LOOKBACK = 50

    def __init__(
        self,
        harness: MemoryHarness,
        thread: str,
        *,
        speaker_names: Optional[dict] = None,
        query: Optional[str] = None,
        budget: int = 2000,
    ) -> None:
        super().__init__(harness, thread, speaker_names=speaker_names)
        self.query = query
        self.budget = budget

    def _read(self) -> Generator:
        query = self.query
        if query is None:
            recent = yield "recent", {"thread": self.thread, "limit": self._QUERY_LOOKBACK}
            query = next((m["content"] for m in reversed(recent) if m.get("role") == "user"), "")
        context = yield "assemble_context", {
            "thread": self.thread,
            "query": query,
            "budget": self.budget,
        }
        return _context_messages(context)


def _context_messages(context: dict) -> list[BaseMessage]:
    """An assembled context as LangChain messages: what precedes the recent turns (summaries,
    recalled and related memories) joined into one SystemMessage, then the recent turns.

    The context's ``messages`` hold one message per summary, one block for the recalled turns,
    one for the related memories and one per recent turn, the recent turns last; so the
    messages before the last ``len(recent)`` are exactly the other sections' (with their
    headers, as Cairn renders them).
    """
    items = context["items"]
    recent = [i for i in items if i.get("section") == "recent"]
    rendered = context["messages"]
    head = rendered[: len(rendered) - len(recent)] if recent else rendered
    out: list[BaseMessage] = []
    if head:
        out.append(SystemMessage(content="\n\n".join(m["content"] for m in head)))
    out.extend(_message_of(i) for i in recent)
    return out
