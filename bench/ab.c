/* ab.c: fg_ab, A/B timing of kernel versions for kernel work: each version is a variant built from
 * a template directory (one flashgen context per version, since a context reads
 * FLASHGEN_TEMPLATE_DIR when it makes its generator), all timed in one process on one problem,
 * interleaved round by round (the order rotates each round), with CUDA events; it prints each
 * version's median, its spread and its ratio to the first. Every version's output is compared
 * with the first's (max |diff|): a rewritten kernel must compute the same function. This is a
 * timing tool; `flashgen check` is the correctness gate. Backward variants (bwd_...) time the
 * backward plan on dO, O and LSE from the built-in forward (TFLOP/s count 2.5x the forward's;
 * the diff is dQ's; --deterministic runs them in deterministic mode, and a version written
 * DIR:VARIANT+det runs in it alone, so that one run times deterministic mode against the
 * other); the versions of one run are all forward or all backward.
 *
 * Run on a machine with a GPU (the kernels are compiled there, with NVRTC):
 *   build/fg_ab [--problem d=128,n=1k,dtype=bf16] [--rounds 7] [--reps 10] DIR:VARIANT ...
 * DIR is a template directory, or '-' for the templates built into the library. Example:
 *   build/fg_ab --problem d=128,n=1k - :fwd_d128_br128_bc64_bf16_noncausal_qouter_w4_s2_sm90a \
 *                                    /tmp/tpl_b:fwd_d128_br128_bc64_bf16_noncausal_qouter_w4_s2_sm90a */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fg_autotune.h"
#include "fg_jit.h"

#define AB_MAX 16   /* versions */
#define AB_REPS 64  /* calls per version and round (one pair of events each) */

typedef struct version {
  char dir[512];
  fg_variant v;
  char name[FG_VARIANT_NAME_MAX];
  int det; /* DIR:VARIANT+det: this backward version in deterministic mode */
  fg_context *ctx;
  double *ms;
  int n;
} version;

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double quantile(double *x, int n, double q) {
  qsort(x, (size_t)n, sizeof *x, cmp_double);
  return x[(int)(q * (n - 1) + 0.5)];
}

/* Normal(0, 1) by Box-Muller from a 64-bit LCG; never all zeros. */
static double normal(uint64_t *s) {
  double u[2];
  for (int i = 0; i < 2; i++) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    u[i] = ((*s >> 11) + 0.5) / 9007199254740992.0;
  }
  return sqrt(-2.0 * log(u[0])) * cos(6.283185307179586 * u[1]);
}

static int fail(const char *what, fg_context *ctx) {
  fprintf(stderr, "fg_ab: %s: %s\n", what, ctx ? fg_context_last_error(ctx) : fg_last_create_error());
  return 1;
}

/* The backward of version v on one input set (dQ into dq). */
static int ab_deterministic; /* --deterministic: backward versions in deterministic mode */
static int ab_bshd;          /* --bshd: the forward's Q, K, V, O in the (B, N, H, d) layout */
static int ab_pitch;         /* --pitch P: the forward's rows P elements apart ((B, H, N, d) layout) */

static fg_status ab_backward(fg_context *ctx, const fg_attention_args *f, CUdeviceptr q,
                             CUdeviceptr k, CUdeviceptr v, CUdeviceptr o, CUdeviceptr d_o,
                             CUdeviceptr lse, CUdeviceptr dq, CUdeviceptr dk, CUdeviceptr dv,
                             CUstream st, const fg_variant *var, int det) {
  fg_attention_backward_args b;
  memset(&b, 0, sizeof b);
  b.size = sizeof b;
  b.dtype = f->dtype;
  b.causal = f->causal;
  b.batch = f->batch, b.heads_q = f->heads_q, b.heads_kv = f->heads_kv;
  b.seqlen_q = f->seqlen_q, b.seqlen_k = f->seqlen_k, b.head_dim = f->head_dim;
  b.q = (const void *)(uintptr_t)q, b.k = (const void *)(uintptr_t)k;
  b.v = (const void *)(uintptr_t)v, b.o = (const void *)(uintptr_t)o;
  b.d_o = (const void *)(uintptr_t)d_o, b.lse = (const float *)(uintptr_t)lse;
  b.dq = (void *)(uintptr_t)dq, b.dk = (void *)(uintptr_t)dk, b.dv = (void *)(uintptr_t)dv;
  b.deterministic = ab_deterministic || det;
  return fg_attention_backward_variant(ctx, &b, st, var);
}

