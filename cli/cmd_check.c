/* cmd_check.c: `flashgen check`, the GPU correctness program. For each case: fresh random inputs
 * (a different seed per case, never zeros), O and LSE poisoned with NaN, the forward call, the
 * fp64 and the naive same-dtype reference kernels, then the gate that `flashgen tune` applies too
 * (fg_gate_forward, autotune/gate.c): every element of O checked as written and compared:
 * max|O - ref| <= 2 * max|lowp - ref| + eps(dtype) * max|ref|, LSE within 1e-3 (relative +
 * absolute) of the fp64 LSE, rows that see no key exactly 0 with LSE = -inf. Also the
 * bad-input cases that need a GPU (the call fails, nothing is written). No test framework: one
 * line per case, `N passed, N failed` last, exit status 1 on any failure.
 *
 * Build: part of the flashgen command (cmake --build build); run: flashgen check [--quick]. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "fg_autotune.h"
#include "fg_check.h"
#include "fg_cli.h"
#include "fg_runtime_internal.h"

/* ------------------------------------------------------------------------------------------ */
/* Cases. */
enum {
  K_RUN = 0,         /* a forward call checked against the references */
  K_BIG,             /* more than 2^31 elements in Q and O: reference on windows of rows */
  K_BAD_HOST_Q,      /* q from malloc */
  K_BAD_PINNED_K,    /* k in page-locked host memory */
  K_BAD_FREED_V,     /* v freed before the call */
  K_BAD_HOST_LSE,    /* lse from malloc */
  K_BAD_MISALIGNED_O,/* o 8 bytes past an aligned address */
  K_BAD_OTHER_DEV_K, /* k on another device */
  K_BAD_DTYPE,       /* dtype 3 */
  K_BAD_HEAD_DIM,    /* head_dim 100 */
  K_EMPTY_BATCH,     /* batch 0: OK, nothing written */
  K_EMPTY_NQ         /* seqlen_q 0: OK, nothing written */
};
enum { L_BHND = 0, L_BNHD = 1, L_PADDED = 2, L_MIXED = 3 };

typedef struct check_case {
  char name[192];
  int kind;
  fg_dtype dtype;
  int causal;
  int64_t B, Hq, Hkv, Nq, Nk, d;
  int layout;
  int lse;
  float scale;
  int forced;     /* run v instead of the dispatcher's choice */
  fg_variant v;
  int quick;
} check_case;

typedef struct case_list {
  check_case *c;
  int n, cap;
} case_list;

static check_case *add_case(case_list *l) {
  if (l->n == l->cap) {
    int cap = l->cap ? l->cap * 2 : 256;
    check_case *c = realloc(l->c, (size_t)cap * sizeof *c);
    if (!c) {
      fprintf(stderr, "flashgen check: out of memory\n");
      exit(1);
    }
    l->c = c;
    l->cap = cap;
  }
  check_case *c = &l->c[l->n++];
  memset(c, 0, sizeof *c);
  c->dtype = FG_DTYPE_BF16;
  c->B = 1;
  c->Hq = c->Hkv = 1;
  c->d = 64;
  c->lse = 1;
  return c;
}

static void set_name(check_case *c, const char *fmt, ...) FG_PRINTF(2, 3);
static void set_name(check_case *c, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(c->name, sizeof c->name, fmt, ap);
  va_end(ap);
}

static const char *causal_word(int causal) { return causal ? "causal" : "noncausal"; }

/* The variant of the default set with these fields and loop order, or NULL. */
static const fg_variant *find_default(const fg_variant *defs, int n, int d, fg_dtype dt, int causal,
                                      fg_loop_order loop) {
  for (int i = 0; i < n; i++)
    if (defs[i].d == d && defs[i].dtype == dt && (defs[i].causal != 0) == (causal != 0) &&
        defs[i].loop == loop)
      return &defs[i];
  return NULL;
}

static void force_loop(check_case *c, const fg_variant *defs, int n, fg_loop_order loop) {
  const fg_variant *v = find_default(defs, n, (int)c->d, c->dtype, c->causal, loop);
  if (v) {
    c->forced = 1;
    c->v = *v;
  }
}

/* A wgmma variant (fwd_wgmma.cu; loop q_wgmma or q_wgmma_ov) for the case's d, dtype, causal. */
static void force_wgmma(check_case *c, fg_arch arch, fg_loop_order loop, int warps, int bc,
                        int stages) {
  fg_variant v = {FG_PASS_FWD, (int)c->d, 16 * warps, bc, c->dtype, c->causal, loop,
                  warps, stages, arch};
  c->forced = 1;
  c->v = v;
}

/* The wgmma path (sm_90a only), both schedules (in order, overlapped): every tile shape on the
 * head dims it takes, both dtypes, causal or not; then sequence-length pairs (partial Q and K/V
 * blocks, one key, rows without keys), GQA and MQA, layouts, no LSE, and more than 2^16 (batch,
 * head) pairs. */
static void add_wgmma_cases(case_list *l, fg_arch arch) {
  if (arch != FG_ARCH_SM90A) return;
  static const struct { int d, warps, bc, stages, ov; } shapes[] = {
      {64, 4, 64, 2, 1},  {64, 4, 128, 2, 0}, {64, 8, 64, 2, 1},  {128, 4, 64, 2, 1},
      {128, 4, 64, 2, 0}, {128, 4, 128, 2, 0}, {128, 8, 64, 2, 1}, {128, 8, 32, 2, 0},
      {256, 4, 32, 2, 0}, {256, 8, 32, 2, 1}};
  check_case *c;
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
    for (int dt = 0; dt < 2; dt++)
      for (int causal = 0; causal <= 1; causal++) {
        c = add_case(l);
        c->d = shapes[i].d;
        c->dtype = dt ? FG_DTYPE_F16 : FG_DTYPE_BF16;
        c->causal = causal;
        c->B = 2;
        c->Hq = 2;
        c->Hkv = 1;
        c->Nq = causal ? 160 : 200;
        c->Nk = causal ? 224 : 200;
        c->quick = (shapes[i].d == 128 || shapes[i].d == 64) && shapes[i].warps == 4 && dt == causal;
        force_wgmma(c, arch, shapes[i].ov ? FG_LOOP_Q_WGMMA_OV : FG_LOOP_Q_WGMMA, shapes[i].warps,
                    shapes[i].bc, shapes[i].stages);
        char vn[FG_VARIANT_NAME_MAX];
        fg_variant_name(&c->v, vn, sizeof vn);
        set_name(c, "wgmma/%s", vn);
      }
  static const int64_t pairs[][2] = {{1, 1},     {17, 129},  {129, 17},   {127, 1000}, {1000, 127},
                                     {1000, 1000}, {4097, 4097}, {300, 100}, {300, 0}};
  for (int dd = 0; dd < 2; dd++)
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++)
      for (int causal = 0; causal <= 1; causal++) {
        if (pairs[i][1] == 0 && causal) continue;
        const int ov = (int)(i + (size_t)dd) % 2;  /* both schedules over the pairs */
        c = add_case(l);
        c->d = dd ? 64 : 128;
        c->dtype = (i + (size_t)causal) % 2 ? FG_DTYPE_F16 : FG_DTYPE_BF16;
        c->causal = causal;
        c->B = pairs[i][0] * pairs[i][1] >= 1000 * 1000 ? 1 : 2;
        c->Hq = 2;
        c->Hkv = dd ? 2 : 1;
        c->Nq = pairs[i][0];
        c->Nk = pairs[i][1];
        c->quick = i == 1 || i == 2 || i == 7;
        force_wgmma(c, arch, ov ? FG_LOOP_Q_WGMMA_OV : FG_LOOP_Q_WGMMA, 4, 64, 2);
        set_name(c, "wgmma_seqlen/d%d_nq%" PRId64 "_nk%" PRId64 "_%s_%s_%s", (int)c->d, c->Nq,
                 c->Nk, fg_dtype_name(c->dtype), causal_word(causal), ov ? "ov" : "inorder");
      }
  static const struct {
    const char *name;
    int d, layout, lse, causal;
    int64_t B, Hq, Hkv, Nq, Nk;
  } ps[] = {{"gqa8", 128, L_BHND, 1, 1, 2, 16, 2, 300, 345},
            {"mqa", 64, L_BHND, 1, 0, 2, 8, 1, 300, 300},
            {"bnhd", 128, L_BNHD, 1, 1, 2, 4, 4, 333, 333},
            {"padded_rows", 64, L_PADDED, 1, 0, 2, 4, 4, 257, 300},
            {"mixed_layouts", 128, L_MIXED, 1, 0, 2, 4, 2, 257, 300},
            {"nolse", 128, L_BHND, 0, 1, 2, 2, 2, 300, 300},
            {"b8300_h16_n1", 128, L_BHND, 1, 0, 8300, 16, 16, 1, 1}};
  for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) {
    c = add_case(l);
    c->d = ps[i].d;
    c->layout = ps[i].layout;
    c->lse = ps[i].lse;
    c->causal = ps[i].causal;
    c->B = ps[i].B;
    c->Hq = ps[i].Hq;
    c->Hkv = ps[i].Hkv;
    c->Nq = ps[i].Nq;
    c->Nk = ps[i].Nk;
    c->quick = 1;
    force_wgmma(c, arch, i % 2 ? FG_LOOP_Q_WGMMA : FG_LOOP_Q_WGMMA_OV, 4, 64, 2);
    set_name(c, "wgmma/%s_%s_%s", ps[i].name, causal_word(c->causal), i % 2 ? "inorder" : "ov");
  }
}

