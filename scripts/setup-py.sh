#!/usr/bin/env bash
# Provisions the Python environment of crates/cairn-py (the `cairn` package: PyO3 module plus
# LangChain and LangGraph adapters): a virtual environment in .cache/py-venv (or
# $CAIRN_PY_VENV) with maturin, pytest, langchain-core and langgraph, every package pinned in
# crates/cairn-py/tests/requirements.txt. Idempotent: does nothing when the environment is
# already complete.
#
#   scripts/setup-py.sh            the environment only
#   scripts/setup-py.sh --install  and (re)build the package with the venv's maturin and
#                                  install it into the venv (cargo rebuilds what changed; the
#                                  build shares $CARGO_TARGET_DIR, default ./target)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="${CAIRN_PY_VENV:-$root/.cache/py-venv}"
requirements="$root/crates/cairn-py/tests/requirements.txt"

install=0
for arg in "$@"; do
  case "$arg" in
    --install) install=1 ;;
    -h | --help)
      sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'
      exit 0
      ;;
    *)
      echo "setup-py.sh: unknown argument '$arg' (use --install)" >&2
      exit 2
      ;;
  esac
done

# The environment is complete when it was made from this very requirements file and its
# packages import.
stamp="$venv/.cairn-requirements.sha256"
want="$(sha256sum "$requirements" | cut -d' ' -f1)"
check="import maturin, pytest, langchain_core.chat_history, langgraph.store.base, langgraph.graph"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ] || ! "$venv/bin/python" -c "$check" >/dev/null 2>&1; then
  echo "cairn: provisioning the Python test environment (maturin, pytest, langchain-core, langgraph; pinned in crates/cairn-py/tests/requirements.txt, ~60 MB from PyPI) into $venv" >&2
  python3 -m venv "$venv"
  # Binary wheels only: every pinned package ships one (pydantic-core, orjson, xxhash, ...), so
  # nothing here needs a compiler.
  "$venv/bin/python" -m pip install --disable-pip-version-check --only-binary :all: \
    -r "$requirements" >&2
  "$venv/bin/python" -c "$check" >&2
  echo "$want" >"$stamp"
  echo "cairn: Python test environment ready" >&2
fi

if [ "$install" = 1 ]; then
  if ! command -v cargo >/dev/null 2>&1; then
    echo "setup-py.sh: cargo is not on PATH; the cairn package is a Rust extension (install Rust first)" >&2
    exit 1
  fi
  export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}"
  echo "cairn: building the cairn package (maturin, release profile, target dir $CARGO_TARGET_DIR) and installing it into $venv" >&2
  # --no-build-isolation: the build uses the venv's pinned maturin, which pip's backend hook
  # runs as `maturin` from PATH, hence the venv's bin first. MATURIN_NO_INSTALL_RUST: never
  # download a toolchain. --no-deps: the adapters' optional dependencies are already pinned
  # here.
  PATH="$venv/bin:$PATH" MATURIN_NO_INSTALL_RUST=1 "$venv/bin/python" -m pip install \
    --disable-pip-version-check --no-cache-dir --no-build-isolation --no-deps --force-reinstall \
    "$root/crates/cairn-py" >&2
  (cd "$root" && "$venv/bin/python" -c "import cairn, cairn._cairn, cairn.langchain, cairn.langgraph") >&2
  echo "cairn: package installed ($("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("cairn-memory"))'))" >&2
fi
