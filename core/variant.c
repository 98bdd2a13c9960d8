/* variant.c: variant names (print and parse), the structural rules every template shares, arch
 * and dtype names, and the built-in choice of variant. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fg_variant.h"

static const char *const arch_names[FG_ARCH_COUNT] = {"sm_80", "sm_86", "sm_89", "sm_90", "sm_90a"};
static const char *const arch_tokens[FG_ARCH_COUNT] = {"sm80", "sm86", "sm89", "sm90", "sm90a"};

const char *fg_arch_name(fg_arch a) {
  return (a >= 0 && a < FG_ARCH_COUNT) ? arch_names[a] : "sm_unknown";
}

int fg_arch_parse(const char *s, fg_arch *out) {
  for (int i = 0; i < FG_ARCH_COUNT; i++) {
    if (strcmp(s, arch_names[i]) == 0 || strcmp(s, arch_tokens[i]) == 0) {
      *out = (fg_arch)i;
      return 0;
    }
  }
  return -1;
}

fg_arch fg_arch_for_cc(int major, int minor) {
  if (major == 9) return FG_ARCH_SM90A;
  /* sm_90a code runs on 9.0 only; newer GPUs (10.x, 12.x) JIT the PTX of plain sm_90. */
  if (major > 9) return FG_ARCH_SM90;
  if (major == 8 && minor >= 9) return FG_ARCH_SM89;
  if (major == 8 && minor >= 6) return FG_ARCH_SM86;
  return FG_ARCH_SM80;
}

static const char *const loop_tokens[FG_LOOP_COUNT] = {"qouter", "kvouter", "qwgmma", "qwgmmaov",
                                                       "kvwgmma", "qtma", "kvtma", "qtmap", "qtmac",
                                                       "qtmad", "qtmadp"};
static const char *const loop_names[FG_LOOP_COUNT] = {"q_outer", "kv_outer", "q_wgmma",
                                                      "q_wgmma_ov", "kv_wgmma", "q_tma", "kv_tma",
                                                      "q_tma_p", "q_tma_c", "q_tma_d", "q_tma_dp"};

const char *fg_loop_token(fg_loop_order l) {
  return ((int)l >= 0 && l < FG_LOOP_COUNT) ? loop_tokens[l] : "?";
}
const char *fg_loop_name(fg_loop_order l) {
  return ((int)l >= 0 && l < FG_LOOP_COUNT) ? loop_names[l] : "?";
}

const char *fg_dtype_name(fg_dtype t) {
  return t == FG_DTYPE_F16 ? "f16" : t == FG_DTYPE_BF16 ? "bf16" : "dtype?";
}

int fg_dtype_parse(const char *s, fg_dtype *out) {
  if (strcmp(s, "f16") == 0 || strcmp(s, "fp16") == 0 || strcmp(s, "half") == 0) {
    *out = FG_DTYPE_F16;
    return 0;
  }
  if (strcmp(s, "bf16") == 0 || strcmp(s, "bfloat16") == 0) {
    *out = FG_DTYPE_BF16;
    return 0;
  }
  return -1;
}

const char *fg_pass_name(fg_pass p) {
  return p == FG_PASS_FWD ? "fwd" : p == FG_PASS_BWD ? "bwd" : "?";
}

int fg_variant_name(const fg_variant *v, char *buf, size_t len) {
  if ((v->pass != FG_PASS_FWD && v->pass != FG_PASS_BWD) || (v->dtype != FG_DTYPE_F16 && v->dtype != FG_DTYPE_BF16) ||
      (int)v->loop < 0 || v->loop >= FG_LOOP_COUNT || v->arch < 0 ||
      v->arch >= FG_ARCH_COUNT)
    return -1;
  int n = snprintf(buf, len, "%s_d%d_br%d_bc%d_%s_%s_%s_w%d_s%d_%s", fg_pass_name(v->pass),
                   v->d, v->br, v->bc,
                   fg_dtype_name(v->dtype), v->causal ? "causal" : "noncausal",
                   fg_loop_token(v->loop), v->warps, v->stages,
                   arch_tokens[v->arch]);
  return n;
}

/* Parses "<prefix><decimal>" into *val; the whole token must match. */
static int parse_num(const char *tok, const char *prefix, int *val) {
  size_t pl = strlen(prefix);
  if (strncmp(tok, prefix, pl) != 0) return -1;
  const char *p = tok + pl;
  if (*p < '0' || *p > '9') return -1;
  char *end;
  long x = strtol(p, &end, 10);
  if (*end != '\0' || x > 100000) return -1;
  *val = (int)x;
  return 0;
}