static void build_cases(case_list *l, const fg_variant *defs, int ndefs, int device_count) {
  static const int64_t lens[] = {1, 17, 127, 128, 129, 1000, 4097};
  const int nlens = (int)(sizeof lens / sizeof lens[0]);
  check_case *c;

  /* 1. Every variant of the default set, partial tiles, GQA 2:1, Nq != Nk when causal. */
  for (int i = 0; i < ndefs; i++) {
    c = add_case(l);
    char vn[FG_VARIANT_NAME_MAX];
    fg_variant_name(&defs[i], vn, sizeof vn);
    set_name(c, "variant/%s", vn);
    c->forced = 1;
    c->v = defs[i];
    c->d = defs[i].d;
    c->dtype = defs[i].dtype;
    c->causal = defs[i].causal;
    c->B = 2;
    c->Hq = 2;
    c->Hkv = 1;
    c->Nq = c->causal ? 160 : 200;
    c->Nk = c->causal ? 224 : 200;
    c->quick = defs[i].d == 64 || defs[i].d == 128;
  }

  if (ndefs > 0) add_wgmma_cases(l, defs[0].arch);

  /* 2. Sequence lengths: every (Nq, Nk) pair, causal on and off, through the dispatcher; the
   * KV-outer loop order on every pair once (causal alternating). */
  for (int i = 0; i < nlens; i++)
    for (int j = 0; j < nlens; j++) {
      const int64_t nq = lens[i], nk = lens[j];
      const int big = nq * nk >= 1000 * 1000;
      const int qpair = (nq == nk && (nq == 1 || nq == 128 || nq == 4097)) ||
                        (nq == 17 && nk == 129) || (nq == 129 && nk == 17) ||
                        (nq == 127 && nk == 1000) || (nq == 1000 && nk == 127);
      for (int causal = 0; causal <= 1; causal++) {
        c = add_case(l);
        c->dtype = ((i + j + causal) % 2) ? FG_DTYPE_F16 : FG_DTYPE_BF16;
        c->causal = causal;
        c->d = 128;
        c->B = big ? 1 : 2;
        c->Hq = c->Hkv = big ? 1 : 2;
        c->Nq = nq;
        c->Nk = nk;
        c->quick = qpair;
        set_name(c, "seqlen/nq%" PRId64 "_nk%" PRId64 "_%s_%s", nq, nk, fg_dtype_name(c->dtype),
                 causal_word(causal));
      }
      c = add_case(l);
      c->causal = (i + j) % 2;
      c->dtype = ((i / 2 + j) % 2) ? FG_DTYPE_F16 : FG_DTYPE_BF16;
      c->d = 64;
      c->B = 1;
      c->Hq = c->Hkv = big ? 1 : 2;
      c->Nq = nq;
      c->Nk = nk;
      c->quick = (nq == 17 && nk == 129) || (nq == 129 && nk == 17) || (nq == 1000 && nk == 1000);
      force_loop(c, defs, ndefs, FG_LOOP_KV_OUTER);
      set_name(c, "seqlen_kvouter/nq%" PRId64 "_nk%" PRId64 "_%s_%s", nq, nk,
               fg_dtype_name(c->dtype), causal_word(c->causal));
      if (!c->forced) l->n--;
    }

  /* 3. Head dimensions, both dtypes, causal on and off, through the dispatcher. */
  static const int dims[] = {32, 40, 64, 80, 96, 128, 160, 192, 256};
  for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++)
    for (int dt = 0; dt < 2; dt++)
      for (int causal = 0; causal <= 1; causal++) {
        c = add_case(l);
        c->d = dims[i];
        c->dtype = dt ? FG_DTYPE_F16 : FG_DTYPE_BF16;
        c->causal = causal;
        c->B = 2;
        c->Hq = 4;
        c->Hkv = 2;
        c->Nq = causal ? 513 : 777;
        c->Nk = 777;
        c->quick = dims[i] == 64 || dims[i] == 128;
        set_name(c, "head_dim/d%d_%s_%s", dims[i], fg_dtype_name(c->dtype), causal_word(causal));
      }

  /* 4. GQA 8:1 and MQA, both loop orders. */
  for (int mqa = 0; mqa <= 1; mqa++)
    for (int causal = 0; causal <= 1; causal++)
      for (int kv = 0; kv <= 1; kv++) {
        c = add_case(l);
        c->d = mqa ? 64 : 128;
        c->dtype = mqa ? FG_DTYPE_F16 : FG_DTYPE_BF16;
        c->causal = causal;
        c->B = 2;
        c->Hq = mqa ? 8 : 16;
        c->Hkv = mqa ? 1 : 2;
        c->Nq = 300;
        c->Nk = causal ? 345 : 300;
        c->quick = 1;
        if (kv) force_loop(c, defs, ndefs, FG_LOOP_KV_OUTER);
        set_name(c, "%s/hq%" PRId64 "_hkv%" PRId64 "_%s_%s", mqa ? "mqa" : "gqa8", c->Hq, c->Hkv,
                 causal_word(causal), kv ? "kvouter" : "dispatch");
        if (kv && !c->forced) l->n--;
      }

  /* 5. Layouts: (B, N, H, d), padded rows, Q/O and K/V in different layouts. */
  for (int dt = 0; dt < 2; dt++)
    for (int causal = 0; causal <= 1; causal++) {
      c = add_case(l);
      c->layout = L_BNHD;
      c->dtype = dt ? FG_DTYPE_F16 : FG_DTYPE_BF16;
      c->causal = causal;
      c->d = 64;
      c->B = 2;
      c->Hq = 4;
      c->Hkv = 4;
      c->Nq = c->Nk = 333;
      c->quick = 1;
      set_name(c, "layout/bnhd_%s_%s", fg_dtype_name(c->dtype), causal_word(causal));
    }
  {
    static const struct {
      int layout;
      const char *name;
      int kv;
      int hkv;
    } ls[] = {{L_BNHD, "bnhd_gqa_kvouter", 1, 2},
              {L_PADDED, "padded_rows", 0, 4},
              {L_PADDED, "padded_rows_kvouter", 1, 4},
              {L_MIXED, "mixed_q_bnhd_kv_bhnd", 0, 4},
              {L_MIXED, "mixed_q_bnhd_kv_bhnd_kvouter", 1, 2}};
    for (size_t i = 0; i < sizeof ls / sizeof ls[0]; i++) {
      c = add_case(l);
      c->layout = ls[i].layout;
      c->dtype = FG_DTYPE_BF16;
      c->causal = (int)(i % 2);
      c->d = 128;
      c->B = 2;
      c->Hq = 4;
      c->Hkv = ls[i].hkv;
      c->Nq = 257;
      c->Nk = 300;
      c->quick = 1;
      if (ls[i].kv) force_loop(c, defs, ndefs, FG_LOOP_KV_OUTER);
      set_name(c, "layout/%s_%s", ls[i].name, causal_word(c->causal));
      if (ls[i].kv && !c->forced) l->n--;
    }
  }

  /* 6. Without LSE. */
  for (int kv = 0; kv <= 1; kv++) {
    c = add_case(l);
    c->lse = 0;
    c->d = 128;
    c->causal = 1;
    c->B = 2;
    c->Hq = c->Hkv = 2;
    c->Nq = c->Nk = 300;
    c->quick = 1;
    if (kv) force_loop(c, defs, ndefs, FG_LOOP_KV_OUTER);
    set_name(c, "nolse/%s", kv ? "kvouter" : "dispatch");
    if (kv && !c->forced) l->n--;
  }

  /* 7. Rows that see no key: causal with Nq > Nk, and Nk = 0. */
  {
    static const int64_t nk_cases[][2] = {{300, 100}, {129, 17}, {1000, 1}, {64, 0}, {300, 0}};
    for (size_t i = 0; i < sizeof nk_cases / sizeof nk_cases[0]; i++)
      for (int kv = 0; kv <= 1; kv++)
        for (int causal = (nk_cases[i][1] == 0 ? 0 : 1); causal <= 1; causal++) {
          c = add_case(l);
          c->d = i % 2 ? 64 : 128;
          c->dtype = (i + (size_t)kv) % 2 ? FG_DTYPE_F16 : FG_DTYPE_BF16;
          c->causal = causal;
          c->B = 2;
          c->Hq = 2;
          c->Hkv = 1;
          c->Nq = nk_cases[i][0];
          c->Nk = nk_cases[i][1];
          c->quick = 1;
          if (kv) force_loop(c, defs, ndefs, FG_LOOP_KV_OUTER);
          set_name(c, "nokey/nq%" PRId64 "_nk%" PRId64 "_%s_%s", c->Nq, c->Nk, causal_word(causal),
                   kv ? "kvouter" : "dispatch");
          if (kv && !c->forced) l->n--;
        }
  }

  /* 8. Scales: a custom one, and large logits (scale 1 at d = 128: a very peaked softmax). */
  c = add_case(l);
  c->d = 128;
  c->scale = 0.5f;
  c->B = 1;
  c->Hq = c->Hkv = 2;
  c->Nq = c->Nk = 500;
  c->quick = 1;
  set_name(c, "scale/0.5");
  for (int kv = 0; kv <= 1; kv++) {
    c = add_case(l);
    c->d = 128;
    c->dtype = FG_DTYPE_F16;
    c->causal = 1;
    c->scale = 1.0f;
    c->B = 1;
    c->Hq = c->Hkv = 2;
    c->Nq = c->Nk = 500;
    c->quick = 1;
    if (kv) force_loop(c, defs, ndefs, FG_LOOP_KV_OUTER);
    set_name(c, "scale/large_logits_%s", kv ? "kvouter" : "dispatch");
    if (kv && !c->forced) l->n--;
  }

  /* 9. 64-bit indexing: batch * heads_q past the grid's y limit; more than 2^31 elements. */
  for (int kv = 0; kv <= 1; kv++)
    for (int causal = 0; causal <= 1; causal++) {
      c = add_case(l);
      c->d = 128;
      c->causal = causal;
      c->B = 8300;
      c->Hq = c->Hkv = 16;
      c->Nq = c->Nk = 1;
      c->quick = !kv && !causal;
      if (kv) force_loop(c, defs, ndefs, FG_LOOP_KV_OUTER);
      set_name(c, "big/b8300_h16_n1_%s_%s", causal_word(causal), kv ? "kvouter" : "dispatch");
      if (kv && !c->forced) l->n--;
    }
  c = add_case(l);
  c->kind = K_BIG;
  c->d = 128;
  c->Nq = (INT64_C(1) << 31) / 128 + 4097; /* Q and O: 2^31 + 4097*128 elements */
  c->Nk = 64;
  set_name(c, "big/q_over_2^31_elements_nq%" PRId64, c->Nq);

  /* 10. Bad input that needs a GPU: the call fails with FG_ERROR_INVALID_ARGUMENT, nothing is
   * written. Empty problems: FG_OK, nothing is written. */
  static const struct {
    int kind;
    const char *name;
  } bad[] = {{K_BAD_HOST_Q, "bad/host_pointer_q"},
             {K_BAD_PINNED_K, "bad/pinned_host_k"},
             {K_BAD_FREED_V, "bad/freed_pointer_v"},
             {K_BAD_HOST_LSE, "bad/host_pointer_lse"},
             {K_BAD_MISALIGNED_O, "bad/misaligned_o"},
             {K_BAD_OTHER_DEV_K, "bad/other_device_k"},
             {K_BAD_DTYPE, "bad/unknown_dtype"},
             {K_BAD_HEAD_DIM, "bad/head_dim_100"},
             {K_EMPTY_BATCH, "empty/batch_0"},
             {K_EMPTY_NQ, "empty/seqlen_q_0"}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    if (bad[i].kind == K_BAD_OTHER_DEV_K && device_count < 2) continue;
    c = add_case(l);
    c->kind = bad[i].kind;
    c->B = 1;
    c->Hq = c->Hkv = 2;
    c->Nq = c->Nk = 64;
    c->d = 64;
    c->quick = 1;
    set_name(c, "%s", bad[i].name);
  }
}

