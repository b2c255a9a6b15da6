#!/usr/bin/env bash
# Provisions the MCP client used by the `cairn serve` end-to-end test (scripts/mcp_client_check.py):
# a virtual environment in .cache/mcp-venv with the official MCP Python SDK (PyPI mcp).
# Idempotent: does nothing when the environment is already complete.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="${CAIRN_MCP_VENV:-$root/.cache/mcp-venv}"
check="import importlib.metadata as m; assert m.version('mcp') == '2.3.0'; import mcp, mcp.client.stdio, mcp.client.streamable_http, httpx2"
if "$venv/bin/python" -c "$check" >/dev/null 2>&1; then
  exit 0
fi
echo "cairn: provisioning the test MCP client (PyPI mcp 2.3.0 and its dependencies, ~70 MB installed) into $venv" >&2
python3 -m venv "$venv"
# Binary wheels only: mcp's dependencies (pydantic-core, cryptography, ...) all ship wheels, so
# nothing needs a compiler.
"$venv/bin/python" -m pip install --disable-pip-version-check --only-binary :all: "mcp==2.3.0" >&2
"$venv/bin/python" -c "$check" >&2
echo "cairn: test MCP client ready" >&2