int fg_variant_parse(const char *name, fg_variant *out, char *err, size_t errlen) {
  enum { NFIELDS = 10 };
  static const char *const what[NFIELDS] = {
      "pass (expected fwd or bwd)",      "head dim (expected d<N>, e.g. d128)",
      "Br (expected br<N>)",         "Bc (expected bc<N>)",
      "dtype (expected f16 or bf16)", "masking (expected causal or noncausal)",
      "loop order (expected qouter, kvouter, qwgmma, qwgmmaov, kvwgmma, qtma, kvtma, qtmap, qtmac or qtmad)", "warps (expected w<N>)",
      "stages (expected s<N>)",      "arch (expected sm80, sm86, sm89, sm90 or sm90a)"};
  char tmp[FG_VARIANT_NAME_MAX * 2];
  if (!name || strlen(name) >= sizeof tmp) {
    snprintf(err, errlen, "variant name is empty or too long");
    return -1;
  }
  strcpy(tmp, name);
  char *tok[NFIELDS + 1];
  int n = 0;
  char *save = NULL;
  for (char *t = strtok_r(tmp, "_", &save); t; t = strtok_r(NULL, "_", &save)) {
    if (n > NFIELDS) break;
    tok[n++] = t;
  }
  if (n != NFIELDS) {
    snprintf(err, errlen,
             "'%s' has %d fields separated by '_', expected %d, as in "
             "fwd_d128_br128_bc64_bf16_causal_qouter_w4_s2_sm80",
             name, n > NFIELDS ? NFIELDS + 1 : n, NFIELDS);
    return -1;
  }
  fg_variant v;
  memset(&v, 0, sizeof v);
  int bad = -1;
  if (strcmp(tok[0], "fwd") == 0) v.pass = FG_PASS_FWD;
  else if (strcmp(tok[0], "bwd") == 0) v.pass = FG_PASS_BWD;
  else bad = 0;
  if (bad < 0 && parse_num(tok[1], "d", &v.d)) bad = 1;
  if (bad < 0 && parse_num(tok[2], "br", &v.br)) bad = 2;
  if (bad < 0 && parse_num(tok[3], "bc", &v.bc)) bad = 3;
  if (bad < 0 && fg_dtype_parse(tok[4], &v.dtype)) bad = 4;
  if (bad < 0) {
    if (strcmp(tok[5], "causal") == 0) v.causal = 1;
    else if (strcmp(tok[5], "noncausal") == 0) v.causal = 0;
    else bad = 5;
  }
  if (bad < 0) {
    bad = 6;
    for (int l = 0; l < FG_LOOP_COUNT; l++)
      if (strcmp(tok[6], loop_tokens[l]) == 0) {
        v.loop = (fg_loop_order)l;
        bad = -1;
      }
  }
  if (bad < 0 && parse_num(tok[7], "w", &v.warps)) bad = 7;
  if (bad < 0 && parse_num(tok[8], "s", &v.stages)) bad = 8;
  if (bad < 0) {
    fg_arch a;
    /* Only the token spelling (sm90a) is canonical inside names. */
    if (strncmp(tok[9], "sm_", 3) == 0 || fg_arch_parse(tok[9], &a)) bad = 9;
    else v.arch = a;
  }
  if (bad >= 0) {
    snprintf(err, errlen, "bad variant name '%s': field %d '%s' is not a valid %s", name, bad + 1,
             tok[bad], what[bad]);
    return -1;
  }
  /* One variant, one name: the fields above also match spellings that are not the name
   * (empty fields from '_' at either end or doubled, leading zeros, dtype aliases), and a
   * second spelling would be a second cache key and a second exported kernel. */
  char canon[FG_VARIANT_NAME_MAX];
  int cn = fg_variant_name(&v, canon, sizeof canon);
  if (cn < 0 || (size_t)cn >= sizeof canon || strcmp(canon, name) != 0) {
    snprintf(err, errlen,
             "bad variant name '%s': not the canonical spelling of its fields (no empty "
             "fields, leading zeros or aliases); write it '%s'",
             name, cn > 0 && (size_t)cn < sizeof canon ? canon : "?");
    return -1;
  }
  *out = v;
  return 0;
}

