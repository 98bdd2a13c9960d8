/* test_cache_files.c: the cache's files: truncated, zeroed and bit-flipped entries are caught,
 * deleted and can be stored again; unusable directories and a full disk degrade with a warning;
 * the directory rules (0700, group/world-writable, symlink, other owner); how the directory is
 * chosen; the schema version and damaged database files. No GPU.
 *
 * Build and run: cmake --build build --target test_cache_files && build/tests/test_cache_files */
#include <criterion/criterion.h>
#include <dirent.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <time.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli_runner.h"
#include "cache_support.h"
#include "fg_cache.h"
#include "fg_cache_internal.h" /* fg_cache_hash64, FG_CACHE_SCHEMA_VERSION */
#include "support_plan.h"

#define NOBODY 65534

TestSuite(cache, .init = fgt_cache_setup, .fini = fgt_cache_teardown);

/* ---- Corruption ---- */

/* Damages the entry of v with sql_or_flip, then: verify counts it, get misses with a warning and
 * deletes it, a new put hits again. */
static void check_damage_is_caught(const char *damage_sql, const char *flip_column) {
  fg_cache *c = fgt_open_ok(fgt_dir);
  const char *v = "fwd_d128_br64_bc64_f16_causal_qouter_w4_s2_sm80";
  fg_kernel_image img = fgt_make_image(v, 11, 40000, 9000);
  fg_cache_key k = fgt_key_of(v);
  fgt_put_ok(c, &k, &img);
  if (damage_sql)
    fgt_db_exec(fg_cache_path(c), damage_sql);
  else
    fgt_flip_bit(fg_cache_path(c), v, flip_column, 1234, 5);

  cr_assert_eq(fg_cache_verify(c, NULL), 1, "verify must see the damaged entry");
  fg_kernel_image got;
  char warn[1024];
  cr_assert_eq(fgt_get(c, &k, &got, warn, sizeof warn), 0, "a damaged entry must be a miss");
  cr_assert_null(got.cubin, "no bytes may be handed out for a damaged entry");
  cr_assert(strstr(warn, "checksum") && strstr(warn, v) && strstr(warn, "deleted"),
            "warning must name the entry and say it was deleted: %s", warn);
  cr_assert_eq(fgt_kernel_count(c), 0, "the damaged entry must be gone");
  cr_assert_eq(fgt_get(c, &k, &got, warn, sizeof warn), 0);
  cr_assert_str_empty(warn, "after deletion it is a plain miss: %s", warn);

  fgt_put_ok(c, &k, &img); /* "recompiled" */
  cr_assert_eq(fgt_get(c, &k, &got, warn, sizeof warn), 1);
  cr_assert(fgt_same_image(&img, &got));
  cr_assert_eq(fg_cache_verify(c, NULL), 0);
  fgt_release(&got);
  fgt_release(&img);
  fg_cache_close(c);
}

Test(cache, truncated_cubin_is_caught) {
  check_damage_is_caught("UPDATE kernels SET cubin = substr(cubin, 1, 1000)", NULL);
}

Test(cache, truncated_cubin_with_matching_size_is_caught) {
  check_damage_is_caught(
      "UPDATE kernels SET cubin = substr(cubin, 1, 1000), size = 1000 + length(ptx)", NULL);
}

Test(cache, zeroed_cubin_is_caught) {
  check_damage_is_caught("UPDATE kernels SET cubin = zeroblob(length(cubin))", NULL);
}

Test(cache, zeroed_ptx_is_caught) {
  check_damage_is_caught("UPDATE kernels SET ptx = zeroblob(length(ptx))", NULL);
}

Test(cache, one_flipped_bit_in_cubin_is_caught) { check_damage_is_caught(NULL, "cubin"); }

Test(cache, one_flipped_bit_in_ptx_is_caught) { check_damage_is_caught(NULL, "ptx"); }

Test(cache, changed_launch_meta_is_caught) {
  check_damage_is_caught("UPDATE kernels SET regs = regs + 1", NULL);
}

Test(cache, changed_plan_is_caught) {
  /* Still a well-formed plan, but not the one stored: the checksum covers it. */
  check_damage_is_caught("UPDATE kernels SET plan = replace(plan, 'q_tiles 64 ', 'q_tiles 32 ')", NULL);
}

Test(cache, malformed_plan_is_caught) {
  check_damage_is_caught("UPDATE kernels SET plan = 'main 7'", NULL);
}

/* A workspace line of the shape before per_key and min_group_rows ("workspace <name> <param>
 * <bytes> <rows> <deterministic_only>") is a malformed plan: a miss, never a plan read without
 * them. */
Test(cache, a_workspace_line_of_the_old_shape_is_caught) {
  check_damage_is_caught(
      "UPDATE kernels SET plan = replace(plan, ' 1 0 0 0' || char(10), ' 1 0' || char(10))", NULL);
}

/* The plan's text carries the per-key workspace and the main step's split_rows, and reads back
 * the same; the old workspace shape, a missing or extra number, a per-key workspace on a grid
 * other than kv_tiles or with rows that do not divide its br, and a split without a per-key
 * workspace of its threshold are refused; a step line without split_rows (written before it)
 * reads as 0. */
