/* tune_internal.h: what the files of a tuning run share, and nothing outside autotune/ sees:
 * the run's state (trun: its problems, their triples of candidates, the kernels to compile, the
 * device buffers), and the stages that tune.c (the run's order) calls in turn: compiling
 * (tune_compile.c), checking (tune_check.c), timing (tune_time.c), the results and the records
 * (tune_record.c), the report (tune_report.c). */
#ifndef FG_TUNE_INTERNAL_H
#define FG_TUNE_INTERNAL_H
#include <stdint.h>
#include <time.h>

#include "fg_autotune.h"
#include "fg_jit.h"

#define MAX_CANDS 256     /* candidates of one (d, dtype, causal) */
#define TIMED_RUNS 10     /* the median of this many */
#define RUNOFF_WITHIN 1.03 /* candidates this close to the best are timed again, taking turns */

static inline double fg_tune_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Rounds a byte count up to 256 (every tensor of an input set starts aligned). */
static inline size_t fg_tune_align256(size_t b) { return (b + 255) / 256 * 256; }

/* Whether the CUDA context still works after a failure (a sticky error breaks it for good). */
static inline int fg_tune_context_alive(fg_context *ctx) {
  return fg_dev_synchronize(ctx) == FG_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* The state of a run. */

/* A kernel to compile: a candidate or a reference kernel. */
typedef struct tjob {
  int is_ref;
  fg_variant v;                 /* is_ref = 0 */
  fg_dtype ref_dtype;           /* is_ref = 1 */
  int ref_exact;
  char name[FG_VARIANT_NAME_MAX];
  int state;                    /* 0 pending, 1 available, -1 failed */
  int from_cache;
  char reason[256];             /* why it failed */
  int kept;                     /* img holds the image: the cache could not store it */
  fg_kernel_image img;
} tjob;

/* The candidates of one (pass, d, dtype, causal). */
typedef struct ttriple {
  fg_problem key;               /* the op, d, dtype and mask; nq = nk = 0: every bucket */
  fg_variant fwd_v;             /* backward: the forward variant that makes O and LSE */
  fg_variant cands[MAX_CANDS];
  int job[MAX_CANDS];           /* index into the job list, -1 when not compiled */
  int n;
  fg_prune_counts pruned;
  int seed;                     /* index of the baseline (fg_baseline_variant), -1 if it does
                                   not fit */
  fg_variant seed_v;
  int last_winner;              /* index of the winner of the previous bucket, -1 */
  double last_ratio[MAX_CANDS]; /* time / the winner's time at the previous bucket; 0: unknown */
  /* The correctness check runs once per candidate and triple (at the first bucket that
   * measures it): 0 not yet, 1 passed, 2 failed (check_reason says why; every later bucket
   * rejects it with that reason). */
  unsigned char checked[MAX_CANDS];
  char check_reason[MAX_CANDS][512];
} ttriple;

/* What one problem needs. */
typedef struct tprob {
  int tri;                      /* index of its triple, -1 when it has none */
  int dup_of;                   /* an earlier problem with the same key, or -1 */
  fg_tune_candidate *rec;       /* the cache's record of this bucket (malloc'd), or NULL */
  int nrec;
  char rec_winner[FG_VARIANT_NAME_MAX];
  unsigned char measure[MAX_CANDS];
  int n_measure;
  fg_tune_candidate res[MAX_CANDS]; /* this run's results, by candidate index */
  unsigned char have_res[MAX_CANDS];
} tprob;

/* The device side of the checking and timing stages. */
typedef struct tdev {
  fg_context *ctx;
  CUstream stream;
  CUevent ev[2 * TIMED_RUNS];
  /* correctness check: Q, K, V, O, LSE of the candidate; O and LSE of a reference kernel */
  CUdeviceptr cq, ck, cv, co, clse, cref, creflse;
  size_t check_elems, check_rows;
  uint16_t *hq, *hk, *hv, *ho;
  float *hlse;
  double *href, *hreflse, *hlowp;
  /* timing */
  CUdeviceptr pool;
  size_t pool_bytes;
  fg_dtype pool_dtype;          /* what the pool's values are (0: not filled) */
  fg_rng rng;
} tdev;

/* A run: filled by fg_tune_run, read and updated by every stage. */
typedef struct trun {
  fg_context *ctx;
  const fg_tune_options *opt;
  const fg_tune_problem *problems;
  int n;
  fg_tune_report *rep;
  fg_cache *cache;
  fg_device_id devid;
  ttriple *tri;
  int ntri;
  tprob *pr;
  tjob *jobs;
  int njobs;
  tdev D;
  int fatal;                    /* the CUDA context is unusable */
  int broken_tri, broken_cand;  /* the candidate that made it so */
} trun;

/* ------------------------------------------------------------------------------------------ */
/* The run (tune.c). */

/* A progress note on stderr ("flashgen tune: ..."), unless the run is quiet. */
void fg_tune_note(const trun *R, const char *fmt, ...) FG_PRINTF(2, 3);

/* ------------------------------------------------------------------------------------------ */
/* Compiling (tune_compile.c). */

/* Builds every job of R (R->jobs[0..njobs)) on the compile pool, each from the kernel cache
 * (under base, for arch) or built by g and stored there; a candidate that spills too much is
 * failed. Fills the report's kernel counts and compile time, notes every failure, and registers
 * the images the cache could not store as an exported table (kept for the process). */
void fg_tune_compile_all(trun *R, fg_generator *g, const fg_cache_key *base, fg_arch arch);

/* ------------------------------------------------------------------------------------------ */
/* Checking (tune_check.c). */

/* The correctness check of every candidate to measure for problem pi (forward or backward) that
 * no earlier bucket of its triple checked, on fresh random inputs drawn from seed (an earlier
 * bucket's verdict stands: a candidate is checked once per op, d, dtype and mask); a wrong
 * candidate gets its result (rejected) here, a correct one in the timing stage. Returns FG_OK, or a failure that stops the whole run (the
 * context is broken). */
fg_status fg_tune_check_problem(trun *R, int pi, uint64_t seed);
/* Releases the buffers of the correctness check (device and host); they can be made again. */
void fg_tune_check_free(tdev *D);

/* ------------------------------------------------------------------------------------------ */
/* Timing (tune_time.c). */

/* Times every candidate of problem pi that passed the check, then the runoff of the closest. */
fg_status fg_tune_time_problem(trun *R, int pi);

/* ------------------------------------------------------------------------------------------ */
/* Results and records (tune_record.c). */

/* Sets candidate c's result for problem P (reason from fmt when not NULL). */
void fg_tune_set_result(tprob *P, const ttriple *T, int c, int ok, double ms, double tflops,
                        const char *fmt, ...) FG_PRINTF(7, 8);
/* A candidate failed while `doing` (checking, timing): records why (prefix: the context's last
 * error) and, when the failure left the CUDA context unusable, stops the run. Returns FG_OK to
 * go on with the next candidate, or the status that ends tuning in this process. */
fg_status fg_tune_candidate_failed(trun *R, tprob *P, ttriple *T, int c, const char *name,
                                   const char *doing, const char *prefix);
/* Marks every candidate of problem pi not decided yet as not checked, and why (the row's note). */
void fg_tune_not_checked(trun *R, int pi, const char *why);
/* The times of problem P's candidates that were fully timed and correct (eligible to win), for
 * fg_tune_finalists and fg_tune_pick_winner; ms is 0 for the others. */
void fg_tune_eligible_times(const tprob *P, const ttriple *T, double *ms, int *ok);
/* Stores problem pi's record and fills its report row from the record merged with this run. */
void fg_tune_finish_problem(trun *R, int pi);
/* Fills the row of a problem that needs no measuring from its record. */
void fg_tune_row_from_record(trun *R, int pi);
/* After the CUDA context broke (R->fatal): the candidate that broke it is recorded as rejected
 * for every problem of its triple not measured yet, so that the next run (which skips what is
 * recorded) goes on. */
void fg_tune_record_broken(trun *R);

/* ------------------------------------------------------------------------------------------ */
/* The report (tune_report.c). */

/* "d=128 bf16 causal N=4096" (forward), "bwd d=128 bf16 causal N=4096" (backward). */
void fg_tune_row_problem(const fg_tune_row *r, char *buf, size_t len);
#endif