int fg_variant_check(const fg_variant *v, char *err, size_t errlen) {
  if (v->d < 32 || v->d > 256 || v->d % 8 != 0) {
    snprintf(err, errlen, "d = %d: head dimension must be a multiple of 8 from 32 to 256", v->d);
    return -1;
  }
  if (v->warps != 1 && v->warps != 2 && v->warps != 4 && v->warps != 8 &&
      !(v->warps == 16 && v->pass == FG_PASS_BWD) &&
      !(v->warps == 12 && v->pass == FG_PASS_FWD &&
        (v->loop == FG_LOOP_Q_TMA || v->loop == FG_LOOP_Q_TMA_P || v->loop == FG_LOOP_Q_TMA_C ||
         v->loop == FG_LOOP_Q_TMA_D))) {
    snprintf(err, errlen,
             "warps = %d: must be 1, 2, 4 or 8 (16 too for the backward pass, 12 for q_tma's "
             "(and q_tma_p's, q_tma_c's, q_tma_d's) three consumer warpgroups)",
             v->warps);
    return -1;
  }
  if (v->pass == FG_PASS_BWD) {
    /* The backward kernel tiles Br and Bc over its warps itself (templates/bwd.lua). */
    if (v->br <= 0 || v->br % 16 != 0 || v->br > 128 || v->bc <= 0 || v->bc % 16 != 0 ||
        v->bc > 128) {
      snprintf(err, errlen, "Br = %d, Bc = %d: the backward pass takes multiples of 16 up to 128",
               v->br, v->bc);
      return -1;
    }
  } else if (v->br <= 0 || v->br % (16 * v->warps) != 0 || v->br / (16 * v->warps) > 4) {
    snprintf(err, errlen,
             "Br = %d with %d warps: each warp takes 16, 32, 48 or 64 rows, so Br must be "
             "16*warps*k with k in 1..4",
             v->br, v->warps);
    return -1;
  }
  if (v->bc <= 0 || v->bc % 16 != 0 || v->bc > 256) {
    snprintf(err, errlen, "Bc = %d: must be a multiple of 16 up to 256", v->bc);
    return -1;
  }
  if (v->stages < 1 || v->stages > 4) {
    snprintf(err, errlen, "stages = %d: must be 1 to 4", v->stages);
    return -1;
  }
  return 0;
}

/* A variant of the problem (pass, d, dtype, causal) on arch with loop order loop; the block
 * sizes, warps and stages are the caller's to set. */
static fg_variant variant_of(fg_pass pass, int d, fg_dtype dtype, int causal, fg_loop_order loop,
                             fg_arch arch) {
  fg_variant v;
  memset(&v, 0, sizeof v);
  v.pass = pass;
  v.d = d;
  v.dtype = dtype;
  v.causal = causal;
  v.loop = loop;
  v.arch = arch;
  return v;
}

fg_variant fg_portable_variant(int d, fg_dtype dtype, int causal, fg_arch arch) {
  fg_variant v = variant_of(FG_PASS_FWD, d, dtype, causal, FG_LOOP_Q_OUTER, arch);
  v.stages = 2;
  /* Up to d = 128: 128 query rows on 4 warps, 32 rows per warp (FlashAttention-2's shape: each K/V
   * fragment read from shared memory feeds two MMAs) and K/V blocks of 64 rows; above, 64 rows on
   * 4 warps and K/V blocks of 16 (d > 128 with Bc = 32 spilled 8-40 B, NVRTC 13.0). */
  v.warps = 4;
  v.br = d <= 128 ? 128 : 64;
  v.bc = d <= 128 ? 64 : 16;
  /* sm_86 and sm_89 allow 99 KB per block: halve the K/V blocks above d = 64. */
  if ((arch == FG_ARCH_SM86 || arch == FG_ARCH_SM89) && d > 64 && d <= 128) v.bc = 32;
  return v;
}

