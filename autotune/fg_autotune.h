/* fg_autotune.h: candidate enumeration for each pass (pruned by the fit rule before anything is
 * compiled), the seed's block-size rule, the problem set, the correctness gate of every op and
 * its random inputs (shared with `flashgen check`), the compile pool (shared with check, export
 * and build-default), and (with a GPU) the tuning run. */
#ifndef FG_AUTOTUNE_H
#define FG_AUTOTUNE_H
#include <stdio.h>

#include <stdint.h>

#include "fg_gen.h"
#include "fg_problem.h"

/* Why candidates were pruned, counted by cause. */
typedef struct fg_prune_counts {
  int smem, regs, threads, rules;
} fg_prune_counts;

/* The candidates of a problem depend on its op, head dim, dtype and mask only (p->pass, d,
 * dtype, causal); its length buckets (nq, nk) do not change them. */

/* The seed's rule (seed 002, FlashAttention-1), the forward's whatever p->pass says: Bc =
 * ceil(M / 4d), Br = min(ceil(M / 4d), d), with M the opt-in shared memory in elements, rounded
 * down to what the templates accept (multiples of 16, Br a multiple of 16*warps), q_outer, 4
 * warps, 2 stages, shrunk until it fits. */
fg_variant fg_seed_rule_variant(fg_generator *g, const fg_problem *p, fg_arch arch,
                                const fg_device_limits *lim);

/* The baseline a pass's tuned winner is compared with ("SEED" in the report), always the first
 * candidate when it fits: the forward's seed rule (fg_seed_rule_variant); the backward's
 * built-in rule (fg_problem_builtin, what runs without a tuning record). */
fg_variant fg_baseline_variant(fg_generator *g, const fg_problem *p, fg_arch arch,
                               const fg_device_limits *lim);

/* Enumerates the candidates of problem p's op (p->pass) for its (d, dtype, causal) on a device,
 * keeping those that fit lim (fg_variant_fits: the template's check and resources through the
 * generator); the baseline (fg_baseline_variant) comes first when it fits. Forward: Br in
 * {64, 128}, Bc in {16..128} (32 and up but for kv_outer), 4 or 8 warps, every loop order with
 * its stages. Backward (templates/bwd.lua): kv_outer, Br and Bc in {32, 64, 128}, 4 or 8 warps,
 * 1 or 2 stages (36 points before pruning). Returns the count written (at most cap); pruned (may
 * be NULL) counts what was rejected and why. */
int fg_candidates(fg_generator *g, const fg_problem *p, fg_arch arch, const fg_device_limits *lim,
                  fg_variant *out, int cap, fg_prune_counts *pruned);

/* ==== The compile pool (pool.c): tune, check, export, build-default ==== */

/* Most threads a pool starts. */
#define FG_POOL_MAX_THREADS 64
/* The online CPUs, 1..FG_POOL_MAX_THREADS. */
int fg_online_cpus(void);
/* Runs work(ud, i) once for every i in [0, n), on `threads` threads (<= 0: fg_online_cpus();
 * at most n and FG_POOL_MAX_THREADS; the calling thread is one of them, so the work is done even
 * when no thread can be started); indices are handed out in increasing order. After each item,
 * done(ud, i, ndone) (may be NULL) runs under the pool's lock, one call at a time, ndone counting
 * the items finished so far: progress lines and counters. Returns when every item is done. */
void fg_pool_run(int n, int threads, void (*work)(void *ud, int i),
                 void (*done)(void *ud, int i, int ndone), void *ud);

/* One kernel of fg_compile_pool. Zero-initialise, set v. */
typedef struct fg_compile_item {
  fg_variant v;         /* in */
  int ok;               /* out: 1 when it built */
  fg_kernel_image img;  /* out: the image (free with fg_kernel_image_free) */
  char *log;            /* out: NVRTC's log or the error, malloc'd or NULL (free it) */
} fg_compile_item;
/* fg_generator_build for every item on `threads` threads (fg_pool_run; done as there). Returns
 * the number of items that failed. */