/* A plan of one main step (its grid, br, threads, smem and what follows) and one workspace line
 * that the parser refuses, with a word of the reason. */
typedef struct bad_plan {
  const char *step, *line, *why;
} bad_plan;
static void expect_refused(const bad_plan *bad, size_t n) {
  fg_kernel_meta back;
  for (size_t i = 0; i < n; i++) {
    char t[512];
    snprintf(t, sizeof t, "main 0\nstep fg_k %s\n%s\n", bad[i].step, bad[i].line);
    const char *why = fg_kernel_plan_parse(t, &back);
    cr_assert(why && strstr(why, bad[i].why), "%s / %s: %s", bad[i].step, bad[i].line,
              why ? why : "(accepted)");
  }
}

Test(cache, plan_text_of_per_key_workspaces) {
  fg_kernel_meta m, back;
  test_backward_plan(&m, "k", 64, 128, 256, 1000);
  char text[FG_CACHE_PLAN_MAX];
  cr_assert_lt(fg_kernel_plan_format(&m, text, sizeof text), (int)sizeof text);
  cr_assert(strstr(text, "step fg_k kv_tiles 128 256 1000 65536\n"), "%s", text);
  cr_assert(strstr(text, "step fg_k_pre q_tiles 64 128 0\n"), "%s", text); /* no split: 5 numbers */
  cr_assert(strstr(text, "workspace dq_accum workspace 256 1 0 0 0\n"), "%s", text);
  cr_assert(strstr(text, "workspace dkv_accum dkv 65552 128 0 1 65536\n"), "%s", text);
  memset(&back, 0, sizeof back);
  cr_assert_null(fg_kernel_plan_parse(text, &back));
  cr_assert(fgt_same_plan(&m, &back));
  cr_assert_eq(back.workspaces[1].per_key, 1);
  cr_assert_eq(back.workspaces[1].min_group_rows, 65536);
  cr_assert_eq(back.steps[1].split_rows, 65536);
  cr_assert_eq(back.steps[0].split_rows, 0);
  /* A threshold past 2^31 survives (on a plan whose main step does not split). */
  m.workspaces[1].min_group_rows = 5000000000LL;
  m.steps[1].split_rows = 0;
  fg_kernel_plan_format(&m, text, sizeof text);
  cr_assert_null(fg_kernel_plan_parse(text, &back));
  cr_assert_eq(back.workspaces[1].min_group_rows, 5000000000LL);
  static const bad_plan bad[] = {
      {"kv_tiles 128 256 0", "workspace dq_accum workspace 256 1 0", "not main, step"},
      {"kv_tiles 128 256 0", "workspace dq_accum workspace 256 1 0 0", "not main, step"},
      {"kv_tiles 128 256 0", "workspace dq_accum workspace 256 1 0 0 0 0 7", "not main, step"},
      {"kv_tiles 128 256 0", "workspace dkv_accum dkv 512 1 0 1 -1", "per_key or min_group_rows"},
      {"kv_tiles 128 256 0", "workspace dkv_accum dkv 512 1 0 2 0", "per_key or min_group_rows"},
      {"kv_tiles 128 256 0", "workspace dkv_accum dkv 512 48 0 1 0", "does not divide"},
      {"kv_tiles 128 256 0 65536", "workspace dq_accum workspace 256 1 0 0 0", "no per-key workspace"},
      {"kv_tiles 128 256 0 65536", "workspace dkv_accum dkv 512 128 0 1 4096", "no per-key workspace"},
      {"kv_tiles 128 256 0 -1", "workspace dq_accum workspace 256 1 0 0 0", "split_rows"},
      {"q_tiles 128 256 0 65536", "workspace dq_accum workspace 256 1 0 0 0", "split_rows"},
      {"kv_tiles 128 256 0 65536 1 0", "workspace dq_accum workspace 256 1 0 0 0", "not main, step"},
  };
  expect_refused(bad, sizeof bad / sizeof bad[0]);
  const char *fwd = "main 0\nstep fg_k q_tiles 64 256 0\nworkspace dkv_accum dkv 512 1 0 1 0\n";
  const char *why = fg_kernel_plan_parse(fwd, &back);
  cr_assert(why && strstr(why, "kv_tiles"), "%s", why ? why : "(accepted)");
  /* The old step shape (five numbers) is a step that never splits; with the split's workspace
   * the six-number shape splits. */
  cr_assert_null(fg_kernel_plan_parse("main 0\nstep fg_k q_tiles 64 256 0\n", &back));
  cr_assert_eq(back.steps[0].split_rows, 0);
  cr_assert_null(fg_kernel_plan_parse(
      "main 0\nstep fg_k kv_tiles 128 256 0 65536\nworkspace dkv_accum dkv 512 128 0 1 65536\n",
      &back));
  cr_assert_eq(back.steps[0].split_rows, 65536);
}

/* The tail's two fields (tests/support_plan.h: what bwd.lua adds to kv_outer and kv_tma): the
 * main step's line gains a 7th number (tail; split_rows then written even when 0), the tail
 * workspace's line an 8th; every other line keeps its shape, so text written before tail reads
 * as tail 0 and a plan without one writes the same text as before. */
