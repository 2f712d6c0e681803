#!/usr/bin/env bash
# Installs `buf` (npm @bufbuild/buf, a gRPC client with reflection: `buf curl`)
# into the project-local, git-ignored .tools/npm and prints the binary's path.
# Idempotent: when the pinned version is there it only prints the path.
# Called by tools/install_deps.sh and by the CTest test that needs it.
set -euo pipefail
BUF_VERSION=1.47.2
root="$(cd "$(dirname "$0")/.." && pwd)"
prefix="$root/.tools/npm"
bin="$prefix/node_modules/.bin/buf"
if [[ -x "$bin" ]] && "$bin" --version 2>/dev/null | grep -qx "$BUF_VERSION"; then
  echo "$bin"
  exit 0
fi
if ! command -v npm >/dev/null; then
  echo "install_buf: npm not found (tools/install_deps.sh installs it)" >&2
  exit 1
fi
mkdir -p "$prefix"
# The npm package ships the prebuilt binary as a per-platform dependency
# (@bufbuild/buf-linux-x64): no download outside the npm registry.
npm install --prefix "$prefix" --no-audit --no-fund --loglevel=error \
  "@bufbuild/buf@$BUF_VERSION" >&2
"$bin" --version >&2
echo "$bin"