int fg_compile_pool(fg_generator *g, fg_compile_item *items, int n, int threads,
                    void (*done)(void *ud, int i, int ndone), void *ud);

/* ==== Tuning (problems.c: the problem set; tune.c and its stages tune_*.c: the run on the live
 * GPU, tune_report.c: the report) ==== */

/* One tuning problem: attention forward (pass FG_PASS_FWD, the zero value) or backward, every
 * tensor contiguous (B, H, N, d), heads_q = heads_kv = heads, seqlen_q = seqlen_k = n. */
typedef struct fg_tune_problem {
  int d;
  fg_dtype dtype;
  int causal;
  int64_t batch, heads, n;
  fg_pass pass;
} fg_tune_problem;

/* The benchmark grid of ANCHORS.md: batch * n = 16384 tokens, hidden 2048 (heads = 2048 / d). */
#define FG_TUNE_TOKENS 16384
#define FG_TUNE_HIDDEN 2048
/* Most problems `flashgen tune` accepts at once. */
#define FG_TUNE_MAX_PROBLEMS 1024

/* Parses "d=128,dtype=bf16,causal=1,n=4096[,batch=4][,heads=16][,pass=bwd]". Keys: d (head_dim),
 * n (seqlen, N; "4k" = 4096), dtype (f16, bf16; default bf16), causal (0/1, yes/no, true/false;
 * default 0), batch (B; default max(1, 16384 / n)), heads (H; default max(1, 2048 / d)), pass
 * (fwd or bwd; default fwd) or its shorthand bwd (0/1, as causal). d and n are required.
 * Returns 0, or -1 with a message in err that names the key and its value. */
int fg_tune_problem_parse(const char *s, fg_tune_problem *out, char *err, size_t errlen);
/* Writes the problem in the syntax above (every key; ",pass=bwd" last for a backward problem,
 * nothing for a forward one). Returns the length. */
int fg_tune_problem_format(const fg_tune_problem *p, char *buf, size_t len);
/* The problem key of p (fg_problem_make: its op, d, dtype, mask and the bucket of its n): what
 * names its tuning record and what its candidates are for. */
fg_problem fg_tune_problem_key(const fg_tune_problem *p);
/* The embedded default set. Forward: d in {64, 128} x {f16, bf16} x causal {0, 1} x n in {512,
 * 1k, 2k, 4k, 8k, 16k} (48 problems). Backward: the same (d, dtype, causal) x n in {1k, 4k}
 * (16; the other buckets take the nearest tuned one: a backward run costs about 5 forward ones,
 * and the whole set is to tune within a minute on an H100). quick: bf16 only, forward n in
 * {1k, 4k}, backward n = 4k (8 + 4). Forward problems first. Returns the count (<= cap). */
#define FG_TUNE_DEFAULT_FWD 48
#define FG_TUNE_DEFAULT_BWD 16
int fg_tune_default_problems(int quick, fg_tune_problem *out, int cap);
/* Reads problems from a file, one per line ('#' starts a comment; blank lines are skipped).
 * Returns the count, or -1 with "FILE:LINE: message" in err. */
int fg_tune_problems_read(const char *path, fg_tune_problem *out, int cap, char *err,
                          size_t errlen);
/* FlashAttention convention: 4 * B * H * N^2 * d, halved when causal; the backward counts 2.5
 * times the forward (five matrix products to the forward's two). */
double fg_tune_flops(const fg_tune_problem *p);
/* TFLOP/s of a run of ms milliseconds (0 when ms <= 0). */
double fg_tune_tflops(const fg_tune_problem *p, double ms);
/* The median of n values (x is not modified); NAN when n <= 0. */
double fg_tune_median(const double *x, int n);
/* The candidates to time again in a runoff: of the n candidates with eligible[c] (fully timed,
 * correct) and ms[c] <= within * the best such time, the (at most max) fastest, written to out in
 * index order. Returns their count. */
