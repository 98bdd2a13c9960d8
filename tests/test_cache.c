/* test_cache.c: tests of the on-disk cache (cache/): kernels round-trip exactly and every key
 * input misses; truncated, zeroed and bit-flipped entries are caught, deleted and can be stored
 * again; 8 processes writing the same entries; unusable directories and a full disk degrade with
 * a warning; the directory rules (0700, group/world-writable, symlink, other owner); the schema
 * version; tuning records merge; ls / stats / verify / clear. Issue 11: 8 processes opening a
 * garbage database at once lose no store (FG_TEST_RACE_ROUNDS rounds, default 50); a held write
 * lock costs one bounded wait and one warning naming the holder; verify names every unreadable
 * row; clear repairs a zeroed page and says "full" on a full disk. No GPU.
 *
 * Build and run: cmake --build build --target test_cache && build/tests/test_cache */
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

/* ---- Fixture: a fresh private temp dir per test; the cache goes in tmp/c. ---- */

static char g_tmp[64];
static char g_dir[128];

static void setup(void) {
  snprintf(g_tmp, sizeof g_tmp, "/tmp/fg-cache-test-XXXXXX");
  cr_assert_not_null(mkdtemp(g_tmp), "mkdtemp: %s", strerror(errno));
  snprintf(g_dir, sizeof g_dir, "%s/c", g_tmp);
  unsetenv("FLASHGEN_CACHE_DIR");
}

static void teardown(void) { fgt_rm_rf(g_tmp); }

TestSuite(cache, .init = setup, .fini = teardown);

/* ---- Helpers ---- */

static void open_refused(const char *dir, const char *expect_in_warn) {
  char warn[1024];
  fg_cache *c = fg_cache_open(dir, warn, sizeof warn);
  cr_assert_null(c, "fg_cache_open(%s) accepted a directory it must refuse", dir);
  cr_assert(strstr(warn, expect_in_warn) != NULL, "warning lacks \"%s\": %s", expect_in_warn, warn);
  cr_assert(strstr(warn, "FLASHGEN_CACHE_DIR") != NULL, "warning says not what to do: %s", warn);
}

/* A deterministic image: bytes from an LCG seeded by seed. */
static fg_kernel_image make_image(const char *variant, unsigned seed, size_t cubin_size,
                                  size_t ptx_size) {
  fg_kernel_image img;
  memset(&img, 0, sizeof img);
  snprintf(img.variant, sizeof img.variant, "%s", variant);
  img.arch = FG_ARCH_SM80;
  img.cubin = malloc(cubin_size);
  img.ptx = malloc(ptx_size + 1);
  cr_assert(img.cubin && img.ptx);
  unsigned x = seed * 2654435761u + 1;
  for (size_t i = 0; i < cubin_size; i++) {
    x = x * 1664525u + 1013904223u;
    img.cubin[i] = (unsigned char)(x >> 24);
  }
  for (size_t i = 0; i < ptx_size; i++) {
    x = x * 1664525u + 1013904223u;
    img.ptx[i] = (char)('a' + (x >> 24) % 26);
  }
  img.ptx[ptx_size] = '\0';
  img.cubin_size = cubin_size;
  img.ptx_size = ptx_size;
  /* A backward plan (three steps, four workspaces) on odd seeds, a forward one on even. */
  char name[32];
  snprintf(name, sizeof name, "kernel_%u", seed);
  if (seed % 2 == 1)
    test_backward_plan(&img.meta, name, 64 + 8 * (int)(seed % 3), 64, 128 + (int)(seed % 4) * 32,
                       49152 + (int)seed);
  else
    fg_kernel_meta_single(&img.meta, name, FG_GRID_Q_TILES, 64, 128 + (int)(seed % 4) * 32,
                          49152 + (int)seed);
  img.meta.regs = 168;
  img.meta.spill_store_bytes = 8;
  img.meta.spill_load_bytes = 12;
  img.meta.stack_bytes = -1;
  img.compile_ms = 123.5;
  return img;
}

/* Every field of two plans (steps and workspaces) equal. */
static int same_plan(const fg_kernel_meta *a, const fg_kernel_meta *b) {
  if (a->n_steps != b->n_steps || a->main_step != b->main_step ||
      a->n_workspaces != b->n_workspaces)
    return 0;
  for (int i = 0; i < a->n_steps; i++) {
    const fg_plan_step *x = &a->steps[i], *y = &b->steps[i];
    if (strcmp(x->entry, y->entry) || x->grid != y->grid || x->br != y->br ||
        x->threads != y->threads || x->smem_bytes != y->smem_bytes ||
        x->split_rows != y->split_rows)
      return 0;
  }
  for (int i = 0; i < a->n_workspaces; i++) {
    const fg_plan_workspace *x = &a->workspaces[i], *y = &b->workspaces[i];
    if (strcmp(x->name, y->name) || strcmp(x->param, y->param) || x->bytes != y->bytes ||
        x->rows != y->rows || x->deterministic_only != y->deterministic_only ||
        x->per_key != y->per_key || x->min_group_rows != y->min_group_rows)
      return 0;
  }
  return 1;
}

/* The contract of fg_cache_get_kernel: the buffers come from malloc and free() releases them. */
static int same_image(const fg_kernel_image *a, const fg_kernel_image *b) {
  return a->cubin_size == b->cubin_size && a->ptx_size == b->ptx_size &&
         memcmp(a->cubin, b->cubin, a->cubin_size) == 0 &&
         memcmp(a->ptx, b->ptx, a->ptx_size) == 0 && b->ptx[b->ptx_size] == '\0' &&
         same_plan(&a->meta, &b->meta) && a->meta.regs == b->meta.regs && a->meta.spill_store_bytes == b->meta.spill_store_bytes &&
         a->meta.spill_load_bytes == b->meta.spill_load_bytes &&
         a->meta.stack_bytes == b->meta.stack_bytes;
}

/* Runs sql on the cache's database through a separate connection (to damage it on purpose). */
static void db_exec(const char *path, const char *sql) {
  sqlite3 *db = NULL;
  cr_assert_eq(sqlite3_open(path, &db), SQLITE_OK);
  sqlite3_busy_timeout(db, 5000);
  char *err = NULL;
  cr_assert_eq(sqlite3_exec(db, sql, NULL, NULL, &err), SQLITE_OK, "%s: %s", sql, err);
  sqlite3_close(db);
}

/* Flips one bit of the cubin (column "cubin") or ptx of variant's entry. */
static void flip_bit(const char *path, const char *variant, const char *column, size_t byte,
                     int bit) {
  sqlite3 *db = NULL;
  cr_assert_eq(sqlite3_open(path, &db), SQLITE_OK);
  sqlite3_busy_timeout(db, 5000);
  char sql[256];
  snprintf(sql, sizeof sql, "SELECT %s FROM kernels WHERE variant = ?1", column);
  sqlite3_stmt *st = NULL;
  cr_assert_eq(sqlite3_prepare_v2(db, sql, -1, &st, NULL), SQLITE_OK);
  sqlite3_bind_text(st, 1, variant, -1, SQLITE_STATIC);
  cr_assert_eq(sqlite3_step(st), SQLITE_ROW);
  size_t n = (size_t)sqlite3_column_bytes(st, 0);
  cr_assert_gt(n, byte);
  unsigned char *b = malloc(n);
  memcpy(b, sqlite3_column_blob(st, 0), n);
  sqlite3_finalize(st);
  b[byte] ^= (unsigned char)(1u << bit);
  snprintf(sql, sizeof sql, "UPDATE kernels SET %s = ?1 WHERE variant = ?2", column);
  cr_assert_eq(sqlite3_prepare_v2(db, sql, -1, &st, NULL), SQLITE_OK);
  sqlite3_bind_blob(st, 1, b, (int)n, SQLITE_TRANSIENT);
  sqlite3_bind_text(st, 2, variant, -1, SQLITE_STATIC);
  cr_assert_eq(sqlite3_step(st), SQLITE_DONE);
  cr_assert_eq(sqlite3_changes(db), 1);
  sqlite3_finalize(st);
  sqlite3_close(db);
  free(b);
}