Test(cache, plan_text_of_a_tail) {
  fg_kernel_meta m, back;
  test_backward_plan(&m, "k", 64, 128, 256, 1000);
  char before[FG_CACHE_PLAN_MAX], text[FG_CACHE_PLAN_MAX];
  cr_assert_lt(fg_kernel_plan_format(&m, before, sizeof before), (int)sizeof before);
  test_backward_plan_add_tail(&m, 64, 128);
  cr_assert_null(fg_kernel_meta_invalid(&m));
  cr_assert_lt(fg_kernel_plan_format(&m, text, sizeof text), (int)sizeof text);
  cr_assert(strstr(text, "step fg_k kv_tiles 128 256 1000 65536 1\n"), "%s", text);
  cr_assert(strstr(text, "step fg_k_pre q_tiles 64 128 0\n"), "%s", text);
  cr_assert(strstr(text, "workspace dkv_accum dkv 65552 128 0 1 65536\n"
                         "workspace dkv_tail dkv_tail 65552 128 0 1 0 1\n"
                         "workspace dsum dsum 4 1 0 0 0\n"),
            "%s", text);
  memset(&back, 0, sizeof back);
  cr_assert_null(fg_kernel_plan_parse(text, &back), "%s", text);
  cr_assert(fgt_same_plan(&m, &back));
  cr_assert(back.n_workspaces == 5 && back.steps[1].tail == 1 && back.workspaces[2].tail == 1 &&
            back.steps[0].tail == 0 && back.workspaces[1].tail == 0 && back.workspaces[3].tail == 0);
  /* A tail without a split: split_rows written as 0, so that tail stays the 7th number. */
  m.steps[1].split_rows = 0;
  fg_kernel_plan_format(&m, text, sizeof text);
  cr_assert(strstr(text, "step fg_k kv_tiles 128 256 1000 0 1\n"), "%s", text);
  cr_assert_null(fg_kernel_plan_parse(text, &back), "%s", text);
  cr_assert(back.steps[1].split_rows == 0 && back.steps[1].tail == 1);
  /* Text of before the tail (the same plan without it) reads as it was written: tail 0. */
  memset(&back, 0xff, sizeof back);
  cr_assert_null(fg_kernel_plan_parse(before, &back), "%s", before);
  cr_assert_eq(back.n_workspaces, 4);
  for (int i = 0; i < back.n_steps; i++) cr_assert_eq(back.steps[i].tail, 0, "step %d", i);
  for (int i = 0; i < back.n_workspaces; i++) cr_assert_eq(back.workspaces[i].tail, 0, "workspace %d", i);
  test_backward_plan(&m, "k", 64, 128, 256, 1000);
  cr_assert(fgt_same_plan(&m, &back));
}

/* Each rule of a tail (fg_kernel_meta_invalid), through the text the cache reads: tail is 0 or
 * 1; only a kv_tiles main step runs with one, and then with a tail workspace; a tail workspace is
 * per key block of the main step (per_key 1, rows its br), unconditional (min_group_rows 0, not
 * deterministic_only), and only with a tail main step. */
Test(cache, plan_text_tail_rules) {
  static const bad_plan bad[] = {
      {"kv_tiles 128 256 0 0 2", "workspace dkv_tail dkv_tail 512 128 0 1 0 1",
       "step of its plan is malformed (tail)"},
      {"kv_tiles 128 256 0 0 -1", "workspace dq_accum workspace 256 1 0 0 0",
       "step of its plan is malformed (tail)"},
      {"q_tiles 128 256 0 0 1", "workspace dq_accum workspace 256 1 0 0 0",
       "runs with a tail but is not a kv_tiles main step"},
      {"kv_tiles 128 256 0 0 1", "workspace dkv_tail dkv_tail 512 128 0 1 0 2",
       "workspace of its plan is malformed (tail)"},
      {"kv_tiles 128 256 0 0 1", "workspace dkv_tail dkv_tail 512 128 0 0 0 1",
       "tail workspace of its plan is not per key block"},
      {"kv_tiles 128 256 0 0 1", "workspace dkv_tail dkv_tail 512 64 0 1 0 1",
       "tail workspace of its plan is not per key block"},
      {"kv_tiles 128 256 0 0 1", "workspace dkv_tail dkv_tail 512 128 0 1 65536 1",
       "tail workspace of its plan is not per key block"},
      {"kv_tiles 128 256 0 0 1", "workspace dkv_tail dkv_tail 512 128 1 1 0 1",
       "tail workspace of its plan is not per key block"},
      {"kv_tiles 128 256 0", "workspace dkv_tail dkv_tail 512 128 0 1 0 1",
       "its main step runs without a tail"},
      {"kv_tiles 128 256 0 65536", "workspace dkv_accum dkv 512 128 0 1 65536 1",
       "tail workspace of its plan is not per key block"},
      {"kv_tiles 128 256 0 0 1", "workspace dq_accum workspace 256 1 0 0 0", "no tail workspace"},
      {"kv_tiles 128 256 0 0 1", "workspace dkv_accum dkv 512 128 0 1 0", "no tail workspace"},
  };
  fg_kernel_meta back;
  expect_refused(bad, sizeof bad / sizeof bad[0]);
  /* A kv_tiles step that is not the main step does not run with a tail either. */
  const char *why = fg_kernel_plan_parse("main 1\nstep fg_a kv_tiles 128 256 0 0 1\n"
                                         "step fg_k kv_tiles 128 256 0 0 1\n"
                                         "workspace dkv_tail dkv_tail 512 128 0 1 0 1\n",
                                         &back);
  cr_assert(why && strstr(why, "runs with a tail but is not a kv_tiles main step"), "%s",
            why ? why : "(accepted)");
  cr_assert_null(fg_kernel_plan_parse("main 1\nstep fg_a q_tiles 64 128 0\n"
                                      "step fg_k kv_tiles 128 256 0 0 1\n"
                                      "workspace dkv_tail dkv_tail 512 128 0 1 0 1\n",
                                      &back));
  cr_assert(back.steps[1].tail == 1 && back.workspaces[0].tail == 1);
}