int fg_tune_finalists(const double *ms, const int *eligible, int n, double within, int max,
                      int *out);
/* The winner among the eligible candidates: the fastest, except that prev (the previous bucket's
 * winner; -1 for none) stays the winner while eligible and ms[prev] <= within * the fastest.
 * Returns -1 when none is eligible. */
int fg_tune_pick_winner(const double *ms, const int *eligible, int n, int prev, double within);
/* How many input buffer sets to rotate among so that their total exceeds twice the L2:
 * the smallest count with count * bytes_per_set > 2 * l2_bytes, clamped to 1..8. */
int fg_tune_rotation_sets(size_t bytes_per_set, size_t l2_bytes);

/* Options of a tuning run. Zero-initialise. */
typedef struct fg_tune_options {
  int jobs;      /* compile threads; <= 0: the number of online CPUs */
  int quiet;     /* no progress or notes on stderr */
  int retune;    /* measure candidates already recorded for a bucket again */
  uint64_t seed; /* random inputs of the correctness check; 0: from the clock */
} fg_tune_options;

/* One problem's line of the report. */
typedef struct fg_tune_row {
  fg_tune_problem problem;
  char key[64];                       /* the bucket key (fg_problem_format) */
  char winner[FG_VARIANT_NAME_MAX];   /* "" when no candidate was correct */
  double winner_ms, winner_tflops;
  char seed_variant[FG_VARIANT_NAME_MAX];
  double seed_tflops;                 /* 0 when the seed-rule candidate was rejected */
  int tried, pruned, rejected;        /* candidates that fit / pruned by the fit rule / rejected */
  int measured;                       /* candidates measured in this run (0: from the record) */
  int stored;                         /* the record was written to the cache */
  char note[256];                     /* why there is no winner, or "" */
} fg_tune_row;

typedef struct fg_tune_report {
  char device[256];
  char arch[16];
  char cache_path[1024];              /* "" when there was no kernel cache */
  int n_rows;
  fg_tune_row *rows;
  int kernels, kernels_cached, kernels_failed, jobs;
  double compile_s, check_s, timing_s, total_s;
  uint64_t seed;
} fg_tune_report;

/* Tunes problems on ctx's GPU: candidates from the device limits, compiled in parallel into the
 * kernel cache, each checked against the fp64 reference on fresh random inputs, the correct ones
 * timed with CUDA events; the records are stored in the cache (fg_cache_put_tuning) and the
 * dispatcher's memo is forgotten. Fills *rep (free with fg_tune_report_free) even on failure, as
 * far as it got. Returns FG_OK, or the failure with the message in fg_context_last_error(ctx):
 * no NVRTC, no generator, a CUDA context that became unusable. A problem without a correct
 * candidate is not a failure of the run (its row says why). */
fg_status fg_tune_run(fg_context *ctx, const fg_tune_problem *problems, int n,
                      const fg_tune_options *opt, fg_tune_report *rep);
/* Prints the report: an aligned table, or Markdown when markdown is nonzero. */
void fg_tune_report_print(const fg_tune_report *rep, FILE *out, int markdown);
void fg_tune_report_free(fg_tune_report *rep);

/* float -> f16 or bf16 bits, round to nearest even (NaN stays NaN, overflow is infinity), and
 * back (exact). The host side of every correctness comparison (half.c). */
uint16_t fg_f32_to_half(float f, fg_dtype t);
float fg_half_to_f32(uint16_t h, fg_dtype t);

/* A backward problem on the host: Q, dO [batch, heads_q, seqlen_q, head_dim] and K, V
 * [batch, heads_kv, seqlen_k, head_dim], contiguous, in dtype's bits. */
typedef struct fg_bwd_host_problem {
  fg_dtype dtype;
  int causal; /* bottom-right aligned, as the kernels */
  int64_t batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim;
  double scale;
  const uint16_t *q, *k, *v, *d_o;
} fg_bwd_host_problem;

