/* check_bwd_big.c: the backward cases of `flashgen check` past 2^31 elements (bwd/big/...): Q,
 * O, dO and dQ of more than 2^31 elements (batch = heads = 1, a few key rows), so that every
 * offset of the three kernels (D and the fp32 dQ accumulator, the main kernel, the dQ
 * conversion) must be 64-bit. Every element of dQ, dK and dV is checked against the fp64
 * reference through the gate the other cases use (fg_gate_tensor).
 *
 * The reference at this size: written out, it would take the host O(Nq * Nk * d) = 2^31 * 64
 * multiply-adds for each of five products, twice (fp64 and naive), and 2 * 17 GiB of doubles
 * for dQ alone. Instead Q and dO repeat a random pattern of P = FG_CHECK_BWD_BIG_PERIOD rows
 * (the forward's big case does the same for Q), dO times a pseudo-random sign per period (from
 * the check's RNG, so fixed by its seed), K and V random. Without a mask, a row's dQ (and its O,
 * LSE and D) depends only on its own Q and dO rows and on K and V, and dK and dV are sums of the
 * rows' contributions; so dQ of row i is the reference's row i % P times its period's sign, and
 * dK, dV are one period's times the sum of the whole periods' signs plus the remaining rows'
 * times theirs (fg_reference_backward_periodic; the naive model the same way): the exact result
 * of the whole problem at the cost of one period, not a sample of it. Why random signs: with the
 * same pattern in every period dK and dV grow with Nq (2048 coherent copies), and the kernel's
 * fp32 sums of 2^24 rows then err by about Nq / 32 ulps (measured on an H100: dK 1.9% of its
 * largest value, against 0.45% for the naive model, which sums one period and multiplies);
 * alternating signs (the first form of this case) kept the sums one period's size, and let
 * errors cancel in pairs too; independent rows' sums grow like a random walk, and so do these
 * (the sum of 2049 random signs: about 45 periods' worth). With alternating signs the kernels
 * without a split of the query range failed the non-causal case's dK and dV by about 1.5x the
 * tolerance: the tensor cores' fp32 sums drift over the ~1M k-steps of one key block
 * (bench/NOTES.md, "Long reductions"); the main kernel now splits a key block's query range
 * past 65536 rows (templates/bwd.lua, SPLIT_ROWS), so here 257 blocks each sum 65536 rows. The
 * pattern is random in every element (never zero), only repeated; P = 8191 divides no power of
 * two (2^24 rows, where an offset of 2^31 elements wraps at d = 128, is row 2048 of the
 * period), so a kernel that reads or writes a row at an offset wrapped at 32 bits uses another
 * row's data and its dQ rows differ from the reference (and rows it never writes keep their NaN
 * poison). Causal (bottom-right aligned): only the last Nk rows see a key; every other row's dQ
 * must be exactly 0, and the last rows are a small problem of their own. */
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fg_autotune.h"
#include "fg_check.h"
#include "fg_runtime_internal.h"


/* Uploads rows [0, n) of a tensor [n, d] whose row i is row i % P of pat, or with neg (pat
 * negated) and signs, row i % P of neg in the periods whose sign is -1. */
static fg_status upload_periodic(fg_context *ctx, CUdeviceptr dst, const uint16_t *pat,
                                 const uint16_t *neg, const signed char *signs, int64_t P,
                                 int64_t n, int64_t d) {
  fg_status st = FG_OK;
  for (int64_t row = 0; row < n && st == FG_OK; row += P) {
    const int64_t rows = n - row < P ? n - row : P;
    const uint16_t *src = neg && signs[row / P] < 0 ? neg : pat;
    st = fg_dev_upload(ctx, dst + (CUdeviceptr)(row * d * 2), src, (size_t)(rows * d) * 2);
  }
  return st;
}