/* FG_CACHE_PLAN_MAX holds the longest plan text there is: FG_PLAN_MAX_STEPS steps and
 * FG_PLAN_MAX_WORKSPACES workspaces with every name and number at its longest, and the tensor
 * maps (the checksum and the stored plan would otherwise be of a truncated text). */
Test(cache, the_longest_plan_text_fits) {
  fg_kernel_meta m;
  memset(&m, 0, sizeof m);
  m.n_steps = FG_PLAN_MAX_STEPS;
  m.main_step = INT32_MIN;
  for (int i = 0; i < FG_PLAN_MAX_STEPS; i++) {
    fg_plan_step *s = &m.steps[i];
    memset(s->entry, 'e', sizeof s->entry - 1);
    s->grid = FG_GRID_PERSISTENT;
    s->br = s->threads = s->smem_bytes = INT32_MIN;
    s->split_rows = INT32_MAX;
    s->tail = INT32_MAX;
  }
  m.n_workspaces = FG_PLAN_MAX_WORKSPACES;
  for (int i = 0; i < FG_PLAN_MAX_WORKSPACES; i++) {
    fg_plan_workspace *w = &m.workspaces[i];
    memset(w->name, 'n', sizeof w->name - 1);
    memset(w->param, 'p', sizeof w->param - 1);
    w->bytes = w->rows = w->deterministic_only = w->per_key = w->tail = INT32_MIN;
    w->min_group_rows = INT64_MIN;
  }
  m.params = FG_PARAMS_BWD_TMA;
  m.n_tmaps = FG_PLAN_MAX_TMAPS;
  for (int i = 0; i < FG_PLAN_MAX_TMAPS; i++) m.tmaps[i] = (fg_plan_tmap){FG_TMAP_DO, INT32_MIN};
  char text[FG_CACHE_PLAN_MAX];
  const int n = fg_kernel_plan_format(&m, text, sizeof text);
  cr_assert(n > 1400 && n < (int)sizeof text, "%d characters", n);
}

Test(cache, missing_cubin_is_caught) {
  check_damage_is_caught("UPDATE kernels SET cubin = NULL", NULL);
}

Test(cache, checksum_is_xxh64) {
  /* Reference values of XXH64 (xxhash 0.8). */
  cr_assert_eq(fg_cache_hash64("", 0, 0), 0xEF46DB3751D8E999ULL);
  cr_assert_eq(fg_cache_hash64(NULL, 0, 0), 0xEF46DB3751D8E999ULL);
  cr_assert_eq(fg_cache_hash64("abc", 3, 0), 0x44BC2CF5AD770999ULL);
  const char *fox = "The quick brown fox jumps over the lazy dog";
  cr_assert_eq(fg_cache_hash64(fox, strlen(fox), 0), 0x0B242D361FDA71BCULL);
  cr_assert_eq(fg_cache_hash64(fox, strlen(fox), 1234567), 0x789C36419F376E77ULL);
  /* Every single-bit flip of a 64 KiB buffer changes the checksum. */
  size_t n = 65536;
  unsigned char *b = malloc(n);
  for (size_t i = 0; i < n; i++) b[i] = (unsigned char)(i * 131 + 7);
  uint64_t h0 = fg_cache_hash64(b, n, 0);
  for (size_t i = 0; i < n; i += 97) {
    for (int bit = 0; bit < 8; bit++) {
      b[i] ^= (unsigned char)(1u << bit);
      cr_assert_neq(fg_cache_hash64(b, n, 0), h0, "flip of byte %zu bit %d undetected", i, bit);
      b[i] ^= (unsigned char)(1u << bit);
    }
  }
  free(b);
}

/* ---- Directories ---- */