/* ------------------------------------------------------------------------------------------ */
/* Numbers: random inputs from the gate's never-zero fill (fg_fill_random), a seed per case. */
typedef fg_rng rng;

static double half_to_f64(uint16_t h, fg_dtype dt) { return fg_half_to_f32(h, dt); }

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* ------------------------------------------------------------------------------------------ */
/* Running a case. */
typedef struct check_env {
  fg_context *ctx;
  CUstream stream;
  uint64_t seed;
  int verbose;
  int device;
} check_env;

typedef struct check_result {
  int pass;
  double max_err, tol, lse_err;
  char variant[FG_VARIANT_NAME_MAX];
  char reason[2048];
} check_result;

static void fail(check_result *r, const char *fmt, ...) FG_PRINTF(2, 3);
static void fail(check_result *r, const char *fmt, ...) {
  if (!r->pass && r->reason[0]) return; /* keep the first reason */
  r->pass = 0;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(r->reason, sizeof r->reason, fmt, ap);
  va_end(ap);
}

/* Element strides of one tensor in a case's layout. */
static void case_strides(const check_case *c, char which, int64_t s[3]) {
  const int qo = which == 'q' || which == 'o';
  const int64_t H = qo ? c->Hq : c->Hkv, N = qo ? c->Nq : c->Nk, d = c->d;
  int layout = c->layout;
  if (layout == L_MIXED) layout = qo ? L_BNHD : L_BHND;
  if (layout == L_BNHD) {
    s[0] = N * H * d, s[1] = d, s[2] = H * d;
  } else if (layout == L_PADDED) {
    const int64_t row = d + 16;
    s[0] = H * N * row, s[1] = N * row, s[2] = row;
  } else {
    s[0] = H * N * d, s[1] = N * d, s[2] = d;
  }
}

