/* tune.c: a tuning run on the live GPU (`flashgen tune`, fg_tune_run), the same for every pass
 * (forward, backward), in the order it goes: the problems sorted and grouped into triples
 * (pass, d, dtype, causal) with their candidates from the device limits; what each problem must
 * measure beyond the cache's record; every kernel compiled before anything is timed
 * (tune_compile.c); then one problem at a time checked on fresh random inputs (tune_check.c:
 * correct before fast, through the gate `flashgen check` applies too), the correct ones timed
 * over input sets rotated past the L2 (tune_time.c), and the record stored and the row filled
 * (tune_record.c); the report is tune_report.c's. What these files share is tune_internal.h. */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tune_internal.h"

/* Whether two problems share their candidates: the same op, d, dtype and mask. */
static int same_triple(const fg_problem *a, const fg_problem *b) {
  return a->pass == b->pass && a->d == b->d && a->dtype == b->dtype && a->causal == b->causal;
}

static int sort_problem_cmp(const fg_tune_problem *a, const fg_tune_problem *b) {
  if (a->pass != b->pass) return a->pass < b->pass ? -1 : 1;
  if (a->dtype != b->dtype) return a->dtype < b->dtype ? -1 : 1;
  if (a->d != b->d) return a->d < b->d ? -1 : 1;
  if (a->causal != b->causal) return a->causal < b->causal ? -1 : 1;
  if (a->n != b->n) return a->n < b->n ? -1 : 1;
  return 0;
}

void fg_tune_note(const trun *R, const char *fmt, ...) {
  if (R->opt->quiet) return;
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "flashgen tune: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
}

static int find_job(const trun *R, const char *name) {
  for (int j = 0; j < R->njobs; j++)
    if (strcmp(R->jobs[j].name, name) == 0) return j;
  return -1;
}

static int add_job(trun *R, const tjob *j) {
  int k = find_job(R, j->name);
  if (k >= 0) return k;
  R->jobs[R->njobs] = *j;
  return R->njobs++;
}

/* Releases the device state of the check and timing stages: buffers, events, the stream. */
static void free_dev(tdev *D) {
  fg_context *ctx = D->ctx;
  fg_tune_check_free(D);
  fg_dev_free(ctx, D->pool);
  for (int i = 0; i < 2 * TIMED_RUNS; i++) fg_event_destroy(ctx, D->ev[i]);
  fg_stream_destroy(ctx, D->stream);
}