/* Reads a whole stream written by a printing function. */
static char *capture(int (*fn)(fg_cache *, FILE *), fg_cache *c, int *ret) {
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  cr_assert_not_null(f);
  *ret = fn(c, f);
  fclose(f);
  return buf;
}

/* ---- Kernels: round trip and keys ---- */

Test(cache, put_then_get_round_trips_bytes_and_meta_exactly) {
  fg_cache *c = fgt_open_ok(g_dir);
  const char *v = "fwd_d128_br128_bc64_bf16_causal_qouter_w4_s2_sm80";
  fg_kernel_image img = make_image(v, 7, 300000, 120000);
  fg_cache_key k = fgt_key_of(v);
  fgt_put_ok(c, &k, &img);
  fg_kernel_image got;
  char warn[1024];
  cr_assert_eq(fgt_get(c, &k, &got, warn, sizeof warn), 1, "miss right after put: %s", warn);
  cr_assert_str_empty(warn);
  cr_assert(same_image(&img, &got), "bytes or meta differ after the round trip");
  cr_assert_str_eq(got.variant, v);
  cr_assert_eq(got.arch, FG_ARCH_SM80);
  cr_assert_eq(got.compile_ms, 0.0, "a cached kernel was not compiled in this process");
  fgt_release(&got);
  fg_cache_close(c);

  /* And from a new handle (another process would see the same). */
  c = fgt_open_ok(g_dir);
  cr_assert_eq(fgt_get(c, &k, &got, warn, sizeof warn), 1);
  cr_assert(same_image(&img, &got));
  fgt_release(&got);
  fgt_release(&img);
  fg_cache_close(c);
}

Test(cache, empty_cubin_and_ptx_round_trip) {
  fg_cache *c = fgt_open_ok(g_dir);
  fg_kernel_image img = make_image("ref", 1, 0, 0);
  fg_cache_key k = fgt_key_of("ref");
  fgt_put_ok(c, &k, &img);
  fg_kernel_image got;
  cr_assert_eq(fgt_get(c, &k, &got, NULL, 0), 1);
  cr_assert_eq(got.cubin_size, 0);
  cr_assert_eq(got.ptx_size, 0);
  cr_assert_not_null(got.ptx);
  cr_assert_eq(got.ptx[0], '\0');
  fgt_release(&got);
  fgt_release(&img);
  fg_cache_close(c);
}

Test(cache, any_key_input_differing_is_a_miss) {
  fg_cache *c = fgt_open_ok(g_dir);
  const char *v = "fwd_d64_br64_bc64_f16_nocausal_qouter_w4_s2_sm80";
  fg_kernel_image img = make_image(v, 3, 5000, 3000);
  fg_cache_key k = fgt_key_of(v);
  fgt_put_ok(c, &k, &img);

  fg_cache_key variants[6];
  for (int i = 0; i < 6; i++) variants[i] = k;
  variants[0].variant = "fwd_d64_br64_bc64_f16_causal_qouter_w4_s2_sm80";
  variants[1].arch = FG_ARCH_SM90A;
  variants[2].nvrtc_version = 12050;
  variants[3].template_hash = k.template_hash ^ 1; /* template text changed */
  variants[4].flashgen_version = "0.1.1";
  variants[5].template_hash = k.template_hash ^ 0x8000000000000000ULL;
  const char *what[6] = {"variant",          "arch",
                         "nvrtc version",    "template hash",
                         "flashgen version", "template hash top bit"};
  for (int i = 0; i < 6; i++) {
    fg_kernel_image got;
    char warn[1024];
    cr_assert_eq(fgt_get(c, &variants[i], &got, warn, sizeof warn), 0,
                 "a different %s must miss, never give a stale kernel", what[i]);
    cr_assert_str_empty(warn, "a plain miss is not a warning: %s", warn);
  }
  fg_kernel_image got;
  cr_assert_eq(fgt_get(c, &k, &got, NULL, 0), 1, "the exact key must still hit");
  fgt_release(&got);
  fgt_release(&img);
  fg_cache_close(c);
}

Test(cache, put_replaces_the_entry_of_the_same_key) {
  fg_cache *c = fgt_open_ok(g_dir);
  fg_cache_key k = fgt_key_of("v1");
  fg_kernel_image a = make_image("v1", 1, 1000, 500), b = make_image("v1", 2, 2000, 700);
  fgt_put_ok(c, &k, &a);
  fgt_put_ok(c, &k, &b);
  cr_assert_eq(fgt_kernel_count(c), 1);
  fg_kernel_image got;
  cr_assert_eq(fgt_get(c, &k, &got, NULL, 0), 1);
  cr_assert(same_image(&b, &got), "the second put must win");
  fgt_release(&got);
  fgt_release(&a);
  fgt_release(&b);
  fg_cache_close(c);
}

Test(cache, null_cache_misses_and_refuses_puts) {
  fg_cache_key k = fgt_key_of("v");
  fg_kernel_image img = make_image("v", 1, 10, 10), got;
  cr_assert_eq(fg_cache_get_kernel(NULL, &k, &got, NULL, 0), 0);
  cr_assert_eq(fg_cache_put_kernel(NULL, &k, &img, NULL, 0), -1);
  cr_assert_eq(fg_cache_writable(NULL), 0);
  fg_cache_close(NULL);
  fgt_release(&img);
}

/* ---- Corruption ---- */

/* Damages the entry of v with sql_or_flip, then: verify counts it, get misses with a warning and
 * deletes it, a new put hits again. */