fg_variant fg_builtin_variant(int d, fg_dtype dtype, int causal, fg_arch arch) {
  fg_variant v = fg_portable_variant(d, dtype, causal, arch);
  if (arch != FG_ARCH_SM90A) return v;
  /* Hopper (sm_90a): the TMA kernels (fwd_tma.cu) at d = 128, 192 and 256, and at d = 64 without a
   * mask: a producer warpgroup and two consumer warpgroups of 64 rows (three at d = 64), the
   * largest spill-free key block (H100, bf16, N = 4k / 16k against q_wgmma: d = 128 1.5x / 1.7x,
   * d = 256 4x, d = 64 1.2x / 1.4x; bench/NOTES.md). d = 64 causal keeps the wgmma kernel in order
   * with K/V blocks of 128 where no length is known (fg_builtin_variant_for, which the dispatcher
   * uses, picks by the key length: Bc 64 up to 512 keys, the TMA kernel from 1k). d = 128 causal
   * takes K/V blocks of 128, its diagonal blocks masked in place (1.01-1.09x Bc 112, N =
   * 512-16k). The persistent grid (q_tma_p) at every head dim
   * padded to 128 or 192 (d = 72-192) and at d = 64 without a mask: without one 1.25x / 1.13x /
   * 1.07x / 1.05x / 1.01x q_tma at d = 128, N = 512 / 1k / 2k / 4k / 16k, 1.23x-1.02x at d = 64,
   * d = 96 1.26x / 1.12x / 1.03x / 1.01x / 1.00x, d = 192 1.01-1.04x (1.03x / 0.99x at 2k / 4k);
   * with a causal mask its tiles paired short with long within a head (d = 128 1.19x / 1.19x /
   * 1.14x / 1.09x / 0.98x q_tma at those lengths, d = 96 1.21x / 1.03x at 512 / 4k, d = 192 1.16x
   * / 1.11x / 1.07x at 1k / 4k / 16k). d = 256 keeps q_tma where no length is known (0.95-1.08x
   * causal, 0.98-1.04x without a mask on K/V blocks of 64, its 80 spilling persistent; bench/NOTES.md,
   * sessions 12 and 14); by length (fg_builtin_variant_for) the persistent grid at 1k-8k keys
   * with a mask and up to 4k without since its Q buffer is released early (session 37).
   * A head dimension off the 64-column blocks runs the TMA kernel on tiles rounded up to the next
   * one (dp: d = 96 as 128, the columns past d zeros, O = P V over the columns below d only) with
   * that one's blocks, but for these (H200, fg_ab, bf16; bench/NOTES.md session 30): below 64
   * without a mask the persistent grid too (1.24x / 1.14x / 1.04x / 1.00x the plain one at d = 40
   * and 56, N = 512 / 1k / 4k / 16k); below 64 with a causal mask the persistent kernel of two
   * consumers (1.10-1.30x the portable one at 512-1k; fg_builtin_variant_for: three from 2k);
   * d = 72, 88 and 104 without a mask three consumers (Br 192, fg_builtin_w12_bc): their rows of
   * 144, 176, 208 bytes end inside a 32-byte sector, which costs K/V's loads from L2 half as much
   * again (Nsight Compute: L2 throughput 62% at d = 72 against 46% at d = 80 for the same work),
   * and a third fewer loads per query row more than pays for the smaller key blocks: d = 72
   * 1.06x / 1.07x / 1.24x / 1.27x two consumers at N = 512 / 1k / 4k / 16k, d = 88 1.09x / 1.12x /
   * - / 1.28x, d = 104 1.03x / 1.10x / 1.15x / 1.19x; so too d = 136, 152 and 168 (rows of 272,
   * 304, 336 bytes) on tiles of 192 columns, on the plain grid where the persistent one's
   * registers do not hold a key block of 64 or more (it spilled 96-216 B): H100, fg_ab against
   * two consumers, d = 136 (Bc 80) 1.02x / 1.15x / 1.31x / 1.27x / 1.31x at N = 512 / 1k / 2k /
   * 4k / 16k, d = 152 (Bc 64) 1.06x / 1.15x / 1.32x / 1.26x / 1.27x, d = 168 (Bc 48, persistent)
   * 1.06x / 1.14x / 1.26x / 1.20x / 1.20x; not d = 184 (0.96-1.06x), nor d = 144 / 160, whose
   * rows end on a sector (0.97-1.02x; bench/NOTES.md session 31). */
  if (d == 64 && causal) {
    v.loop = FG_LOOP_Q_WGMMA;
    v.br = 64;
    v.bc = 128;
    return v;
  }
  const int dp = (d + 63) / 64 * 64;
  v.loop = dp <= 192 ? FG_LOOP_Q_TMA_P : FG_LOOP_Q_TMA;
  v.warps = dp == 64 && !causal ? 12 : 8;
  v.br = 16 * v.warps;
  v.bc = dp == 64    ? 128
         : dp == 128 ? 128
         : dp == 192 ? (causal ? 64 : 96)
                     : (causal ? 64 : 80);
  v.stages = 2;
  if (fg_builtin_sector_dim(d) && !causal) {
    v.warps = 12;
    v.br = 192;
    v.bc = fg_builtin_w12_bc(d);
    if (v.bc > 48 && dp == 192) v.loop = FG_LOOP_Q_TMA;
  }
  return v;
}

int fg_rows_mid_sector(int d) { return d % 16 == 8; }

int fg_builtin_sector_dim(int d) {
  return fg_rows_mid_sector(d) && ((d >= 72 && d <= 104) || (d >= 136 && d <= 168));
}

