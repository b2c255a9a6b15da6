#!/usr/bin/env bash
# Provisions PostgreSQL 16.2 with pgvector 0.6.2 for the PostgreSQL backend's tests: the
# server binaries inside PyPI's `pgserver` 0.1.4 wheel (its `pgserver/pginstall` tree and the
# `pgserver.libs` it links against), unpacked into .cache/pgserver. The wheel's sha256 is
# checked. Idempotent: does nothing when the tree is already complete. Prints the install
# directory (the one holding bin/, lib/, share/) on stdout.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dest="${CAIRN_PGSERVER_DIR:-$root/.cache/pgserver}"
wheel="pgserver-0.1.4-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl"
sha="d595789b47624a3d963aa9aa6359da9be31beb7e61f1a45541953242068b8813"
install="$dest/pgserver/pginstall"
if [ -x "$install/bin/postgres" ] && [ -f "$install/lib/postgresql/vector.so" ] && [ -f "$dest/.complete" ]; then
  echo "$install"
  exit 0
fi
echo "cairn: provisioning PostgreSQL 16.2 + pgvector 0.6.2 (PyPI pgserver 0.1.4, 11 MB) into $dest" >&2
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --disable-pip-version-check --no-deps --only-binary :all: \
  --python-version 3.11 --platform manylinux2014_x86_64 -d "$tmp" "pgserver==0.1.4" >&2
echo "$sha  $tmp/$wheel" | sha256sum -c - >&2
rm -rf "$dest"
mkdir -p "$dest"
python3 - "$tmp/$wheel" "$dest" <<'PY'
import os, stat, sys, zipfile
wheel, dest = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z:
    for info in z.infolist():
        name = info.filename
        if not (name.startswith("pgserver/pginstall/") or name.startswith("pgserver.libs/")):
            continue
        z.extract(info, dest)
        mode = (info.external_attr >> 16) & 0o777
        if mode:
            os.chmod(os.path.join(dest, name), mode)
PY
# Every user (PostgreSQL runs as an unprivileged user when the tests run as root) reads and
# runs the tree.
chmod -R a+rX "$dest"
"$install/bin/postgres" --version >&2
touch "$dest/.complete"
echo "cairn: PostgreSQL ready in $install" >&2
echo "$install"
