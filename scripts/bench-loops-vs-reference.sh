#!/usr/bin/env bash
# Issue 17's throughput target, measured the way it is stated: edit-test-publish
# loops/s of N agents in one sandbox (bench scenario e) with this checkout's
# code against the code before the round (REF, default c73852f) on the same
# machine, in alternating runs (ref, this, ref, this, ...), so both see the
# same load. Each side is built whole from its own tree (bench harness,
# gateway, worker and embedded Temporal in-process, static daemon and session
# init), REF's by scripts/bench-reference.sh under $WORK.
#
#   bash scripts/bench-loops-vs-reference.sh            # make bench-loops
#   REF=<rev> PAIRS=5 AGENTS=50 SCALE=0.5 OUT=bench/results/<date>-loops.md bash scripts/...
#
# Prints (and writes to OUT) one row per pair: loops/s of each side, their
# ratio, failed ops and conflicts, and the median ratio over the pairs.
set -euo pipefail
REF=${REF:-c73852f}
PAIRS=${PAIRS:-3}
AGENTS=${AGENTS:-50}
SCALE=${SCALE:-0.5}
GO=${GO:-go}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=${WORK:-${TMPDIR:-/var/tmp}/eos-bench-loops}
OUT=${OUT:-$ROOT/bench/results/$(date +%F)-loops.md}

case "$PAIRS$AGENTS" in *[!0-9]*) echo "PAIRS and AGENTS must be numbers" >&2; exit 2 ;; esac
mkdir -p "$WORK"
refsha=$(git -C "$ROOT" rev-parse --verify "$REF^{commit}")
thissha=$(git -C "$ROOT" rev-parse HEAD)
reftree=$(REF=$REF WORK=$WORK GO=$GO bash "$ROOT/scripts/bench-reference.sh")
cp "$reftree/bin/sandbox-bench" "$WORK/bench-ref"
echo "building this tree ($thissha)" >&2
(cd "$ROOT" && make -s daemon >/dev/null && $GO build -o "$WORK/bench-this" ./cmd/sandbox-bench)

# loops <report.md>: the loops/s and failed ops and conflicts of the AGENTS row
# of the throughput table (columns: agents, ops/s, loops/s, publishes,
# conflicts, failed ops, ...).
loops() {
	awk -F'|' -v n="$AGENTS" '$2 ~ "^ *"n" *$" && NF > 10 { gsub(/ /, ""); print $4, $6, $7; exit }' "$1"
}

rows=()
ratios=()
for i in $(seq 1 "$PAIRS"); do
	for side in ref this; do
		if [ $side = ref ]; then dir=$reftree; else dir=$ROOT; fi
		out=$WORK/run-$side-$i
		rm -rf "$out"
		(cd "$dir" && "$WORK/bench-$side" -only e -agents "$AGENTS" -scale "$SCALE" -profile=false \
			-out "$out" -workdir "$WORK/wd" >"$out.log" 2>&1) || { echo "run $side $i failed: $out.log" >&2; exit 1; }
		read -r l c f < <(loops "$out"/*.md)
		declare "${side}_l=$l" "${side}_c=$c" "${side}_f=$f"
		echo "pair $i $side: $l loops/s, $f failed, $c conflicts (load $(cut -d' ' -f1 /proc/loadavg))" >&2
	done
	r=$(awk -v a="$this_l" -v b="$ref_l" 'BEGIN { printf "%.2f", a / b }')
	ratios+=("$r")
	rows+=("| $i | $ref_l | $ref_f / $ref_c | $this_l | $this_f / $this_c | ${r}x |")
done
median=$(printf '%s\n' "${ratios[@]}" | sort -n | awk '{ a[NR] = $1 } END { if (NR % 2) print a[(NR + 1) / 2]; else printf "%.2f", (a[NR / 2] + a[NR / 2 + 1]) / 2 }')

{
	echo "# Edit-test-publish loops/s, $AGENTS agents: this code against $REF, alternating on one machine — $(date -u +%F)"
	echo
	echo "Reproduce: \`REF=$REF PAIRS=$PAIRS AGENTS=$AGENTS SCALE=$SCALE bash scripts/bench-loops-vs-reference.sh\` (\`make bench-loops\`)."
	echo "Each run is \`sandbox-bench -only e -agents $AGENTS -scale $SCALE\` built from its own tree"
	echo "(reference $refsha, this $thissha); the pairs ran back to back, reference first."
	echo "Machine: $(nproc) cores, load after $(cut -d' ' -f1-3 /proc/loadavg)."
	echo
	echo "| pair | $REF loops/s | failed / conflicts | this loops/s | failed / conflicts | this / $REF |"
	echo "|---|---|---|---|---|---|"
	printf '%s\n' "${rows[@]}"
	echo
	echo "Median over $PAIRS pairs: **${median}x** (issue 17's target: ≥ 1.5x, 0 failed)."
} | tee "$OUT"
