#!/usr/bin/env bash
# The Python tests of crates/cairn-py: provisions the environment and (re)builds and installs
# the package (scripts/setup-py.sh --install), then runs pytest on crates/cairn-py/tests.
# Fails when pytest fails, when it collects no test (its exit 5) and when fewer tests than
# $CAIRN_PY_MIN_TESTS passed (a suite that silently shrank). Extra arguments go to pytest.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="${CAIRN_PY_VENV:-$root/.cache/py-venv}"
min="${CAIRN_PY_MIN_TESTS:-57}"

"$root/scripts/setup-py.sh" --install

log="$(mktemp)"
trap 'rm -f "$log"' EXIT
cd "$root"
# No __pycache__ in the tree (pytest keeps its rewritten test modules there otherwise).
export PYTHONDONTWRITEBYTECODE=1
set +e
# Not from crates/cairn-py: there `import cairn` would find the source tree (no native
# module) instead of the installed package. -p no:cacheprovider: no .pytest_cache in the tree.
"$venv/bin/python" -m pytest "$root/crates/cairn-py/tests" -q -p no:cacheprovider \
  --rootdir "$root/crates/cairn-py" "$@" 2>&1 | tee "$log"
status="${PIPESTATUS[0]}"
set -e

if [ "$status" = 5 ]; then
  echo "test-python.sh: pytest collected no tests" >&2
  exit 1
fi
if [ "$status" != 0 ]; then
  exit "$status"
fi
# The closing line, e.g. "57 passed, 1 warning in 12.34s".
passed="$(tail -n 5 "$log" | grep -oE '[0-9]+ passed' | tail -n 1 | cut -d' ' -f1)"
if [ -z "$passed" ] || [ "$passed" -lt "$min" ]; then
  echo "test-python.sh: ${passed:-no} tests passed, fewer than the $min expected (CAIRN_PY_MIN_TESTS)" >&2
  exit 1
fi
