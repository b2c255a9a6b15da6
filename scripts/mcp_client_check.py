#!/usr/bin/env python3
"""End-to-end check of `cairn serve` with the official MCP Python SDK (PyPI mcp 2.3.0).

Provision the SDK with scripts/setup-mcp-client.sh and run this with its venv's python:

    python scripts/mcp_client_check.py --stdio -- cairn serve --stdio ...
    python scripts/mcp_client_check.py --http http://127.0.0.1:PORT/mcp --key KEY

One line per check goes to stderr; the first failure exits 1 with a message saying what was
wrong. On success "mcp check passed (<transport>)" goes to stdout. `--mode legacy` (the default)
connects with the initialize handshake; `--mode auto` is what `mcp.Client` does by default
(probe `server/discover`, adopt 2026-07-28 if offered, else fall back to initialize).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import uuid
from typing import Any

import anyio
import httpx2
from mcp import Client, MCPError, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

try:
    BaseExceptionGroup
except NameError:  # Python 3.10: anyio depends on the backport
    from exceptiongroup import BaseExceptionGroup

TOOLS = ("memory_add", "memory_add_summary", "memory_context", "memory_search", "memory_expand",
         "memory_get", "memory_delete", "memory_tree", "memory_forget")
TURNS = (("Ana", "Ana adopted a grey cat named Pixel in March."),
         ("Ben", "Ben said he is training for the Lisbon marathon."),
         ("Ana", "Ana asked Ben what shoes he runs in."))
TIMEOUT_S = 60


class CheckFailed(Exception):
    pass


last_ok = ""  # the last check passed, to place an unexpected error


def ok(msg: str) -> None:
    global last_ok
    last_ok = msg.split(":")[0]
    print(f"ok: {msg}", file=sys.stderr, flush=True)


def expect(cond: Any, msg: str, got: Any = None) -> None:
    if not cond:
        if got is not None:
            msg += f"; got {json.dumps(got, default=str)[:1500]}"
        raise CheckFailed(msg)


async def call(client: Client, tool: str, args: dict[str, Any]) -> dict[str, Any]:
    """Calls a tool that must succeed and return a structured object."""
    try:
        result = await client.call_tool(tool, args)
    except MCPError as e:
        raise CheckFailed(f"{tool}: protocol error {e.code}: {e.message} (data={e.data!r})") from e
    except RuntimeError as e:  # the SDK's outputSchema validation of structuredContent
        raise CheckFailed(f"{tool}: {e}") from e
    text = "".join(getattr(c, "text", "") for c in result.content)
    expect(not result.is_error, f"{tool}: isError result: {text[:500]}")
    sc = result.structured_content
    expect(isinstance(sc, dict), f"{tool}: structuredContent is not an object", sc)
    return sc


async def run_checks(client: Client, transport: str, thread: str) -> None:
    info = client.server_info
    server = f"{info.name} {info.version}" if info else "anonymous"
    ok(f"initialize ({transport}, protocol {client.protocol_version}, server {server})")

    tools: dict[str, Any] = {}
    cursor = None
    while True:
        page = await client.list_tools(cursor=cursor)
        tools.update((t.name, t) for t in page.tools)
        cursor = page.next_cursor
        if cursor is None:
            break
    missing = [t for t in TOOLS if t not in tools]
    expect(not missing, f"list_tools: missing {missing}", sorted(tools))
    for name, tool in tools.items():
        expect(isinstance(tool.input_schema, dict) and tool.input_schema.get("type") == "object",
               f"list_tools: {name} inputSchema is not of type object", tool.input_schema)
    expect(tools["memory_context"].output_schema, "list_tools: memory_context has no outputSchema")
    ok(f"list_tools: {len(tools)} tools: {', '.join(sorted(tools))}")

    memories = [{"content": c, "kind": "conversational", "thread": thread, "role": "user", "speaker": s}
                for s, c in TURNS]
    sc = await call(client, "memory_add", {"memories": memories})
    ids = sc.get("ids")
    expect(isinstance(ids, list) and len(ids) == 3 and all(isinstance(i, str) for i in ids)
           and len(set(ids)) == 3, "memory_add: expected {ids: [3 distinct ids]}", sc)
    ok(f"memory_add: {ids}")

    sc = await call(client, "memory_context",
                    {"thread": thread, "query": "What is the name of Ana's cat?", "budget": 2000})
    items = sc.get("items")
    expect(isinstance(items, list) and isinstance(sc.get("tokens"), int) and sc.get("budget") == 2000
           and isinstance(sc.get("text"), str), "memory_context: expected {items, tokens, budget: 2000, text}", sc)
    for item in items:
        expect(isinstance(item, dict) and all(k in item for k in ("id", "content", "section", "kind")),
               "memory_context: item lacks id/content/section/kind", item)
    got = {item["id"] for item in items}
    expect(set(ids) <= got, f"memory_context: not all of {ids} among items", sc)
    ok(f"memory_context: {len(items)} items, {sc['tokens']} tokens")

    sc = await call(client, "memory_add_summary",
                    {"content": "Ana has a cat named Pixel; Ben runs marathons.", "source_ids": ids, "thread": thread})
    summary = sc.get("memory")
    expect(isinstance(summary, dict) and isinstance(summary.get("id"), str) and summary.get("level") == 1,
           "memory_add_summary: expected {memory: {id, level: 1, ...}}", sc)
    sid = summary["id"]
    ok(f"memory_add_summary: {sid}")

    for args in ({"id": sid}, {"id": sid, "leaves": True}):
        sc = await call(client, "memory_expand", args)
        mems = sc.get("memories")
        expect(isinstance(mems, list) and [m.get("id") for m in mems if isinstance(m, dict)] == ids,
               f"memory_expand {args}: expected memories {ids} in order", sc)
        ok(f"memory_expand {json.dumps(args)}: {len(mems)} memories")

    sc = await call(client, "memory_search", {"query": "marathon", "thread": thread, "k": 5})
    hits = sc.get("hits")
    expect(isinstance(hits, list), "memory_search: expected {hits: [...]}", sc)
    for hit in hits:
        expect(isinstance(hit, dict) and all(k in hit for k in ("id", "content", "score")),
               "memory_search: hit lacks id/content/score", hit)
    expect(ids[1] in [h["id"] for h in hits], f"memory_search: Ben's turn {ids[1]} not among hits", sc)
    ok(f"memory_search: {len(hits)} hits")

    unknown = str(uuid.uuid4())
    try:
        result = await client.call_tool("memory_get", {"id": unknown})
    except MCPError as e:
        raise CheckFailed(f"memory_get unknown id: protocol error {e.code} ({e.message}), "
                          "expected a tool result with isError true") from e
    text = "".join(getattr(c, "text", "") for c in result.content)
    expect(result.is_error, "memory_get unknown id: expected isError true", result.model_dump(mode="json"))
    expect(unknown in text or "no memory" in text.lower(),
           f"memory_get unknown id: error text mentions neither {unknown} nor 'no memory': {text!r}")
    ok(f"memory_get unknown id: isError: {text[:120]}")

    sc = await call(client, "memory_tree", {"thread": thread})
    trees = sc.get("trees")
    expect(isinstance(trees, list) and trees and isinstance(trees[0], dict), "memory_tree: expected {trees: [...]}", sc)
    root = trees[0]
    node = root["memory"] if isinstance(root.get("memory"), dict) else root  # {memory, children} or flat
    root_id = node.get("id")
    children = root.get("children")
    expect(root_id == sid and isinstance(children, list) and len(children) == 3,
           f"memory_tree: expected first tree rooted at {sid} with 3 children", sc)
    ok(f"memory_tree: {len(trees)} tree(s), root {root_id} with {len(children)} children")

    # Forgetting Ben's turn rewrites the summary from Ana's two turns, and search no
    # longer finds the marathon.
    sc = await call(client, "memory_forget", {"ids": [ids[1]]})
    expect(sc.get("deleted") == [ids[1]] and sc.get("resummarized") == [sid],
           f"memory_forget: expected deleted [{ids[1]}] and resummarized [{sid}]", sc)
    sc = await call(client, "memory_search", {"query": "Lisbon marathon", "thread": thread, "k": 5})
    expect(all("marathon" not in h["content"] for h in sc.get("hits", [])),
           "memory_forget: the forgotten turn (or a summary quoting it) is still found", sc)
    ok("memory_forget: deleted, summary rewritten, not found again")


async def main(args: argparse.Namespace) -> str:
    with anyio.fail_after(TIMEOUT_S):
        if args.http:
            # Caller-owned httpx2 client: the SDK's way to set headers; it does not close it.
            headers = {"Authorization": f"Bearer {args.key}"} if args.key else {}
            async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30.0)) as http:
                transport = streamable_http_client(args.http, http_client=http)
                async with Client(transport, mode=args.mode, read_timeout_seconds=30) as client:
                    await run_checks(client, "http", args.thread)
            return "http"
        # The SDK passes only PATH/HOME/... to the child by default; pass the caller's whole
        # environment so the test can configure the server (data dir, embedder) through it.
        params = StdioServerParameters(command=args.cmd[0], args=args.cmd[1:], env=dict(os.environ))
        async with Client(stdio_client(params), mode=args.mode, read_timeout_seconds=30) as client:
            await run_checks(client, "stdio", args.thread)
        return "stdio"


def leaf_errors(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for sub in exc.exceptions for leaf in leaf_errors(sub)]
    return [exc]


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--stdio", action="store_true", help="launch the server command given after --")
    p.add_argument("--http", metavar="URL", help="streamable HTTP endpoint, e.g. http://127.0.0.1:PORT/mcp")
    p.add_argument("--key", help="API key, sent as Authorization: Bearer KEY (with --http)")
    p.add_argument("--thread", default="mcp-check")
    p.add_argument("--mode", default="legacy", help="legacy (initialize), auto, or a modern version")
    p.add_argument("cmd", nargs="*", help="server command and arguments (with --stdio)")
    args = p.parse_args()
    if bool(args.stdio) == bool(args.http):
        p.error("give exactly one of --stdio -- CMD... or --http URL")
    if args.stdio and not args.cmd:
        p.error("--stdio needs the server command after --")
    return args


if __name__ == "__main__":
    args = parse_args()
    try:
        transport = anyio.run(main, args)
    except BaseException as exc:  # noqa: BLE001 - report every failure as one clear line
        errors = leaf_errors(exc)
        failed = [e for e in errors if isinstance(e, CheckFailed)] or errors
        for e in failed:
            kind = "" if isinstance(e, CheckFailed) else f"{type(e).__name__}: "
            if isinstance(e, TimeoutError):
                kind = f"timed out after {TIMEOUT_S} s: "
            if not isinstance(e, CheckFailed):
                kind = (f"after '{last_ok}': " if last_ok else "connecting/initializing: ") + kind
            print(f"mcp check FAILED: {kind}{e}", file=sys.stderr, flush=True)
        sys.exit(1)
    print(f"mcp check passed ({transport})")
