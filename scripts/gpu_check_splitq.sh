#!/usr/bin/env bash
# scripts/gpu_check_splitq.sh: the GPU checks of the backward's split of long query ranges
# (templates/bwd.lua, SPLIT_ROWS; branch splitq), on the GPU machine, from the repo root, over
# the release build in build-rel (cmake -S . -B build-rel -DCMAKE_BUILD_TYPE=Release
# -DFG_BUILD_TESTS=OFF). Runs flashgen check on bwd/big (16.8M query rows on one KV head: 257
# splits), bwd/gqa (bwd/gqa/long_*: 8 x 16401 rows per KV head, 3 splits, both masks) and
# bwd/deterministic (gqa_long_*: the splits add in order, the same bits twice), then fg_ab of the
# built-in H100 backward at d = 128, n = 4k, causal and not, against main's templates (below the
# threshold: nothing may have slowed down). Main's templates: MAIN_TEMPLATES=DIR, else
# `git archive ${FG_BASE:-85723de} templates` when this is a git checkout. Logs go to $OUT
# (default ./gpu-out-splitq); a summary is printed last. Exit 1 if any step failed.
set -uo pipefail
B=${B:-build-rel}
OUT=${OUT:-gpu-out-splitq}
FG="$B/flashgen"
AB="$B/fg_ab"
mkdir -p "$OUT"
export FLASHGEN_CACHE_DIR=${FLASHGEN_CACHE_DIR:-/tmp/flashgen-cache-splitq}
[ -x "$FG" ] && [ -x "$AB" ] || {
  echo "no $FG or $AB: build the release build first (cmake -S . -B $B -DCMAKE_BUILD_TYPE=Release" \
       "-DFG_BUILD_TESTS=OFF && cmake --build $B -j)" >&2; exit 2; }
MAIN=${MAIN_TEMPLATES:-}
if [ -z "$MAIN" ]; then
  MAIN=$(mktemp -d /tmp/fg-main-templates.XXXXXX)
  if git archive "${FG_BASE:-85723de}" templates 2>/dev/null | tar -x -C "$MAIN"; then
    MAIN="$MAIN/templates"
  else
    echo "main's templates: set MAIN_TEMPLATES=DIR (a copy of templates/ at main 85723de); this" \
         "is not a git checkout with that commit" >&2; MAIN=""
  fi
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$OUT/gpu.txt" 2>&1
fail=0
step() {
  local name=$1; shift
  local t0; t0=$(date +%s.%N)
  "$@" > "$OUT/$name.txt" 2>&1
  local rc=$?
  [ $rc -eq 0 ] || fail=1
  printf '%-24s rc=%d %7.1fs  %s\n' "$name" $rc \
    "$(awk -v a="$(date +%s.%N)" -v b="$t0" 'BEGIN{print a-b}')" "$(tail -n1 "$OUT/$name.txt")" |
    tee -a "$OUT/summary.txt"
}
# --verbose: the variant and the errors against tolerances of every case.
step check_bwd_big timeout 900 "$FG" check --verbose --filter bwd/big
step check_bwd_gqa timeout 600 "$FG" check --verbose --filter bwd/gqa
step check_bwd_det timeout 600 "$FG" check --verbose --filter bwd/deterministic
# The plan as explain prints it past the threshold (grid z, dkv_accum).
step explain_split "$FG" explain --backward --d 64 --nq 16401 --nk 129 --heads 8 --heads-kv 1
if [ -n "$MAIN" ]; then
  for c in 1 0; do
    m=$([ $c = 1 ] && echo causal || echo noncausal)
    v=bwd_d128_br64_bc128_bf16_${m}_kvwgmma_w8_s2_sm90a
    step "ab_d128_4k_$m" "$AB" --problem "d=128,n=4k,causal=$c" --rounds 5 "$MAIN:$v" "-:$v"
  done
else
  fail=1
fi
echo "--- summary (logs in $OUT)"
cat "$OUT/summary.txt"
for f in check_bwd_big check_bwd_gqa check_bwd_det; do grep -E "passed|failed" "$OUT/$f.txt" | tail -n1; done
exit $fail
