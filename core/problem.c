/* problem.c: the problem key (core/fg_problem.h): length buckets, building a key from a call's
 * arguments, formatting it into the strings tuning records and exported tables hold, parsing it
 * back, and the built-in rule per op. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "fg_problem.h"

int64_t fg_seqlen_bucket(int64_t seqlen) {
  int64_t b = FG_BUCKET_MIN;
  while (b < seqlen && b < FG_BUCKET_MAX) b *= 2;
  return b;
}

fg_problem fg_problem_make(fg_pass pass, int d, fg_dtype dtype, int causal, int64_t seqlen_k) {
  fg_problem p;
  memset(&p, 0, sizeof p);
  p.pass = pass;
  p.d = d;
  p.dtype = dtype;
  p.causal = causal != 0;
  p.nq = 0;
  p.nk = fg_seqlen_bucket(seqlen_k);
  return p;
}

fg_problem fg_problem_from_forward(const fg_attention_args *a) {
  return fg_problem_make(FG_PASS_FWD, (int)a->head_dim, a->dtype, a->causal, a->seqlen_k);
}

fg_problem fg_problem_from_backward(const fg_attention_backward_args *b) {
  return fg_problem_make(FG_PASS_BWD, (int)b->head_dim, b->dtype, b->causal, b->seqlen_k);
}

int fg_problem_prefix(const fg_problem *p, char *buf, size_t len) {
  const char *pass = fg_pass_name(p->pass), *dtype = fg_dtype_name(p->dtype);
  const char *mask = p->causal ? "causal" : "noncausal";
  if (p->nq > 0)
    return snprintf(buf, len, "%s_d%d_%s_%s_nq%" PRId64 "_nk", pass, p->d, dtype, mask, p->nq);
  return snprintf(buf, len, "%s_d%d_%s_%s_nk", pass, p->d, dtype, mask);
}

int fg_problem_format(const fg_problem *p, char *buf, size_t len) {
  const int n = fg_problem_prefix(p, buf, len);
  if (n < 0 || (size_t)n >= len) return n < 0 ? n : n + snprintf(NULL, 0, "%" PRId64, p->nk);
  return n + snprintf(buf + n, len - (size_t)n, "%" PRId64, p->nk);
}

/* A decimal number without sign or leading zeros, whole of [s, end); -1 if not. */
static int64_t fg_parse_count(const char *s, const char *end) {
  if (s >= end || (*s == '0' && end - s > 1)) return -1;
  int64_t v = 0;
  for (; s < end; s++) {
    if (*s < '0' || *s > '9' || v > INT64_MAX / 10 - 10) return -1;
    v = v * 10 + (*s - '0');
  }
  return v;
}

int64_t fg_problem_key_bucket(const char *key, const char *prefix) {
  size_t pl = strlen(prefix);
  if (strncmp(key, prefix, pl) != 0) return -1;
  const char *p = key + pl;
  if (!*p) return -1;
  int64_t v = 0;
  for (; *p; p++) {
    if (*p < '0' || *p > '9' || v > INT64_MAX / 10 - 10) return -1;
    v = v * 10 + (*p - '0');
  }
  return v;
}