static void check_damage_is_caught(const char *damage_sql, const char *flip_column) {
  fg_cache *c = fgt_open_ok(g_dir);
  const char *v = "fwd_d128_br64_bc64_f16_causal_qouter_w4_s2_sm80";
  fg_kernel_image img = make_image(v, 11, 40000, 9000);
  fg_cache_key k = fgt_key_of(v);
  fgt_put_ok(c, &k, &img);
  if (damage_sql)
    db_exec(fg_cache_path(c), damage_sql);
  else
    flip_bit(fg_cache_path(c), v, flip_column, 1234, 5);

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
  cr_assert(same_image(&img, &got));
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
  cr_assert(same_plan(&m, &back));
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
  static const struct {
    const char *step, *line, *why;
  } bad[] = {
      {"kv_tiles 128 256 0", "workspace dq_accum workspace 256 1 0", "not main, step"},
      {"kv_tiles 128 256 0", "workspace dq_accum workspace 256 1 0 0", "not main, step"},
      {"kv_tiles 128 256 0", "workspace dq_accum workspace 256 1 0 0 0 7", "not main, step"},
      {"kv_tiles 128 256 0", "workspace dkv_accum dkv 512 1 0 1 -1", "per_key or min_group_rows"},
      {"kv_tiles 128 256 0", "workspace dkv_accum dkv 512 1 0 2 0", "per_key or min_group_rows"},
      {"kv_tiles 128 256 0", "workspace dkv_accum dkv 512 48 0 1 0", "does not divide"},
      {"kv_tiles 128 256 0 65536", "workspace dq_accum workspace 256 1 0 0 0", "no per-key workspace"},
      {"kv_tiles 128 256 0 65536", "workspace dkv_accum dkv 512 128 0 1 4096", "no per-key workspace"},
      {"kv_tiles 128 256 0 -1", "workspace dq_accum workspace 256 1 0 0 0", "split_rows"},
      {"q_tiles 128 256 0 65536", "workspace dq_accum workspace 256 1 0 0 0", "split_rows"},
      {"kv_tiles 128 256 0 65536 1", "workspace dq_accum workspace 256 1 0 0 0", "not main, step"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    char t[512];
    snprintf(t, sizeof t, "main 0\nstep fg_k %s\n%s\n", bad[i].step, bad[i].line);
    const char *why = fg_kernel_plan_parse(t, &back);
    cr_assert(why && strstr(why, bad[i].why), "%s / %s: %s", bad[i].step, bad[i].line,
              why ? why : "(accepted)");
  }
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

/* ---- Concurrency ---- */

#define NPROC 8
#define NKEYS 20

static void key_name(int i, char *buf, size_t len) {
  snprintf(buf, len, "fwd_d%d_br64_bc64_bf16_causal_qouter_w4_s2_sm80", 32 + 8 * i);
}

/* One writer process: waits for the start signal, opens the cache, puts all keys twice (in an
 * order of its own), then reads every one back. Returns an exit code. */
static int writer(int id, int start_fd) {
  char b;
  if (read(start_fd, &b, 1) < 0) return 2;
  char warn[1024];
  fg_cache *c = fg_cache_open(g_dir, warn, sizeof warn);
  if (!c) {
    fprintf(stderr, "writer %d: open: %s\n", id, warn);
    return 10;
  }
  for (int round = 0; round < 2; round++) {
    for (int j = 0; j < NKEYS; j++) {
      int i = (j + id * 3) % NKEYS;
      char name[FG_VARIANT_NAME_MAX];
      key_name(i, name, sizeof name);
      fg_cache_key k = fgt_key_of(name);
      fg_kernel_image img = make_image(name, (unsigned)i, 50000 + 1000 * (size_t)i, 20000);
      int rc = fg_cache_put_kernel(c, &k, &img, warn, sizeof warn);
      fgt_release(&img);
      if (rc != 0) {
        fprintf(stderr, "writer %d: put %s: %s\n", id, name, warn);
        return 20;
      }
    }
  }
  for (int i = 0; i < NKEYS; i++) {
    char name[FG_VARIANT_NAME_MAX];
    key_name(i, name, sizeof name);
    fg_cache_key k = fgt_key_of(name);
    fg_kernel_image want = make_image(name, (unsigned)i, 50000 + 1000 * (size_t)i, 20000), got;
    memset(&got, 0, sizeof got);
    int hit = fg_cache_get_kernel(c, &k, &got, warn, sizeof warn);
    int same = hit == 1 && same_image(&want, &got);
    fgt_release(&want);
    fgt_release(&got);
    if (!same) {
      fprintf(stderr, "writer %d: get %s: hit %d, warn %s\n", id, name, hit, warn);
      return 30;
    }
  }
  fg_cache_close(c);
  return 0;
}

Test(cache, eight_processes_writing_the_same_entries) {
  /* The directory does not exist yet: creating it and the schema is part of the race. */
  int fds[2];
  cr_assert_eq(pipe(fds), 0);
  pid_t pids[NPROC];
  for (int p = 0; p < NPROC; p++) {
    pids[p] = fork();
    cr_assert_geq(pids[p], 0, "fork: %s", strerror(errno));
    if (pids[p] == 0) {
      close(fds[1]);
      _exit(writer(p, fds[0]));
    }
  }
  close(fds[0]);
  close(fds[1]); /* start: every reader sees end of file at once */
  for (int p = 0; p < NPROC; p++) {
    int status = 0;
    cr_assert_eq(waitpid(pids[p], &status, 0), pids[p]);
    cr_assert(
        WIFEXITED(status) && WEXITSTATUS(status) == 0, "writer %d failed (exit %d, signal %d)", p,
        WIFEXITED(status) ? WEXITSTATUS(status) : -1, WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  }
  fg_cache *c = fgt_open_ok(g_dir);
  cr_assert_eq(fgt_kernel_count(c), NKEYS, "one entry per key");
  cr_assert_eq(fg_cache_verify(c, NULL), 0, "every entry valid");
  cr_assert_eq(fg_cache_ls(c, NULL), NKEYS);
  for (int i = 0; i < NKEYS; i++) {
    char name[FG_VARIANT_NAME_MAX];
    key_name(i, name, sizeof name);
    fg_cache_key k = fgt_key_of(name);
    fg_kernel_image want = make_image(name, (unsigned)i, 50000 + 1000 * (size_t)i, 20000), got;
    cr_assert_eq(fgt_get(c, &k, &got, NULL, 0), 1, "%s missing", name);
    cr_assert(same_image(&want, &got), "%s differs", name);
    fgt_release(&want);
    fgt_release(&got);
  }
  fg_cache_close(c);
}

typedef struct thread_arg {
  fg_cache *c;
  int id, failures;
} thread_arg;

static void *thread_main(void *p) {
  thread_arg *a = p;
  for (int i = 0; i < 10; i++) {
    char name[64];
    snprintf(name, sizeof name, "t%d_k%d", a->id, i);
    fg_cache_key k = fgt_key_of(name);
    fg_kernel_image img = make_image(name, (unsigned)(a->id * 100 + i), 20000, 5000), got;
    memset(&got, 0, sizeof got);
    if (fg_cache_put_kernel(a->c, &k, &img, NULL, 0) != 0) a->failures++;
    if (fg_cache_get_kernel(a->c, &k, &got, NULL, 0) != 1 || !same_image(&img, &got)) a->failures++;
    fgt_release(&img);
    fgt_release(&got);
  }
  return NULL;
}

Test(cache, one_handle_shared_by_threads) {
  fg_cache *c = fgt_open_ok(g_dir);
  pthread_t t[4];
  thread_arg a[4];
  for (int i = 0; i < 4; i++) {
    a[i] = (thread_arg){c, i, 0};
    cr_assert_eq(pthread_create(&t[i], NULL, thread_main, &a[i]), 0);
  }
  for (int i = 0; i < 4; i++) {
    pthread_join(t[i], NULL);
    cr_assert_eq(a[i].failures, 0, "thread %d", i);
  }
  cr_assert_eq(fgt_kernel_count(c), 40);
  fg_cache_close(c);
}

/* ---- Directories ---- */

Test(cache, directory_is_created_with_mode_0700) {
  mode_t old = umask(0); /* even with a permissive umask */
  char deep[256];
  snprintf(deep, sizeof deep, "%s/a/b/flashgen", g_tmp);
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
  snprintf(deep, sizeof deep, "%s/other", g_tmp);
  c = fgt_open_ok(deep);
  umask(old);
  cr_assert_eq(stat(deep, &st), 0);
  cr_assert_eq(st.st_mode & 07777, 0700, "mode %o", (unsigned)(st.st_mode & 07777));
  fg_cache_close(c);
}

Test(cache, group_writable_directory_is_refused) {
  cr_assert_eq(mkdir(g_dir, 0700), 0);
  cr_assert_eq(chmod(g_dir, 0770), 0);
  open_refused(g_dir, "group-writable");
  char db[300];
  snprintf(db, sizeof db, "%s/flashgen.sqlite3", g_dir);
  cr_assert_neq(access(db, F_OK), 0, "nothing may be written into a refused directory");
}

Test(cache, world_writable_directory_is_refused) {
  cr_assert_eq(mkdir(g_dir, 0700), 0);
  cr_assert_eq(chmod(g_dir, 0707), 0);
  open_refused(g_dir, "world-writable");
  cr_assert_eq(chmod(g_dir, 01777), 0); /* like /tmp: sticky does not make it private */
  open_refused(g_dir, "world-writable");
}

Test(cache, symlinked_directory_is_refused) {
  char real[256];
  snprintf(real, sizeof real, "%s/real", g_tmp);
  cr_assert_eq(mkdir(real, 0700), 0);
  cr_assert_eq(symlink(real, g_dir), 0);
  open_refused(g_dir, "symbolic link");
  fg_cache_close(fgt_open_ok(real)); /* the real directory itself is fine */
}

Test(cache, directory_of_another_user_is_refused) {
  if (geteuid() == 0) {
    cr_assert_eq(mkdir(g_dir, 0700), 0);
    cr_assert_eq(chown(g_dir, NOBODY, NOBODY), 0);
    open_refused(g_dir, "owned by uid 65534");
  } else {
    open_refused("/", "owned by uid 0"); /* root's, mode 0755 */
  }
}

Test(cache, path_that_is_a_file_is_refused) {
  cr_assert_eq(close(open(g_dir, O_CREAT | O_WRONLY, 0600)), 0);
  open_refused(g_dir, "not a directory");
}

Test(cache, database_that_cannot_be_opened_is_refused) {
  char db[300];
  cr_assert_eq(mkdir(g_dir, 0700), 0);
  snprintf(db, sizeof db, "%s/flashgen.sqlite3", g_dir);
  cr_assert_eq(mkdir(db, 0700), 0); /* a directory where the database file should be */
  open_refused(g_dir, "not a regular file");
}

Test(cache, missing_and_uncreatable_directory) {
  /* Under a regular file: mkdir fails even for root. */
  char file[256], under[300];
  snprintf(file, sizeof file, "%s/file", g_tmp);
  cr_assert_eq(close(open(file, O_CREAT | O_WRONLY, 0600)), 0);
  snprintf(under, sizeof under, "%s/sub/flashgen", file);
  open_refused(under, "cannot create");
  /* In /proc nobody can create directories. */
  open_refused("/proc/flashgen-x/cache", "cannot create");
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
  fg_cache *c = fg_cache_open(g_dir, warn, sizeof warn);
  if (c) return 1;
  if (!strstr(warn, "not writable") || !strstr(warn, "FLASHGEN_CACHE_DIR")) {
    fprintf(stderr, "warning: %s\n", warn);
    return 2;
  }
  return 0;
}

Test(cache, read_only_directory_is_refused) {
  /* First a working cache with an entry, then the directory is made read-only. */
  fg_cache *c = fgt_open_ok(g_dir);
  fg_kernel_image img = make_image("v", 1, 100, 100);
  fg_cache_key k = fgt_key_of("v");
  fgt_put_ok(c, &k, &img);
  fgt_release(&img);
  fg_cache_close(c);
  cr_assert_eq(chmod(g_dir, 0500), 0);
  if (geteuid() == 0) {
    /* Root ignores permission bits: check as nobody, in a child, on a copy the child owns. */
    cr_assert_eq(chown(g_tmp, NOBODY, NOBODY), 0);
    cr_assert_eq(chown(g_dir, NOBODY, NOBODY), 0);
    char db[300];
    snprintf(db, sizeof db, "%s/flashgen.sqlite3", g_dir);
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
  snprintf(db, sizeof db, "%s/flashgen.sqlite3", g_dir);
  if (chmod(db, 0400) != 0) return 3;
  fg_cache *c = fg_cache_open(g_dir, warn, sizeof warn);
  if (!c) return warn[0] ? 0 : 4;
  fg_kernel_image img = make_image("w", 2, 100, 100);
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
  fg_cache *c = fgt_open_ok(g_dir);
  fg_cache_close(c);
  if (geteuid() == 0) {
    cr_assert_eq(chown(g_tmp, NOBODY, NOBODY), 0);
    cr_assert_eq(chown(g_dir, NOBODY, NOBODY), 0);
    char p[300];
    const char *suffix[3] = {"", "-wal", "-shm"};
    for (int i = 0; i < 3; i++) {
      snprintf(p, sizeof p, "%s/flashgen.sqlite3%s", g_dir, suffix[i]);
      chown(p, NOBODY, NOBODY);
    }
    cr_assert_eq(as_nobody(readonly_db_file), 0);
  } else {
    cr_assert_eq(readonly_db_file(), 0);
  }
}

Test(cache, full_disk_fails_the_put_with_one_warning) {
  fg_cache *c = fgt_open_ok(g_dir);
  fg_cache_key k1 = fgt_key_of("small"), k2 = fgt_key_of("big"), k3 = fgt_key_of("later");
  fg_kernel_image small = make_image("small", 1, 1000, 1000);
  fg_kernel_image big = make_image("big", 2, 2000000, 100000);
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
  cr_assert(same_image(&small, &got));
  fgt_release(&got);
  cr_assert_eq(fgt_get(c, &k2, &got, NULL, 0), 0);
  cr_assert_eq(fg_cache_verify(c, NULL), 0);
  fg_cache_close(c);
  /* A new handle (a new process) tries again. */
  c = fgt_open_ok(g_dir);
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
  setenv("FLASHGEN_CACHE_DIR", g_dir, 1);
  fg_cache *c = fgt_open_ok(NULL);
  char want[300];
  snprintf(want, sizeof want, "%s/flashgen.sqlite3", g_dir);
  cr_assert_str_eq(fg_cache_path(c), want);
  fg_cache_close(c);
}

/* ---- Schema versions and damaged files ---- */

Test(cache, older_schema_is_rebuilt) {
  cr_assert_eq(mkdir(g_dir, 0700), 0);
  char db[300];
  snprintf(db, sizeof db, "%s/flashgen.sqlite3", g_dir);
  /* A database from before versioning, with a kernels table of another shape. */
  db_exec(db,
          "CREATE TABLE kernels(name TEXT, blob BLOB); INSERT INTO kernels VALUES('x', x'00');"
          "CREATE TABLE junk(a); PRAGMA user_version = 0;");
  fg_cache *c = fgt_open_ok(g_dir);
  fg_kernel_image img = make_image("v", 5, 1000, 1000), got;
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
  cr_assert_eq(mkdir(g_dir, 0700), 0);
  char db[300];
  snprintf(db, sizeof db, "%s/flashgen.sqlite3", g_dir);
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
  db_exec(db, sql);
  fg_cache *c = fgt_open_ok(g_dir);
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
  fg_kernel_image img = make_image(v, 3, 100, 100);
  fgt_put_ok(c, &k, &img);
  cr_assert_eq(fgt_get(c, &k, &got, NULL, 0), 1);
  cr_assert(same_image(&img, &got));
  cr_assert_eq(got.meta.n_steps, 3);
  fgt_release(&got);
  fgt_release(&img);
  fg_cache_close(c);
}

Test(cache, newer_schema_is_left_alone_and_refused) {
  cr_assert_eq(mkdir(g_dir, 0700), 0);
  char db[300];
  snprintf(db, sizeof db, "%s/flashgen.sqlite3", g_dir);
  db_exec(db, "CREATE TABLE future(a); PRAGMA user_version = 999;");
  char warn[1024];
  cr_assert_null(fg_cache_open(g_dir, warn, sizeof warn));
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
  cr_assert_eq(mkdir(g_dir, 0700), 0);
  char db[300];
  snprintf(db, sizeof db, "%s/flashgen.sqlite3", g_dir);
  FILE *f = fopen(db, "wb");
  cr_assert_not_null(f);
  for (int i = 0; i < 8192; i++) fputc((i * 7) & 0xff, f);
  fclose(f);
  char warn[1024];
  fg_cache *c = fg_cache_open(g_dir, warn, sizeof warn);
  cr_assert_not_null(c, "%s", warn);
  cr_assert(strstr(warn, "rebuilt"), "one warning says so: %s", warn);
  fg_kernel_image img = make_image("v", 5, 1000, 1000), got;
  fg_cache_key k = fgt_key_of("v");
  fgt_put_ok(c, &k, &img);
  cr_assert_eq(fgt_get(c, &k, &got, NULL, 0), 1);
  fgt_release(&got);
  fgt_release(&img);
  fg_cache_close(c);
}

/* ---- Tuning records ---- */

static fg_tune_candidate cand(const char *v, int ok, double ms, double tflops, const char *why) {
  fg_tune_candidate k;
  memset(&k, 0, sizeof k);
  snprintf(k.variant, sizeof k.variant, "%s", v);
  snprintf(k.reason, sizeof k.reason, "%s", why);
  k.ok = ok;
  k.ms = ms;
  k.tflops = tflops;
  return k;
}

static const fg_tune_candidate *find_cand(const fg_tune_candidate *c, int n, const char *v) {
  for (int i = 0; i < n; i++)
    if (strcmp(c[i].variant, v) == 0) return &c[i];
  return NULL;
}

static fg_device_id h100(void) {
  fg_device_id d;
  memset(&d, 0, sizeof d);
  snprintf(d.name, sizeof d.name, "NVIDIA H100 80GB HBM3");
  d.cc_major = 9;
  d.cc_minor = 0;
  d.sm_count = 132;
  d.driver_version = 12040;
  return d;
}

Test(cache, tuning_merge_keeps_old_candidates_and_updates_the_winner) {
  fg_cache *c = fgt_open_ok(g_dir);
  fg_device_id dev = h100();
  const char *bucket = "fwd_d128_bf16_causal_n4096";
  fg_tune_candidate first[3] = {cand("A", 1, 1.0, 100.0, ""), cand("B", 1, 2.0, 50.0, ""),
                                cand("C", 0, 0, 0, "wrong result: max error 0.5")};
  char warn[1024];
  cr_assert_eq(fg_cache_put_tuning(c, &dev, bucket, first, 3, "A", warn, sizeof warn), 0, "%s",
               warn);
  char w[FG_VARIANT_NAME_MAX];
  double tf = 0;
  cr_assert_eq(fg_cache_get_winner(c, &dev, bucket, w, sizeof w, &tf), 1);
  cr_assert_str_eq(w, "A");
  cr_assert_eq(tf, 100.0);

  fg_tune_candidate second[2] = {cand("D", 1, 0.5, 200.0, ""), cand("B", 1, 0.9, 110.0, "")};
  cr_assert_eq(fg_cache_put_tuning(c, &dev, bucket, second, 2, "D", warn, sizeof warn), 0, "%s",
               warn);
  cr_assert_eq(fg_cache_get_winner(c, &dev, bucket, w, sizeof w, &tf), 1);
  cr_assert_str_eq(w, "D");
  cr_assert_eq(tf, 200.0);

  fg_tune_candidate *all = NULL;
  int n = 0;
  char winner[FG_VARIANT_NAME_MAX];
  cr_assert_eq(fg_cache_get_tuning(c, &dev, bucket, &all, &n, winner, sizeof winner), 1);
  cr_assert_eq(n, 4, "3 old + 1 new, the re-measured one replaced");
  cr_assert_str_eq(winner, "D");
  const fg_tune_candidate *a = find_cand(all, n, "A"), *b = find_cand(all, n, "B"),
                          *cc = find_cand(all, n, "C"), *d = find_cand(all, n, "D");
  cr_assert(a && b && cc && d);
  cr_assert(a->ok && a->ms == 1.0 && a->tflops == 100.0, "A kept as measured");
  cr_assert(b->ok && b->ms == 0.9 && b->tflops == 110.0, "B replaced by its new measurement");
  cr_assert(!cc->ok && strcmp(cc->reason, "wrong result: max error 0.5") == 0,
            "C keeps its reason");
  cr_assert(d->ok && d->ms == 0.5);
  free(all);

  cr_assert_eq(fg_cache_get_tuning(c, &dev, "fwd_other", &all, &n, winner, sizeof winner), 0);
  cr_assert_eq(n, 0);
  cr_assert_null(all);
  fg_cache_close(c);
}

Test(cache, a_rejected_candidate_never_becomes_the_winner) {
  fg_cache *c = fgt_open_ok(g_dir);
  fg_device_id dev = h100();
  fg_tune_candidate k[2] = {cand("A", 1, 1.0, 100.0, ""), cand("C", 0, 0, 0, "launch failed")};
  char warn[1024];
  cr_assert_eq(fg_cache_put_tuning(c, &dev, "b", k, 2, "C", warn, sizeof warn), -1);
  cr_assert(strstr(warn, "not an accepted candidate"), "%s", warn);
  cr_assert_eq(fg_cache_put_tuning(c, &dev, "b", k, 2, "Z", warn, sizeof warn), -1, "unmeasured");
  char w[FG_VARIANT_NAME_MAX];
  cr_assert_eq(fg_cache_get_winner(c, &dev, "b", w, sizeof w, NULL), 0, "nothing stored");
  cr_assert_eq(fg_cache_writable(c), 1, "a caller's mistake does not turn the cache off");
  /* No winner at all is a valid record (every candidate rejected). */
  cr_assert_eq(fg_cache_put_tuning(c, &dev, "b", k + 1, 1, NULL, warn, sizeof warn), 0, "%s", warn);
  cr_assert_eq(fg_cache_get_winner(c, &dev, "b", w, sizeof w, NULL), 0);
  fg_tune_candidate *all = NULL;
  int n = 0;
  cr_assert_eq(fg_cache_get_tuning(c, &dev, "b", &all, &n, w, sizeof w), 1);
  cr_assert_eq(n, 1);
  cr_assert_str_empty(w);
  free(all);
  fg_cache_close(c);
}

typedef struct seen {
  int n;
  char buckets[8][64];
  char winners[8][64];
  double tflops[8];
} seen;

static void collect(void *ud, const char *bucket, const char *winner, double tflops) {
  seen *s = ud;
  if (s->n < 8) {
    snprintf(s->buckets[s->n], 64, "%s", bucket);
    snprintf(s->winners[s->n], 64, "%s", winner);
    s->tflops[s->n] = tflops;
  }
  s->n++;
}

Test(cache, each_winner_filters_by_prefix_and_device) {
  fg_cache *c = fgt_open_ok(g_dir);
  fg_device_id dev = h100(), newer_driver = h100(), fewer_sms = h100();
  newer_driver.driver_version = 12050;
  fewer_sms.sm_count = 114;
  struct {
    const fg_device_id *dev;
    const char *bucket, *winner;
    double tf;
  } recs[] = {{&dev, "fwd_d64_f16_causal_n1024", "W1", 10},
              {&dev, "fwd_d64_f16_causal_n512", "W2", 20},
              {&dev, "fwd_d128_f16_causal_n512", "W3", 30},
              {&newer_driver, "fwd_d64_f16_causal_n512", "W4", 40}};
  for (size_t i = 0; i < sizeof recs / sizeof recs[0]; i++) {
    fg_tune_candidate k = cand(recs[i].winner, 1, 1, recs[i].tf, "");
    cr_assert_eq(
        fg_cache_put_tuning(c, recs[i].dev, recs[i].bucket, &k, 1, recs[i].winner, NULL, 0), 0);
  }
  seen s = {0};
  cr_assert_eq(fg_cache_each_winner(c, &dev, "fwd_d64_", collect, &s), 2);
  cr_assert_eq(s.n, 2);
  cr_assert_str_eq(s.buckets[0], "fwd_d64_f16_causal_n1024");
  cr_assert_str_eq(s.winners[0], "W1");
  cr_assert_eq(s.tflops[0], 10.0);
  cr_assert_str_eq(s.buckets[1], "fwd_d64_f16_causal_n512");
  cr_assert_str_eq(s.winners[1], "W2");

  memset(&s, 0, sizeof s);
  cr_assert_eq(fg_cache_each_winner(c, &dev, NULL, collect, &s), 3);
  memset(&s, 0, sizeof s);
  cr_assert_eq(fg_cache_each_winner(c, &newer_driver, "fwd_d64_", collect, &s), 1);
  cr_assert_str_eq(s.winners[0], "W4", "records of another driver are another device's");
  memset(&s, 0, sizeof s);
  cr_assert_eq(fg_cache_each_winner(c, &fewer_sms, "", collect, &s), 0);

  char w[FG_VARIANT_NAME_MAX];
  cr_assert_eq(fg_cache_get_winner(c, &fewer_sms, "fwd_d64_f16_causal_n512", w, sizeof w, NULL), 0,
               "a different SM count is a different device");
  fg_device_id other_name = h100();
  snprintf(other_name.name, sizeof other_name.name, "NVIDIA H100 PCIe");
  cr_assert_eq(fg_cache_get_winner(c, &other_name, "fwd_d64_f16_causal_n512", w, sizeof w, NULL),
               0);
  fg_device_id other_cc = h100();
  other_cc.cc_minor = 1;
  cr_assert_eq(fg_cache_get_winner(c, &other_cc, "fwd_d64_f16_causal_n512", w, sizeof w, NULL), 0);
  cr_assert_eq(fg_cache_get_winner(c, &dev, "fwd_d64_f16_causal_n512", w, 2, NULL), -1,
               "a buffer too small for the name");
  fg_cache_close(c);
}

/* ---- ls, stats, verify, clear ---- */

Test(cache, verify_reports_each_bad_entry) {
  fg_cache *c = fgt_open_ok(g_dir);
  const char *names[3] = {"kern_alpha", "kern_beta", "kern_gamma"};
  fg_kernel_image imgs[3];
  for (int i = 0; i < 3; i++) {
    imgs[i] = make_image(names[i], (unsigned)i, 3000, 2000);
    fg_cache_key k = fgt_key_of(names[i]);
    fgt_put_ok(c, &k, &imgs[i]);
    fgt_release(&imgs[i]);
  }
  int ret;
  char *out = capture(fg_cache_verify, c, &ret);
  cr_assert_eq(ret, 0);
  cr_assert(strstr(out, "all 3 entries ok"), "%s", out);
  free(out);

  flip_bit(fg_cache_path(c), "kern_alpha", "cubin", 10, 0);
  db_exec(fg_cache_path(c),
          "UPDATE kernels SET ptx = substr(ptx, 1, 5) WHERE variant = 'kern_gamma'");
  out = capture(fg_cache_verify, c, &ret);
  cr_assert_eq(ret, 2, "two bad entries: %s", out);
  cr_assert(strstr(out, "kern_alpha") && strstr(out, "kern_gamma") && !strstr(out, "kern_beta"),
            "each bad entry named, the good one not: %s", out);
  cr_assert(strstr(out, "2 of 3 entries bad"), "%s", out);
  free(out);
  cr_assert_eq(fgt_kernel_count(c), 3, "verify reports, it does not delete");
  fg_cache_close(c);
}

Test(cache, ls_stats_list_tuning_and_clear) {
  fg_cache *c = fgt_open_ok(g_dir);
  fg_kernel_image img =
      make_image("fwd_d64_br64_bc64_f16_nocausal_qouter_w4_s2_sm80", 1, 4000, 1000);
  fg_cache_key k = fgt_key_of(img.variant);
  fgt_put_ok(c, &k, &img);
  k.arch = FG_ARCH_SM90A;
  fgt_put_ok(c, &k, &img);
  fgt_release(&img);
  fg_device_id dev = h100();
  fg_tune_candidate cs[2] = {cand("fwd_d64_x", 1, 0.25, 321.5, ""),
                             cand("fwd_d64_y", 0, 0, 0, "smem")};
  cr_assert_eq(fg_cache_put_tuning(c, &dev, "fwd_d64_f16_n4096", cs, 2, "fwd_d64_x", NULL, 0), 0);

  int ret;
  char *out = capture(fg_cache_ls, c, &ret);
  cr_assert_eq(ret, 2);
  cr_assert(strstr(out, "fwd_d64_br64_bc64_f16_nocausal_qouter_w4_s2_sm80") &&
                strstr(out, "sm_80") && strstr(out, "sm_90a") && strstr(out, "12.4") &&
                strstr(out, "5000"),
            "ls shows variant, arch, NVRTC version and size: %s", out);
  free(out);

  out = capture(fg_cache_stats, c, &ret);
  cr_assert_eq(ret, 0);
  cr_assert(strstr(out, fg_cache_path(c)), "%s", out);
  cr_assert(strstr(out, "2 entries, 10000 bytes"), "%s", out);
  cr_assert(strstr(out, "1 buckets on 1 devices, 2 candidates"), "%s", out);
  free(out);
  fg_cache_counts n;
  cr_assert_eq(fg_cache_count(c, &n), 0);
  cr_assert_eq(n.kernels, 2);
  cr_assert_eq(n.kernel_bytes, 10000);
  cr_assert_eq(n.tuning_records, 1);
  cr_assert_eq(n.candidates, 2);
  cr_assert_gt(n.file_bytes, 10000);

  out = capture(fg_cache_list_tuning, c, &ret);
  cr_assert_eq(ret, 1);
  cr_assert(strstr(out, "NVIDIA H100 80GB HBM3") && strstr(out, "fwd_d64_f16_n4096") &&
                strstr(out, "fwd_d64_x") && strstr(out, "321.5") && strstr(out, "2 (1)"),
            "device, bucket, winner, TFLOP/s, candidates (rejected): %s", out);
  free(out);

  cr_assert_eq(fg_cache_clear(c, NULL, 0), 0);
  cr_assert_eq(fg_cache_count(c, &n), 0);
  cr_assert_eq(n.kernels + n.tuning_records + n.candidates + n.devices, 0);
  cr_assert_eq(fg_cache_ls(c, NULL), 0);
  char w[FG_VARIANT_NAME_MAX];
  cr_assert_eq(fg_cache_get_winner(c, &dev, "fwd_d64_f16_n4096", w, sizeof w, NULL), 0);
  fg_cache_close(c);
}

/* ---- Damage under contention, held locks, repair (issue 11, items 3-5) ---- */

static void db_file(char *buf, size_t len) { snprintf(buf, len, "%s/flashgen.sqlite3", g_dir); }

/* Asserts that PRAGMA integrity_check of the database at path says "ok". */
static void h_integrity_ok(const char *path) {
  sqlite3 *h = NULL;
  cr_assert_eq(sqlite3_open_v2(path, &h, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
  sqlite3_busy_timeout(h, 5000);
  sqlite3_stmt *st = NULL;
  cr_assert_eq(sqlite3_prepare_v2(h, "PRAGMA integrity_check", -1, &st, NULL), SQLITE_OK);
  cr_assert_eq(sqlite3_step(st), SQLITE_ROW, "%s", sqlite3_errmsg(h));
  cr_assert_str_eq((const char *)sqlite3_column_text(st, 0), "ok");
  sqlite3_finalize(st);
  sqlite3_close(h);
}

/* Removes the database and its side files, then writes garbage where the database goes. */
static void plant_garbage_db(void) {
  char db[300], p[320];
  db_file(db, sizeof db);
  const char *suffix[] = {"", "-wal", "-shm", "-journal"};
  for (int i = 0; i < 4; i++) {
    snprintf(p, sizeof p, "%s%s", db, suffix[i]);
    unlink(p);
  }
  FILE *f = fopen(db, "wb");
  cr_assert_not_null(f);
  for (int i = 0; i < 8192; i++) fputc((i * 7 + 3) & 0xff, f);
  fclose(f);
}

#define RACE_PROCS 8
#define RACE_PUTS 3

/* One racer: waits for the start signal, opens the cache (which finds it damaged), stores its
 * own kernels and writes one byte per store that reported success to report_fd. */
static int racer(int id, int start_fd, int report_fd) {
  char b;
  if (read(start_fd, &b, 1) < 0) return 2;
  char warn[1024];
  fg_cache *c = fg_cache_open(g_dir, warn, sizeof warn);
  if (!c) {
    fprintf(stderr, "racer %d: open: %s\n", id, warn);
    return 10;
  }
  int rc = 0;
  for (int j = 0; j < RACE_PUTS; j++) {
    char name[64];
    snprintf(name, sizeof name, "race_p%d_k%d", id, j);
    fg_cache_key k = fgt_key_of(name);
    fg_kernel_image img = make_image(name, (unsigned)(id * 10 + j), 6000, 2000);
    if (fg_cache_put_kernel(c, &k, &img, warn, sizeof warn) == 0) {
      unsigned char r = (unsigned char)(id * 16 + j);
      if (write(report_fd, &r, 1) != 1) rc = 3;
    } else {
      fprintf(stderr, "racer %d: put %s: %s\n", id, name, warn);
    }
    fgt_release(&img);
  }
  fg_cache_close(c);
  return rc;
}

/* Runs one round; returns the number of stores reported done whose rows are missing, and adds
 * the stores that reported failure to *failed. Asserts the rebuilt database is whole. */
static int race_round(int round, int *failed) {
  plant_garbage_db();
  int start[2], report[2];
  cr_assert_eq(pipe(start), 0);
  cr_assert_eq(pipe(report), 0);
  pid_t pids[RACE_PROCS];
  for (int p = 0; p < RACE_PROCS; p++) {
    pids[p] = fork();
    cr_assert_geq(pids[p], 0, "fork: %s", strerror(errno));
    if (pids[p] == 0) {
      close(start[1]);
      close(report[0]);
      _exit(racer(p, start[0], report[1]));
    }
  }
  close(start[0]);
  close(report[1]);
  close(start[1]); /* go */
  unsigned char done[RACE_PROCS * RACE_PUTS];
  int ndone = 0;
  ssize_t got;
  while (ndone < (int)sizeof done &&
         (got = read(report[0], done + ndone, sizeof done - (size_t)ndone)) > 0)
    ndone += (int)got;
  close(report[0]);
  for (int p = 0; p < RACE_PROCS; p++) {
    int status = 0;
    cr_assert_eq(waitpid(pids[p], &status, 0), pids[p]);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0,
              "round %d: racer %d failed (exit %d, signal %d)", round, p,
              WIFEXITED(status) ? WEXITSTATUS(status) : -1,
              WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  }
  *failed += RACE_PROCS * RACE_PUTS - ndone;
  char db[300];
  db_file(db, sizeof db);
  sqlite3 *h = NULL;
  cr_assert_eq(sqlite3_open_v2(db, &h, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
  sqlite3_busy_timeout(h, 5000);
  sqlite3_stmt *st = NULL;
  cr_assert_eq(sqlite3_prepare_v2(h, "PRAGMA integrity_check", -1, &st, NULL), SQLITE_OK);
  cr_assert_eq(sqlite3_step(st), SQLITE_ROW, "round %d: %s", round, sqlite3_errmsg(h));
  cr_assert_str_eq((const char *)sqlite3_column_text(st, 0), "ok", "round %d: rebuilt database "
                   "fails its integrity check", round);
  sqlite3_finalize(st);
  int lost = 0;
  cr_assert_eq(sqlite3_prepare_v2(h, "SELECT count(*) FROM kernels WHERE variant = ?1", -1, &st,
                                  NULL),
               SQLITE_OK, "round %d: %s", round, sqlite3_errmsg(h));
  for (int i = 0; i < ndone; i++) {
    char name[64];
    snprintf(name, sizeof name, "race_p%d_k%d", done[i] / 16, done[i] % 16);
    sqlite3_reset(st);
    sqlite3_bind_text(st, 1, name, -1, SQLITE_TRANSIENT);
    cr_assert_eq(sqlite3_step(st), SQLITE_ROW);
    if (sqlite3_column_int(st, 0) != 1) {
      fprintf(stderr, "round %d: %s was reported stored but is missing\n", round, name);
      lost++;
    }
  }
  sqlite3_finalize(st);
  sqlite3_close(h);
  return lost;
}

/* Eight processes open a garbage database at once: one rebuilds it under the lock, the others
 * wait and use the new one; every store reported done is in the database. FG_TEST_RACE_ROUNDS
 * runs more rounds (200 by hand). */
Test(cache, eight_processes_opening_a_damaged_database_lose_no_store, .timeout = 600) {
  cr_assert_eq(mkdir(g_dir, 0700), 0);
  int rounds = 50;
  const char *env = getenv("FG_TEST_RACE_ROUNDS");
  if (env && atoi(env) > 0) rounds = atoi(env);
  int lost = 0, lost_rounds = 0, failed = 0;
  for (int r = 0; r < rounds; r++) {
    int l = race_round(r, &failed);
    lost += l;
    lost_rounds += l > 0;
  }
  fprintf(stderr, "damaged-open race: %d rounds, %d with lost stores (%d rows lost), %d stores "
          "reported failed\n", rounds, lost_rounds, lost, failed);
  cr_assert_eq(lost, 0, "%d stores reported done are missing, in %d of %d rounds", lost,
               lost_rounds, rounds);
  cr_assert_eq(failed, 0, "%d stores failed", failed);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* A child that holds BEGIN EXCLUSIVE on the database until the parent closes its pipe. */
static pid_t hold_write_lock(int *release_fd) {
  char db[300];
  db_file(db, sizeof db);
  int ready[2], rel[2];
  cr_assert_eq(pipe(ready), 0);
  cr_assert_eq(pipe(rel), 0);
  pid_t pid = fork();
  cr_assert_geq(pid, 0);
  if (pid == 0) {
    close(ready[0]);
    close(rel[1]);
    sqlite3 *h = NULL;
    if (sqlite3_open(db, &h) != SQLITE_OK) _exit(1);
    if (sqlite3_exec(h, "BEGIN EXCLUSIVE", NULL, NULL, NULL) != SQLITE_OK) _exit(2);
    char b = 1;
    if (write(ready[1], &b, 1) != 1) _exit(3);
    while (read(rel[0], &b, 1) > 0) {
    }
    sqlite3_exec(h, "ROLLBACK", NULL, NULL, NULL);
    sqlite3_close(h);
    _exit(0);
  }
  close(ready[1]);
  close(rel[0]);
  char b;
  cr_assert_eq(read(ready[0], &b, 1), 1, "the lock holder did not start");
  close(ready[0]);
  *release_fd = rel[1];
  return pid;
}

static void release_lock(pid_t pid, int release_fd) {
  close(release_fd);
  int status = 0;
  cr_assert_eq(waitpid(pid, &status, 0), pid);
  cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "lock holder exit %d",
            WIFEXITED(status) ? WEXITSTATUS(status) : -1);
}

/* Another process holds the write lock: the stores of this process cost one bounded wait in
 * all, one warning names the lock and the process holding it, then writing is off. */
Test(cache, a_held_write_lock_costs_one_bounded_wait, .timeout = 120) {
  fg_cache *c = fgt_open_ok(g_dir);
  fg_cache_key k0 = fgt_key_of("before_the_lock");
  fg_kernel_image img0 = make_image("before_the_lock", 1, 3000, 1000);
  fgt_put_ok(c, &k0, &img0);
  fg_cache_close(c);
  int rel;
  pid_t holder = hold_write_lock(&rel);
  double t0 = now_s();
  c = fgt_open_ok(g_dir);
  char warn[1024], first[1024] = "";
  int warnings = 0;
  for (int i = 0; i < 5; i++) {
    char name[64];
    snprintf(name, sizeof name, "under_the_lock_%d", i);
    fg_cache_key k = fgt_key_of(name);
    fg_kernel_image img = make_image(name, (unsigned)i + 2, 3000, 1000);
    cr_assert_eq(fg_cache_put_kernel(c, &k, &img, warn, sizeof warn), -1,
                 "a store cannot succeed while another process holds the lock");
    if (warn[0]) {
      warnings++;
      if (!first[0]) snprintf(first, sizeof first, "%s", warn);
    }
    fgt_release(&img);
  }
  double waited = now_s() - t0;
  fprintf(stderr, "held lock: 5 stores returned after %.2f s; warning: %s\n", waited, first);
  cr_assert_lt(waited, 10.0, "5 stores under a held lock took %.1f s", waited);
  cr_assert_eq(warnings, 1, "one warning, not one per store");
  char pid[32];
  snprintf(pid, sizeof pid, "%ld", (long)holder);
  cr_assert(strstr(first, "locked") && strstr(first, fg_cache_path(c)) && strstr(first, pid),
            "the warning names the lock, the database and the holder (pid %s): %s", pid, first);
  cr_assert_eq(fg_cache_writable(c), 0, "writing is off after the lock wait");
  /* Reading still works under a writer's lock. */
  fg_kernel_image got;
  cr_assert_eq(fgt_get(c, &k0, &got, NULL, 0), 1);
  fgt_release(&got);
  fg_cache_close(c);

  /* `cache clear` fails fast and says the cache is locked (not read-only), and by whom. */
  char args[400];
  snprintf(args, sizeof args, "cache --dir '%s' clear", g_dir);
  t0 = now_s();
  int st = fg_test_run_cli(NULL, NULL, args);
  double clear_s = now_s() - t0;
  fprintf(stderr, "held lock: `cache clear` returned after %.2f s: %s", clear_s, fg_test_err);
  cr_assert_eq(st, 1, "clear under a lock fails: %s%s", fg_test_out, fg_test_err);
  cr_assert_lt(clear_s, 10.0, "clear under a lock took %.1f s", clear_s);
  cr_assert(strstr(fg_test_err, "locked") && strstr(fg_test_err, pid) &&
                !strstr(fg_test_err, "read-only"),
            "clear must say locked and by whom, not read-only: %s", fg_test_err);
  release_lock(holder, rel);

  /* Once the lock is gone a new process stores again. */
  c = fgt_open_ok(g_dir);
  cr_assert_eq(fg_cache_writable(c), 1);
  fg_cache_key k1 = fgt_key_of("after_the_lock");
  fgt_put_ok(c, &k1, &img0);
  fgt_release(&img0);
  fg_cache_close(c);
}

/* Stores n kernels of about 40 KB each (several overflow pages each) and closes the cache, so
 * everything is in the database file. */
static void store_big_kernels(const char *const *names, int n) {
  fg_cache *c = fgt_open_ok(g_dir);
  for (int i = 0; i < n; i++) {
    fg_cache_key k = fgt_key_of(names[i]);
    fg_kernel_image img = make_image(names[i], (unsigned)(100 + i), 40000, 3000);
    fgt_put_ok(c, &k, &img);
    fgt_release(&img);
  }
  fg_cache_close(c);
}

/* Zeroes the page of the database file holding byte 20000 of names's cubin: a page in the middle
 * of its overflow chain, so that row (and no other) can no longer be read. */
static void zero_page_of(const char *name, unsigned seed) {
  fg_kernel_image img = make_image(name, seed, 40000, 3000);
  char db[300];
  db_file(db, sizeof db);
  int fd = open(db, O_RDWR);
  cr_assert_geq(fd, 0);
  struct stat st;
  cr_assert_eq(fstat(fd, &st), 0);
  unsigned char *buf = malloc((size_t)st.st_size);
  cr_assert_eq(pread(fd, buf, (size_t)st.st_size, 0), st.st_size);
  long at = -1;
  for (long i = 0; i + 32 <= st.st_size; i++)
    if (memcmp(buf + i, img.cubin + 20000, 32) == 0) {
      at = i;
      break;
    }
  cr_assert_geq(at, 0, "cubin bytes of %s not found in the file", name);
  static const unsigned char zero[4096];
  cr_assert_eq(pwrite(fd, zero, sizeof zero, at / 4096 * 4096), 4096);
  close(fd);
  free(buf);
  fgt_release(&img);
}

Test(cache, verify_lists_every_unreadable_row) {
  const char *names[6] = {"row_a", "row_b", "row_c", "row_d", "row_e", "row_f"};
  store_big_kernels(names, 6);
  zero_page_of("row_b", 101);
  zero_page_of("row_d", 103);
  zero_page_of("row_f", 105);
  fg_cache *c = fgt_open_ok(g_dir);
  int ret;
  char *out = capture(fg_cache_verify, c, &ret);
  fprintf(stderr, "unreadable rows, verify:\n%s", out);
  cr_assert_eq(ret, 3, "three bad rows, verify returned %d: %s", ret, out);
  cr_assert(strstr(out, "row_b") && strstr(out, "row_d") && strstr(out, "row_f"),
            "every bad row named: %s", out);
  cr_assert(!strstr(out, "row_a") && !strstr(out, "row_c") && !strstr(out, "row_e"),
            "the readable rows are not named: %s", out);
  free(out);
  fg_cache_close(c);
}

Test(cache, verify_names_every_row_with_a_bad_checksum) {
  const char *names[5] = {"sum_a", "sum_b", "sum_c", "sum_d", "sum_e"};
  store_big_kernels(names, 5);
  fg_cache *c = fgt_open_ok(g_dir);
  db_exec(fg_cache_path(c), "UPDATE kernels SET checksum = checksum + 1"
                            " WHERE variant IN ('sum_a', 'sum_c', 'sum_e')");
  int ret;
  char *out = capture(fg_cache_verify, c, &ret);
  cr_assert_eq(ret, 3, "%s", out);
  cr_assert(strstr(out, "sum_a") && strstr(out, "sum_c") && strstr(out, "sum_e") &&
                !strstr(out, "sum_b") && !strstr(out, "sum_d"),
            "%s", out);
  cr_assert(strstr(out, "3 of 5 entries bad"), "%s", out);
  free(out);
  fg_cache_close(c);
}

/* Page 2 zeroed (the kernels table's root): verify reports the damage and names the rows it
 * lost, `cache clear` repairs it, and the cache works again. */
Test(cache, clear_repairs_a_database_with_a_zeroed_page) {
  const char *names[3] = {"zp_one", "zp_two", "zp_three"};
  store_big_kernels(names, 3);
  char db[300];
  db_file(db, sizeof db);
  int fd = open(db, O_RDWR);
  cr_assert_geq(fd, 0);
  static const unsigned char zero[4096];
  cr_assert_eq(pwrite(fd, zero, sizeof zero, 4096), 4096);
  close(fd);

  char args[400];
  snprintf(args, sizeof args, "cache --dir '%s' verify", g_dir);
  int st = fg_test_run_cli(NULL, NULL, args);
  cr_assert_eq(st, 1, "%s%s", fg_test_out, fg_test_err);
  cr_assert(strstr(fg_test_out, "damaged") && strstr(fg_test_out, "zp_one") &&
                strstr(fg_test_out, "zp_two") && strstr(fg_test_out, "zp_three") &&
                strstr(fg_test_out, "flashgen cache clear"),
            "verify reports the damage and each lost row: %s%s", fg_test_out, fg_test_err);
  fprintf(stderr, "zeroed page, verify:\n%s", fg_test_out);

  snprintf(args, sizeof args, "cache --dir '%s' clear", g_dir);
  st = fg_test_run_cli(NULL, NULL, args);
  cr_assert_eq(st, 0, "clear must repair a damaged cache: %s%s", fg_test_out, fg_test_err);
  fprintf(stderr, "zeroed page, clear: %s%s", fg_test_out, fg_test_err);

  fg_cache *c = fgt_open_ok(g_dir);
  cr_assert_eq(fg_cache_verify(c, NULL), 0);
  cr_assert_eq(fgt_kernel_count(c), 0);
  fg_cache_key k = fgt_key_of("after_repair");
  fg_kernel_image img = make_image("after_repair", 9, 40000, 3000), got;
  fgt_put_ok(c, &k, &img);
  cr_assert_eq(fgt_get(c, &k, &got, NULL, 0), 1);
  cr_assert(same_image(&img, &got));
  fgt_release(&img);
  fgt_release(&got);
  fg_cache_close(c);
  h_integrity_ok(db);
}

/* Makes every pwrite64 of the calling process fail with ENOSPC (what SQLite sees on a full disk).
 * x86-64 and aarch64 both have __NR_pwrite64; SQLite writes with pwrite only. */
static int fill_the_disk(void) {
  struct sock_filter f[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_pwrite64, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (ENOSPC & SECCOMP_RET_DATA)),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  struct sock_fprog prog = {(unsigned short)(sizeof f / sizeof f[0]), f};
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return -1;
  return prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog);
}

/* `cache clear` on a full disk says the disk is full, not "read-only, or locked". */
Test(cache, clear_on_a_full_disk_says_the_disk_is_full) {
  const char *cli = getenv("FLASHGEN_CLI");
  if (!cli || !*cli) cr_skip_test("FLASHGEN_CLI is not set (run through ctest)");
  const char *names[2] = {"full_a", "full_b"};
  store_big_kernels(names, 2);
  /* This handle keeps the shared-memory file mapped at its full size, so the command does not
   * need to write to open the database, only to clear it. */
  fg_cache *c = fgt_open_ok(g_dir);
  cr_assert_eq(fgt_kernel_count(c), 2);
  char out[300];
  snprintf(out, sizeof out, "%s/out.txt", g_tmp);
  pid_t pid = fork();
  cr_assert_geq(pid, 0);
  if (pid == 0) {
    int fd = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0 || dup2(fd, 1) < 0 || dup2(fd, 2) < 0) _exit(126);
    if (fill_the_disk() != 0) _exit(125);
    execl(cli, cli, "cache", "--dir", g_dir, "clear", (char *)NULL);
    _exit(127);
  }
  int status = 0;
  cr_assert_eq(waitpid(pid, &status, 0), pid);
  char text[4096];
  fg_test_slurp(out, text, sizeof text);
  cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 1, "exit %d: %s",
            WIFEXITED(status) ? WEXITSTATUS(status) : -1, text);
  fprintf(stderr, "full disk, clear: %s", text);
  cr_assert(strstr(text, "full") && !strstr(text, "read-only") && !strstr(text, "locked"),
            "clear on a full disk must say the disk is full: %s", text);
  cr_assert_eq(fgt_kernel_count(c), 2, "nothing was removed");
  fg_cache_close(c);
}