/* Device buffers of one case. */
typedef struct bufs {
  CUdeviceptr q, k, v, o, lse, ref_o, ref_lse, low_o, low_lse;
  int64_t nq, nk, nv, no, nrows;
} bufs;

static void free_bufs(fg_context *ctx, bufs *b) {
  CUdeviceptr *p[] = {&b->q, &b->k, &b->v, &b->o, &b->lse, &b->ref_o, &b->ref_lse, &b->low_o,
                      &b->low_lse};
  for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) {
    fg_dev_free(ctx, *p[i]);
    *p[i] = 0;
  }
}

#define TRY(r, call, what)                                                           \
  do {                                                                               \
    if ((call) != FG_OK) {                                                           \
      fail(r, "%s: %s", what, fg_context_last_error(env->ctx));                      \
      goto done;                                                                     \
    }                                                                                \
  } while (0)

/* Uploads random inputs for Q, K, V (whole allocations, padding included). */
static fg_status upload_random(check_env *env, CUdeviceptr p, int64_t n, rng *r, fg_dtype dt,
                               int normal) {
  if (n == 0) return FG_OK;
  uint16_t *h = malloc((size_t)n * 2);
  if (!h)
    return fg_fail(env->ctx, FG_ERROR_OUT_OF_MEMORY, "out of host memory (%" PRId64 " elements)",
                   n);
  fg_fill_random(h, n, r, dt, normal);
  fg_status st = fg_dev_upload(env->ctx, p, h, (size_t)n * 2);
  free(h);
  return st;
}

/* Runs both references for args (normalised) into b->ref_* and b->low_*. */
static fg_status run_references(check_env *env, const fg_attention_args *a, bufs *b) {
  const fg_loaded_kernel *exact, *low;
  fg_status st = fg_registry_get_reference(env->ctx, a->dtype, 1, &exact);
  if (st != FG_OK) return st;
  if ((st = fg_registry_get_reference(env->ctx, a->dtype, 0, &low)) != FG_OK) return st;
  fg_fwd_params p;
  fg_params_from_args(a, &p);
  p.o_sb = a->heads_q * a->seqlen_q * a->head_dim;
  p.o_sh = a->seqlen_q * a->head_dim;
  p.o_sn = a->head_dim;
  p.o = b->ref_o;
  p.lse = b->ref_lse;
  if ((st = fg_kernel_launch(env->ctx, exact, &p, FG_ELEMS_REFERENCE, env->stream)) != FG_OK)
    return st;
  p.o = b->low_o;
  p.lse = b->low_lse;
  return fg_kernel_launch(env->ctx, low, &p, FG_ELEMS_REFERENCE, env->stream);
}

/* Compares O (host copy of the whole allocation, strides of a) and LSE with the references,
 * rows [0, a->seqlen_q) of every (b, h); the references hold rows [0, nrows_ref) contiguous.
 * The rule is the gate's (fg_gate_forward), the one `flashgen tune` applies. */
static void compare(const fg_attention_args *a, const uint16_t *o, const float *lse,
                    const double *ref_o, const double *ref_lse, const double *low_o,
                    check_result *r) {
  const fg_gate_fwd f = {a->dtype, a->causal, a->batch, a->heads_q, a->seqlen_q, a->seqlen_k,
                         a->head_dim, o, {a->o_stride[0], a->o_stride[1], a->o_stride[2]}, lse,
                         ref_o, ref_lse, low_o};
  fg_gate_result g;
  fg_gate_forward(&f, &g);
  r->max_err = g.err[0];
  r->tol = g.tol[0];
  r->lse_err = g.err[1];
  if (!g.pass) fail(r, "%s", g.reason);
}

static void run_case(check_env *env, const check_case *cs, check_result *r) {
  bufs b;
  memset(&b, 0, sizeof b);
  uint16_t *ho = NULL;
  float *hl = NULL;
  double *hr = NULL, *hrl = NULL, *hlow = NULL;
  r->pass = 1;
  fg_context *ctx = env->ctx;
  fg_attention_args a;
  memset(&a, 0, sizeof a);
  a.size = sizeof a;
  a.dtype = cs->dtype;
  a.causal = cs->causal;
  a.batch = cs->B;
  a.heads_q = cs->Hq;
  a.heads_kv = cs->Hkv;
  a.seqlen_q = cs->Nq;
  a.seqlen_k = cs->Nk;
  a.head_dim = cs->d;
  a.scale = cs->scale;
  int64_t sq[3], sk[3], sv[3], so[3];
  case_strides(cs, 'q', sq);
  case_strides(cs, 'k', sk);
  case_strides(cs, 'v', sv);
  case_strides(cs, 'o', so);
  if (cs->layout != L_BHND) {
    memcpy(a.q_stride, sq, sizeof sq);
    memcpy(a.k_stride, sk, sizeof sk);
    memcpy(a.v_stride, sv, sizeof sv);
    memcpy(a.o_stride, so, sizeof so);
  }
  b.nq = fg_tensor_extent(cs->B, cs->Hq, cs->Nq, cs->d, sq);
  b.nk = fg_tensor_extent(cs->B, cs->Hkv, cs->Nk, cs->d, sk);
  b.nv = fg_tensor_extent(cs->B, cs->Hkv, cs->Nk, cs->d, sv);
  b.no = fg_tensor_extent(cs->B, cs->Hq, cs->Nq, cs->d, so);
  b.nrows = cs->B * cs->Hq * cs->Nq;
  rng rg = {env->seed ^ fg_seed_of_name(cs->name)};

  TRY(r, fg_dev_alloc(ctx, &b.q, (size_t)b.nq * 2), "allocating Q");
  TRY(r, fg_dev_alloc(ctx, &b.k, (size_t)b.nk * 2), "allocating K");
  TRY(r, fg_dev_alloc(ctx, &b.v, (size_t)b.nv * 2), "allocating V");
  TRY(r, fg_dev_alloc(ctx, &b.o, (size_t)b.no * 2), "allocating O");
  if (cs->lse) TRY(r, fg_dev_alloc(ctx, &b.lse, (size_t)b.nrows * 4), "allocating LSE");
  TRY(r, fg_dev_alloc(ctx, &b.ref_o, (size_t)(b.nrows * cs->d) * 8), "allocating the reference O");
  TRY(r, fg_dev_alloc(ctx, &b.ref_lse, (size_t)b.nrows * 8), "allocating the reference LSE");
  TRY(r, fg_dev_alloc(ctx, &b.low_o, (size_t)(b.nrows * cs->d) * 8), "allocating the lowp O");
  TRY(r, fg_dev_alloc(ctx, &b.low_lse, (size_t)b.nrows * 8), "allocating the lowp LSE");
  TRY(r, upload_random(env, b.q, b.nq, &rg, cs->dtype, 1), "uploading Q");
  TRY(r, upload_random(env, b.k, b.nk, &rg, cs->dtype, 1), "uploading K");
  TRY(r, upload_random(env, b.v, b.nv, &rg, cs->dtype, 0), "uploading V");
  TRY(r, fg_dev_fill16(ctx, b.o, 0xFFFF, (size_t)b.no), "poisoning O");
  if (b.lse) TRY(r, fg_dev_fill32(ctx, b.lse, 0xFFFFFFFFu, (size_t)b.nrows), "poisoning LSE");
  TRY(r, fg_dev_fill32(ctx, b.ref_lse, 0xFFFFFFFFu, (size_t)b.nrows * 2),
      "poisoning the reference");
  TRY(r, fg_dev_synchronize(ctx), "setting up");

  a.q = (const void *)(uintptr_t)b.q;
  a.k = (const void *)(uintptr_t)b.k;
  a.v = (const void *)(uintptr_t)b.v;
  a.o = (void *)(uintptr_t)b.o;
  a.lse = (float *)(uintptr_t)b.lse;
  if (cs->forced) {
    fg_variant_name(&cs->v, r->variant, sizeof r->variant);
  } else {
    fg_attention_args n;
    char err[512];
    const fg_dispatch *d;
    if (fg_validate_args(&a, FG_VALIDATE_CALL, &n, err, sizeof err) == FG_OK &&
        fg_dispatch_choose(ctx, &n, 0, &d, NULL) == FG_OK)
      snprintf(r->variant, sizeof r->variant, "%s", d->variant_name);
  }
  fg_status st = cs->forced ? fg_attention_forward_variant(ctx, &a, env->stream, &cs->v)
                            : fg_attention_forward(ctx, &a, env->stream);
  if (st != FG_OK) {
    fail(r, "fg_attention_forward: %s: %s", fg_status_string(st), fg_context_last_error(ctx));
    goto done;
  }
  fg_attention_args n;
  char err[512];
  if (fg_validate_args(&a, FG_VALIDATE_CALL, &n, err, sizeof err) != FG_OK) {
    fail(r, "validation: %s", err);
    goto done;
  }
  TRY(r, run_references(env, &n, &b), "running the references");
  TRY(r, fg_stream_synchronize(ctx, env->stream), "synchronising (a kernel failed)");

  ho = malloc((size_t)b.no * 2 + 2);
  hl = malloc((size_t)b.nrows * 4 + 4);
  hr = malloc((size_t)(b.nrows * cs->d) * 8 + 8);
  hrl = malloc((size_t)b.nrows * 8 + 8);
  hlow = malloc((size_t)(b.nrows * cs->d) * 8 + 8);
  if (!ho || !hl || !hr || !hrl || !hlow) {
    fail(r, "out of host memory");
    goto done;
  }
  TRY(r, fg_dev_download(ctx, ho, b.o, (size_t)b.no * 2), "downloading O");
  if (b.lse) TRY(r, fg_dev_download(ctx, hl, b.lse, (size_t)b.nrows * 4), "downloading LSE");
  TRY(r, fg_dev_download(ctx, hr, b.ref_o, (size_t)(b.nrows * cs->d) * 8),
      "downloading the reference");
  TRY(r, fg_dev_download(ctx, hrl, b.ref_lse, (size_t)b.nrows * 8), "downloading the reference");
  TRY(r, fg_dev_download(ctx, hlow, b.low_o, (size_t)(b.nrows * cs->d) * 8), "downloading lowp");
  compare(&n, ho, b.lse ? hl : NULL, hr, hrl, hlow, r);
done:
  free(ho);
  free(hl);
  free(hr);
  free(hrl);
  free(hlow);
  free_bufs(ctx, &b);
}

