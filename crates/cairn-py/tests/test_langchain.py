"""The LangChain chat histories over Cairn (cairn.langchain)."""

from __future__ import annotations

import asyncio

import pytest
from langchain_core.chat_history import BaseChatMessageHistory
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    ChatMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)

import cairn.langchain
from cairn.langchain import CairnChatMessageHistory, CairnSummaryBufferChatMessageHistory


def conversation() -> list[BaseMessage]:
    return [
        SystemMessage(content="You are a helpful assistant."),
        HumanMessage(content="What's the weather in Lisbon?", id="h1"),
        AIMessage(
            content="",
            id="a1",
            tool_calls=[{"name": "weather", "args": {"city": "Lisbon"}, "id": "call-1"}],
        ),
        ToolMessage(content="22 C, sunny", tool_call_id="call-1", name="weather"),
        AIMessage(content="It's 22 C and sunny in Lisbon.", response_metadata={"model": "m"}),
    ]


def test_is_a_langchain_chat_history(harness):
    history = CairnChatMessageHistory(harness, "chat")
    assert isinstance(history, BaseChatMessageHistory)
    assert history.messages == []


def test_messages_round_trip_with_their_fields(harness):
    history = CairnChatMessageHistory(harness, "chat")
    sent = conversation()
    history.add_messages(sent)
    got = history.messages
    assert [type(m) for m in got] == [SystemMessage, HumanMessage, AIMessage, ToolMessage, AIMessage]
    assert [m.content for m in got] == [m.content for m in sent]
    assert got[1].id == "h1" and got[2].id == "a1"
    assert got[2].tool_calls == sent[2].tool_calls
    assert got[3].tool_call_id == "call-1" and got[3].name == "weather"
    assert got[4].response_metadata == {"model": "m"}
    assert got == sent  # every field, as written


def test_messages_are_cairn_turns(harness):
    history = CairnChatMessageHistory(
        harness, "chat", speaker_names={"user": "Ana", "assistant": "Bot"}
    )
    history.add_messages(conversation())
    turns = harness.list(thread="chat")
    assert [t["kind"] for t in turns] == ["conversational"] * 5
    assert [t["role"] for t in turns] == ["system", "user", "assistant", "tool", "assistant"]
    assert [t["speaker"] for t in turns] == [None, "Ana", "Bot", "weather", "Bot"]
    assert turns[1]["content"] == "What's the weather in Lisbon?"
    # A turn without text (a tool call) is stored as text that says what it was.
    assert "weather" in turns[2]["content"] and "Lisbon" in turns[2]["content"]
    assert turns[3]["metadata"]["tool_call_id"] == "call-1"
    # So they are searchable and assembled like any turn.
    assert harness.search("sunny", thread="chat", mode="keyword")[0]["role"] == "tool"
    ctx = harness.assemble_context("chat", "weather", budget=500)
    assert ctx["items"][-1]["content"] == "It's 22 C and sunny in Lisbon."


def test_add_user_and_ai_message_keep_order(harness):
    history = CairnChatMessageHistory(harness, "chat")
    for i in range(3):
        history.add_user_message(f"question {i}")
        history.add_ai_message(AIMessage(content=f"answer {i}"))
    assert [(m.type, m.content) for m in history.messages] == [
        (t, f"{w} {i}") for i in range(3) for t, w in (("human", "question"), ("ai", "answer"))
    ]
    assert str(history).startswith("Human: question 0\nAI: answer 0")


def test_content_blocks_and_chat_messages_round_trip(harness):
    history = CairnChatMessageHistory(harness, "chat")
    blocks = [
        {"type": "text", "text": "What is in this picture?"},
        {"type": "image_url", "image_url": {"url": "https://example.invalid/cat.png"}},
    ]
    history.add_messages(
        [HumanMessage(content=blocks), ChatMessage(role="critic", content="Too vague.")]
    )
    human, chat = history.messages
    assert human.content == blocks
    assert isinstance(chat, ChatMessage) and chat.role == "critic"
    turns = harness.list(thread="chat")
    assert turns[0]["content"] == "What is in this picture?"  # the text is what Cairn indexes
    assert turns[1]["role"] is None


def test_turns_written_by_other_means_read_by_role(harness):
    harness.add("You are terse.", thread="chat", role="system")
    harness.add("Hi there", thread="chat", role="user", speaker="Ana")
    harness.add("Hello.", thread="chat", role="assistant")
    harness.add("42", thread="chat", role="tool", metadata={"tool_call_id": "call-9"})
    tool_id = harness.add("43", thread="chat", role="tool")
    harness.add("a fact, not a turn", thread="chat", kind="knowledge")
    got = CairnChatMessageHistory(harness, "chat").messages
    assert [type(m) for m in got] == [
        SystemMessage,
        HumanMessage,
        AIMessage,
        ToolMessage,
        ToolMessage,
    ]
    assert got[1].name == "Ana" and got[1].content == "Hi there"
    assert got[3].tool_call_id == "call-9"
    assert got[4].tool_call_id == tool_id and got[4].id == tool_id


