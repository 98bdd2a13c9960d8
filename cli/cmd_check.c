/* cmd_check.c: `flashgen check`, the GPU correctness program: the options, the cases selected
 * (the forward table of check_cases.c, then the backward cases of check_bwd.c), every kernel
 * they use loaded on several threads first (fg_pool_run), then each case run (check_run.c: the
 * forward call against the reference kernels through fg_gate_forward, the gate `flashgen tune`
 * applies too; or bad input that needs a GPU). No test framework: one line per case,
 * `N passed, N failed` last, exit status 1 on any failure.
 *
 * Build: part of the flashgen command (cmake --build build); run: flashgen check [--quick]. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fg_autotune.h"
#include "fg_check.h"
#include "fg_cli.h"
#include "fg_runtime_internal.h"

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

static void preload(fg_context *ctx, const fg_check_list *l, const char *sel, int jobs) {
  preload_item *items = calloc((size_t)l->n + 8, sizeof *items);
  if (!items) return;
  int n = 0, dtypes_used[3] = {0, 0, 0};
  for (int i = 0; i < l->n; i++) {
    const fg_check_case *c = &l->c[i];
    if (!sel[i] || (c->kind != FG_CHECK_RUN && c->kind != FG_CHECK_BIG)) continue;
    dtypes_used[c->dtype] = 1;
    fg_variant v;
    if (c->forced) {
      v = c->v;
    } else {
      fg_attention_args a;
      fg_check_case_args(c, &a);
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
  double t0 = fg_check_now_ms();
  fprintf(stderr, "loading %d kernels (compiling those not in the cache) on %d threads\n", n, jobs);
  fg_pool_run(n, jobs, preload_one, preload_done, &j);
  if (j.tty) fputc('\n', stderr);
  fprintf(stderr, "loaded %d kernels in %.1f s (%d failed; their cases report why)\n",
          n - j.failed, (fg_check_now_ms() - t0) / 1e3, j.failed);
  free(items);
}

/* ------------------------------------------------------------------------------------------ */
static void check_usage(FILE *f) {
  fprintf(f,
          "usage: flashgen check [--quick] [--filter SUBSTRING] [--list] [--device N] [--seed N]\n"
          "                      [-j N] [--sync] [--verbose]\n\n"
          "Checks the forward kernels on the GPU against an fp64 reference: every variant of\n"
          "the default set, sequence lengths, head dimensions, GQA/MQA, strided layouts, LSE,\n"
          "every loop order (q_outer, kv_outer, and on sm_90a the wgmma kernels, in order and\n"
          "overlapped, and the TMA kernels, tma/...: one to three consumer warpgroups, the\n"
          "tensor maps encoded per call; tma_mask_in_place/...: causal blocks masked in place;\n"
          "tma_persistent/...: the persistent grid, its tiles in a fixed order or from a\n"
          "counter, its consumers in ping-pong or not; tma_cluster/...: clusters of two blocks\n"
          "sharing each K/V block, causal or not), rows that see no key, 64-bit indexing, and\n"
          "bad input. Then the backward pass (cases bwd/...): dQ, dK, dV of the built-in backward\n"
          "variant of every head dimension (the warp-specialised kernel on sm_90a at every\n"
          "head dim; bwd/hopper/...: every Hopper backward variant the tuner tries, forced;\n"
          "bwd/portable/...: the mma.sync kernel at sm_80's and sm_90's built-in shapes),\n"
          "odd sequence lengths, GQA/MQA (bwd/gqa/long_...: query rows per KV head past the\n"
          "split of the main kernel), strides, seqlen_k = 0, batch * heads past the grid, more\n"
          "than 2^31 elements (bwd/big: about 25 GB of device memory; on a smaller GPU it fails\n"
          "saying so), deterministic mode (the same bits twice), bad input, against an fp64\n"
          "reference computed on the host. Inputs are random, outputs and the plans' scratch\n"
          "workspaces start as NaN. Prints one line per case and `N passed, N failed`\n"
          "last; exits 1 on any failure, and 3 when the GPU has not finished a single wait\n"
          "after FLASHGEN_HANG_TIMEOUT seconds (default 300; 0: never), naming the last kernel\n"
          "launched (a kernel that hangs: the process cannot go on).\n\n"
          "  --quick         a subset that runs in under a minute\n"
          "  --filter S      only the cases whose name contains S (S1,S2,...: any of them, run in\n"
          "                  the full run's order; !S: none whose name contains S, e.g.\n"
          "                  bwd/,!bwd/portable/)\n"
          "  --list          print the case names and exit\n"
          "  --device N      CUDA device (default 0)\n"
          "  --seed N        base seed of the random inputs (default 1)\n"
          "  -j N            threads that compile kernels (default: the number of cores)\n"
          "  --sync          in a backward case, wait for the GPU between the forward call that\n"
          "                  makes O and LSE and the backward call (a failure that goes away with\n"
          "                  it depends on the two calls' work overlapping)\n"
          "  --verbose       print the variant and messages of every case\n");
}