/* '-' renders the template text built into this binary, which after an edit of templates/ (or a
 * revert of one) is that folder's text only once fg_ab is rebuilt: a stale '-' baseline once made
 * an unchanged kernel look 20% slower than a candidate (bench/NOTES.md, session 28). So where the
 * working directory has a templates/ folder, each '-' version's source is rendered from both and
 * a difference is said on stderr. The source of v from the templates under dir ('-': the built-in
 * ones), malloc'd; NULL where it cannot be rendered. It leaves FLASHGEN_TEMPLATE_DIR set or unset:
 * main sets it for every version's context next. */
static char *ab_render(const char *dir, const fg_variant *v) {
  if (strcmp(dir, "-") == 0) unsetenv("FLASHGEN_TEMPLATE_DIR");
  else setenv("FLASHGEN_TEMPLATE_DIR", dir, 1);
  fg_generator *g = NULL;
  char *src = NULL, err[256];
  fg_kernel_meta meta;
  if (fg_generator_create(&g, err, sizeof err) == 0 &&
      fg_generator_render(g, v, &src, &meta, err, sizeof err) != 0)
    src = NULL;
  if (g) fg_generator_destroy(g);
  return src;
}

static void ab_check_builtin(const version *ver, int nv) {
  FILE *f = fopen("templates/fwd.lua", "r");
  if (!f) return;
  fclose(f);
  for (int i = 0; i < nv; i++) {
    int seen = strcmp(ver[i].dir, "-") != 0;
    for (int j = 0; j < i && !seen; j++)  /* once per variant */
      seen = strcmp(ver[j].dir, "-") == 0 && strcmp(ver[j].name, ver[i].name) == 0;
    if (seen) continue;
    char *b = ab_render("-", &ver[i].v), *t = ab_render("templates", &ver[i].v);
    if (b && t && strcmp(b, t) != 0)
      fprintf(stderr,
              "fg_ab: warning: [%d] '-' renders %s from the templates built into this binary, "
              "which differ from ./templates: rebuild fg_ab, or name a folder instead of '-'\n",
              i, ver[i].name);
    free(b);
    free(t);
  }
}