Test(cache, directory_is_created_with_mode_0700) {
  mode_t old = umask(0); /* even with a permissive umask */
  char deep[256];
  snprintf(deep, sizeof deep, "%s/a/b/flashgen", fgt_tmp);
  fg_cache *c = fgt_open_ok(deep);
  umask(old);
  struct stat st;
  cr_assert_eq(stat(deep, &st), 0);
  cr_assert(S_ISDIR(st.st_mode));
  cr_assert_eq(st.st_mode & 07777, 0700, "mode %o", (unsigned)(st.st_mode & 07777));
  char db[300];
  snprintf(db, sizeof db, "%s/flashgen.sqlite3", deep);
  cr_assert_str_eq(fg_cache_path(c), db);
  cr_assert_eq(stat(db, &st), 0, "the database is a file in that directory");
  fg_cache_close(c);

  old = umask(0277); /* and with one that would remove the owner's write bit */
  snprintf(deep, sizeof deep, "%s/other", fgt_tmp);
  c = fgt_open_ok(deep);
  umask(old);
  cr_assert_eq(stat(deep, &st), 0);
  cr_assert_eq(st.st_mode & 07777, 0700, "mode %o", (unsigned)(st.st_mode & 07777));
  fg_cache_close(c);
}

Test(cache, group_writable_directory_is_refused) {
  cr_assert_eq(mkdir(fgt_dir, 0700), 0);
  cr_assert_eq(chmod(fgt_dir, 0770), 0);
  fgt_open_refused(fgt_dir, "group-writable");
  char db[300];
  snprintf(db, sizeof db, "%s/flashgen.sqlite3", fgt_dir);
  cr_assert_neq(access(db, F_OK), 0, "nothing may be written into a refused directory");
}

Test(cache, world_writable_directory_is_refused) {
  cr_assert_eq(mkdir(fgt_dir, 0700), 0);
  cr_assert_eq(chmod(fgt_dir, 0707), 0);
  fgt_open_refused(fgt_dir, "world-writable");
  cr_assert_eq(chmod(fgt_dir, 01777), 0); /* like /tmp: sticky does not make it private */
  fgt_open_refused(fgt_dir, "world-writable");
}

Test(cache, symlinked_directory_is_refused) {
  char real[256];
  snprintf(real, sizeof real, "%s/real", fgt_tmp);
  cr_assert_eq(mkdir(real, 0700), 0);
  cr_assert_eq(symlink(real, fgt_dir), 0);
  fgt_open_refused(fgt_dir, "symbolic link");
  fg_cache_close(fgt_open_ok(real)); /* the real directory itself is fine */
}

Test(cache, directory_of_another_user_is_refused) {
  if (geteuid() == 0) {
    cr_assert_eq(mkdir(fgt_dir, 0700), 0);
    cr_assert_eq(chown(fgt_dir, NOBODY, NOBODY), 0);
    fgt_open_refused(fgt_dir, "owned by uid 65534");
  } else {
    fgt_open_refused("/", "owned by uid 0"); /* root's, mode 0755 */
  }
}

Test(cache, path_that_is_a_file_is_refused) {
  cr_assert_eq(close(open(fgt_dir, O_CREAT | O_WRONLY, 0600)), 0);
  fgt_open_refused(fgt_dir, "not a directory");
}

Test(cache, database_that_cannot_be_opened_is_refused) {
  char db[300];
  cr_assert_eq(mkdir(fgt_dir, 0700), 0);
  snprintf(db, sizeof db, "%s/flashgen.sqlite3", fgt_dir);
  cr_assert_eq(mkdir(db, 0700), 0); /* a directory where the database file should be */
  fgt_open_refused(fgt_dir, "not a regular file");
}

Test(cache, missing_and_uncreatable_directory) {
  /* Under a regular file: mkdir fails even for root. */
  char file[256], under[300];
  snprintf(file, sizeof file, "%s/file", fgt_tmp);
  cr_assert_eq(close(open(file, O_CREAT | O_WRONLY, 0600)), 0);
  snprintf(under, sizeof under, "%s/sub/flashgen", file);
  fgt_open_refused(under, "cannot create");
  /* In /proc nobody can create directories. */
  fgt_open_refused("/proc/flashgen-x/cache", "cannot create");
}

