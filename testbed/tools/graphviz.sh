#!/usr/bin/env bash
# Graphviz's dot, which tests/without_cluster/plan_picture.rs runs on every
# picture `cascade-guard plan -o dot` draws (it fails, naming this script,
# when dot is missing). Debian's graphviz, installed with apt-get when dot is
# not on PATH (as root; a fresh machine may have no package lists yet: update
# once, then retry); a machine that has it returns at once. Not pinned to a
# Debian revision, unlike musl-tools in scripts/image.sh: the test reads only
# the dot language, and a pin would break with each Debian security update.
# Prints dot's path on its last line.
set -euo pipefail

if ! command -v dot >/dev/null 2>&1; then
  if [ "$(id -u)" != 0 ]; then
    echo "graphviz.sh: Graphviz's dot is missing; as root: apt-get install graphviz" >&2
    exit 1
  fi
  echo "graphviz.sh: installing Debian's graphviz (dot)" >&2
  if ! DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends graphviz >&2; then
    apt-get update >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends graphviz >&2
  fi
fi
command -v dot