int fg_problem_parse(const char *key, fg_problem *out, char *err, size_t errlen) {
  fg_problem p;
  memset(&p, 0, sizeof p);
  char tok[6][24];
  int n = 0;
  const char *s = key;
  while (n < 6) {
    const char *u = strchr(s, '_');
    size_t l = u ? (size_t)(u - s) : strlen(s);
    if (l == 0 || l >= sizeof tok[0]) break;
    memcpy(tok[n], s, l);
    tok[n++][l] = 0;
    if (!u) break;
    s = u + 1;
  }
  const char *want = "<op>_d<head_dim>_<f16|bf16>_<causal|noncausal>[_nq<N>]_nk<N>, e.g. "
                     "fwd_d128_bf16_causal_nk4096";
  if (n < 5) {
    snprintf(err, errlen, "problem key '%s' does not have the form %s", key, want);
    return -1;
  }
  if (strcmp(tok[0], "fwd") == 0) p.pass = FG_PASS_FWD;
  else if (strcmp(tok[0], "bwd") == 0) p.pass = FG_PASS_BWD;
  else {
    snprintf(err, errlen, "problem key '%s': unknown op '%s' (fwd or bwd)", key, tok[0]);
    return -1;
  }
  int64_t d = tok[1][0] == 'd' ? fg_parse_count(tok[1] + 1, tok[1] + strlen(tok[1])) : -1;
  if (d <= 0 || d > 4096) {
    snprintf(err, errlen, "problem key '%s': '%s' is not a head dim (d<N>)", key, tok[1]);
    return -1;
  }
  p.d = (int)d;
  if (fg_dtype_parse(tok[2], &p.dtype) != 0 || strcmp(fg_dtype_name(p.dtype), tok[2]) != 0) {
    snprintf(err, errlen, "problem key '%s': unknown dtype '%s' (f16 or bf16)", key, tok[2]);
    return -1;
  }
  if (strcmp(tok[3], "causal") == 0) p.causal = 1;
  else if (strcmp(tok[3], "noncausal") != 0) {
    snprintf(err, errlen, "problem key '%s': '%s' is not causal or noncausal", key, tok[3]);
    return -1;
  }
  int i = 4;
  if (n == 6) {
    p.nq = strncmp(tok[4], "nq", 2) == 0 ? fg_parse_count(tok[4] + 2, tok[4] + strlen(tok[4])) : -1;
    if (p.nq <= 0) {
      snprintf(err, errlen, "problem key '%s': '%s' is not a query-length bucket (nq<N>)", key,
               tok[4]);
      return -1;
    }
    i = 5;
  }
  p.nk = strncmp(tok[i], "nk", 2) == 0 ? fg_parse_count(tok[i] + 2, tok[i] + strlen(tok[i])) : -1;
  if (p.nk <= 0) {
    snprintf(err, errlen, "problem key '%s': '%s' is not a key-length bucket (nk<N>)", key, tok[i]);
    return -1;
  }
  char back[FG_PROBLEM_KEY_MAX];
  if (fg_problem_format(&p, back, sizeof back) >= (int)sizeof back || strcmp(back, key) != 0) {
    snprintf(err, errlen, "problem key '%s' is not in canonical form (%s)", key, want);
    return -1;
  }
  *out = p;
  return 0;
}

int fg_problem_served_by(const fg_problem *p, const fg_variant *v) {
  return v->pass == p->pass && v->d == p->d && v->dtype == p->dtype &&
         (v->causal != 0) == (p->causal != 0);
}

