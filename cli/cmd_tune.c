/* cmd_tune.c: `flashgen tune`: option parsing and output around fg_tune_run (autotune/tune.c):
 * which problems (the default set, --quick, PROBLEM arguments, --problems FILE), the report on
 * stdout and in --report FILE (Markdown), and the exit status. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fg_autotune.h"
#include "fg_cli.h"
#include "fg_runtime_internal.h"

static void tune_usage(FILE *f) {
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  fprintf(f,
          "usage: flashgen tune [options] [PROBLEM ...]\n\n"
          "Finds, on the live GPU, the fastest correct kernel variant of each problem (forward or\n"
          "backward) and records it in the kernel cache, where the dispatcher of every later\n"
          "process finds it. Every candidate that fits the GPU is compiled first (in parallel,\n"
          "into the cache), checked against an fp64 reference on fresh random inputs by the gate\n"
          "of `flashgen check` (forward: O and LSE; backward: dQ, dK, dV at B=1, Hq=2, Hkv=1,\n"
          "N=257), then timed with CUDA events (median of 10 runs). A candidate more than 3x\n"
          "slower than the best stops after one run, and\n"
          "one that lost by more than 3x at the previous bucket of the same (d, dtype, causal)\n"
          "is not timed at the larger ones. The candidates within 3%% of the best are timed again,\n"
          "taking turns, and within 3%% the previous bucket's winner keeps winning (the clock's\n"
          "drift under load is about that large). Buckets already tuned on this GPU are skipped\n"
          "unless candidates are new (--retune measures everything again).\n\n"
          "Without PROBLEMs: the default set: d in {64, 128}, f16 and bf16, causal and not,\n"
          "B*N = 16384 tokens, H = 2048/d; forward at N in {512, 1k, 2k, 4k, 8k, 16k} (48\n"
          "problems), backward at N in {1k, 4k} (16; other buckets use the nearest).\n\n"
          "PROBLEM: d=128,dtype=bf16,causal=1,n=4096[,batch=B][,heads=H][,pass=bwd]\n"
          "  d and n are required; dtype defaults to bf16, causal to 0, batch to 16384/n,\n"
          "  heads to 2048/d and pass to fwd (bwd=1 is pass=bwd: the backward, FLOPs counted\n"
          "  2.5x the forward's); n accepts a k suffix (4k = 4096).\n\n"
          "options:\n"
          "  --quick           the default set reduced to bf16, forward N in {1k, 4k} and\n"
          "                    backward N = 4k (12 problems)\n"
          "  --problems FILE   read problems from FILE, one per line ('#' starts a comment)\n"
          "  -j N, --jobs N    compile on N threads (default: the online CPUs, %ld here)\n"
          "  --report FILE     also write the report to FILE as Markdown\n"
          "  --retune          measure candidates already recorded again\n"
          "  --seed N          seed of the random check inputs (default: from the clock)\n"
          "  --device N        CUDA device ordinal (default 0)\n"
          "  --cache-dir DIR   kernel cache directory (default $FLASHGEN_CACHE_DIR, else\n"
          "                    $XDG_CACHE_HOME/flashgen, else ~/.cache/flashgen)\n"
          "  -q, --quiet       no progress or notes on stderr\n"
          "  -h, --help        this text\n\n"
          "exit status: 0 every problem has a winner and its record is stored; 1 failure (no GPU,\n"
          "no NVRTC, a problem without a correct candidate, records not stored); 2 bad usage;\n"
          "3 the GPU has not finished a single wait after FLASHGEN_HANG_TIMEOUT seconds (default\n"
          "300; 0: never): a kernel that hangs, named on stderr (the process cannot go on).\n",
          cpus > 0 ? cpus : 1);
}

/* Parses a non-negative integer option value; 0 on success. */
static int parse_int(const char *opt, const char *s, long long lo, long long hi, long long *out) {
  char *end;
  errno = 0;
  long long v = s ? strtoll(s, &end, 0) : 0;
  if (!s || !*s || errno || *end || v < lo || v > hi) {
    fprintf(stderr, "flashgen tune: %s needs an integer from %lld to %lld, got '%s'\n", opt, lo,
            hi, s ? s : "");
    return -1;
  }
  *out = v;
  return 0;
}