/* Q and O of more than 2^31 elements: a periodic random pattern (period 8191 rows, which divides
 * no power of two, so an offset that wrapped at 32 bits reads different data), every element
 * of O checked as written, and windows of rows (at the start, around element 2^31, at the end)
 * compared with the references run on those rows alone (non-causal rows are independent). */
static void run_big_case(check_env *env, const check_case *cs, check_result *r) {
  fg_context *ctx = env->ctx;
  const int64_t N = cs->Nq, d = cs->d, Nk = cs->Nk, P = 8191, W = 256;
  CUdeviceptr q = 0, k = 0, v = 0, o = 0, lse = 0, ro = 0, rl = 0, lo = 0, ll = 0;
  uint16_t *pat = NULL, *ho = NULL;
  float *hl = NULL;
  double *hr = NULL, *hrl = NULL, *hlow = NULL;
  r->pass = 1;
  snprintf(r->variant, sizeof r->variant, "(dispatcher)");
  rng rg = {env->seed ^ fg_seed_of_name(cs->name)};
  const size_t qbytes = (size_t)(N * d) * 2;
  size_t free_b = 0, total_b = 0;
  if (fg_ctx_push(ctx) == FG_OK) {
    fg_cu.cuMemGetInfo(&free_b, &total_b);
    fg_ctx_pop(ctx);
  }
  if (free_b < 2 * qbytes + ((size_t)N * 4) + ((size_t)1 << 28)) {
    fail(r, "needs %.1f GiB of free device memory, the device has %.1f GiB free",
         (double)(2 * qbytes) / 1073741824.0, (double)free_b / 1073741824.0);
    return;
  }
  TRY(r, fg_dev_alloc(ctx, &q, qbytes), "allocating Q");
  TRY(r, fg_dev_alloc(ctx, &o, qbytes), "allocating O");
  TRY(r, fg_dev_alloc(ctx, &lse, (size_t)N * 4), "allocating LSE");
  TRY(r, fg_dev_alloc(ctx, &k, (size_t)(Nk * d) * 2), "allocating K");
  TRY(r, fg_dev_alloc(ctx, &v, (size_t)(Nk * d) * 2), "allocating V");
  pat = malloc((size_t)(P * d) * 2);
  if (!pat) {
    fail(r, "out of host memory");
    goto done;
  }
  fg_fill_random(pat, P * d, &rg, cs->dtype, 1);
  for (int64_t row = 0; row < N; row += P) {
    const int64_t rows = N - row < P ? N - row : P;
    TRY(r, fg_dev_upload(ctx, q + (CUdeviceptr)(row * d * 2), pat, (size_t)(rows * d) * 2),
        "uploading Q");
  }
  TRY(r, upload_random(env, k, Nk * d, &rg, cs->dtype, 1), "uploading K");
  TRY(r, upload_random(env, v, Nk * d, &rg, cs->dtype, 0), "uploading V");
  TRY(r, fg_dev_fill16(ctx, o, 0xFFFF, (size_t)(N * d)), "poisoning O");
  TRY(r, fg_dev_fill32(ctx, lse, 0xFFFFFFFFu, (size_t)N), "poisoning LSE");
  TRY(r, fg_dev_synchronize(ctx), "setting up");

  fg_attention_args a;
  memset(&a, 0, sizeof a);
  a.size = sizeof a;
  a.dtype = cs->dtype;
  a.batch = a.heads_q = a.heads_kv = 1;
  a.seqlen_q = N;
  a.seqlen_k = Nk;
  a.head_dim = d;
  a.q = (const void *)(uintptr_t)q;
  a.k = (const void *)(uintptr_t)k;
  a.v = (const void *)(uintptr_t)v;
  a.o = (void *)(uintptr_t)o;
  a.lse = (float *)(uintptr_t)lse;
  {
    fg_attention_args n;
    char err[512];
    const fg_dispatch *dd;
    if (fg_validate_args(&a, FG_VALIDATE_CALL, &n, err, sizeof err) == FG_OK &&
        fg_dispatch_choose(ctx, &n, 0, &dd, NULL) == FG_OK)
      snprintf(r->variant, sizeof r->variant, "%s", dd->variant_name);
  }
  fg_status st = fg_attention_forward(ctx, &a, env->stream);
  if (st != FG_OK) {
    fail(r, "fg_attention_forward: %s: %s", fg_status_string(st), fg_context_last_error(ctx));
    goto done;
  }
  TRY(r, fg_stream_synchronize(ctx, env->stream), "synchronising (the kernel failed)");

  /* Every element of O written and finite, in chunks. */
  {
    const int64_t chunk = INT64_C(1) << 25; /* elements */
    ho = malloc((size_t)chunk * 2);
    if (!ho) {
      fail(r, "out of host memory");
      goto done;
    }
    int64_t bad = 0, first = -1;
    for (int64_t off = 0; off < N * d; off += chunk) {
      const int64_t n = N * d - off < chunk ? N * d - off : chunk;
      TRY(r, fg_dev_download(ctx, ho, o + (CUdeviceptr)(off * 2), (size_t)n * 2), "downloading O");
      for (int64_t i = 0; i < n; i++)
        if (!isfinite(half_to_f64(ho[i], cs->dtype)) && !bad++) first = off + i;
    }
    if (bad) {
      fail(r,
           "%" PRId64 " elements of O are not finite (unwritten or NaN), first at element %" PRId64
           " (row %" PRId64 ")",
           bad, first, first / d);
      goto done;
    }
    free(ho);
    ho = NULL;
  }

  /* Windows of rows against the references. */
  fg_attention_args n;
  char err[512];
  if (fg_validate_args(&a, FG_VALIDATE_CALL, &n, err, sizeof err) != FG_OK) {
    fail(r, "validation: %s", err);
    goto done;
  }
  TRY(r, fg_dev_alloc(ctx, &ro, (size_t)(W * d) * 8), "allocating the reference");
  TRY(r, fg_dev_alloc(ctx, &rl, (size_t)W * 8), "allocating the reference");
  TRY(r, fg_dev_alloc(ctx, &lo, (size_t)(W * d) * 8), "allocating the reference");
  TRY(r, fg_dev_alloc(ctx, &ll, (size_t)W * 8), "allocating the reference");
  ho = malloc((size_t)(W * d) * 2);
  hl = malloc((size_t)W * 4);
  hr = malloc((size_t)(W * d) * 8);
  hrl = malloc((size_t)W * 8);
  hlow = malloc((size_t)(W * d) * 8);
  if (!ho || !hl || !hr || !hrl || !hlow) {
    fail(r, "out of host memory");
    goto done;
  }
  const int64_t starts[4] = {0, (INT64_C(1) << 31) / d - W / 2, N / 2 + 7, N - W};
  double max_err = 0, tol = 1e300, lse_err = 0;
  for (int w = 0; w < 4; w++) {
    const int64_t r0 = starts[w];
    fg_attention_args win = n;
    win.seqlen_q = W;
    win.q = (const char *)n.q + r0 * n.q_stride[2] * 2;
    win.o = (char *)n.o + r0 * n.o_stride[2] * 2;
    win.q_stride[0] = win.q_stride[1] = W * d; /* batch = heads = 1: unused */
    win.o_stride[0] = win.o_stride[1] = W * d;
    bufs b;
    memset(&b, 0, sizeof b);
    b.ref_o = ro, b.ref_lse = rl, b.low_o = lo, b.low_lse = ll;
    TRY(r, run_references(env, &win, &b), "running the references");
    TRY(r, fg_stream_synchronize(ctx, env->stream), "synchronising (a reference failed)");
    TRY(r, fg_dev_download(ctx, ho, o + (CUdeviceptr)(r0 * d * 2), (size_t)(W * d) * 2),
        "downloading O");
    TRY(r, fg_dev_download(ctx, hl, lse + (CUdeviceptr)(r0 * 4), (size_t)W * 4), "downloading LSE");
    TRY(r, fg_dev_download(ctx, hr, ro, (size_t)(W * d) * 8), "downloading the reference");
    TRY(r, fg_dev_download(ctx, hrl, rl, (size_t)W * 8), "downloading the reference");
    TRY(r, fg_dev_download(ctx, hlow, lo, (size_t)(W * d) * 8), "downloading the reference");
    win.o_stride[2] = d; /* the host copy holds the window contiguously */
    check_result wr;
    memset(&wr, 0, sizeof wr);
    wr.pass = 1;
    compare(&win, ho, hl, hr, hrl, hlow, &wr);
    max_err = fmax(max_err, wr.max_err);
    tol = fmin(tol, wr.tol);
    lse_err = fmax(lse_err, wr.lse_err);
    if (!wr.pass) fail(r, "rows %" PRId64 "..%" PRId64 ": %s", r0, r0 + W - 1, wr.reason);
  }
  r->max_err = max_err;
  r->tol = tol;
  r->lse_err = lse_err;
done:
  free(pat);
  free(ho);
  free(hl);
  free(hr);
  free(hrl);
  free(hlow);
  CUdeviceptr all[] = {q, k, v, o, lse, ro, rl, lo, ll};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) fg_dev_free(ctx, all[i]);
}