/* The persistent grid taking its tiles from a counter as its blocks come free (q_tma_d) where the
 * static order's blocks ended far apart: its quantisation (blocks one pair of tiles short) and the
 * spread of blocks with equal work left 5-12% of the SMs' time idle at the short rows (per-block
 * stamps, d = 96 causal 512 87.5% busy). H100, fg_ab against q_tma_p, bf16 (bench/NOTES.md
 * session 33): with a mask up to 1k keys on two consumers 1.03-1.07x at d = 32-56, 80, 96, 104,
 * 120 (512), 1.01-1.02x at 88, 112, 128, 144, 160, 1.02-1.11x at 1k for d = 32, 40, 64 (1.06x), 80,
 * 96 (1.04x), 120, 128, but 0.99x at d = 72 and 0.98x at 168 and 184 (176 and 192 1.00-1.01x), so
 * not there nor past 160 but at 176 and 192, where its Q tiles from a thread of their own
 * (fwd_tma.cu's QLOAD, session 34) made it 1.021-1.023x / 1.011-1.013x at d = 176, 512 / 1k, and
 * 1.025-1.030x / 1.018-1.022x at d = 192 (bf16 and f16; 0.97-0.99x at 168 and 184); d = 64 on
 * three consumers at 2k / 4k
 * 1.03x / 1.04x (d = 40, 56 1.00x / 0.99x at 2k); without one at 512 keys d = 32-72 (three
 * consumers) 1.00-1.05x and d = 192 1.02x, where d = 80-120 ran 0.97-1.00x, and d = 192 at 1k
 * too with the 512 keys' blocks of 64 (1.016x / 1.012x bf16 / f16 the Bc 96 rule; 0.97x at 2k);
 * d = 128 up to 1k once the consumers took the tile's fields from the scheduler (session 34):
 * 1.006-1.013x at 512, 1.008-1.012x at 1k (d = 96 1.01x, 112 0.99x).
 * With a mask up to 512 keys at d = 128 its two consumers in ping-pong (q_tma_dp), tiles of two or
 * three blocks there: 1.033-1.036x bf16, 1.032-1.038x f16 (fg_ab against q_tma_d, H100,
 * bench/NOTES.md session 35); not at 1k (0.93x), nor without a mask (0.92x at 512), nor at d = 192
 * (0.99x at 512) or 256 (0.97x); at d = 96 1.011-1.015x bf16, but bench.py read f16 0.85x cuDNN
 * in two of four runs (not understood): not taken. d = 240 and 256 with a mask wherever they take
 * the persistent grid (1k-8k keys): 1.000x / 1.007x / 1.008x / 1.009x q_tma_p at d = 256 1k / 2k /
 * 4k / 8k (bench/NOTES.md session 37). */
static fg_variant fg_builtin_dynamic(fg_variant v, int causal, int64_t nk) {
  if (v.loop != FG_LOOP_Q_TMA_P) return v;
  const int dyn = causal ? (v.warps == 8 && nk <= 1024 &&
                                ((v.d <= 160 && v.d != 72) || v.d == 176 || v.d == 192)) ||
                               (v.d == 64 && nk <= 4096) || v.d == 240 || v.d == 256
                         : (nk <= 512 && v.d <= 72) || ((v.d == 128 || v.d == 192) && nk <= 1024);
  if (dyn) v.loop = causal && nk <= 512 && v.d == 128 ? FG_LOOP_Q_TMA_DP : FG_LOOP_Q_TMA_D;
  return v;
}