/* The value of an option: "--opt VALUE" or "--opt=VALUE" (and "-jN" for -j). */
static const char *opt_value(int argc, char **argv, int *i, const char *name) {
  const char *a = argv[*i];
  size_t n = strlen(name);
  if (strncmp(a, name, n) == 0 && a[n] == '=') return a + n + 1;
  if (strcmp(name, "-j") == 0 && strncmp(a, "-j", 2) == 0 && a[2]) return a + 2;
  if (*i + 1 >= argc) return NULL;
  return argv[++*i];
}

static int matches(const char *a, const char *name) {
  size_t n = strlen(name);
  return strncmp(a, name, n) == 0 && (a[n] == '\0' || a[n] == '=');
}

int fg_cmd_tune(int argc, char **argv) {
  int quick = 0, quiet = 0, retune = 0, device = 0;
  long long v;
  const char *problems_file = NULL, *report_file = NULL, *cache_dir = NULL;
  fg_tune_options opt;
  memset(&opt, 0, sizeof opt);
  fg_tune_problem *probs = calloc(FG_TUNE_MAX_PROBLEMS, sizeof *probs);
  if (!probs) {
    fprintf(stderr, "flashgen tune: out of memory\n");
    return 1;
  }
  int np = 0, rc = 2;
  char err[1024];

  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
      tune_usage(stdout);
      free(probs);
      return 0;
    } else if (strcmp(a, "--quick") == 0) {
      quick = 1;
    } else if (strcmp(a, "-q") == 0 || strcmp(a, "--quiet") == 0) {
      quiet = 1;
    } else if (strcmp(a, "--retune") == 0) {
      retune = 1;
    } else if (matches(a, "--jobs") || strncmp(a, "-j", 2) == 0) {
      const char *name = a[1] == 'j' ? "-j" : "--jobs";
      if (parse_int(name, opt_value(argc, argv, &i, name), 1, 1024, &v)) goto out;
      opt.jobs = (int)v;
    } else if (matches(a, "--seed")) {
      const char *s = opt_value(argc, argv, &i, "--seed");
      char *end;
      errno = 0;
      unsigned long long u = s ? strtoull(s, &end, 0) : 0;
      if (!s || !*s || errno || *end || u == 0) {
        fprintf(stderr, "flashgen tune: --seed needs a positive integer, got '%s'\n", s ? s : "");
        goto out;
      }
      opt.seed = u;
    } else if (matches(a, "--device")) {
      if (parse_int("--device", opt_value(argc, argv, &i, "--device"), 0, 1023, &v)) goto out;
      device = (int)v;
    } else if (matches(a, "--problems")) {
      problems_file = opt_value(argc, argv, &i, "--problems");
      if (!problems_file || !*problems_file) {
        fprintf(stderr, "flashgen tune: --problems needs a file name\n");
        goto out;
      }
    } else if (matches(a, "--report")) {
      report_file = opt_value(argc, argv, &i, "--report");
      if (!report_file || !*report_file) {
        fprintf(stderr, "flashgen tune: --report needs a file name\n");
        goto out;
      }
    } else if (matches(a, "--cache-dir")) {
      cache_dir = opt_value(argc, argv, &i, "--cache-dir");
      if (!cache_dir || !*cache_dir) {
        fprintf(stderr, "flashgen tune: --cache-dir needs a directory\n");
        goto out;
      }
    } else if (a[0] == '-') {
      fprintf(stderr, "flashgen tune: unknown option '%s' (flashgen tune --help)\n", a);
      goto out;
    } else {
      if (np >= FG_TUNE_MAX_PROBLEMS) {
        fprintf(stderr, "flashgen tune: more than %d problems\n", FG_TUNE_MAX_PROBLEMS);
        goto out;
      }
      if (fg_tune_problem_parse(a, &probs[np], err, sizeof err) != 0) {
        fprintf(stderr, "flashgen tune: %s\n", err);
        goto out;
      }
      np++;
    }
  }
  if (problems_file) {
    int m = fg_tune_problems_read(problems_file, probs + np, FG_TUNE_MAX_PROBLEMS - np, err,
                                  sizeof err);
    if (m < 0) {
      fprintf(stderr, "flashgen tune: %s\n", err);
      goto out;
    }
    np += m;
  }
  if (quick && np > 0) {
    fprintf(stderr, "flashgen tune: --quick reduces the default set; it cannot be combined with "
                    "PROBLEMs or --problems\n");
    goto out;
  }
  if (np == 0) np = fg_tune_default_problems(quick, probs, FG_TUNE_MAX_PROBLEMS);
  if (fg_watchdog_arm("flashgen tune", 300) != 0) goto out;

  rc = 1;
  FILE *report = NULL;
  if (report_file && !(report = fopen(report_file, "w"))) {
    fprintf(stderr, "flashgen tune: cannot write the report to %s: %s\n", report_file,
            strerror(errno));
    goto out;
  }

  fg_context_options co;
  memset(&co, 0, sizeof co);
  co.size = sizeof co;
  co.device = device;
  co.policy = FG_POLICY_JIT;
  co.cache_dir = cache_dir;
  co.quiet = quiet;
  fg_context *ctx = NULL;
  fg_status st = fg_context_create(&ctx, &co);
  if (st != FG_OK) {
    const char *why = fg_last_create_error();
    fprintf(stderr,
            "flashgen tune: tuning needs a CUDA GPU, and none can be used (%s%s%s)\n"
            "  (`flashgen list --arch sm_90a` shows the candidates without a GPU)\n",
            fg_status_string(st), why && *why ? ": " : "", why ? why : "");
    if (report) fclose(report);
    if (report_file) remove(report_file);
    goto out;
  }
  opt.quiet = quiet;
  opt.retune = retune;
  if (!quiet)
    fprintf(stderr, "flashgen tune: %d problem%s on %s\n", np, np == 1 ? "" : "s",
            fg_context_limits(ctx)->name);

  fg_tune_report rep;
  st = fg_tune_run(ctx, probs, np, &opt, &rep);
  char fail[2048] = "";
  if (st != FG_OK)
    snprintf(fail, sizeof fail, "%s: %s", fg_status_string(st), fg_context_last_error(ctx));
  fg_tune_report_print(&rep, stdout, 0);
  fflush(stdout);
  if (report) {
    fg_tune_report_print(&rep, report, 1);
    if (fail[0]) fprintf(report, "\n**The run failed:** %s\n", fail);
    if (fclose(report) != 0)
      fprintf(stderr, "flashgen tune: writing the report to %s failed: %s\n", report_file,
              strerror(errno));
    else if (!quiet)
      fprintf(stderr, "flashgen tune: report written to %s\n", report_file);
  }
  int no_winner = 0, not_stored = 0;
  for (int i = 0; i < rep.n_rows; i++) {
    no_winner += !rep.rows[i].winner[0];
    not_stored += !rep.rows[i].stored;
  }
  if (fail[0]) {
    fprintf(stderr, "flashgen tune: %s\n", fail);
  } else if (no_winner) {
    fprintf(stderr, "flashgen tune: %d of %d problems have no correct candidate (see the table)\n",
            no_winner, rep.n_rows);
  } else if (not_stored) {
    fprintf(stderr, "flashgen tune: the records of %d of %d problems were not stored in the kernel "
                    "cache; the dispatcher will not use them\n",
            not_stored, rep.n_rows);
  } else {
    rc = 0;
  }
  fg_tune_report_free(&rep);
  fg_context_destroy(ctx);
out:
  free(probs);
  return rc;
}
