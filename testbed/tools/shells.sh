#!/usr/bin/env bash
# zsh and fish, whose parsers tests/without_cluster/completion.rs runs on the
# completion scripts `cascade-guard completion zsh|fish` prints (`zsh -n`,
# `fish --no-execute`). Debian's, installed with apt-get when missing (as
# root; a fresh machine may have no package lists yet: update once, then
# retry); a machine that has them returns at once. Not pinned: only their
# parsers are used. The test needs only bash, and says it skipped a shell
# that is missing, so a failed install here is reported, not fatal.
set -euo pipefail

missing=()
for shell in zsh fish; do
  command -v "$shell" >/dev/null 2>&1 || missing+=("$shell")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "shells.sh: ${missing[*]} missing; as root: apt-get install ${missing[*]} (the completion test skips them)" >&2
    exit 0
  fi
  echo "shells.sh: installing Debian's ${missing[*]}" >&2
  install() { DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}" >&2; }
  if ! install; then
    apt-get update >&2 || true
    install || echo "shells.sh: apt-get install ${missing[*]} failed (above); the completion test skips them" >&2
  fi
fi
for shell in zsh fish; do
  command -v "$shell" || true
done