void fg_check_bwd_big(const fg_check_bwd_env *env, const fg_check_bwd_case *c,
                      fg_check_bwd_result *r) {
  fg_context *ctx = env->ctx;
  const int64_t N = c->nq, Nk = c->nk, d = c->d, P = FG_CHECK_BWD_BIG_PERIOD;
  const fg_dtype dt = c->dt;
  const uint16_t nan16 = dt == FG_DTYPE_BF16 ? 0x7fc0 : 0x7e00;
  r->pass = 1;
  const fg_problem key = fg_check_bwd_problem(c);
  const fg_variant v = fg_problem_builtin(&key, fg_context_arch(ctx));
  fg_variant_name(&v, r->variant, sizeof r->variant);
  if (c->b != 1 || c->hq != 1 || c->hkv != 1 || c->bnhd || N < 1 || Nk < 1) {
    fg_check_bwd_fail(
        r, "a bwd/big case is batch = heads = 1, contiguous, with rows: fix its table row");
    return;
  }
  /* Host: the patterns (P rows of Q and dO), K, V, the references of one period, a period of dQ. */
  const int64_t ref_rows = c->causal ? (N < Nk ? N : Nk) : P;
  const size_t pe = (size_t)(P * d), ke = (size_t)(Nk * d), re = (size_t)(ref_rows * d);
  uint16_t *pq = malloc(pe * 2), *pdo = malloc(pe * 2), *ndo = malloc(pe * 2), *hk = malloc(ke * 2),
           *hv = malloc(ke * 2);
  uint16_t *gq = malloc(pe * 2), *gk = malloc(ke * 2), *gv = malloc(ke * 2);
  const int64_t periods = (N + P - 1) / P;
  signed char *signs = malloc((size_t)periods);
  double *ex_q = malloc(re * 8), *ex_k = malloc(ke * 8), *ex_v = malloc(ke * 8);
  double *nv_q = malloc(re * 8), *nv_k = malloc(ke * 8), *nv_v = malloc(ke * 8);
  CUdeviceptr q = 0, o = 0, dout = 0, dq = 0, k = 0, vv = 0, dk = 0, dv = 0, lse = 0;
  if (!pq || !pdo || !ndo || !hk || !hv || !gq || !gk || !gv || !ex_q || !ex_k || !ex_v || !nv_q ||
      !nv_k || !nv_v || !signs) {
    fg_check_bwd_fail(r, "out of host memory (about %.0f MiB needed)",
             (double)(pe * 6 + re * 16 + ke * 28) / 1048576.0);
    goto done;
  }
  fg_rng g = {env->seed ^ fg_seed_of_name(c->name)};
  fg_fill_random(pq, (int64_t)pe, &g, dt, 1);
  fg_fill_random(hk, (int64_t)ke, &g, dt, 1);
  fg_fill_random(hv, (int64_t)ke, &g, dt, 0);
  fg_fill_random(pdo, (int64_t)pe, &g, dt, 0);
  for (size_t x = 0; x < pe; x++) ndo[x] = pdo[x] ^ 0x8000; /* dO of periods of sign -1 */
  int64_t sign_sum = 0;
  for (int64_t i = 0; i < periods; i++) {
    signs[i] = fg_rng_next(&g) >> 63 ? -1 : 1;
    sign_sum += signs[i];
  }

  fg_attention_backward_args a;
  memset(&a, 0, sizeof a);
  a.size = sizeof a;
  a.dtype = dt;
  a.causal = c->causal;
  a.batch = a.heads_q = a.heads_kv = 1;
  a.seqlen_q = N;
  a.seqlen_k = Nk;
  a.head_dim = d;
  /* Device memory: Q, O, dO, dQ (N * d each), K, V, dK, dV, LSE, and the workspace flashgen
   * takes itself (the fp32 dQ accumulator and D). */
  size_t ws = 0;
  if (fg_attention_backward_workspace_size(ctx, &a, &ws) != FG_OK) {
    fg_check_bwd_fail(r, "fg_attention_backward_workspace_size: %s", fg_context_last_error(ctx));
    goto done;
  }
  const size_t qbytes = (size_t)(N * d) * 2, need = 4 * qbytes + 4 * ke * 2 + (size_t)N * 4 + ws;
  size_t free_b = 0, total_b = 0;
  if (fg_ctx_push(ctx) == FG_OK) {
    fg_cu.cuMemGetInfo(&free_b, &total_b);
    fg_ctx_pop(ctx);
  }
  if (free_b < need + ((size_t)1 << 29)) {
    fg_check_bwd_fail(r,
             "needs %.1f GiB of free device memory (Q, O, dO, dQ %.1f GiB each, workspace %.1f "
             "GiB) and the device has %.1f GiB free: run it on a larger GPU, or leave it out "
             "with --filter",
             (double)need / 1073741824.0, (double)qbytes / 1073741824.0,
             (double)ws / 1073741824.0, (double)free_b / 1073741824.0);
    goto done;
  }
  fg_status st = FG_OK;
  CUdeviceptr *big[4] = {&q, &o, &dout, &dq}, *small[4] = {&k, &vv, &dk, &dv};
  for (int i = 0; i < 4 && st == FG_OK; i++) st = fg_dev_alloc(ctx, big[i], qbytes);
  for (int i = 0; i < 4 && st == FG_OK; i++) st = fg_dev_alloc(ctx, small[i], ke * 2);
  if (st == FG_OK) st = fg_dev_alloc(ctx, &lse, (size_t)N * 4);
  if (st == FG_OK) st = upload_periodic(ctx, q, pq, NULL, NULL, P, N, d);
  if (st == FG_OK) st = upload_periodic(ctx, dout, pdo, ndo, signs, P, N, d);
  if (st == FG_OK) st = fg_dev_upload(ctx, k, hk, ke * 2);
  if (st == FG_OK) st = fg_dev_upload(ctx, vv, hv, ke * 2);
  if (st == FG_OK) st = fg_dev_fill16(ctx, o, nan16, (size_t)(N * d));
  if (st == FG_OK) st = fg_dev_fill16(ctx, dq, nan16, (size_t)(N * d));
  if (st == FG_OK) st = fg_dev_fill16(ctx, dk, nan16, ke);
  if (st == FG_OK) st = fg_dev_fill16(ctx, dv, nan16, ke);
  if (st == FG_OK) st = fg_dev_synchronize(ctx);
  if (st != FG_OK) {
    fg_check_bwd_fail(r, "setting up device memory: %s", fg_context_last_error(ctx));
    goto done;
  }
  a.q = (const void *)(uintptr_t)q, a.k = (const void *)(uintptr_t)k;
  a.v = (const void *)(uintptr_t)vv, a.o = (const void *)(uintptr_t)o;
  a.d_o = (const void *)(uintptr_t)dout, a.lse = (const float *)(uintptr_t)lse;
  a.dq = (void *)(uintptr_t)dq, a.dk = (void *)(uintptr_t)dk, a.dv = (void *)(uintptr_t)dv;
  fg_attention_args f;
  fg_backward_forward_args(&a, &f);
  if ((st = fg_attention_forward(ctx, &f, env->stream)) != FG_OK ||
      (env->sync && (st = fg_dev_synchronize(ctx)) != FG_OK)) {
    fg_check_bwd_fail(r, "the forward call that makes O and LSE failed: %s",
                      fg_context_last_error(ctx));
    goto done;
  }
  if (fg_check_bwd_call(env, &a, &v, r)) goto done;

  /* The references of the whole problem from one period (see the top of the file). */
  const fg_bwd_host_problem hp = {dt, c->causal, 1, 1, 1, P, Nk, d, 1.0 / sqrt((double)d),
                                  pq, hk, hv, pdo};
  if (fg_reference_backward_periodic(&hp, N, signs, 1, ex_q, ex_k, ex_v, env->threads) != 0 ||
      fg_reference_backward_periodic(&hp, N, signs, 0, nv_q, nv_k, nv_v, env->threads) != 0) {
    fg_check_bwd_fail(r, "the host reference failed (out of memory?)");
    goto done;
  }

  /* dQ, a period at a time: every element finite and within the gate's tolerance (the same
   * reference rows for every whole period); causal rows that see no key exactly 0. */
  fg_gate_result gr;
  memset(&gr, 0, sizeof gr);
  gr.pass = 1;
  gr.tol[0] = INFINITY;
  const int64_t first_key_row = c->causal ? N - ref_rows : 0;
  for (int64_t row = 0; row < N && gr.pass; row += P) {
    const int64_t rows = N - row < P ? N - row : P;
    if (fg_dev_download(ctx, gq, dq + (CUdeviceptr)(row * d * 2), (size_t)(rows * d) * 2) !=
        FG_OK) {
      fg_check_bwd_fail(r, "downloading dQ: %s", fg_context_last_error(ctx));
      goto done;
    }
    /* Rows [row, row + rows): those before first_key_row must be 0, the others are checked. */
    int64_t zero_to = first_key_row - row;
    if (zero_to < 0) zero_to = 0;
    if (zero_to > rows) zero_to = rows;
    for (int64_t x = 0; x < zero_to * d; x++)
      if (gq[x] & 0x7fff) {
        fg_check_bwd_fail(r, "dQ row %" PRId64 " (col %" PRId64 ") sees no key but holds %g, not 0",
                 row + x / d, x % d, (double)fg_half_to_f32(gq[x], dt));
        gr.pass = 0;
        break;
      }
    if (!gr.pass || zero_to == rows) continue;
    /* Without a mask the reference is one period's rows: dQ of a period of sign -1 is their
     * negation. */
    if (!c->causal && signs[row / P] < 0)
      for (int64_t x = 0; x < rows * d; x++) gq[x] ^= 0x8000;
    const int64_t r0 = row + zero_to; /* the first checked row of this period */
    const int64_t ref0 = c->causal ? r0 - first_key_row : r0 % P;
    fg_gate_result pr;
    memset(&pr, 0, sizeof pr);
    pr.pass = 1;
    fg_gate_tensor("dQ", gq + zero_to * d, ex_q + ref0 * d, nv_q + ref0 * d,
                   (rows - zero_to) * d, dt, 0, &pr);
    gr.err[0] = fmax(gr.err[0], pr.err[0]);
    gr.tol[0] = fmin(gr.tol[0], pr.tol[0]);
    if (!pr.pass) {
      fg_check_bwd_fail(r, "rows %" PRId64 "..%" PRId64 " (dQ row %" PRId64 "): %s", r0,
                        row + rows - 1, r0 + pr.worst[0] / d, pr.reason);
      gr.pass = 0;
    }
  }
  r->err[0] = gr.err[0];
  r->tol[0] = isfinite(gr.tol[0]) ? gr.tol[0] : 0;
  if (!gr.pass) goto done;

  /* dK and dV whole. */
  if (fg_dev_download(ctx, gk, dk, ke * 2) != FG_OK ||
      fg_dev_download(ctx, gv, dv, ke * 2) != FG_OK) {
    fg_check_bwd_fail(r, "downloading dK, dV: %s", fg_context_last_error(ctx));
    goto done;
  }
  memset(&gr, 0, sizeof gr);
  gr.pass = 1;
  fg_gate_tensor("dK", gk, ex_k, nv_k, (int64_t)ke, dt, 1, &gr);
  fg_gate_tensor("dV", gv, ex_v, nv_v, (int64_t)ke, dt, 2, &gr);
  for (int i = 1; i < 3; i++) r->err[i] = gr.err[i], r->tol[i] = gr.tol[i];
  if (!gr.pass)
    fg_check_bwd_fail(r, "%s (dK, dV: %" PRId64 " periods whose signs sum to %" PRId64 ")",
                      gr.reason, periods, sign_sum);
done:
  fg_dev_free(ctx, q), fg_dev_free(ctx, o), fg_dev_free(ctx, dout), fg_dev_free(ctx, dq);
  fg_dev_free(ctx, k), fg_dev_free(ctx, vv), fg_dev_free(ctx, dk), fg_dev_free(ctx, dv);
  fg_dev_free(ctx, lse);
  free(pq), free(pdo), free(ndo), free(hk), free(hv), free(gq), free(gk), free(gv);
  free(ex_q), free(ex_k), free(ex_v), free(nv_q), free(nv_k), free(nv_v), free(signs);
}