/* The backward pass on the host (reference_bwd.c), with `threads` threads: exact = 1 in fp64;
 * exact = 0 the naive same-dtype computation (S, P, dP, D, dS and the gradients rounded to
 * dtype), whose error sets the tolerance. Writes dQ, dK, dV contiguous in the shapes of Q, K, V,
 * and (when lse is not NULL) the log-sum-exp [batch, heads_q, seqlen_q] of the scores, -inf for
 * rows that see no key. Returns 0, or -1 (heads_q not a multiple of heads_kv, out of memory). */
int fg_reference_backward(const fg_bwd_host_problem *p, int exact, double *dq, double *dk,
                          double *dv, double *lse, int threads);
/* fg_reference_backward of a long problem (batch = heads_q = heads_kv = 1) of n query rows
 * whose Q and dO repeat with a period of P = p->seqlen_q rows, dO signed per period: row i holds
 * row i % P of p->q and signs[i / P] (+1 or -1; ceil(n / P) of them) times row i % P of p->d_o.
 * At the cost of a period: `flashgen check`'s case past 2^31 elements. (Random signs make dK and
 * dV grow like a random walk over the periods, as sums of independent rows do, rather than with
 * n, as coherent copies would: a kernel's fp32 sums of 2^24 coherent rows carry an error ~n/32
 * ulps that no same-precision bound covers.) Without a mask a row's dQ depends on its own Q and
 * dO rows only, and dK, dV sum the rows' contributions: dq gets P rows (dQ of row i is
 * signs[i / P] times row i % P), dk and dv the whole sums: (the sum of the whole periods' signs)
 * times one period's plus the last partial period's sign times the remaining rows' (with exact =
 * 0 each part is rounded to dtype before it is scaled and summed: the naive model the same
 * way). Causal (bottom-right aligned): only the last r = min(n, seqlen_k) rows see a key; dq
 * gets those r rows, signs included (row n - r + t is row t), every other row's dQ is 0.
 * Returns 0, or -1 (not batch = heads = 1, a sign other than +1 or -1, out of memory). */
int fg_reference_backward_periodic(const fg_bwd_host_problem *p, int64_t n,
                                   const signed char *signs, int exact, double *dq, double *dk,
                                   double *dv, int threads);

/* ==== The correctness gate (gate.c): `flashgen tune` and `flashgen check`, every op ==== */

/* Random inputs: splitmix64 from the state s (any value, 0 included). */
typedef struct fg_rng {
  uint64_t s;
} fg_rng;
uint64_t fg_rng_next(fg_rng *r);
/* Uniform in [0, 1) (53 bits); normal(0, 1) (Box-Muller). */
double fg_rng_uniform(fg_rng *r);
double fg_rng_normal(fg_rng *r);
/* Fills h with n values of dtype dt, never zero (a value that rounds to +-0 becomes 2^-8 in bf16,
 * 2^-14 in f16, so that a kernel that skips an element cannot pass by luck): normal(0, 1) when
 * normal, else uniform in [-1, 1). The inputs of every correctness check. */
void fg_fill_random(uint16_t *h, int64_t n, fg_rng *r, fg_dtype dt, int normal);
/* A seed from a name (FNV-1a): each `flashgen check` case draws its own inputs. */
uint64_t fg_seed_of_name(const char *s);

/* The verdict of the gate. Forward: slot 0 is O, slot 1 the LSE (err[1] = max |lse - ref| over
 * the rows that see a key, tol[1] = FG_GATE_LSE_TOL, worst[1] the row of err[1]);
 * backward: slots 0..2 are dQ, dK, dV. */
