#!/usr/bin/env bash
# scripts/tune_default_time.sh: the wall time of `flashgen tune` over the whole default problem
# set (48 forward + 16 backward problems) from an empty kernel cache, against issue 12's budget
# (60 s on an H100): nothing compiled or tuned before, every candidate compiled, checked and timed.
# Run it on the GPU machine over a build folder: scripts/tune_default_time.sh [BUILD_DIR]
# (default build). FG_TUNE_BUDGET_S changes the budget; extra tune options go in FG_TUNE_ARGS
# (e.g. "-j 16"). Prints the summary and the times of the report; exits 1 over the budget, 2 when
# the run itself failed (its log says why).
set -uo pipefail
B=${1:-build}
FG="$B/flashgen"
BUDGET=${FG_TUNE_BUDGET_S:-60}
[ -x "$FG" ] || { echo "no $FG: build first (cmake --build $B) or pass the build folder" >&2; exit 2; }
CACHE=$(mktemp -d /tmp/flashgen-tune-time.XXXXXX)
LOG="$CACHE.log"
REPORT="$CACHE.md"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader 2>/dev/null || true
t0=$(date +%s.%N)
# shellcheck disable=SC2086
"$FG" tune --cache-dir "$CACHE" --report "$REPORT" ${FG_TUNE_ARGS:-} > "$LOG" 2>&1
rc=$?
t1=$(date +%s.%N)
wall=$(awk -v a="$t1" -v b="$t0" 'BEGIN { printf "%.1f", a - b }')
grep -E '^kernels:|^records:' "$LOG"
problems=$(grep -cE '^(bwd )?d=' "$LOG")
echo "flashgen tune, default set ($problems problems), empty cache: ${wall} s wall (budget ${BUDGET} s), exit $rc"
echo "log: $LOG  report: $REPORT  cache: $CACHE (remove when done)"
[ "$rc" -eq 0 ] || { echo "the tuning run failed (exit $rc): see $LOG" >&2; exit 2; }
awk -v w="$wall" -v b="$BUDGET" 'BEGIN { exit !(w <= b) }' || { echo "OVER BUDGET" >&2; exit 1; }
echo "within budget"
