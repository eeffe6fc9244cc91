#!/usr/bin/env bash
# The BEFORE build that benchmarks/run.py measures as `inferd-before`, beside the current tree.
#
#   benchmarks/before.sh [REF] [DIR]     # build; prints DIR/.venv/bin/python as its last line
#   benchmarks/before.sh --remove [DIR]  # remove the worktree (and its venv and build)
#
# REF (default 6dd1f18, the last commit before issue 11's work: the grpc.aio transport) is
# checked out as a detached git worktree in DIR (default /tmp/inferd-before, outside the
# repository) and built there with its own Makefile (`make build`: DIR/.venv, an editable
# install of that tree; a few minutes on 2 cores). Run again, it reuses the worktree when it is
# at REF (make rebuilds only what changed).
# The build's output goes to DIR.build.log; stdout is the Python path only, so that
#
#   .venv/bin/python benchmarks/run.py --before-python "$(benchmarks/before.sh)" ...
#
# works. `git worktree add` records the worktree in this repository's .git (no commit, no change
# to the checked-out tree); --remove takes it out again.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)

if [ "${1:-}" = "--remove" ]; then
  DIR=${2:-/tmp/inferd-before}
  git -C "$ROOT" worktree remove --force "$DIR"
  rm -f "$DIR.build.log"
  exit 0
fi

REF=${1:-6dd1f18}
DIR=${2:-/tmp/inferd-before}
want=$(git -C "$ROOT" rev-parse --verify "$REF^{commit}")

if [ -e "$DIR/.git" ]; then
  have=$(git -C "$DIR" rev-parse HEAD)
  if [ "$have" != "$want" ]; then
    echo "$DIR is a worktree at $have, not $REF ($want): remove it first (--remove $DIR)" >&2
    exit 1
  fi
elif [ -e "$DIR" ]; then
  echo "$DIR exists and is not a git worktree" >&2
  exit 1
else
  git -C "$ROOT" worktree add --detach "$DIR" "$want" >&2
fi

# Name the core's threads as the current tree does (inferd-worker, inferd-stager), so that
# run.py's per-thread CPU tells the BEFORE build's batch worker from its Python threads. Thread
# names change nothing else; NAME_THREADS=0 builds REF exactly as committed.
if [ "${NAME_THREADS:-1}" = 1 ] && ! grep -q pthread_setname_np "$DIR/cpp/src/scheduler.cpp"; then
  python3 - "$DIR/cpp/src/scheduler.cpp" <<'PATCH'
import re
import sys
from pathlib import Path

path = Path(sys.argv[1])
text = path.read_text()
edits = [
    (r"(#include <condition_variable>\n)", r"#include <pthread.h>\n\n\1"),
    (
        r"(void Scheduler::run_instance\([^)]*\) \{\n)",
        r'\1  pthread_setname_np(pthread_self(), "inferd-worker");\n',
    ),
    (
        r"(void Scheduler::run_pipelined_instance\([^)]*\) \{\n)",
        r'\1  pthread_setname_np(pthread_self(), "inferd-worker");\n',
    ),
    (
        r"(std::thread stager\(\[&\] \{\n)",
        r'\1    pthread_setname_np(pthread_self(), "inferd-stager");\n',
    ),
]
for pattern, replacement in edits:
    text, n = re.subn(pattern, replacement, text, count=1)
    if n != 1:
        raise SystemExit(f"cannot name the threads in {path}: no match for {pattern}")
path.write_text(text)
print(f"named the core's threads in {path} (NAME_THREADS=0 to leave it as committed)", file=sys.stderr)
PATCH
fi

echo "building $REF in $DIR (log: $DIR.build.log)" >&2
if ! make -C "$DIR" build >"$DIR.build.log" 2>&1; then
  tail -30 "$DIR.build.log" >&2
  exit 1
fi
# The extension must import from the worktree's venv, not from this checkout.
"$DIR/.venv/bin/python" - "$DIR" >&2 <<'EOF'
import sys
from pathlib import Path

import inferd
import inferd._core

where = Path(inferd.__file__).resolve()
if not where.is_relative_to(Path(sys.argv[1]).resolve()):
    raise SystemExit(f"inferd imports from {where}, not from the worktree {sys.argv[1]}")
print(f"inferd from {where.parent}, core {inferd._core.__file__}")
EOF
echo "$DIR/.venv/bin/python"
