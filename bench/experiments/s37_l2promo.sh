#!/bin/bash
# s37_l2promo.sh: the tensor maps' L2 promotion (runtime/tmap.c: L2_256B) against L2_128B and NONE,
# prepared in session 37 and not run (no device time left); bench/NOTES.md, session 37, what next.
#
#   bench/experiments/s37_l2promo.sh prep   (here: builds build-p128/fg_ab and build-pnone/fg_ab from a
#                                            copy of the tree with the constant replaced, Release)
#   bench/experiments/s37_l2promo.sh run    (on the device, carrying build-dev/{fg_ab,liblua5.4.so.0,
#                                            libsqlite3.so.0} and the same three files of build-p128/
#                                            and build-pnone/; writes $OUT/ab.txt and $OUT/ncu.txt)
#
# fg_ab times versions of one process, and the promotion is the runtime's (linked into fg_ab), not a
# template's: so each build's fg_ab runs the same built-ins in its own process, alternated three
# times, and Nsight Compute reads each build's L2 bytes and time on one call.
set -euo pipefail
mode=${1:-}
if [ "$mode" = prep ]; then
  # CUtensorMapL2promotion (cuda.h): NONE 0, L2_64B 1, L2_128B 2, L2_256B 3 (runtime/fg_cuda.h has 3 only).
  for p in 2:p128 0:pnone; do
    val=${p%%:*} dir=build-${p##*:}
    rm -rf "/tmp/src-$dir" && mkdir -p "/tmp/src-$dir"
    git ls-files -z | xargs -0 -I{} cp --parents {} "/tmp/src-$dir/"
    sed -i "s/FG_CU_TENSOR_MAP_L2_PROMOTION_L2_256B, FG_CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE/$val, FG_CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE/" \
      "/tmp/src-$dir/runtime/tmap.c"
    grep -q " $val, FG_CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE" "/tmp/src-$dir/runtime/tmap.c"
    cmake -S "/tmp/src-$dir" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release > /dev/null
    cmake --build "$dir" -j2 --target fg_ab > /dev/null
    cp build-dev/liblua5.4.so.0 build-dev/libsqlite3.so.0 "$dir/"
  done
  exit 0
fi
[ "$mode" = run ] || { echo "usage: $0 prep|run" >&2; exit 2; }
export FLASHGEN_CACHE_DIR=/tmp/fgc
rows=("d=256,n=512,dtype=bf16,causal=1 fwd_d256_br128_bc64_bf16_causal_qtma_w8_s2_sm90a"
      "d=128,n=512,dtype=bf16,causal=0 fwd_d128_br128_bc128_bf16_noncausal_qtmad_w8_s2_sm90a"
      "d=128,n=512,dtype=bf16,causal=1 fwd_d128_br128_bc128_bf16_causal_qtmadp_w8_s2_sm90a"
      "d=64,n=1k,dtype=bf16,causal=1 fwd_d64_br128_bc128_bf16_causal_qtmad_w8_s4_sm90a"
      "d=128,n=16k,dtype=bf16,causal=0 fwd_d128_br128_bc128_bf16_noncausal_qtmap_w8_s2_sm90a")
for r in "${rows[@]}"; do
  pr=${r% *} v=${r#* }
  for round in 1 2 3; do
    for b in build-dev build-p128 build-pnone; do
      ms=$(LD_LIBRARY_PATH=$PWD/$b "$b/fg_ab" --problem "$pr" --rounds 5 --reps 8 "-:$v" | awk '/^  \[0\]/ {print $2}')
      echo "$pr $b round $round: $ms ms"
    done
  done
done > "$OUT/ab.txt" 2>&1
MET=gpu__time_duration.sum,lts__t_bytes.sum,lts__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_sectors_srcunit_tex_op_read.sum
for r in "${rows[@]:0:2}"; do
  pr=${r% *} v=${r#* }
  for b in build-dev build-p128 build-pnone; do
    echo "== $pr $b"
    LD_LIBRARY_PATH=$PWD/$b ncu --metrics $MET --clock-control none --kernel-name "regex:fg_$v" --launch-skip 3 \
      --launch-count 1 "$b/fg_ab" --problem "$pr" --rounds 1 --reps 4 "-:$v" 2>&1 | grep -E "^    [a-z]" || true
  done
done > "$OUT/ncu.txt" 2>&1