int fg_builtin_w12_bc(int d) {
  /* The largest key block (a multiple of 16) whose three consumers fit their 160 registers
   * (templates/fwd.lua: O d / 2 + S Bc / 2 + P Bc / 4 + 32): 112 up to d = 88, 96 up to 112, 80
   * at 120-136, 64 up to 160, 48 up to 184; spill-free with NVRTC 13.0 on the plain grid, and on
   * the persistent one up to d = 128 and at Bc 48 (tests/test_compile.c). tests/test_plans.c
   * checks it against fwd.lua's fit: this block fits, 16 more does not. */
  int bc = 128;
  while (bc > 16 && d / 2 + bc / 2 + bc / 4 + 32 > 160) bc -= 16;
  return bc;
}

int fg_variant_spill_limit(const fg_variant *v) { return v->pass == FG_PASS_BWD ? 128 : 0; }

fg_variant fg_builtin_backward_variant(int d, fg_dtype dtype, int causal, fg_arch arch) {
  fg_variant v = variant_of(FG_PASS_BWD, d, dtype, causal, FG_LOOP_KV_OUTER, arch);
  const int small_smem = arch == FG_ARCH_SM86 || arch == FG_ARCH_SM89; /* 99 KB per block */
  /* Measured on an H100 (bf16, N = 4k, fg_ab): key blocks of 128 are 1.3-1.5x blocks of 64 at
   * d = 64 and 128 (each Q/dO block and each dQ reduction serves twice the keys). Eight warps;
   * query blocks of 64, double-buffered where shared memory allows (sm_90: 177 KB at d = 128;
   * sm_80's 163 KB takes one buffer above d = 64). Above d = 128, key blocks of 64 and one
   * buffer (and query blocks of 32 above d = 192: 64 spilled 268 B at d = 232/240 on sm_90a). sm_86/89 (99 KB per block): key blocks of 128 up to d = 64, then 64, then 32 x 32
   * tiles on four warps above d = 128. Resources per arch: tests/test_compile.c. */
  v.warps = 8;
  v.br = 64;
  v.bc = d <= 128 ? 128 : 64;
  if (d > 192) v.br = 32;
  v.stages = arch >= FG_ARCH_SM90 && d <= 128 ? 2 : (d <= 64 && !small_smem ? 2 : 1);
  /* Up to d = 64, query blocks of 128 (FlashAttention-2's 128 x 128 at d = 64): 1.13x / 1.10x
   * Br 64 (H100, kv_outer, bf16 N = 4k, non-causal / causal), 1.07x / 1.06x single-buffered,
   * which is what sm_80's 163 KB hold (141 KB; 178 KB double-buffered). */
  if (d <= 64 && !small_smem) {
    v.br = 128;
    if (arch < FG_ARCH_SM90) v.stages = 1;
  }
  if (small_smem) {
    v.stages = 1;
    if (d > 64) v.bc = 64;
    if (d > 128) v.bc = 32, v.br = 32, v.warps = 4;
  }
  /* sm_90 / sm_90a at d = 192 and 256, whose rows are swizzled without a pad (bwd.lua: swz), so
   * Br 64 double-buffered fits (d = 256: 216 KB): 1.17-1.19x (d = 192) and 1.51-1.55x (d = 256)
   * the single-buffered Br 64 / Br 32 before (H100, bf16, N = 4k-16k, causal or not;
   * bench/NOTES.md, session 23). */
  if (arch >= FG_ARCH_SM90 && (d == 192 || d == 256)) {
    v.br = 64;
    v.stages = 2;
  }
  /* Hopper (sm_90a), d up to 128: the wgmma kernels, two warpgroups of 64 keys; query blocks
   * of 64 at d = 128 (dQ split by columns), 128 at d = 64 (one block each): the warp-specialised
   * kernel (bwd_tma.cu: TMA loads, bulk dQ reductions; H100, bf16, B N = 16k, N = 1k-16k, causal or
   * not: 1.25-1.48x kv_wgmma at d = 128, 1.14-1.39x at d = 64 with a dQ buffer per warpgroup).
   * Head dims between run it on tiles of d rounded up to 64 (bwd.lua, tma_dp), with that head
   * dim's shape. */
  if (arch == FG_ARCH_SM90A && d <= 128) {
    v.loop = FG_LOOP_KV_TMA;
    v.br = d > 64 ? 64 : 128;
    v.bc = 128;
    v.warps = 8;
    v.stages = 2;
  }
  /* Above d = 128 kv_tma is bwd_tmat.cu (dK and dV transposed, split over the two consumer
   * warpgroups by d; query and key blocks of 64). */
  if (arch == FG_ARCH_SM90A && d > 128) {
    v.loop = FG_LOOP_KV_TMA;
    v.br = 64;
    v.bc = 64;
    v.warps = 8;
    v.stages = 2;
  }
  return v;
}