int main(int argc, char **argv) {
  const char *problem = "d=128,n=1k";
  int rounds = 7, reps = 10;
  version ver[AB_MAX];
  int nv = 0;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--problem") == 0 && i + 1 < argc) problem = argv[++i];
    else if (strcmp(argv[i], "--rounds") == 0 && i + 1 < argc) rounds = atoi(argv[++i]);
    else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc) reps = atoi(argv[++i]);
    else if (strcmp(argv[i], "--deterministic") == 0) ab_deterministic = 1;
    else if (strcmp(argv[i], "--bshd") == 0) ab_bshd = 1;
    else if (strcmp(argv[i], "--pitch") == 0 && i + 1 < argc) ab_pitch = atoi(argv[++i]);
    else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
      printf("usage: fg_ab [--problem P] [--rounds R] [--reps K] [--deterministic] [--bshd | --pitch P] DIR:VARIANT[+det] ...\n"
             "  P as in `flashgen tune` (default d=128,n=1k); DIR '-' = the built-in templates;\n"
             "  R rounds (default 7) of K calls per version (default 10, at most %d);\n"
             "  --deterministic: backward versions in deterministic mode; +det: that version.\n"
             "  --bshd: the forward's tensors in the (B, N, H, d) layout (default (B, H, N, d));\n"
             "  --pitch P: (B, H, N, d) with rows P >= d elements apart (the forward's).\n", AB_REPS);
      return 0;
    } else {
      const char *colon = strchr(argv[i], ':');
      if (!colon || nv == AB_MAX) {
        fprintf(stderr, "fg_ab: '%s' is not DIR:VARIANT (or more than %d versions)\n", argv[i],
                AB_MAX);
        return 2;
      }
      version *x = &ver[nv];
      memset(x, 0, sizeof *x);
      snprintf(x->dir, sizeof x->dir, "%.*s", (int)(colon - argv[i]), argv[i]);
      char err[256];
      snprintf(x->name, sizeof x->name, "%s", colon + 1);
      const size_t len = strlen(x->name);
      if (len > 4 && strcmp(x->name + len - 4, "+det") == 0) x->name[len - 4] = '\0', x->det = 1;
      if (fg_variant_parse(x->name, &x->v, err, sizeof err)) {
        fprintf(stderr, "fg_ab: %s\n", err);
        return 2;
      }
      nv++;
    }
  }
  fg_tune_problem pr;
  char err[256];
  if (nv == 0 || rounds < 1 || reps < 1 || reps > AB_REPS) {
    fprintf(stderr, "fg_ab: give at least one DIR:VARIANT, --rounds >= 1 and --reps 1..%d (see "
            "--help)\n", AB_REPS);
    return 2;
  }
  if (fg_tune_problem_parse(problem, &pr, err, sizeof err)) {
    fprintf(stderr, "fg_ab: %s\n", err);
    return 2;
  }

  ab_check_builtin(ver, nv);
  for (int i = 0; i < nv; i++) {
    if (strcmp(ver[i].dir, "-") == 0) unsetenv("FLASHGEN_TEMPLATE_DIR");
    else setenv("FLASHGEN_TEMPLATE_DIR", ver[i].dir, 1);
    fg_context_options o = {0};
    o.size = sizeof o;
    o.no_disk_cache = 1;
    if (fg_context_create(&ver[i].ctx, &o) != FG_OK) return fail("creating a context", NULL);
    fg_generator *g;
    if (fg_context_generator(ver[i].ctx, &g) != FG_OK) return fail(ver[i].dir, ver[i].ctx);
    ver[i].ms = calloc((size_t)(rounds * reps), sizeof(double));
    if (!ver[i].ms) {
      fprintf(stderr, "fg_ab: out of host memory\n");
      return 1;
    }
  }
  fg_context *c0 = ver[0].ctx;

  /* Inputs: (B, H, N, d) contiguous, N(0, 1) in the problem's dtype; enough sets that one pass
   * over them exceeds twice the L2, so no call runs from cache. */
  if (ab_pitch && (ab_pitch < pr.d || ab_bshd)) {
    fprintf(stderr, "fg_ab: --pitch %d: at least d = %d, and not with --bshd\n", ab_pitch, pr.d);
    return 2;
  }
  const int pitch = ab_pitch ? ab_pitch : pr.d; /* elements from a row to the next */
  const size_t elems = (size_t)(pr.batch * pr.heads * pr.n * pitch);
  const int sets = fg_tune_rotation_sets(elems * 2 * 3, (size_t)c0->limits.l2_bytes);
  CUdeviceptr q[8], k[8], v[8], o[AB_MAX];
  uint16_t *h = malloc(elems * 2), *h0 = malloc(elems * 2);
  if (!h || !h0) {
    fprintf(stderr, "fg_ab: out of host memory (%zu B input buffers)\n", elems * 4);
    return 1;
  }
  uint64_t seed = 0x9e3779b97f4a7c15ull;
  for (int s = 0; s < sets; s++) {
    CUdeviceptr *t[3] = {&q[s], &k[s], &v[s]};
    for (int j = 0; j < 3; j++) {
      for (size_t e = 0; e < elems; e++) h[e] = fg_f32_to_half((float)normal(&seed), pr.dtype);
      if (fg_dev_alloc(c0, t[j], elems * 2) || fg_dev_upload(c0, *t[j], h, elems * 2))
        return fail("uploading inputs", c0);
    }
  }
  for (int i = 0; i < nv; i++)
    if (fg_dev_alloc(c0, &o[i], elems * 2) || fg_dev_fill16(c0, o[i], 0xFFFF, elems))
      return fail("allocating outputs", c0);
  const int bwd = ver[0].v.pass == FG_PASS_BWD;
  for (int i = 1; i < nv; i++)
    if ((ver[i].v.pass == FG_PASS_BWD) != bwd) {
      fprintf(stderr, "fg_ab: the versions of one run are all forward or all backward\n");
      return 2;
    }
  for (int i = 0; i < nv; i++)
    if (ver[i].det && !bwd) {
      fprintf(stderr, "fg_ab: +det is for backward versions (%s)\n", ver[i].name);
      return 2;
    }
  /* Backward: dO per set, the forward's O and LSE per set, dK and dV per version (o[] is dQ). */
  CUdeviceptr dO[8] = {0}, fo[8] = {0}, lse[8] = {0}, dk[AB_MAX] = {0}, dv[AB_MAX] = {0};
  const size_t rows = (size_t)(pr.batch * pr.heads * pr.n);
  for (int s2 = 0; bwd && s2 < sets; s2++) {
    for (size_t e = 0; e < elems; e++) h[e] = fg_f32_to_half((float)normal(&seed), pr.dtype);
    if (fg_dev_alloc(c0, &dO[s2], elems * 2) || fg_dev_upload(c0, dO[s2], h, elems * 2) ||
        fg_dev_alloc(c0, &fo[s2], elems * 2) || fg_dev_alloc(c0, &lse[s2], rows * 4))
      return fail("allocating backward inputs", c0);
  }
  for (int i = 0; bwd && i < nv; i++)
    if (fg_dev_alloc(c0, &dk[i], elems * 2) || fg_dev_alloc(c0, &dv[i], elems * 2))
      return fail("allocating gradients", c0);
  CUstream st;
  CUevent e0[AB_REPS], e1[AB_REPS];
  if (fg_stream_create(c0, &st)) return fail("creating a stream", c0);
  for (int r = 0; r < reps; r++)
    if (fg_event_create(c0, &e0[r]) || fg_event_create(c0, &e1[r])) return fail("events", c0);

  fg_attention_args a = {0};
  a.dtype = pr.dtype;
  a.causal = pr.causal;
  a.batch = pr.batch;
  a.heads_q = a.heads_kv = pr.heads;
  a.seqlen_q = a.seqlen_k = pr.n;
  a.head_dim = pr.d;
  if ((ab_bshd || ab_pitch) && bwd) {
    fprintf(stderr, "fg_ab: --bshd and --pitch time the forward only\n");
    return 2;
  }
  if (ab_pitch || ab_bshd) { /* (B, H, N, d) with rows `pitch` apart, or (B, N, H, d) */
    const int64_t st3[3] = {(int64_t)pr.heads * pr.n * pitch, ab_bshd ? pr.d : (int64_t)pr.n * pitch,
                            ab_bshd ? (int64_t)pr.heads * pr.d : pitch};
    memcpy(a.q_stride, st3, sizeof st3);
    memcpy(a.k_stride, st3, sizeof st3);
    memcpy(a.v_stride, st3, sizeof st3);
    memcpy(a.o_stride, st3, sizeof st3);
  }
  if (bwd) {
    for (int s2 = 0; s2 < sets; s2++) {
      a.q = (const void *)(uintptr_t)q[s2];
      a.k = (const void *)(uintptr_t)k[s2];
      a.v = (const void *)(uintptr_t)v[s2];
      a.o = (void *)(uintptr_t)fo[s2];
      a.lse = (float *)(uintptr_t)lse[s2];
      if (fg_attention_forward(c0, &a, st) != FG_OK) return fail("the forward", c0);
    }
    a.lse = NULL;
  }
  /* One timed call: version i on input set s2. */
