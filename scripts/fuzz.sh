#!/usr/bin/env bash
# Runs every fuzz target of the given packages briefly (go test -fuzz takes
# one target per run). make fuzz calls it; FUZZTIME=5m (any -fuzztime value)
# fuzzes every target that long instead.
#
# The default budget is a count of executions per target (-fuzztime Nx),
# about 10 s of this project's 2-core reference VM each, not a duration: a
# duration races Go's fuzzing coordinator at its deadline (go.dev/issue/75804,
# fixed in Go 1.27; this module builds with 1.26), which on a loaded machine
# ends a run that found nothing with "context deadline exceeded". A count has
# no deadline to race; a slower machine only takes longer. Minimization is
# bounded by a count too, for the same reason.
set -euo pipefail
GO=${GO:-go}
TESTTMP=${TESTTMP:-${TMPDIR:-/tmp}}
mkdir -p "$TESTTMP"

# Executions per target: about what each runs in 10 s on the reference VM
# (measured 2026-12-02, an idle machine).
budget() {
	case "$1" in
	FuzzImportStream) echo 6000x ;;
	FuzzCaptureRoundTrip) echo 9000x ;;
	FuzzApplyTar | FuzzSegmentRecords) echo 12000x ;;
	FuzzDiffLines | FuzzMerge3) echo 15000x ;; # their corpus grows to larger inputs, each slower
	FuzzCInitRequest) echo 30000x ;;
	FuzzClientConfigs) echo 60000x ;;
	FuzzDaemonStream) echo 90000x ;;
	FuzzCleanPath) echo 110000x ;;
	FuzzReverseLines) echo 160000x ;;
	*) echo 10000x ;;
	esac
}

for p in "$@"; do
	for t in $("$GO" test -list 'Fuzz.*' "$p" | grep '^Fuzz'); do
		ft=${FUZZTIME:-$(budget "$t")}
		echo "fuzz $p $t ($ft)"
		log=$TESTTMP/fuzz-$t.log
		if ! "$GO" test -run '^$' -fuzz "^$t\$" -fuzztime "$ft" -fuzzminimizetime 1000x "$p" >"$log" 2>&1; then
			grep -v '^fuzz: elapsed' "$log"
			if ls "$p/testdata/fuzz/$t/"* >/dev/null 2>&1 && [ -n "$(git status --porcelain "$p/testdata/fuzz")" ]; then
				echo "fuzz $t found a failing input (kept in $p/testdata/fuzz/$t)"
			fi
			exit 1
		fi
	done
done
