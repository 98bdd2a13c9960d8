/* tune_record.c: the results of a tuning run: each candidate's result as the check and timing
 * stages set it (or the failure that broke the CUDA context), the winner picked with hysteresis
 * from this run merged with the cache's record, the record stored, and each problem's report row
 * filled from them. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tune_internal.h"

void fg_tune_set_result(tprob *P, const ttriple *T, int c, int ok, double ms, double tflops,
                        const char *fmt, ...) {
  fg_tune_candidate *r = &P->res[c];
  memset(r, 0, sizeof *r);
  fg_variant_name(&T->cands[c], r->variant, sizeof r->variant);
  r->ok = ok;
  r->ms = ms;
  r->tflops = tflops;
  if (fmt) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->reason, sizeof r->reason, fmt, ap);
    va_end(ap);
  }
  P->have_res[c] = 1;
}

fg_status fg_tune_candidate_failed(trun *R, tprob *P, ttriple *T, int c, const char *name,
                                   const char *doing, const char *prefix) {
  char msg[512];
  snprintf(msg, sizeof msg, "%s", fg_context_last_error(R->ctx));
  fg_tune_set_result(P, T, c, 0, 0, 0, "%s: %s", prefix, msg);
  if (fg_tune_context_alive(R->ctx)) return FG_OK;
  R->fatal = 1;
  R->broken_tri = P->tri;
  R->broken_cand = c;
  return fg_fail(R->ctx, FG_ERROR_CUDA,
                 "the CUDA context became unusable while %s %s (%s); tuning cannot continue in "
                 "this process",
                 doing, name, msg);
}

/* Marks every candidate of problem pi not decided yet as not checked, and why (the row's note). */
void fg_tune_not_checked(trun *R, int pi, const char *why) {
  tprob *P = &R->pr[pi];
  ttriple *T = &R->tri[P->tri];
  snprintf(R->rep->rows[pi].note, sizeof R->rep->rows[pi].note, "%.250s", why);
  for (int c = 0; c < T->n; c++)
    if (P->measure[c] && !P->have_res[c])
      fg_tune_set_result(P, T, c, 0, 0, 0, "not checked: %s", why);
}


/* The times of problem P's candidates that were fully timed and correct (eligible to win), for
 * fg_tune_finalists and fg_tune_pick_winner; ms is 0 for the others. */
void fg_tune_eligible_times(const tprob *P, const ttriple *T, double *ms, int *ok) {
  for (int c = 0; c < T->n; c++) {
    const fg_tune_candidate *r = &P->res[c];
    ok[c] = P->have_res[c] && r->ok && !r->reason[0];
    ms[c] = ok[c] ? r->ms : 0;
  }
}


