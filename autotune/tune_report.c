/* tune_report.c: the report of a tuning run (fg_tune_report_print, fg_tune_report_free): the
 * table of problems with their winner, TFLOP/s, the baseline's ("SEED") and the candidate counts,
 * plain or Markdown, then the baselines, the compile/check/timing times and where the records
 * went; and the one-line name of a problem that the progress notes use too. */
#include <stdio.h>
#include <stdlib.h>

#include "tune_internal.h"

/* "d=128 bf16 causal N=4096" (forward), "bwd d=128 bf16 causal N=4096" (backward). */
void fg_tune_row_problem(const fg_tune_row *r, char *buf, size_t len) {
  snprintf(buf, len, "%sd=%d %s %s N=%lld", r->problem.pass == FG_PASS_BWD ? "bwd " : "",
           r->problem.d, fg_dtype_name(r->problem.dtype),
           r->problem.causal ? "causal" : "noncausal", (long long)r->problem.n);
}

void fg_tune_report_print(const fg_tune_report *rep, FILE *out, int md) {
  if (!rep || !out) return;
  if (md) {
    fprintf(out, "# flashgen tune: %s (%s)\n\n", rep->device, rep->arch);
    fprintf(out, "| problem | B x H | winner | TFLOP/s | seed rule TFLOP/s | winner / seed | "
                 "tried | pruned | rejected |\n");
    fprintf(out, "|---|---|---|---:|---:|---:|---:|---:|---:|\n");
  } else {
    fprintf(out, "%-34s %-9s %-56s %8s %8s %7s %5s %6s %8s\n", "PROBLEM", "B x H", "WINNER",
            "TFLOP/s", "SEED", "RATIO", "TRIED", "PRUNED", "REJECTED");
  }
  for (int i = 0; i < rep->n_rows; i++) {
    const fg_tune_row *r = &rep->rows[i];
    char prob[96], bh[32], win[FG_VARIANT_NAME_MAX + 64], tf[32], sd[32], ratio[32];
    fg_tune_row_problem(r, prob, sizeof prob);
    snprintf(bh, sizeof bh, "%lldx%lld", (long long)r->problem.batch, (long long)r->problem.heads);
    if (r->winner[0]) {
      snprintf(win, sizeof win, md ? "`%s`%s" : "%s%s", r->winner, r->measured ? "" : " *");
      snprintf(tf, sizeof tf, r->winner_tflops >= 1 ? "%.1f" : "%.3g", r->winner_tflops);
    } else {
      snprintf(win, sizeof win, "none: %.150s", r->note[0] ? r->note : "no correct candidate");
      snprintf(tf, sizeof tf, "-");
    }
    if (r->seed_tflops > 0)
      snprintf(sd, sizeof sd, r->seed_tflops >= 1 ? "%.1f" : "%.3g", r->seed_tflops);
    else snprintf(sd, sizeof sd, "%s", r->seed_variant[0] ? "rejected" : "-");
    if (r->winner[0] && r->seed_tflops > 0)
      snprintf(ratio, sizeof ratio, "%.2fx", r->winner_tflops / r->seed_tflops);
    else snprintf(ratio, sizeof ratio, "-");
    if (md)
      fprintf(out, "| %s | %s | %s | %s | %s | %s | %d | %d | %d |\n", prob, bh, win, tf, sd,
              ratio, r->tried, r->pruned, r->rejected);
    else
      fprintf(out, "%-34s %-9s %-56s %8s %8s %7s %5d %6d %8d\n", prob, bh, win, tf, sd, ratio,
              r->tried, r->pruned, r->rejected);
  }
  const char *sep = md ? "\n" : "";
  int recorded = 0;
  for (int i = 0; i < rep->n_rows; i++) recorded |= rep->rows[i].winner[0] && !rep->rows[i].measured;
  if (recorded)
    fprintf(out, "%s* already tuned: from the record of an earlier run (--retune measures again)\n",
            sep);
  /* The baseline ("SEED") of each (pass, d, dtype, causal), once: the forward's seed rule, the
   * backward's built-in rule. */
  for (int pass = FG_PASS_FWD; pass <= FG_PASS_BWD; pass++) {
    int header = 0;
    for (int i = 0; i < rep->n_rows; i++) {
      const fg_tune_row *r = &rep->rows[i];
      int seen = (int)r->problem.pass != pass;
      for (int j = 0; j < i && !seen; j++)
        seen = rep->rows[j].problem.pass == r->problem.pass &&
               rep->rows[j].problem.d == r->problem.d &&
               rep->rows[j].problem.dtype == r->problem.dtype &&
               rep->rows[j].problem.causal == r->problem.causal;
      if (seen || !r->seed_variant[0]) continue;
      if (!header++)
        fprintf(out, "%s%s:%s\n", sep,
                pass == FG_PASS_FWD
                    ? "seed-rule candidates (Bc = ceil(M/4d), Br = min(ceil(M/4d), d))"
                    : "backward baseline (SEED): the built-in rule, what runs without a record",
                md ? "\n" : "");
      fprintf(out, "%s %sd=%d %s %s: %s\n", md ? "-" : " ", pass == FG_PASS_BWD ? "bwd " : "",
              r->problem.d, fg_dtype_name(r->problem.dtype),
              r->problem.causal ? "causal" : "noncausal", r->seed_variant);
    }
  }
  fprintf(out, "%skernels: %d (%d from the cache, %d failed to compile or spilled) on %d threads in %.1f s; "
               "checks %.1f s; timing %.1f s; total tune time %.1f s%s\n",
          sep, rep->kernels, rep->kernels_cached, rep->kernels_failed, rep->jobs, rep->compile_s,
          rep->check_s, rep->timing_s, rep->total_s, md ? "  " : "");
  fprintf(out, "records: %s; input seed %llu (--seed to repeat)\n",
          rep->cache_path[0] ? rep->cache_path : "not stored (no kernel cache)",
          (unsigned long long)rep->seed);
}

void fg_tune_report_free(fg_tune_report *rep) {
  if (!rep) return;
  free(rep->rows);
  rep->rows = NULL;
  rep->n_rows = 0;
}
