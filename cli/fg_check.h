/* fg_check.h: what the parts of `flashgen check` share: the options of a run; the forward cases
 * (check_cases.c: the table), how one runs (check_run.c) and its result; the backward cases
 * (check_bwd.c), which cmd_check.c (the command: options, kernel preload, the loop) runs after
 * the forward ones. */
#ifndef FG_CHECK_H
#define FG_CHECK_H
#include <stdint.h>

#include "fg_jit.h"
#include "fg_runtime_internal.h"

typedef struct fg_check_options {
  fg_context *ctx;       /* NULL with list: only list the cases */
  CUstream stream;
  const char *filter;    /* substrings of the case names, comma-separated (any), or NULL */
  int quick, list, verbose, jobs;
  int sync; /* backward cases: wait for the GPU between the forward call and the backward */
  uint64_t seed;
} fg_check_options;

/* Whether case `name` is selected by filter (NULL: all; else comma-separated substrings, of
 * which the name contains at least one) and, with quick, is a quick case (is_quick). */
int fg_check_selected(const char *name, int is_quick, const char *filter, int quick);

/* Runs (or with o->list prints) the backward cases that o selects, printing one line per case
 * and adding to *passed / *failed. Returns the number of cases selected. */
int fg_check_backward(const fg_check_options *o, int *passed, int *failed);

/* ---- The backward cases (check_bwd.c: the table and the ordinary run; check_bwd_big.c: past
 * 2^31 elements) ----------------------------------------------------------------------------- */

typedef struct fg_check_bwd_case {
  char name[128];
  int kind, quick, bnhd;
  fg_dtype dt;
  int causal, d;
  int64_t b, hq, hkv, nq, nk;
  int forced;   /* 1: run variant v, not the problem's built-in */
  fg_variant v;
} fg_check_bwd_case;

typedef struct fg_check_bwd_result {
  int pass;
  double err[3], tol[3]; /* dQ, dK, dV: max |x - ref| and the gate's tolerance */
  char variant[FG_VARIANT_NAME_MAX];
  char reason[2048];
} fg_check_bwd_result;
/* Marks r failed with the reason (printf-style); the first failure's reason wins. */
void fg_check_bwd_fail(fg_check_bwd_result *r, const char *fmt, ...) FG_PRINTF(2, 3);

typedef struct fg_check_bwd_env {
  fg_context *ctx;
  CUstream stream;
  uint64_t seed;
  int threads;
  int sync; /* fg_check_options.sync */
} fg_check_bwd_env;
/* Runs backward variant v on a and waits for it; 0, or -1 with the failure recorded in r. */
int fg_check_bwd_call(const fg_check_bwd_env *env, const fg_attention_backward_args *a,
                      const fg_variant *v, fg_check_bwd_result *r);

/* The problem key of a backward case (fg_problem_from_backward of its call). */
fg_problem fg_check_bwd_problem(const fg_check_bwd_case *c);

/* Runs a backward case whose Q, O, dO and dQ hold more than 2^31 elements (batch = heads = 1):
 * Q and dO repeat a random pattern of FG_CHECK_BWD_BIG_PERIOD rows, so that the fp64 reference
 * of every row of dQ and of the whole dK and dV costs the host one period (check_bwd_big.c says
 * why that is a full check). Zeroes nothing: r->pass = 1 first, as fg_check_bwd's cases do. */
#define FG_CHECK_BWD_BIG_PERIOD 8191
void fg_check_bwd_big(const fg_check_bwd_env *env, const fg_check_bwd_case *c,
                      fg_check_bwd_result *r);

/* ---- The forward cases ---------------------------------------------------------------------- */

enum {
  FG_CHECK_RUN = 0,          /* a forward call checked against the references */
  FG_CHECK_BIG,              /* more than 2^31 elements in Q and O: reference on windows of rows */
  FG_CHECK_BAD_HOST_Q,       /* q from malloc */
  FG_CHECK_BAD_PINNED_K,     /* k in page-locked host memory */
  FG_CHECK_BAD_FREED_V,      /* v freed before the call */
  FG_CHECK_BAD_HOST_LSE,     /* lse from malloc */
  FG_CHECK_BAD_MISALIGNED_O, /* o 8 bytes past an aligned address */
  FG_CHECK_BAD_OTHER_DEV_K,  /* k on another device */
  FG_CHECK_BAD_DTYPE,        /* dtype 3 */
  FG_CHECK_BAD_HEAD_DIM,     /* head_dim 100 */
  FG_CHECK_EMPTY_BATCH,      /* batch 0: OK, nothing written */
  FG_CHECK_EMPTY_NQ          /* seqlen_q 0: OK, nothing written */
};
/* Layouts: (B, H, N, d) contiguous; (B, N, H, d); rows padded to d + 16; Q/O (B, N, H, d) with
 * K/V (B, H, N, d). */
enum { FG_CHECK_BHND = 0, FG_CHECK_BNHD = 1, FG_CHECK_PADDED = 2, FG_CHECK_MIXED = 3 };

typedef struct fg_check_case {
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
} fg_check_case;

typedef struct fg_check_list {
  fg_check_case *c;
  int n, cap;
} fg_check_list;

/* Appends every forward case, in the order `flashgen check` lists and runs them: the variants
 * of the default set defs (whose arch also decides the wgmma cases), sequence lengths, head
 * dimensions, GQA/MQA, layouts, no LSE, rows without keys, scales, 64-bit indexing and bad
 * input (the other-device case only when device_count >= 2). Exits on out of memory. */
void fg_check_build_cases(fg_check_list *l, const fg_variant *defs, int ndefs, int device_count);

/* ---- Running a forward case (check_run.c) ---------------------------------------------------- */

typedef struct fg_check_env {
  fg_context *ctx;
  CUstream stream;
  uint64_t seed;
  int verbose;
  int device;
} fg_check_env;

typedef struct fg_check_result {
  int pass;
  double max_err, tol, lse_err;
  char variant[FG_VARIANT_NAME_MAX];
  char reason[2048];
} fg_check_result;

/* Runs one case (zeroes *r first): fresh random inputs (fg_fill_random, seeded by env->seed and
 * the case's name), outputs poisoned with NaN, the forward call, the reference kernels and
 * fg_gate_forward; or, for the bad-input kinds, the expected error with the outputs untouched. */
void fg_check_run(fg_check_env *env, const fg_check_case *c, fg_check_result *r);
/* The call's arguments of a case: size, dtype, causal, the sizes and scale; no pointers, default
 * strides (check_cases.c). */
void fg_check_case_args(const fg_check_case *c, fg_attention_args *a);
/* A monotonic clock in milliseconds. */
double fg_check_now_ms(void);
#endif