typedef struct fg_gate_result {
  int pass;                 /* 1: every value finite and every error within its tolerance */
  double err[3];            /* max |x - ref| */
  double tol[3];            /* 2 * max |naive - ref| + eps(dtype) * max |ref| (+ FG_GATE_FLOOR for
                               the backward) */
  double naive_err[3];      /* max |naive - ref| */
  double ref_max[3];        /* max |ref| */
  int64_t worst[3];         /* index of the largest error (or of the first non-finite value) */
  int64_t nonfinite;        /* forward: elements of O not finite */
  int64_t nokey_bad;        /* forward: elements of rows that see no key that are not 0 */
  int64_t lse_bad;          /* forward: LSE values out of tolerance (or not -inf without a key) */
  char reason[512];         /* why it failed (the first failure), "" when it passed */
} fg_gate_result;

/* The forward's LSE tolerance: |lse - ref| <= FG_GATE_LSE_TOL * (1 + |ref|). */
#define FG_GATE_LSE_TOL 1e-3

/* A forward result on the host and its references (the reference kernels' output: fp64 and the
 * naive same-dtype computation, O contiguous [batch, heads, seqlen_q, head_dim], LSE contiguous
 * [batch, heads, seqlen_q], -inf for rows that see no key). */
typedef struct fg_gate_fwd {
  fg_dtype dtype;
  int causal;                   /* bottom-right aligned, as the kernels */
  int64_t batch, heads, seqlen_q, seqlen_k, head_dim;
  const uint16_t *o;            /* O in dtype's bits, element (b, h, i, c) at b * o_stride[0] +
                                   h * o_stride[1] + i * o_stride[2] + c */
  int64_t o_stride[3];          /* all 0: contiguous */
  const float *lse;             /* the kernel's LSE, contiguous; NULL: not checked */
  const double *ref_o, *ref_lse; /* fp64 reference (ref_lse only read when lse is not NULL) */
  const double *naive_o;        /* the naive same-dtype computation's O */
} fg_gate_fwd;

/* The gate of a forward result: the reference finite (else the reference kernel is broken),
 * every element of O finite; in rows that see no key (seqlen_k = 0, or causal with
 * i + seqlen_k - seqlen_q < 0) O exactly 0 and the LSE -inf; elsewhere the LSE within
 * FG_GATE_LSE_TOL of the fp64 LSE; and max|O - ref| <= 2 * max|naive - ref| + eps(dtype) *
 * max|ref| (eps = 2^-8 for bf16, 2^-11 for f16; no floor: a forward output is never all but
 * zero). Non-finite elements are left out of the maxima. Resets *r first; r->reason names the
 * first failure in that order. Returns r->pass. */
int fg_gate_forward(const fg_gate_fwd *f, fg_gate_result *r);

/* The absolute floor of every tolerance (a gradient whose reference is all but zero). */
#define FG_GATE_FLOOR 1e-6

/* The FlashAttention rule for one gradient `what` ("dQ", "dK", "dV") of n values x (dtype's
 * bits) against the fp64 reference ref and the naive same-dtype computation naive: every x
 * finite and max|x - ref| <= 2 * max|naive - ref| + eps(dtype) * max|ref| + FG_GATE_FLOOR,
 * eps = 2^-8 for bf16 and 2^-11 for f16. Fills slot `slot` (0..2) of *r and, on the first
 * failure, r->pass = 0 and r->reason (set r->pass = 1 before the first call, as
 * fg_gate_backward does). Returns 1 when this gradient passes, else 0. */
int fg_gate_tensor(const char *what, const uint16_t *x, const double *ref, const double *naive,
                   int64_t n, fg_dtype dtype, int slot, fg_gate_result *r);
/* The gate of a backward result: dQ (nq values, the shape of Q), dK and dV (nk values each, the
 * shape of K), against fp64 references and naive computations laid out as fg_reference_backward
 * writes them (ref and naive hold dQ, then dK, then dV: nq + 2 * nk values). Resets *r first.
 * Returns 1 when all three pass (r->pass), else 0 with r->reason naming the first failure. */
int fg_gate_backward(fg_dtype dtype, const uint16_t *dq, const uint16_t *dk, const uint16_t *dv,
                     const double *ref, const double *naive, int64_t nq, int64_t nk,
                     fg_gate_result *r);
#endif