fg_variant fg_builtin_variant_for(int d, fg_dtype dtype, int causal, int64_t nk, fg_arch arch) {
  fg_variant v = fg_builtin_variant(d, dtype, causal, arch);
  if (arch != FG_ARCH_SM90A || nk <= 0) return v;
  /* The best kernel changes with the length (H100, `flashgen tune` of the default set in both
   * dtypes, bench/latest/tune_report.md, fg_ab and the grid's rows with and without each rule in
   * one run; bench/NOTES.md, sessions 12-14). */
  const int dp = (d + 63) / 64 * 64;
  if (!causal) {
    /* Up to 512 keys at d = 136-256: K/V blocks of 64, which divide the length (d = 192's 96 and
     * d = 256's 80 leave a partial last block: 512 keys cost 576 or 560 keys' work), on the
     * persistent grid: d = 192 1.11x, d = 256 1.04x the length-free rule at N = 512 (0.97-1.00x
     * at 1k, 0.97-0.99x at 2k, where it stays; but d = 192 at 1k too with the dynamic order,
     * fg_builtin_dynamic); d = 256 up to 4k since its Q buffer is released early (fwd_tma.cu's
     * QEARLY): 1.047x / 1.034x / 1.024x q_tma's Bc 80 at 1k / 2k / 4k (bench/NOTES.md session
     * 37). d = 80-120 from 2k keys three consumers (Br 192),
     * as d = 72, 88, 104 at every length (fg_builtin_variant): d = 80 1.04x / 1.11x two at 4k /
     * 16k, d = 96 1.06x / 1.06x / 1.09x at 2k / 4k / 16k, d = 112 1.05x / 1.09x, d = 120 1.03x /
     * 1.07x (H200, fg_ab; 0.91-0.97x at 512-1k, where two stay; bench/NOTES.md session 30).
     *
     * Where rows end inside a 32-byte sector (fg_rows_mid_sector), clusters of two query tiles
     * that share each K/V block, each block loading half (q_tma_c): a K/V row costs its L2
     * reads half as much again there, and the cluster halves them. H100, fg_ab against the rule
     * before (bench/NOTES.md sessions 31-32):
     *   - d = 200, 216, 232: 1.04x / 1.07x / 1.06x at 512 keys (Bc 64), 1.19x / 1.21x / 1.19x at
     *     1k, 1.25x / 1.27x / 1.25x at 2k, 1.22-1.31x at 4k, 1.15-1.30x at 16k (Bc 80, d = 232
     *     Bc 64: 1.03x / 1.05x Bc 80 at 4k / 16k); d = 248 (Bc 64) from 1k: 1.09x / 1.15x /
     *     1.15x / 1.10x at 1k / 2k / 4k / 16k (0.98x at 512);
     *   - d = 184 (Bc 64) from 2k: 1.04-1.07x / 1.08x / 1.05x at 2k / 4k / 16k (0.90x at 512);
     *   - from 4k keys on top of three consumers at d = 72, 88, 104, 136, 152 (1.06x / 1.10x at
     *     d = 72, 4k / 16k, d = 104 1.06x / 1.15x, d = 136 1.10x / 1.08x, d = 152 1.05x / 1.05x;
     *     0.6-1.0x up to 2k), and at d = 168 on two (Bc 96: 1.07x / 1.13x three consumers).
     *     Not the head dims on sectors: d = 80-120 0.90-0.97x at 4k / 16k, d = 64, 128, 192, 256
     *     0.59-0.95x at 512 / 1k / 4k, d = 224 1.01x. */
    const int mid = fg_rows_mid_sector(d);
    if (mid && dp == 256 && nk >= (d == 248 ? 1024 : 1)) {
      v.loop = FG_LOOP_Q_TMA_C;
      v.bc = d >= 232 || nk <= 512 ? 64 : 80;
    } else if (mid && d == 184 && nk >= 2048) {
      v.loop = FG_LOOP_Q_TMA_C;
      v.bc = 64;
    } else if (fg_builtin_sector_dim(d) && nk >= 4096) {
      v.loop = FG_LOOP_Q_TMA_C;
      if (d == 168) v.warps = 8, v.br = 128, v.bc = 96;
    } else if (nk <= (d == 192 ? 1024 : d == 256 ? 4096 : 512) && (dp == 192 || dp == 256) &&
               !fg_builtin_sector_dim(d)) {
      v.loop = FG_LOOP_Q_TMA_P;
      v.bc = 64;
    } else if (dp == 128 && d < 128 && nk >= 2048) {
      v.warps = 12;
      v.br = 192;
      v.bc = fg_builtin_w12_bc(d);
    } else if (dp == 64 && nk <= 1024) {
      /* d <= 64 up to 1k keys: 4 K/V stages (tiles of 4-8 blocks: the next tile's first blocks
       * load under this one's last), d = 64 1.04x / 1.02x two at 512 / 1k, d = 48 1.03x / 1.04x,
       * d = 40 / 56 1.10x / 1.07x at 1k (H100, fg_ab; 0.99-1.03x from 2k; bench/NOTES.md
       * session 32). */
      v.stages = 4;
    }
    return fg_builtin_dynamic(v, causal, nk);
  }
  /* With a causal mask, d = 64: the wgmma kernel in order up to 512 keys, there with K/V blocks of
   * 64 (1.07x 128: half the diagonal block's masked work per query block); the TMA kernel with K/V
   * blocks of 128 from 1k, on the persistent grid (tiles paired short with long), with two
   * consumer warpgroups at 1k (1.04x the wgmma kernel, 1.14x three), three at 2k-4k, and on the
   * plain grid with three from 8k: 0.99-1.04x cuDNN at 2k-4k and 1.13-1.19x at 8k-16k, where the
   * wgmma kernel ran 0.90-0.94x. */
  if (d == 64 && nk <= 512) {
    v.bc = 64;
  } else if (dp == 64) {
    /* Below 64 (H200, fg_ab; bench/NOTES.md session 30): three consumers from 2k keys too
     * (d = 40 / 56: 1.11x / 1.07x two at 2k), but on the persistent grid at every length (at
     * 16k 1.47x / 1.73x the portable kernel, the plain grid's three 1.44x / 1.66x). Up to 1k
     * keys 4 K/V stages (tiles of 2-8 blocks: the next tile's blocks load under this one's
     * last): d = 40 / 48 / 56 1.02x / 1.04x / 1.07x two stages at 1k, d = 64 1.01x (H100, fg_ab;
     * 3 stages 0.95-1.05x; bench/NOTES.md session 32). */
    v.loop = nk >= 8192 && d == 64 ? FG_LOOP_Q_TMA : FG_LOOP_Q_TMA_P;
    v.warps = nk >= 2048 ? 12 : 8;
    v.br = 16 * v.warps;
    v.bc = 128;
    v.stages = nk <= 1024 ? 4 : 2;
  } else if (dp == 192 && fg_builtin_sector_dim(d) && nk >= (d < 168 ? 1024 : 2048)) {
    /* d = 136, 152 from 1k keys and d = 168 from 2k: three consumers (Br 192; their rows end
     * inside a sector, fg_builtin_variant), on the plain grid with the key block that fits it
     * (Bc 80 / 64 / 48), but d = 168 at 2k on the persistent one (Bc 48 fits it). H100, fg_ab
     * against two consumers (the rule below): d = 136 1.04x / 1.19x / 1.15x / 1.21x at 1k / 2k / 4k
     * / 16k, d = 152 1.08x / 1.21x / 1.17x / 1.22x, d = 168 1.22x (persistent) at 2k, 1.08x /
     * 1.11x at 4k / 16k (0.91-0.93x at 1k, where two stay; bench/NOTES.md session 31). */
    v.warps = 12;
    v.br = 192;
    v.bc = fg_builtin_w12_bc(d);
    v.loop = v.bc == 48 && nk < 4096 ? FG_LOOP_Q_TMA_P : FG_LOOP_Q_TMA;
  } else if (dp == 192 && d < 192 && nk >= 4096) {
    /* d = 136-184 from 4k keys: the plain grid, longest tiles first over groups of heads (H100,
     * fg_ab, against the persistent grid: d = 136 1.05x / 1.06x at 4k / 16k, d = 152 1.05x /
     * 1.07x, 8k 1.06x, d = 168 1.01x / 1.02x, d = 176 1.06x / 1.11x, d = 184 1.05x / 1.07x; d = 192
     * itself 0.96x / 1.01x, so it stays; bench/NOTES.md session 30). */
    v.loop = FG_LOOP_Q_TMA;
  } else if ((d == 240 || d == 256) && nk >= 1024 && nk <= 8192) {
    /* d = 240 and 256 from 1k to 8k keys: the persistent grid (its Q buffer released early,
     * fwd_tma.cu's QEARLY, and spill-free since Q's descriptor is formed per block), tiles from
     * the counter (fg_builtin_dynamic). H100, fg_ab against the plain grid, bf16 (bench/NOTES.md
     * session 37): d = 256 1.046x / 1.090x / 1.040x / 1.021x at 1k / 2k / 4k / 8k (f16 1.075x at
     * 2k), d = 240 1.03x at 1k; not at 512 (1.00x) nor 16k (0.98-0.99x), nor d = 208 / 224
     * (0.87-0.97x at 1k-16k). */
    v.loop = FG_LOOP_Q_TMA_P;
  } else if ((d == 88 || d == 104) && nk > 512 && nk <= 1024) {
    /* At 1k keys d = 88 and 104 (rows ending inside a sector) take three consumers with K/V
     * blocks of 96: 1.10x / 1.11x two (bf16; f16 1.11x at 104), where Bc 112 at d = 88 ran 1.01x
     * and d = 72 1.02x (Bc 96) / 0.95x (112), the other padded head dims 0.84-0.92x, and 512 keys
     * 0.83-0.99x but d = 104 1.06x (H100, fg_ab; bench/NOTES.md session 31). */
    v.warps = 12;
    v.br = 192;
    v.bc = 96;
  } else if (dp == 128 && d < 128 && nk >= 2048) {
    /* From 2k keys three consumers (Br 192, the largest key block that fits) on the persistent
     * grid: d = 72 1.13x / 1.20x two consumers at 4k / 16k (the plain grid there), d = 96 1.07x /
     * 1.06x / 1.09x at 2k / 4k / 16k, d = 104 1.11x / 1.10x, d = 112 1.06x / 1.05x, d = 120 1.07x /
     * 1.04x, d = 80 1.00x / 1.04x (H200, fg_ab; 0.82-0.90x at 512-1k, where two stay). */
    v.loop = FG_LOOP_Q_TMA_P;
    v.warps = 12;
    v.br = 192;
    v.bc = fg_builtin_w12_bc(d);
  }
  /* With a causal mask too, clusters of two query tiles where rows end inside a sector (q_tma_c:
   * the pair loads the K/V blocks of its later tile, the earlier one releasing those past its
   * own). H100, fg_ab, bf16, against the rules above (bench/NOTES.md session 32): d = 200, 216,
   * 232 with K/V blocks of 64 from 1k keys (1.01-1.04x at 1k, 1.22-1.23x at 4k, 1.19-1.20x at
   * 16k), d = 248 from 4k (1.10x / 1.09x at 4k / 16k, 0.95x at 1k); d = 184 from 4k with blocks
   * of 80 (1.06x / 1.14x; 0.91x at 1k); d = 168 from 4k on two consumers with blocks of 96 (1.12x
   * / 1.15x three on the plain grid); on top of three consumers at d = 72, 88, 104, 136, 152 from
   * 8k (1.02-1.08x at 8k, 1.06-1.16x at 16k; 0.99-1.06x at 4k, 0.82-0.89x at 2k). */
  if (fg_rows_mid_sector(d)) {
    if ((dp == 256 && nk >= (d == 248 ? 4096 : 1024)) || (d == 184 && nk >= 4096)) {
      v.loop = FG_LOOP_Q_TMA_C;
      v.bc = d == 184 ? 80 : 64;
    } else if (d == 168 && nk >= 4096) {
      v.loop = FG_LOOP_Q_TMA_C;
      v.warps = 8;
      v.br = 128;
      v.bc = 96;
    } else if (fg_builtin_sector_dim(d) && nk >= 8192) {
      v.loop = FG_LOOP_Q_TMA_C;
    }
  }
  return fg_builtin_dynamic(v, causal, nk);
}

int fg_builtin_variants(int d, fg_dtype dtype, int causal, fg_arch arch,
                        fg_variant out[FG_BUILTIN_MAX]) {
  int n = 0;
  out[n++] = fg_builtin_variant(d, dtype, causal, arch);
  for (int64_t nk = FG_BUCKET_MIN; nk <= FG_BUCKET_MAX && n < FG_BUILTIN_MAX; nk *= 2) {
    const fg_variant v = fg_builtin_variant_for(d, dtype, causal, nk, arch);
    int seen = 0;
    for (int i = 0; i < n && !seen; i++) seen = memcmp(&v, &out[i], sizeof v) == 0;
    if (!seen) out[n++] = v;
  }
  return n;
}

fg_variant fg_problem_builtin(const fg_problem *p, fg_arch arch) {
  return p->pass == FG_PASS_BWD ? fg_builtin_backward_variant(p->d, p->dtype, p->causal, arch)
                                : fg_builtin_variant_for(p->d, p->dtype, p->causal, p->nk, arch);
}