/* Bad input that needs the driver, and empty problems: checks the status, the message and that
 * O and LSE still hold their poison. */
static void run_bad_case(check_env *env, const check_case *cs, check_result *r) {
  fg_context *ctx = env->ctx;
  fg_context *other = NULL;
  CUdeviceptr q = 0, k = 0, v = 0, o = 0, lse = 0, freed = 0, other_k = 0;
  void *host = NULL, *pinned = NULL;
  uint16_t *ho = NULL;
  uint32_t *hl = NULL;
  r->pass = 1;
  snprintf(r->variant, sizeof r->variant, "(none)");
  const int64_t n = cs->B * cs->Hq * cs->Nq * cs->d, rows = cs->B * cs->Hq * cs->Nq;
  const size_t bytes = (size_t)n * 2;
  rng rg = {env->seed ^ fg_seed_of_name(cs->name)};
  TRY(r, fg_dev_alloc(ctx, &q, bytes), "allocating Q");
  TRY(r, fg_dev_alloc(ctx, &k, bytes), "allocating K");
  TRY(r, fg_dev_alloc(ctx, &v, bytes), "allocating V");
  TRY(r, fg_dev_alloc(ctx, &o, bytes + 16), "allocating O");
  TRY(r, fg_dev_alloc(ctx, &lse, (size_t)rows * 4), "allocating LSE");
  TRY(r, upload_random(env, q, n, &rg, FG_DTYPE_BF16, 1), "uploading Q");
  TRY(r, upload_random(env, k, n, &rg, FG_DTYPE_BF16, 1), "uploading K");
  TRY(r, upload_random(env, v, n, &rg, FG_DTYPE_BF16, 0), "uploading V");
  TRY(r, fg_dev_fill16(ctx, o, 0xFFFF, (size_t)n + 8), "poisoning O");
  TRY(r, fg_dev_fill32(ctx, lse, 0xFFFFFFFFu, (size_t)rows), "poisoning LSE");

  fg_attention_args a;
  memset(&a, 0, sizeof a);
  a.size = sizeof a;
  a.dtype = FG_DTYPE_BF16;
  a.batch = cs->B;
  a.heads_q = cs->Hq;
  a.heads_kv = cs->Hkv;
  a.seqlen_q = cs->Nq;
  a.seqlen_k = cs->Nk;
  a.head_dim = cs->d;
  a.q = (const void *)(uintptr_t)q;
  a.k = (const void *)(uintptr_t)k;
  a.v = (const void *)(uintptr_t)v;
  a.o = (void *)(uintptr_t)o;
  a.lse = (float *)(uintptr_t)lse;
  fg_status want = FG_ERROR_INVALID_ARGUMENT;
  const char *needle = NULL;
  switch (cs->kind) {
    case K_BAD_HOST_Q:
      host = aligned_alloc(64, bytes);
      if (!host) {
        fail(r, "out of host memory");
        goto done;
      }
      memset(host, 0x3c, bytes);
      a.q = host;
      needle = "args->q";
      break;
    case K_BAD_PINNED_K:
      if (fg_host_alloc_pinned(ctx, &pinned, bytes) != FG_OK) {
        fail(r, "cuMemAllocHost: %s", fg_context_last_error(ctx));
        goto done;
      }
      memset(pinned, 0x3c, bytes);
      a.k = pinned;
      needle = "args->k";
      break;
    case K_BAD_FREED_V:
      TRY(r, fg_dev_alloc(ctx, &freed, bytes + 4096), "allocating");
      fg_dev_free(ctx, freed);
      a.v = (const void *)(uintptr_t)freed;
      needle = "args->v";
      break;
    case K_BAD_HOST_LSE:
      host = aligned_alloc(64, (size_t)rows * 4);
      if (!host) {
        fail(r, "out of host memory");
        goto done;
      }
      a.lse = host;
      needle = "args->lse";
      break;
    case K_BAD_MISALIGNED_O:
      a.o = (void *)(uintptr_t)(o + 8);
      needle = "args->o";
      break;
    case K_BAD_OTHER_DEV_K: {
      fg_context_options opt;
      memset(&opt, 0, sizeof opt);
      opt.size = sizeof opt;
      opt.device = env->device == 0 ? 1 : 0;
      opt.quiet = 1;
      if (fg_context_create(&other, &opt) != FG_OK) {
        fail(r, "creating a context on device %d: %s", opt.device, fg_last_create_error());
        goto done;
      }
      if (fg_dev_alloc(other, &other_k, bytes) != FG_OK) {
        fail(r, "allocating on device %d: %s", opt.device, fg_context_last_error(other));
        goto done;
      }
      a.k = (const void *)(uintptr_t)other_k;
      needle = "args->k";
      break;
    }
    case K_BAD_DTYPE:
      a.dtype = (fg_dtype)3;
      needle = "args->dtype";
      break;
    case K_BAD_HEAD_DIM:
      a.head_dim = 100;
      needle = "args->head_dim";
      break;
    case K_EMPTY_BATCH:
      a.batch = 0;
      want = FG_OK;
      break;
    case K_EMPTY_NQ:
      a.seqlen_q = 0;
      want = FG_OK;
      break;
  }
  TRY(r, fg_dev_synchronize(ctx), "setting up");
  fg_status st = fg_attention_forward(ctx, &a, env->stream);
  const char *msg = fg_context_last_error(ctx);
  if (st != want)
    fail(r, "expected %s, got %s: %s", fg_status_string(want), fg_status_string(st), msg);
  else if (needle && !strstr(msg, needle))
    fail(r, "the message does not name %s: \"%s\"", needle, msg);
  else if (env->verbose && msg[0])
    printf("      message: %s\n", msg);
  TRY(r, fg_dev_synchronize(ctx), "synchronising");
  ho = malloc(bytes + 16);
  hl = malloc((size_t)rows * 4);
  if (!ho || !hl) {
    fail(r, "out of host memory");
    goto done;
  }
  TRY(r, fg_dev_download(ctx, ho, o, bytes + 16), "downloading O");
  TRY(r, fg_dev_download(ctx, hl, lse, (size_t)rows * 4), "downloading LSE");
  for (int64_t i = 0; i < n + 8; i++)
    if (ho[i] != 0xFFFF) {
      fail(r, "O was written (element %" PRId64 " = 0x%04x) by a call that %s", i, ho[i],
           want == FG_OK ? "had nothing to do" : "failed");
      break;
    }
  for (int64_t i = 0; i < rows; i++)
    if (hl[i] != 0xFFFFFFFFu) {
      fail(r, "LSE was written (row %" PRId64 ") by a call that %s", i,
           want == FG_OK ? "had nothing to do" : "failed");
      break;
    }
done:
  free(ho);
  free(hl);
  free(host);
  if (pinned) fg_host_free_pinned(ctx, pinned);
  if (other) {
    fg_dev_free(other, other_k);
    fg_context_destroy(other);
  }
  CUdeviceptr all[] = {q, k, v, o, lse};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) fg_dev_free(ctx, all[i]);
}
#undef TRY