/* Runs fn in a child process as user nobody (root only) and returns its exit status. */
static int as_nobody(int (*fn)(void)) {
  pid_t pid = fork();
  if (pid == 0) {
    if (setgroups(0, NULL) != 0 || setgid(NOBODY) != 0 || setuid(NOBODY) != 0) _exit(99);
    _exit(fn());
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 100 + WTERMSIG(status);
}

/* Opening a read-only cache directory must fail with a warning; the caller goes on in memory. */
static int open_readonly_dir(void) {
  char warn[1024];
  fg_cache *c = fg_cache_open(fgt_dir, warn, sizeof warn);
  if (c) return 1;
  if (!strstr(warn, "not writable") || !strstr(warn, "FLASHGEN_CACHE_DIR")) {
    fprintf(stderr, "warning: %s\n", warn);
    return 2;
  }
  return 0;
}

Test(cache, read_only_directory_is_refused) {
  /* First a working cache with an entry, then the directory is made read-only. */
  fg_cache *c = fgt_open_ok(fgt_dir);
  fg_kernel_image img = fgt_make_image("v", 1, 100, 100);
  fg_cache_key k = fgt_key_of("v");
  fgt_put_ok(c, &k, &img);
  fgt_release(&img);
  fg_cache_close(c);
  cr_assert_eq(chmod(fgt_dir, 0500), 0);
  if (geteuid() == 0) {
    /* Root ignores permission bits: check as nobody, in a child, on a copy the child owns. */
    cr_assert_eq(chown(fgt_tmp, NOBODY, NOBODY), 0);
    cr_assert_eq(chown(fgt_dir, NOBODY, NOBODY), 0);
    char db[300];
    snprintf(db, sizeof db, "%s/flashgen.sqlite3", fgt_dir);
    chown(db, NOBODY, NOBODY);
    cr_assert_eq(as_nobody(open_readonly_dir), 0, "as nobody, a 0500 directory must be refused");
  } else {
    cr_assert_eq(open_readonly_dir(), 0);
  }
}

/* A read-only database file in a writable directory: opening may fail or succeed, but a put
 * must not succeed silently and nothing may crash. */
static int readonly_db_file(void) {
  char warn[1024], db[300];
  snprintf(db, sizeof db, "%s/flashgen.sqlite3", fgt_dir);
  if (chmod(db, 0400) != 0) return 3;
  fg_cache *c = fg_cache_open(fgt_dir, warn, sizeof warn);
  if (!c) return warn[0] ? 0 : 4;
  fg_kernel_image img = fgt_make_image("w", 2, 100, 100);
  fg_cache_key k = fgt_key_of("w");
  int rc = fg_cache_put_kernel(c, &k, &img, warn, sizeof warn);
  fgt_release(&img);
  if (rc != -1 || !strstr(warn, "read-only")) {
    fprintf(stderr, "put on a read-only database: %d, %s\n", rc, warn);
    return 5;
  }
  fg_cache_close(c);
  return 0;
}

Test(cache, read_only_database_file) {
  fg_cache *c = fgt_open_ok(fgt_dir);
  fg_cache_close(c);
  if (geteuid() == 0) {
    cr_assert_eq(chown(fgt_tmp, NOBODY, NOBODY), 0);
    cr_assert_eq(chown(fgt_dir, NOBODY, NOBODY), 0);
    char p[300];
    const char *suffix[3] = {"", "-wal", "-shm"};
    for (int i = 0; i < 3; i++) {
      snprintf(p, sizeof p, "%s/flashgen.sqlite3%s", fgt_dir, suffix[i]);
      chown(p, NOBODY, NOBODY);
    }
    cr_assert_eq(as_nobody(readonly_db_file), 0);
  } else {
    cr_assert_eq(readonly_db_file(), 0);
  }
}

Test(cache, full_disk_fails_the_put_with_one_warning) {
  fg_cache *c = fgt_open_ok(fgt_dir);
  fg_cache_key k1 = fgt_key_of("small"), k2 = fgt_key_of("big"), k3 = fgt_key_of("later");
  fg_kernel_image small = fgt_make_image("small", 1, 1000, 1000);
  fg_kernel_image big = fgt_make_image("big", 2, 2000000, 100000);
  fgt_put_ok(c, &k1, &small);
  cr_assert_gt(fg_cache_debug_set_max_pages(c, 0), 0);
  char warn[1024];
  cr_assert_eq(fg_cache_put_kernel(c, &k2, &big, warn, sizeof warn), -1, "a full disk must fail");
  cr_assert(strstr(warn, "full") && strstr(warn, "flashgen cache clear"),
            "the warning must say the disk is full and what to do: %s", warn);
  cr_assert_eq(fg_cache_writable(c), 0);
  /* Only one warning: later writes fail quietly. */
  cr_assert_eq(fg_cache_put_kernel(c, &k3, &small, warn, sizeof warn), -1);
  cr_assert_str_empty(warn);
  fg_tune_candidate cand = {.variant = "small", .ok = 1, .ms = 1, .tflops = 1};
  fg_device_id dev = {.name = "GPU", .cc_major = 9};
  cr_assert_eq(fg_cache_put_tuning(c, &dev, "b", &cand, 1, "small", warn, sizeof warn), -1);
  cr_assert_str_empty(warn);
  /* What was stored is still served, nothing half-written is. */
  fg_kernel_image got;
  cr_assert_eq(fgt_get(c, &k1, &got, NULL, 0), 1);
  cr_assert(fgt_same_image(&small, &got));
  fgt_release(&got);
  cr_assert_eq(fgt_get(c, &k2, &got, NULL, 0), 0);
  cr_assert_eq(fg_cache_verify(c, NULL), 0);
  fg_cache_close(c);
  /* A new handle (a new process) tries again. */
  c = fgt_open_ok(fgt_dir);
  cr_assert_eq(fg_cache_writable(c), 1);
  fgt_put_ok(c, &k2, &big);
  fgt_release(&small);
  fgt_release(&big);
  fg_cache_close(c);
}

/* ---- Directory resolution ---- */

Test(cache, resolve_dir_order) {
  char buf[512];
  setenv("FLASHGEN_CACHE_DIR", "/x/env", 1);
  setenv("XDG_CACHE_HOME", "/x/xdg", 1);
  setenv("HOME", "/x/home", 1);
  cr_assert_eq(fg_cache_resolve_dir("/x/arg", buf, sizeof buf), 0);
  cr_assert_str_eq(buf, "/x/arg");
  cr_assert_eq(fg_cache_resolve_dir(NULL, buf, sizeof buf), 0);
  cr_assert_str_eq(buf, "/x/env");
  unsetenv("FLASHGEN_CACHE_DIR");
  cr_assert_eq(fg_cache_resolve_dir(NULL, buf, sizeof buf), 0);
  cr_assert_str_eq(buf, "/x/xdg/flashgen");
  setenv("XDG_CACHE_HOME", "relative", 1); /* ignored, as the XDG spec says */
  cr_assert_eq(fg_cache_resolve_dir(NULL, buf, sizeof buf), 0);
  cr_assert_str_eq(buf, "/x/home/.cache/flashgen");
  unsetenv("XDG_CACHE_HOME");
  cr_assert_eq(fg_cache_resolve_dir(NULL, buf, sizeof buf), 0);
  cr_assert_str_eq(buf, "/x/home/.cache/flashgen");
  cr_assert_eq(fg_cache_resolve_dir(NULL, buf, 8), -1, "too small a buffer is an error");
}

Test(cache, open_uses_FLASHGEN_CACHE_DIR) {
  setenv("FLASHGEN_CACHE_DIR", fgt_dir, 1);
  fg_cache *c = fgt_open_ok(NULL);
  char want[300];
  snprintf(want, sizeof want, "%s/flashgen.sqlite3", fgt_dir);
  cr_assert_str_eq(fg_cache_path(c), want);
  fg_cache_close(c);
}

/* ---- Schema versions and damaged files ---- */

Test(cache, older_schema_is_rebuilt) {
  cr_assert_eq(mkdir(fgt_dir, 0700), 0);
  char db[300];
  snprintf(db, sizeof db, "%s/flashgen.sqlite3", fgt_dir);
  /* A database from before versioning, with a kernels table of another shape. */
  fgt_db_exec(db,
          "CREATE TABLE kernels(name TEXT, blob BLOB); INSERT INTO kernels VALUES('x', x'00');"
          "CREATE TABLE junk(a); PRAGMA user_version = 0;");
  fg_cache *c = fgt_open_ok(fgt_dir);
  fg_kernel_image img = fgt_make_image("v", 5, 1000, 1000), got;
  fg_cache_key k = fgt_key_of("v");
  fgt_put_ok(c, &k, &img);
  cr_assert_eq(fgt_get(c, &k, &got, NULL, 0), 1);
  cr_assert_eq(fgt_kernel_count(c), 1);
  fgt_release(&got);
  fgt_release(&img);
  fg_cache_close(c);
  sqlite3 *h;
  cr_assert_eq(sqlite3_open(db, &h), SQLITE_OK);
  sqlite3_stmt *st;
  cr_assert_eq(sqlite3_prepare_v2(h, "PRAGMA user_version", -1, &st, NULL), SQLITE_OK);
  cr_assert_eq(sqlite3_step(st), SQLITE_ROW);
  cr_assert_eq(sqlite3_column_int(st, 0), FG_CACHE_SCHEMA_VERSION);
  sqlite3_finalize(st);
  cr_assert_eq(sqlite3_prepare_v2(h, "SELECT count(*) FROM sqlite_master WHERE name = 'junk'", -1,
                                  &st, NULL),
               SQLITE_OK);
  cr_assert_eq(sqlite3_step(st), SQLITE_ROW);
  cr_assert_eq(sqlite3_column_int(st, 0), 0, "the old tables are dropped");
  sqlite3_finalize(st);
  sqlite3_close(h);
}

/* A version-1 database (before plans): its kernel rows held one launch contract (entry ...
 * workspace_floats_per_row) and cannot be read as plans. They are a clean miss (the kernel is
 * compiled again and stored in the new format), never misread; the tuning results stay. */
Test(cache, version_1_kernel_rows_are_a_miss_and_tuning_is_kept) {
  cr_assert_eq(mkdir(fgt_dir, 0700), 0);
  char db[300];
  snprintf(db, sizeof db, "%s/flashgen.sqlite3", fgt_dir);
  const char *v = "bwd_d64_br64_bc64_f16_causal_kvouter_w4_s1_sm80";
  fg_cache_key k = fgt_key_of(v);
  char sql[4096];
  snprintf(sql, sizeof sql,
           "CREATE TABLE kernels(id INTEGER PRIMARY KEY, variant TEXT NOT NULL, arch TEXT NOT NULL,"
           " nvrtc_version INTEGER NOT NULL, template_hash INTEGER NOT NULL,"
           " flashgen_version TEXT NOT NULL, entry TEXT NOT NULL, threads INTEGER NOT NULL,"
           " smem_bytes INTEGER NOT NULL, grid INTEGER NOT NULL, br INTEGER NOT NULL,"
           " workspace_floats_per_row INTEGER NOT NULL, regs INTEGER NOT NULL,"
           " spill_store_bytes INTEGER NOT NULL, spill_load_bytes INTEGER NOT NULL,"
           " stack_bytes INTEGER NOT NULL, size INTEGER NOT NULL, checksum INTEGER NOT NULL,"
           " created INTEGER NOT NULL, cubin BLOB, ptx BLOB,"
           " UNIQUE(variant, arch, nvrtc_version, template_hash, flashgen_version));"
           "CREATE TABLE devices(id INTEGER PRIMARY KEY, name TEXT NOT NULL,"
           " cc_major INTEGER NOT NULL, cc_minor INTEGER NOT NULL, sm_count INTEGER NOT NULL,"
           " driver_version INTEGER NOT NULL,"
           " UNIQUE(name, cc_major, cc_minor, sm_count, driver_version));"
           "CREATE TABLE tuning(device_id INTEGER NOT NULL, bucket TEXT NOT NULL, winner TEXT,"
           " updated INTEGER NOT NULL, PRIMARY KEY(device_id, bucket));"
           "CREATE TABLE candidates(device_id INTEGER NOT NULL, bucket TEXT NOT NULL,"
           " variant TEXT NOT NULL, ok INTEGER NOT NULL, reason TEXT NOT NULL, ms REAL NOT NULL,"
           " tflops REAL NOT NULL, measured INTEGER NOT NULL,"
           " PRIMARY KEY(device_id, bucket, variant));"
           "INSERT INTO kernels VALUES(1, '%s', '%s', %d, %lld, '%s', 'fg_%s', 128, 70000, 4, 64,"
           " 65, 168, 0, 0, 0, 8, 0, 0, x'7f454c46', x'2e656e747279');"
           "INSERT INTO devices VALUES(1, 'NVIDIA A100', 8, 0, 108, 12040);"
           "INSERT INTO tuning VALUES(1, 'bwd_d64_f16_causal_nk4096', '%s', 0);"
           "INSERT INTO candidates VALUES(1, 'bwd_d64_f16_causal_nk4096', '%s', 1, '', 1.0, 100.0,"
           " 0);"
           "PRAGMA user_version = 1;",
           v, fg_arch_name(k.arch), k.nvrtc_version, (long long)fg_cache_u64_to_i64(k.template_hash),
           k.flashgen_version, v, v, v);
  fgt_db_exec(db, sql);
  fg_cache *c = fgt_open_ok(fgt_dir);
  fg_kernel_image got;
  char warn[512] = "";
  cr_assert_eq(fgt_get(c, &k, &got, warn, sizeof warn), 0, "a version-1 row must be a miss");
  cr_assert_null(got.cubin);
  cr_assert_str_empty(warn, "a plain miss, not a damaged entry: %s", warn);
  cr_assert_eq(fgt_kernel_count(c), 0, "the version-1 rows are gone");
  fg_device_id dev = {"NVIDIA A100", 8, 0, 108, 12040};
  char winner[FG_VARIANT_NAME_MAX];
  double tf = 0;
  cr_assert_eq(fg_cache_get_winner(c, &dev, "bwd_d64_f16_causal_nk4096", winner, sizeof winner, &tf),
               1, "the tuning results survive the upgrade");
  cr_assert_str_eq(winner, v);
  /* Compiled again: stored and read back in the new format, plan and all. */
  fg_kernel_image img = fgt_make_image(v, 3, 100, 100);
  fgt_put_ok(c, &k, &img);
  cr_assert_eq(fgt_get(c, &k, &got, NULL, 0), 1);
  cr_assert(fgt_same_image(&img, &got));
  cr_assert_eq(got.meta.n_steps, 3);
  fgt_release(&got);
  fgt_release(&img);
  fg_cache_close(c);
}

Test(cache, newer_schema_is_left_alone_and_refused) {
  cr_assert_eq(mkdir(fgt_dir, 0700), 0);
  char db[300];
  snprintf(db, sizeof db, "%s/flashgen.sqlite3", fgt_dir);
  fgt_db_exec(db, "CREATE TABLE future(a); PRAGMA user_version = 999;");
  char warn[1024];
  cr_assert_null(fg_cache_open(fgt_dir, warn, sizeof warn));
  cr_assert(strstr(warn, "newer flashgen") && strstr(warn, "FLASHGEN_CACHE_DIR"), "%s", warn);
  sqlite3 *h;
  sqlite3_stmt *st;
  cr_assert_eq(sqlite3_open(db, &h), SQLITE_OK);
  cr_assert_eq(sqlite3_prepare_v2(h, "SELECT count(*) FROM future", -1, &st, NULL), SQLITE_OK);
  cr_assert_eq(sqlite3_step(st), SQLITE_ROW);
  sqlite3_finalize(st);
  sqlite3_close(h);
}

Test(cache, damaged_database_file_is_rebuilt) {
  cr_assert_eq(mkdir(fgt_dir, 0700), 0);
  char db[300];
  snprintf(db, sizeof db, "%s/flashgen.sqlite3", fgt_dir);
  FILE *f = fopen(db, "wb");
  cr_assert_not_null(f);
  for (int i = 0; i < 8192; i++) fputc((i * 7) & 0xff, f);
  fclose(f);
  char warn[1024];
  fg_cache *c = fg_cache_open(fgt_dir, warn, sizeof warn);
  cr_assert_not_null(c, "%s", warn);
  cr_assert(strstr(warn, "rebuilt"), "one warning says so: %s", warn);
  fg_kernel_image img = fgt_make_image("v", 5, 1000, 1000), got;
  fg_cache_key k = fgt_key_of("v");
  fgt_put_ok(c, &k, &img);
  cr_assert_eq(fgt_get(c, &k, &got, NULL, 0), 1);
  fgt_release(&got);
  fgt_release(&img);
  fg_cache_close(c);
}