int fg_check_selected(const char *name, int is_quick, const char *filter, int quick) {
  if (quick && !is_quick) return 0;
  if (!filter || !*filter) return 1; /* "" selects all, as strstr did */
  int wanted = 0, hit = 0;           /* any plain alternative; one that name contains */
  for (const char *f = filter;;) {
    const char *comma = strchr(f, ',');
    size_t n = comma ? (size_t)(comma - f) : strlen(f);
    const int exclude = n > 0 && *f == '!';
    const char *sub = f + exclude;
    n -= (size_t)exclude;
    /* a substring of n bytes, searched without copying (names are short); empty alternatives,
     * and "!" alone, select nothing by themselves */
    int found = 0;
    for (const char *s = name; n && *s && !found; s++) found = !strncmp(s, sub, n);
    if (exclude && found) return 0;
    if (!exclude && n) wanted = 1, hit |= found;
    if (!comma) break;
    f = comma + 1;
  }
  return wanted ? hit : 1; /* only exclusions: every case but theirs */
}

int fg_cmd_check(int argc, char **argv) {
  int quick = 0, list = 0, verbose = 0, device = 0, sync = 0;
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
    } else if (!strcmp(opt, "--sync")) {
      sync = 1;
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
  if (!list && fg_watchdog_arm("flashgen check", 300) != 0) {
    fg_context_destroy(ctx);
    return 2;
  }
  fg_arch arch = ctx ? fg_context_arch(ctx) : FG_ARCH_SM90A;
  int device_count = 1;
  if (ctx) fg_cu.cuDeviceGetCount(&device_count);
  fg_variant *defs = calloc(FG_DEFAULT_VARIANTS_MAX, sizeof *defs);
  int ndefs = defs ? fg_default_variants(arch, 1, defs, FG_DEFAULT_VARIANTS_MAX) : 0;
  fg_check_list l = {0};
  fg_check_build_cases(&l, defs, ndefs, device_count);
  char *sel = calloc((size_t)l.n + 1, 1);
  int nsel = 0;
  for (int i = 0; sel && i < l.n; i++) {
    sel[i] = fg_check_selected(l.c[i].name, l.c[i].quick, filter, quick);
    nsel += sel[i];
  }
  fg_check_options co;
  memset(&co, 0, sizeof co);
  co.ctx = ctx;
  co.filter = filter;
  co.quick = quick;
  co.list = 1;
  co.verbose = verbose;
  co.sync = sync;
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

  fg_check_env env;
  memset(&env, 0, sizeof env);
  env.ctx = ctx;
  env.seed = seed;
  env.verbose = verbose;
  env.device = device;
  /* Every workspace a plan allocates starts as NaN (and its semaphores as 0xffffffff): a kernel
   * that reads scratch memory it never wrote fails here at once, not only when the memory pool
   * hands back a block an earlier call left such values in. */
  fg_context_poison_workspaces(ctx, 1);
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
  double t_all = fg_check_now_ms();
  for (int i = 0; i < l.n; i++) {
    if (!sel[i]) continue;
    const fg_check_case *c = &l.c[i];
    fg_check_result r;
    double t0 = fg_check_now_ms();
    fg_check_run(&env, c, &r);
    double ms = fg_check_now_ms() - t0;
    if (c->kind == FG_CHECK_RUN || c->kind == FG_CHECK_BIG)
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
  fprintf(stderr, "ran %d cases in %.1f s\n", passed + failed, (fg_check_now_ms() - t_all) / 1e3);
  printf("%d passed, %d failed\n", passed, failed);
  fg_stream_destroy(ctx, env.stream);
  free(sel);
  free(l.c);
  free(defs);
  fg_context_destroy(ctx);
  return failed ? 1 : 0;
}