/* ------------------------------------------------------------------------------------------ */
/* Loading every kernel the selected cases use, on several threads (fg_pool_run; one compile per
 * kernel, the registry makes the others wait), so compiling does not dominate the run. */
typedef struct preload_item {
  int ref; /* 0: variant; 1: reference */
  fg_variant v;
  fg_dtype dtype;
  int exact;
  int failed; /* set by the pool */
} preload_item;

typedef struct preload_job {
  fg_context *ctx;
  preload_item *items;
  int n, failed, tty;
} preload_job;

static void preload_one(void *arg, int i) {
  preload_job *j = arg;
  const fg_loaded_kernel *k;
  fg_status st = j->items[i].ref
                     ? fg_registry_get_reference(j->ctx, j->items[i].dtype, j->items[i].exact, &k)
                     : fg_registry_get(j->ctx, &j->items[i].v, &k);
  if (st != FG_OK) j->items[i].failed = 1;
}

static void preload_done(void *arg, int i, int ndone) {
  preload_job *j = arg;
  j->failed += j->items[i].failed;
  if (j->tty) fprintf(stderr, "\rloading kernels: %d/%d", ndone, j->n);
}

static int same_variant(const fg_variant *a, const fg_variant *b) {
  return a->pass == b->pass && a->d == b->d && a->br == b->br && a->bc == b->bc &&
         a->dtype == b->dtype && a->causal == b->causal && a->loop == b->loop &&
         a->warps == b->warps && a->stages == b->stages && a->arch == b->arch;
}

static void preload(fg_context *ctx, const case_list *l, const char *sel, int jobs) {
  preload_item *items = calloc((size_t)l->n + 8, sizeof *items);
  if (!items) return;
  int n = 0, dtypes_used[3] = {0, 0, 0};
  for (int i = 0; i < l->n; i++) {
    const check_case *c = &l->c[i];
    if (!sel[i] || (c->kind != K_RUN && c->kind != K_BIG)) continue;
    dtypes_used[c->dtype] = 1;
    fg_variant v;
    if (c->forced) {
      v = c->v;
    } else {
      fg_attention_args a;
      memset(&a, 0, sizeof a);
      a.dtype = c->dtype;
      a.causal = c->causal;
      a.batch = c->B;
      a.heads_q = c->Hq;
      a.heads_kv = c->Hkv;
      a.seqlen_q = c->Nq;
      a.seqlen_k = c->Nk;
      a.head_dim = c->d;
      fg_attention_args norm;
      char err[256];
      const fg_dispatch *d;
      if (fg_validate_args(&a, FG_VALIDATE_SHAPES, &norm, err, sizeof err) != FG_OK ||
          fg_args_empty(&norm) || fg_dispatch_choose(ctx, &norm, 0, &d, NULL) != FG_OK)
        continue;
      v = d->variant;
    }
    int dup = 0;
    for (int k = 0; k < n && !dup; k++) dup = !items[k].ref && same_variant(&items[k].v, &v);
    if (!dup) items[n++].v = v;
  }
  for (int dt = 1; dt <= 2; dt++)
    for (int exact = 0; exact <= 1; exact++)
      if (dtypes_used[dt]) {
        items[n].ref = 1;
        items[n].dtype = (fg_dtype)dt;
        items[n].exact = exact;
        n++;
      }
  /* References first: every case needs them. */
  preload_item *sorted = calloc((size_t)n + 1, sizeof *sorted);
  if (sorted) {
    int m = 0;
    for (int i = 0; i < n; i++)
      if (items[i].ref) sorted[m++] = items[i];
    for (int i = 0; i < n; i++)
      if (!items[i].ref) sorted[m++] = items[i];
    free(items);
    items = sorted;
  }
  preload_job j;
  memset(&j, 0, sizeof j);
  j.ctx = ctx;
  j.items = items;
  j.n = n;
  j.tty = isatty(2);
  if (jobs < 1) jobs = 1;
  if (jobs > FG_POOL_MAX_THREADS) jobs = FG_POOL_MAX_THREADS;
  if (jobs > n) jobs = n;
  double t0 = now_ms();
  fprintf(stderr, "loading %d kernels (compiling those not in the cache) on %d threads\n", n, jobs);
  fg_pool_run(n, jobs, preload_one, preload_done, &j);
  if (j.tty) fputc('\n', stderr);
  fprintf(stderr, "loaded %d kernels in %.1f s (%d failed; their cases report why)\n",
          n - j.failed, (now_ms() - t0) / 1e3, j.failed);
  free(items);
}