#define AB_CALL(i, s2)                                                                       \
  (bwd ? ab_backward(ver[i].ctx, &a, q[s2], k[s2], v[s2], fo[s2], dO[s2], lse[s2], o[i], dk[i], \
                     dv[i], st, &ver[i].v, ver[i].det)                                        \
       : (a.q = (const void *)(uintptr_t)q[s2], a.k = (const void *)(uintptr_t)k[s2],         \
          a.v = (const void *)(uintptr_t)v[s2], a.o = (void *)(uintptr_t)o[i],                \
          fg_attention_forward_variant(ver[i].ctx, &a, st, &ver[i].v)))
  /* Warm-up: compile and load every version, and write each one's output on set 0. */
  for (int i = 0; i < nv; i++)
    for (int w = 0; w < 3; w++)
      if (AB_CALL(i, 0) != FG_OK) return fail(ver[i].name, ver[i].ctx);
  if (fg_stream_synchronize(c0, st)) return fail("warm-up", c0);
  if (fg_dev_download(c0, h0, o[0], elems * 2)) return fail("downloading", c0);
  double diff[AB_MAX] = {0};
  for (int i = 1; i < nv; i++) {
    if (fg_dev_download(c0, h, o[i], elems * 2)) return fail("downloading", c0);
    for (size_t e = 0; e < elems; e++) {
      if ((int)(e % (size_t)pitch) >= pr.d) continue; /* --pitch: columns past d are no output */
      double x = fg_half_to_f32(h[e], pr.dtype), y = fg_half_to_f32(h0[e], pr.dtype);
      double dd = fabs(x - y);
      if (!(dd <= diff[i])) diff[i] = isnan(dd) ? INFINITY : dd;
    }
  }

  int call = 0;
  for (int r = 0; r < rounds; r++)
    for (int jj = 0; jj < nv; jj++) {
      version *x = &ver[(jj + r) % nv];
      for (int k2 = 0; k2 < reps; k2++, call++) {
        fg_event_record(c0, e0[k2], st);
        if (AB_CALL((int)(x - ver), call % sets) != FG_OK) return fail(x->name, x->ctx);
        fg_event_record(c0, e1[k2], st);
      }
      for (int k2 = 0; k2 < reps; k2++) {
        float ms;
        if (fg_event_elapsed_ms(c0, e0[k2], e1[k2], &ms)) return fail("timing", c0);
        x->ms[x->n++] = ms;
      }
    }

  const double flops = fg_tune_flops(&pr) * (bwd ? 2.5 : 1.0);
  char pb[128];
  fg_tune_problem_format(&pr, pb, sizeof pb);
  printf("fg_ab: %s on %s, %d rounds x %d calls per version, %d input set%s\n", pb,
         c0->limits.name, rounds, reps, sets, sets == 1 ? "" : "s");
  double base = 0;
  for (int i = 0; i < nv; i++) {
    double med = quantile(ver[i].ms, ver[i].n, 0.5);
    double p10 = quantile(ver[i].ms, ver[i].n, 0.1), p90 = quantile(ver[i].ms, ver[i].n, 0.9);
    if (i == 0) base = med;
    printf("  [%d] %-8.3f ms  %6.1f TFLOP/s  p10-p90 %.3f-%.3f  x%.3f  max|diff| %.2e  %s:%s%s\n", i,
           med, flops / (med * 1e-3) / 1e12, p10, p90, base / med, diff[i], ver[i].dir,
           ver[i].name, ver[i].det ? "+det" : "");
  }
  for (int i = 0; i < nv; i++) fg_context_destroy(ver[i].ctx);
  return 0;
}
