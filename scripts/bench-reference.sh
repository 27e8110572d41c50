#!/usr/bin/env bash
# Builds the code before issue 17's round two (REF, default c73852f), the
# reference of its loops/s target, in a tree of its own under WORK (an export
# of REF: no worktree is registered in this repository): its static daemon and
# session init (make daemon) and its sandbox-bench, WORK/ref-<sha>/bin/sandbox-bench.
# Kept between runs; built once per REF. Prints the tree's path.
#
#   bash scripts/bench-reference.sh              # make bench and make bench-loops call it
#   REF=<rev> WORK=<dir> bash scripts/bench-reference.sh
set -euo pipefail
REF=${REF:-c73852f}
GO=${GO:-go}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=${WORK:-${TMPDIR:-/var/tmp}/eos-bench-loops}

if ! refsha=$(git -C "$ROOT" rev-parse --verify --quiet "$REF^{commit}"); then
	echo "bench-reference: $REF is not in this clone's history (a shallow clone?); git fetch --unshallow, or set REF" >&2
	exit 1
fi
tree=$WORK/ref-$refsha
if [ ! -x "$tree/bin/sandbox-bench" ]; then
	echo "building the reference $REF ($refsha) in $tree" >&2
	rm -rf "$tree"
	mkdir -p "$tree"
	git -C "$ROOT" archive "$refsha" | tar -x -C "$tree"
	(cd "$tree" && make -s daemon >&2 && $GO build -o bin/sandbox-bench.tmp ./cmd/sandbox-bench && mv bin/sandbox-bench.tmp bin/sandbox-bench)
fi
echo "$tree"