/* ------------------------------------------------------------------------------------------ */
static void check_usage(FILE *f) {
  fprintf(f,
          "usage: flashgen check [--quick] [--filter SUBSTRING] [--list] [--device N] [--seed N]\n"
          "                      [-j N] [--verbose]\n\n"
          "Checks the forward kernels on the GPU against an fp64 reference: every variant of\n"
          "the default set, sequence lengths, head dimensions, GQA/MQA, strided layouts, LSE,\n"
          "every loop order (q_outer, kv_outer, and on sm_90a the wgmma kernels, in order and\n"
          "overlapped), rows that see no key, 64-bit indexing, and bad input. Then the\n"
          "backward pass (cases bwd/...): dQ, dK, dV of the built-in backward variant of every\n"
          "head dimension, odd sequence lengths, GQA/MQA, strides, seqlen_k = 0, batch * heads\n"
          "past the grid, bad input, against an fp64 reference computed on the host. Prints one\n"
          "line per case and `N passed, N failed` last; exits 1 on any failure.\n\n"
          "  --quick         a subset that runs in under a minute\n"
          "  --filter S      only the cases whose name contains S\n"
          "  --list          print the case names and exit\n"
          "  --device N      CUDA device (default 0)\n"
          "  --seed N        base seed of the random inputs (default 1)\n"
          "  -j N            threads that compile kernels (default: the number of cores)\n"
          "  --verbose       print the variant and messages of every case\n");
}

int fg_cmd_check(int argc, char **argv) {
  int quick = 0, list = 0, verbose = 0, device = 0;
  long jobs = sysconf(_SC_NPROCESSORS_ONLN);
  uint64_t seed = 1;
  const char *filter = NULL;
  for (int i = 1; i < argc; i++) {
    const char *opt = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(opt, "--help") || !strcmp(opt, "-h")) {
      check_usage(stdout);
      return 0;
    } else if (!strcmp(opt, "--quick")) {
      quick = 1;
    } else if (!strcmp(opt, "--list")) {
      list = 1;
    } else if (!strcmp(opt, "--verbose") || !strcmp(opt, "-v")) {
      verbose = 1;
    } else if (val && !strcmp(opt, "--filter")) {
      filter = val;
      i++;
    } else if (val && (!strcmp(opt, "--device") || !strcmp(opt, "--seed") || !strcmp(opt, "-j"))) {
      char *end;
      errno = 0;
      unsigned long long x = strtoull(val, &end, 10);
      if (errno || end == val || *end) {
        fprintf(stderr, "flashgen check: %s expects a number, got '%s'\n", opt, val);
        return 2;
      }
      if (!strcmp(opt, "--device")) device = (int)x;
      else if (!strcmp(opt, "--seed")) seed = x;
      else jobs = (long)x;
      i++;
    } else {
      fprintf(stderr, "flashgen check: unknown option or missing value: %s\n\n", opt);
      check_usage(stderr);
      return 2;
    }
  }

  /* The case list needs the arch (the default set) and the device count: without a GPU,
   * --list shows the cases of an sm_90a device. */
  fg_context *ctx = NULL;
  fg_context_options o;
  memset(&o, 0, sizeof o);
  o.size = sizeof o;
  o.device = device;
  fg_status st = fg_context_create(&ctx, &o);
  if (st != FG_OK && !list) {
    fprintf(stderr, "flashgen check: %s: %s\n", fg_status_string(st), fg_last_create_error());
    printf("0 passed, 1 failed\n");
    return 1;
  }
  fg_arch arch = ctx ? fg_context_arch(ctx) : FG_ARCH_SM90A;
  int device_count = 1;
  if (ctx) fg_cu.cuDeviceGetCount(&device_count);
  fg_variant *defs = calloc(1024, sizeof *defs);
  int ndefs = defs ? fg_default_variants(arch, 1, defs, 1024) : 0;
  case_list l = {0};
  build_cases(&l, defs, ndefs, device_count);
  char *sel = calloc((size_t)l.n + 1, 1);
  int nsel = 0;
  for (int i = 0; sel && i < l.n; i++) {
    sel[i] = (!quick || l.c[i].quick) && (!filter || strstr(l.c[i].name, filter));
    nsel += sel[i];
  }
  fg_check_options co;
  memset(&co, 0, sizeof co);
  co.ctx = ctx;
  co.filter = filter;
  co.quick = quick;
  co.list = 1;
  co.verbose = verbose;
  co.jobs = (int)jobs;
  co.seed = seed;
  int bwd_passed = 0, bwd_failed = 0;
  if (list) {
    for (int i = 0; i < l.n; i++)
      if (sel[i]) printf("%s\n", l.c[i].name);
    nsel += fg_check_backward(&co, &bwd_passed, &bwd_failed);
    fprintf(stderr, "%d cases\n", nsel);
    free(sel);
    free(l.c);
    free(defs);
    fg_context_destroy(ctx);
    return 0;
  }

  check_env env;
  memset(&env, 0, sizeof env);
  env.ctx = ctx;
  env.seed = seed;
  env.verbose = verbose;
  env.device = device;
  if (fg_stream_create(ctx, &env.stream) != FG_OK) {
    fprintf(stderr, "flashgen check: creating a stream: %s\n", fg_context_last_error(ctx));
    printf("0 passed, 1 failed\n");
    fg_context_destroy(ctx);
    return 1;
  }
  const fg_rt_limits *lim = fg_context_limits(ctx);
  printf("flashgen %s check on device %d: %s (compute capability %d.%d, %s), %d default variants, "
         "%d cases, seed %" PRIu64 "\n",
         fg_version(), device, lim->name, lim->cc_major, lim->cc_minor, fg_arch_name(arch), ndefs,
         nsel, seed);
  fflush(stdout);
  preload(ctx, &l, sel, (int)jobs);

  int passed = 0, failed = 0;
  double t_all = now_ms();
  for (int i = 0; i < l.n; i++) {
    if (!sel[i]) continue;
    const check_case *c = &l.c[i];
    check_result r;
    memset(&r, 0, sizeof r);
    double t0 = now_ms();
    if (c->kind == K_RUN) run_case(&env, c, &r);
    else if (c->kind == K_BIG) run_big_case(&env, c, &r);
    else run_bad_case(&env, c, &r);
    double ms = now_ms() - t0;
    if (c->kind == K_RUN || c->kind == K_BIG)
      printf("%-64s max_err %.3e  tol %.3e  lse_err %.2e  %7.1f ms  %s\n", c->name, r.max_err,
             r.tol, r.lse_err, ms, r.pass ? "PASS" : "FAIL");
    else
      printf("%-64s %-42s %7.1f ms  %s\n", c->name, "expected error, output untouched", ms,
             r.pass ? "PASS" : "FAIL");
    if (!r.pass || verbose) printf("    variant %s\n", r.variant[0] ? r.variant : "?");
    if (!r.pass) printf("    %s\n", r.reason);
    fflush(stdout);
    if (r.pass) passed++;
    else failed++;
  }
  co.list = 0;
  co.stream = env.stream;
  fg_check_backward(&co, &passed, &failed);
  fprintf(stderr, "ran %d cases in %.1f s\n", passed + failed, (now_ms() - t_all) / 1e3);
  printf("%d passed, %d failed\n", passed, failed);
  fg_stream_destroy(ctx, env.stream);
  free(sel);
  free(l.c);
  free(defs);
  fg_context_destroy(ctx);
  return failed ? 1 : 0;
}