fg_status fg_tune_run(fg_context *ctx, const fg_tune_problem *problems, int n,
                      const fg_tune_options *opt_in, fg_tune_report *rep) {
  const double t_start = fg_tune_now();
  fg_tune_options opt0;
  memset(&opt0, 0, sizeof opt0);
  const fg_tune_options *opt = opt_in ? opt_in : &opt0;
  memset(rep, 0, sizeof *rep);
  if (!ctx || n < 0 || (n > 0 && !problems)) return FG_ERROR_INVALID_ARGUMENT;
  rep->rows = calloc((size_t)(n ? n : 1), sizeof *rep->rows);
  if (!rep->rows) return fg_fail(ctx, FG_ERROR_OUT_OF_MEMORY, "tune: out of memory");
  rep->n_rows = n;
  const fg_rt_limits *L = fg_context_limits(ctx);
  const fg_arch arch = fg_context_arch(ctx);
  snprintf(rep->device, sizeof rep->device, "%.200s, %d SMs, cc %d.%d", L->name, L->sm_count,
           L->cc_major, L->cc_minor);
  snprintf(rep->arch, sizeof rep->arch, "%s", fg_arch_name(arch));
  rep->seed = opt->seed ? opt->seed : ((uint64_t)time(NULL) * 1000003u) ^ (uint64_t)getpid();
  for (int i = 0; i < n; i++) {
    rep->rows[i].problem = problems[i];
    const fg_problem key = fg_tune_problem_key(&problems[i]);
    fg_problem_format(&key, rep->rows[i].key, sizeof rep->rows[i].key);
    snprintf(rep->rows[i].note, sizeof rep->rows[i].note, "not reached");
  }

  char err[2048];
  if (!fg_policy_allows_jit(ctx))
    return fg_fail(ctx, FG_ERROR_UNSUPPORTED,
                   "tuning compiles every candidate, but the context's policy '%s' forbids "
                   "compiling; use the JIT policy",
                   fg_policy_name(fg_context_policy(ctx)));
  if (fg_nvrtc_load(err, sizeof err) != 0)
    return fg_fail(ctx, FG_ERROR_NO_COMPILER,
                   "tuning compiles every candidate with NVRTC, which could not be loaded: %s",
                   err);
  fg_generator *g;
  fg_status st = fg_context_generator(ctx, &g);
  if (st != FG_OK) return st;

  trun R;
  memset(&R, 0, sizeof R);
  R.ctx = ctx;
  R.opt = opt;
  R.problems = problems;
  R.n = n;
  R.rep = rep;
  R.D.ctx = ctx;
  R.broken_tri = R.broken_cand = -1;
  R.D.rng.s = rep->seed ^ 0x5DEECE66Dull;
  fg_device_limits lim;
  fg_context_device_limits(ctx, &lim);
  fg_context_device_id(ctx, &R.devid);
  R.cache = fg_context_cache(ctx); /* warns once itself when it cannot be used */
  if (R.cache) snprintf(rep->cache_path, sizeof rep->cache_path, "%s", fg_cache_path(R.cache));
  fg_cache_key base;
  if (fg_context_cache_key(ctx, &base, err, sizeof err) != 0)
    return fg_fail(ctx, FG_ERROR_INTERNAL, "tune: %s", err);

  R.tri = calloc((size_t)(n ? n : 1), sizeof *R.tri);
  R.pr = calloc((size_t)(n ? n : 1), sizeof *R.pr);
  int *order = calloc((size_t)(n ? n : 1), sizeof *order);
  if (!R.tri || !R.pr || !order) {
    free(R.tri);
    free(R.pr);
    free(order);
    return fg_fail(ctx, FG_ERROR_OUT_OF_MEMORY, "tune: out of memory");
  }

  /* Processing order: grouped by (pass, dtype, d, causal), N ascending. */
  for (int i = 0; i < n; i++) { /* a stable insertion sort: n is small */
    int j = i;
    while (j > 0 && sort_problem_cmp(&problems[order[j - 1]], &problems[i]) > 0) {
      order[j] = order[j - 1];
      j--;
    }
    order[j] = i;
  }

  /* Triples and their candidates; duplicates of a bucket; what each problem must measure. */
  int total_measure = 0;
  for (int oi = 0; oi < n; oi++) {
    const int pi = order[oi];
    const fg_tune_problem *pb = &problems[pi];
    tprob *P = &R.pr[pi];
    fg_tune_row *row = &rep->rows[pi];
    P->dup_of = -1;
    for (int oj = 0; oj < oi && P->dup_of < 0; oj++)
      if (strcmp(rep->rows[order[oj]].key, row->key) == 0) P->dup_of = order[oj];
    fg_problem key = fg_tune_problem_key(pb);
    key.nq = key.nk = 0; /* a triple serves every bucket */
    int t = 0;
    while (t < R.ntri && !same_triple(&R.tri[t].key, &key)) t++;
    if (t == R.ntri) {
      ttriple *T = &R.tri[R.ntri++];
      T->key = key;
      T->n = fg_candidates(g, &key, arch, &lim, T->cands, MAX_CANDS, &T->pruned);
      T->seed_v = fg_baseline_variant(g, &key, arch, &lim);
      fg_problem fwd = key;
      fwd.pass = FG_PASS_FWD;
      T->fwd_v = fg_problem_builtin(&fwd, arch);
      T->seed = -1;
      T->last_winner = -1;
      for (int c = 0; c < T->n; c++) {
        T->job[c] = -1;
        if (T->seed < 0 && memcmp(&T->cands[c], &T->seed_v, sizeof T->seed_v) == 0) T->seed = c;
      }
    }
    P->tri = t;
    ttriple *T = &R.tri[t];
    row->pruned = T->pruned.smem + T->pruned.regs + T->pruned.threads + T->pruned.rules;
    fg_variant_name(&T->seed_v, row->seed_variant, sizeof row->seed_variant);
    if (P->dup_of >= 0) {
      snprintf(row->note, sizeof row->note, "same bucket as an earlier problem");
      continue;
    }
    if (T->n == 0) {
      snprintf(row->note, sizeof row->note,
               "no candidate fits %.120s (%d pruned: %d shared memory, %d registers, %d threads, "
               "%d rules)",
               L->name, row->pruned, T->pruned.smem, T->pruned.regs, T->pruned.threads,
               T->pruned.rules);
      continue;
    }
    if (R.cache && !opt->retune &&
        fg_cache_get_tuning(R.cache, &R.devid, row->key, &P->rec, &P->nrec, P->rec_winner,
                            sizeof P->rec_winner) != 1) {
      free(P->rec);
      P->rec = NULL;
      P->nrec = 0;
      P->rec_winner[0] = '\0';
    }
    /* Measure what the record lacks (everything without a record or with --retune), and then
     * the recorded winner again, so that the comparison is of one run. */
    int any_new = 0, winner_cand = -1;
    for (int c = 0; c < T->n; c++) {
      char name[FG_VARIANT_NAME_MAX];
      fg_variant_name(&T->cands[c], name, sizeof name);
      int recorded = 0;
      for (int k = 0; k < P->nrec && !recorded; k++) recorded = strcmp(P->rec[k].variant, name) == 0;
      P->measure[c] = (unsigned char)!recorded;
      any_new |= !recorded;
      if (strcmp(name, P->rec_winner) == 0) winner_cand = c;
    }
    if (any_new && winner_cand >= 0) P->measure[winner_cand] = 1;
    for (int c = 0; c < T->n; c++) P->n_measure += P->measure[c];
    total_measure += P->n_measure;
  }

  /* Every kernel to compile: the candidates measured, and the reference kernels. */
  int max_jobs = 4;
  for (int t = 0; t < R.ntri; t++) max_jobs += R.tri[t].n + 1; /* + the backward's forward */
  R.jobs = calloc((size_t)max_jobs, sizeof *R.jobs);
  if (!R.jobs) {
    st = fg_fail(ctx, FG_ERROR_OUT_OF_MEMORY, "tune: out of memory");
    goto done;
  }
  int need_ref[3] = {0, 0, 0};
  for (int pi = 0; pi < n; pi++) {
    tprob *P = &R.pr[pi];
    if (P->dup_of >= 0 || P->n_measure == 0) continue;
    ttriple *T = &R.tri[P->tri];
    if (T->key.pass == FG_PASS_FWD) { /* the forward's check runs the reference kernels */
      need_ref[T->key.dtype] = 1;
    } else { /* the backward's check and timing take O and LSE from the built-in forward */
      tjob j;
      memset(&j, 0, sizeof j);
      j.v = T->fwd_v;
      fg_variant_name(&j.v, j.name, sizeof j.name);
      add_job(&R, &j);
    }
    for (int c = 0; c < T->n; c++) {
      if (!P->measure[c] || T->job[c] >= 0) continue;
      tjob j;
      memset(&j, 0, sizeof j);
      j.v = T->cands[c];
      fg_variant_name(&j.v, j.name, sizeof j.name);
      T->job[c] = add_job(&R, &j);
    }
  }
  if (R.cache) /* without a cache the registry compiles the reference kernels itself */
    for (int dt = FG_DTYPE_F16; dt <= FG_DTYPE_BF16; dt++)
      for (int exact = 0; exact <= 1 && need_ref[dt]; exact++) {
        tjob j;
        memset(&j, 0, sizeof j);
        j.is_ref = 1;
        j.ref_dtype = (fg_dtype)dt;
        j.ref_exact = exact;
        snprintf(j.name, sizeof j.name, "ref_%s_%s", exact ? "f64" : "lowp",
                 fg_dtype_name((fg_dtype)dt));
        add_job(&R, &j);
      }

  for (int t = 0; t < R.ntri; t++) {
    const ttriple *T = &R.tri[t];
    fg_tune_note(&R,
                 "%s d=%d %s %s on %s: %d candidates fit; pruned %d by shared memory, %d by "
                 "registers, %d by threads, %d by rules",
                 fg_pass_name(T->key.pass), T->key.d, fg_dtype_name(T->key.dtype),
                 T->key.causal ? "causal" : "noncausal", L->name, T->n, T->pruned.smem,
                 T->pruned.regs, T->pruned.threads, T->pruned.rules);
  }
  if (!R.cache)
    fg_tune_note(&R, "warning: no kernel cache: the tuning results will not be remembered");

  /* Compile everything before timing anything. */
  fg_tune_compile_all(&R, g, &base, arch);

  /* Compile failures are rejections. */
  for (int pi = 0; pi < n; pi++) {
    tprob *P = &R.pr[pi];
    if (P->dup_of >= 0) continue;
    ttriple *T = &R.tri[P->tri];
    for (int c = 0; c < T->n; c++)
      if (P->measure[c] && T->job[c] >= 0 && R.jobs[T->job[c]].state < 0)
        fg_tune_set_result(P, T, c, 0, 0, 0, "%s", R.jobs[T->job[c]].reason);
  }

  /* Check, then time, one problem at a time. */
  if (total_measure > 0) {
    if ((st = fg_stream_create(ctx, &R.D.stream)) != FG_OK) goto done;
    for (int i = 0; i < 2 * TIMED_RUNS; i++)
      if ((st = fg_event_create(ctx, &R.D.ev[i])) != FG_OK) goto done;
  }
  int done_count = 0, todo = 0;
  for (int pi = 0; pi < n; pi++) todo += R.pr[pi].dup_of < 0 && R.pr[pi].n_measure > 0;
  for (int oi = 0; oi < n; oi++) {
    const int pi = order[oi];
    tprob *P = &R.pr[pi];
    fg_tune_row *row = &rep->rows[pi];
    if (P->dup_of >= 0 || R.tri[P->tri].n == 0) continue;
    row->note[0] = '\0';
    if (P->n_measure == 0) {
      fg_tune_row_from_record(&R, pi);
      continue;
    }
    const double t0 = fg_tune_now();
    uint64_t seed = rep->seed + 0x9E3779B97F4A7C15ull * (uint64_t)(pi + 1);
    fg_rng sr = {seed};
    seed = fg_rng_next(&sr);
    st = fg_tune_check_problem(&R, pi, seed);
    const double t1 = fg_tune_now();
    rep->check_s += t1 - t0;
    if (st == FG_OK) st = fg_tune_time_problem(&R, pi);
    rep->timing_s += fg_tune_now() - t1;
    fg_tune_finish_problem(&R, pi);
    done_count++;
    if (st != FG_OK) goto done;
    char pname[96];
    fg_tune_row_problem(row, pname, sizeof pname);
    if (row->winner[0])
      fg_tune_note(&R,
                   "[%d/%d] %s: %s %.1f TFLOP/s (seed rule %.1f), %d measured, %d rejected, %.1f s",
                   done_count, todo, pname, row->winner, row->winner_tflops, row->seed_tflops,
                   row->measured, row->rejected, fg_tune_now() - t0);
    else
      fg_tune_note(&R, "[%d/%d] %s: no correct candidate (%s)", done_count, todo, pname, row->note);
  }
  st = FG_OK;

done:
  if (st != FG_OK) fg_tune_record_broken(&R);
  for (int pi = 0; pi < n; pi++) {
    tprob *P = &R.pr[pi];
    if (P->dup_of >= 0) {
      fg_tune_row keep = rep->rows[pi];
      rep->rows[pi] = rep->rows[P->dup_of];
      rep->rows[pi].problem = keep.problem;
    }
  }
  if (R.cache) fg_dispatch_forget(ctx);
  if (R.D.stream || R.D.pool || R.D.check_elems) free_dev(&R.D);
  for (int j = 0; j < R.njobs; j++)
    if (R.jobs[j].kept) fg_kernel_image_free(&R.jobs[j].img);
  for (int pi = 0; pi < n; pi++) free(R.pr[pi].rec);
  free(R.jobs);
  free(R.tri);
  free(R.pr);
  free(order);
  rep->total_s = fg_tune_now() - t_start;
  return st;
}