def test_messages_page_through_long_threads(harness, monkeypatch):
    monkeypatch.setattr(cairn.langchain, "_PAGE", 7)
    history = CairnChatMessageHistory(harness, "chat")
    history.add_messages([HumanMessage(content=f"m{i}") for i in range(23)])
    assert [m.content for m in history.messages] == [f"m{i}" for i in range(23)]


def test_add_messages_is_all_or_none(harness):
    history = CairnChatMessageHistory(harness, "chat")
    with pytest.raises(TypeError):
        history.add_messages([HumanMessage(content="ok"), "not a message"])
    assert history.messages == []
    history.add_messages([])
    assert history.messages == []


def test_clear_deletes_the_thread_only(harness):
    history = CairnChatMessageHistory(harness, "chat")
    history.add_messages(conversation())
    CairnChatMessageHistory(harness, "other").add_user_message("keep me")
    history.clear()
    assert history.messages == []
    assert harness.threads() == ["other"]


def test_async_forms(harness):
    history = CairnChatMessageHistory(harness, "chat")

    async def main():
        await history.aadd_messages(conversation())
        first = await history.aget_messages()
        await history.aclear()
        return first, await history.aget_messages()

    first, after = asyncio.run(main())
    assert [m.content for m in first] == [m.content for m in conversation()]
    assert after == []


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.filterwarnings("ignore::langchain_core._api.deprecation.LangChainDeprecationWarning")
def test_runnable_with_message_history(harness):
    from langchain_core.runnables import RunnableLambda
    from langchain_core.runnables.history import RunnableWithMessageHistory

    def model(messages: list[BaseMessage]) -> AIMessage:  # remembers how many turns it saw
        return AIMessage(content=f"seen {len(messages)}: {messages[-1].content}")

    chain = RunnableWithMessageHistory(
        RunnableLambda(model), lambda session_id: CairnChatMessageHistory(harness, session_id)
    )
    config = {"configurable": {"session_id": "s1"}}
    assert chain.invoke([HumanMessage(content="hi")], config=config).content == "seen 1: hi"
    assert chain.invoke([HumanMessage(content="again")], config=config).content == "seen 3: again"
    assert [t["role"] for t in harness.list(thread="s1")] == ["user", "assistant"] * 2


# -- the summary buffer ------------------------------------------------------------------


def long_conversation(harness, past, n=60):
    """`n` turns two days old, a minute apart, consolidated into summaries; then 4 new turns."""
    history = CairnChatMessageHistory(harness, "chat")
    old = []
    for i in range(n):
        cls, who = (HumanMessage, "I") if i % 2 == 0 else (AIMessage, "You")
        old.append(cls(content=f"{who} said thing number {i} about the garden and the weather."))
    # Written as Cairn turns with their (past) times; the history reads them like its own.
    harness.add_many(
        [
            {
                "content": m.content,
                "thread": "chat",
                "role": "user" if m.type == "human" else "assistant",
                "created_at": past(i),
            }
            for i, m in enumerate(old)
        ]
    )
    report = harness.consolidate(older_than="1h", thread="chat")
    assert report["summaries"]
    new = [
        HumanMessage(content="Now, about the tomatoes: should I water them daily?"),
        AIMessage(content="Every two days is enough unless it is very hot."),
        HumanMessage(content="And the basil?"),
        AIMessage(content="Basil likes a little water every day."),
    ]
    history.add_messages(new)
    return old, new


def test_summary_buffer_is_summary_plus_recent_turns_within_budget(harness, past):
    old, new = long_conversation(harness, past)
    # Cairn gives summaries 5% of the budget, the recent turns 10%, recall the rest.
    window = CairnSummaryBufferChatMessageHistory(harness, "chat", budget=2000)
    got = window.messages
    assert isinstance(got[0], SystemMessage)
    assert "[summary of earlier conversation" in got[0].content
    assert all(not isinstance(m, SystemMessage) for m in got[1:])
    assert [m.content for m in got[-4:]] == [m.content for m in new]
    assert [type(m) for m in got[-4:]] == [HumanMessage, AIMessage, HumanMessage, AIMessage]
    assert len(got) < len(old) + len(new)
    assert sum(harness.count_tokens(m.content) for m in got) <= 2000
    # Nothing was dropped from Cairn: the plain history still has every turn.
    everything = CairnChatMessageHistory(harness, "chat").messages
    assert len(everything) == len(old) + len(new)
    # asyncio gives the same.
    assert asyncio.run(window.aget_messages()) == got


def test_summary_buffer_query_recalls_older_turns(harness, past):
    long_conversation(harness, past)
    window = CairnSummaryBufferChatMessageHistory(
        harness, "chat", query="thing number 17", budget=2000
    )
    system = window.messages[0]
    assert isinstance(system, SystemMessage)
    assert "thing number 17 " in system.content


def test_summary_buffer_writes_like_the_plain_history(harness):
    window = CairnSummaryBufferChatMessageHistory(harness, "chat", budget=2000)
    window.add_user_message("hello")
    window.add_ai_message("hi!")
    # A short thread without summaries: just its turns.
    assert [(type(m), m.content) for m in window.messages] == [
        (HumanMessage, "hello"),
        (AIMessage, "hi!"),
    ]
    window.clear()
    assert window.messages == []