/* Stores problem pi's record and fills its report row from the record merged with this run. */
void fg_tune_finish_problem(trun *R, int pi) {
  tprob *P = &R->pr[pi];
  ttriple *T = &R->tri[P->tri];
  fg_tune_row *row = &R->rep->rows[pi];
  fg_tune_candidate cands[MAX_CANDS];
  double ms[MAX_CANDS];
  int ok[MAX_CANDS], nc = 0;
  for (int c = 0; c < T->n; c++)
    if (P->have_res[c]) cands[nc++] = P->res[c];
  fg_tune_eligible_times(P, T, ms, ok);
  /* Hysteresis: the previous (smaller) bucket's winner stays the winner unless beaten by more than
   * RUNOFF_WITHIN, the tuner's own run-to-run spread. Near-equals otherwise flipped with the
   * noise: at d=64, N=8k, Bc 32 beat the Bc 64 winner of 4k and 16k by 2-3% here and then ran
   * 5% slower than it in bench/bench.py. */
  int win = fg_tune_pick_winner(ms, ok, T->n, T->last_winner, RUNOFF_WITHIN);
  row->measured = nc;
  const char *keep = NULL; /* the recorded winner, when this run did not measure it */
  if (win < 0 && P->rec_winner[0]) {
    keep = P->rec_winner;
    for (int c = 0; c < T->n; c++)
      if (P->have_res[c] && strcmp(P->res[c].variant, P->rec_winner) == 0) keep = NULL;
    if (keep) {
      snprintf(row->winner, sizeof row->winner, "%s", keep);
      for (int k = 0; k < P->nrec; k++)
        if (strcmp(P->rec[k].variant, keep) == 0) {
          row->winner_ms = P->rec[k].ms;
          row->winner_tflops = P->rec[k].tflops;
        }
    }
  }
  if (win >= 0) {
    fg_variant_name(&T->cands[win], row->winner, sizeof row->winner);
    row->winner_ms = P->res[win].ms;
    row->winner_tflops = P->res[win].tflops;
    T->last_winner = win;
    for (int c = 0; c < T->n; c++)
      if (P->have_res[c] && P->res[c].ok && P->res[c].ms > 0 && P->res[win].ms > 0)
        T->last_ratio[c] = P->res[c].ms / P->res[win].ms;
  }
  if (nc > 0 && R->cache) {
    char warn[1024] = "";
    if (fg_cache_put_tuning(R->cache, &R->devid, row->key, cands, nc,
                            win >= 0 || keep ? row->winner : NULL, warn, sizeof warn) == 0)
      row->stored = 1;
    else
      fg_tune_note(R, "could not store the record of %s: %s", row->key,
                   warn[0] ? warn : "cache not writable");
  }
  /* The merged view: this run's results over the record's. */
  int tried = 0, rejected = 0;
  for (int c = 0; c < T->n; c++) {
    const fg_tune_candidate *r = P->have_res[c] ? &P->res[c] : NULL;
    char name[FG_VARIANT_NAME_MAX];
    fg_variant_name(&T->cands[c], name, sizeof name);
    for (int k = 0; !r && k < P->nrec; k++)
      if (strcmp(P->rec[k].variant, name) == 0) r = &P->rec[k];
    if (!r) continue;
    tried++;
    if (!r->ok) rejected++;
    if (c == T->seed) row->seed_tflops = r->ok ? r->tflops : 0;
  }
  row->tried = tried;
  row->rejected = rejected;
  if (!row->winner[0] && !row->note[0])
    snprintf(row->note, sizeof row->note, "every candidate was rejected");
}

/* Fills the row of a problem that needs no measuring from its record. */
void fg_tune_row_from_record(trun *R, int pi) {
  tprob *P = &R->pr[pi];
  ttriple *T = &R->tri[P->tri];
  fg_tune_row *row = &R->rep->rows[pi];
  int rejected = 0;
  for (int k = 0; k < P->nrec; k++) {
    if (!P->rec[k].ok) rejected++;
    if (strcmp(P->rec[k].variant, P->rec_winner) == 0) {
      row->winner_ms = P->rec[k].ms;
      row->winner_tflops = P->rec[k].tflops;
    }
    if (strcmp(P->rec[k].variant, row->seed_variant) == 0)
      row->seed_tflops = P->rec[k].ok ? P->rec[k].tflops : 0;
  }
  snprintf(row->winner, sizeof row->winner, "%s", P->rec_winner);
  row->tried = P->nrec;
  row->rejected = rejected;
  row->stored = 1;
  for (int c = 0; c < T->n; c++) {
    char name[FG_VARIANT_NAME_MAX];
    fg_variant_name(&T->cands[c], name, sizeof name);
    if (strcmp(name, P->rec_winner) == 0) T->last_winner = c;
  }
  if (!row->winner[0]) snprintf(row->note, sizeof row->note, "recorded without a winner (--retune)");
}

void fg_tune_record_broken(trun *R) {
  if (!R->fatal || !R->cache || R->broken_tri < 0) return;
  ttriple *T = &R->tri[R->broken_tri];
  fg_tune_candidate bc;
  memset(&bc, 0, sizeof bc);
  fg_variant_name(&T->cands[R->broken_cand], bc.variant, sizeof bc.variant);
  snprintf(bc.reason, sizeof bc.reason, "broke the CUDA context: %.200s",
           fg_context_last_error(R->ctx));
  for (int pi = 0; pi < R->n; pi++) {
    tprob *P = &R->pr[pi];
    if (P->dup_of >= 0 || P->tri != R->broken_tri || R->rep->rows[pi].measured || !P->n_measure)
      continue;
    char warn[1024] = "";
    const char *w = P->rec_winner[0] && strcmp(P->rec_winner, bc.variant) ? P->rec_winner : NULL;
    if (fg_cache_put_tuning(R->cache, &R->devid, R->rep->rows[pi].key, &bc, 1, w, warn,
                            sizeof warn) != 0)
      fg_tune_note(R, "could not store the record of %s: %s", R->rep->rows[pi].key, warn);
  }
}
