/* test_cache_integrity.c: the cache's paths and its guard against mixed-up entries (issue 11,
 * items 7 and 8). Paths: a FLASHGEN_CACHE_DIR that looks like an SQLite URI ('file:...') is a
 * plain directory and never opens the file it names; a symlinked cache directory is refused
 * with or without trailing slashes; a path longer than the cache can use says so and gives the
 * limit. Entries: a row planted under one variant's key with another variant's entry point and
 * cubin, its checksum recomputed, is a miss, is evicted and is flagged by verify; a row copied
 * under another key fails its checksum; a row whose recorded key differs from the key looked up
 * is a miss. No GPU.
 *
 * Build and run: cmake --build build --target test_cache_integrity &&
 *                build/tests/test_cache_integrity */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli_runner.h"
#include "cache_support.h"
#include "fg_cache.h"
#include "fg_cache_internal.h" /* fg_cache_kernel_checksum */

/* ---- Fixture: a fresh private temp dir per test. ---- */

static char g_tmp[64];

static void setup(void) {
  snprintf(g_tmp, sizeof g_tmp, "/tmp/fg-integrity-XXXXXX");
  cr_assert_not_null(mkdtemp(g_tmp), "mkdtemp: %s", strerror(errno));
  unsetenv("FLASHGEN_CACHE_DIR");
}

static void teardown(void) {
  if (chdir("/") != 0) return;
  fgt_rm_rf(g_tmp);
}

TestSuite(cache_integrity, .init = setup, .fini = teardown);

/* ---- Helpers ---- */

/* A deterministic image of variant with entry point entry (NULL: "fg_" + variant, as the
 * templates name it). */
static fg_kernel_image make_image(const char *variant, const char *entry, unsigned seed) {
  fg_kernel_image img = fgt_image_bytes(variant, seed, 3000 + seed * 17, 1000 + seed * 5);
  char e[64];
  snprintf(e, sizeof e, entry ? "%s" : "fg_%s", entry ? entry : variant);
  fg_kernel_meta_single(&img.meta, e, FG_GRID_Q_TILES, 64, 128, 16384 + (int)seed);
  img.meta.regs = 128;
  img.meta.spill_store_bytes = 0;
  img.meta.spill_load_bytes = 0;
  img.meta.stack_bytes = 0;
  return img;
}

static int same_bytes(const fg_kernel_image *a, const fg_kernel_image *b) {
  return a->cubin_size == b->cubin_size && a->ptx_size == b->ptx_size &&
         memcmp(a->cubin, b->cubin, a->cubin_size) == 0 &&
         memcmp(a->ptx, b->ptx, a->ptx_size) == 0 &&
         strcmp(fg_kernel_main(&a->meta)->entry, fg_kernel_main(&b->meta)->entry) == 0;
}

/* A second connection to the database, as another program (or a person) would open it. path
 * is absolute, so it is never read as a URI. */
static sqlite3 *raw_open(const char *path) {
  sqlite3 *db = NULL;
  cr_assert_eq(path[0], '/');
  cr_assert_eq(sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, NULL),
               SQLITE_OK, "%s", path);
  sqlite3_busy_timeout(db, 5000);
  return db;
}

static void raw_exec(sqlite3 *db, const char *sql) {
  char *err = NULL;
  cr_assert_eq(sqlite3_exec(db, sql, NULL, NULL, &err), SQLITE_OK, "%s: %s", sql, err);
}

/* Runs fg_cache_verify into a string. */
static int verify_text(fg_cache *c, char *buf, size_t len) {
  FILE *f = fmemopen(buf, len, "w");
  cr_assert_not_null(f);
  int bad = fg_cache_verify(c, f);
  fclose(f);
  buf[len - 1] = '\0';
  return bad;
}

static unsigned char *slurp_bytes(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  cr_assert_not_null(f, "%s: %s", path, strerror(errno));
  fseek(f, 0, SEEK_END);
  long sz = ftell(f);
  fseek(f, 0, SEEK_SET);
  unsigned char *b = malloc((size_t)sz + 1);
  cr_assert_eq(fread(b, 1, (size_t)sz, f), (size_t)sz);
  fclose(f);
  *n = (size_t)sz;
  return b;
}

static int exists(const char *path) {
  struct stat st;
  return lstat(path, &st) == 0;
}

/* ================================ Item 7: paths ================================ */

/* Makes dir/x/NAME a small SQLite database with one table of its own (the file a URI-looking
 * cache path names) and returns its path. */
static void make_victim(const char *name, char *path, size_t len) {
  char x[256];
  snprintf(x, sizeof x, "%s/x", g_tmp);
  mkdir(x, 0700);
  snprintf(path, len, "%s/%s", x, name);
  sqlite3 *db = raw_open(path);
  raw_exec(db, "CREATE TABLE precious(v INTEGER); INSERT INTO precious VALUES(42);");
  sqlite3_close(db);
}

Test(cache_integrity, uri_like_cache_dir_is_a_plain_directory) {
  char victim[512];
  make_victim("victim.db", victim, sizeof victim);
  size_t n0;
  unsigned char *before = slurp_bytes(victim, &n0);

  /* FLASHGEN_CACHE_DIR='file:/tmp/.../x/victim.db#' from the temp dir: a relative path whose
   * first component is the directory 'file:'. */
  cr_assert_eq(chdir(g_tmp), 0);
  char env[600];
  snprintf(env, sizeof env, "file:%s#", victim);
  setenv("FLASHGEN_CACHE_DIR", env, 1);
  fg_cache *c = fgt_open_ok(NULL);
  const char *v = "fwd_d64_br64_bc64_f16_causal_qouter_w4_s2_sm80";
  fg_kernel_image img = make_image(v, NULL, 1), got;
  fg_cache_key k = fgt_key_of(v);
  fgt_put_ok(c, &k, &img);
  cr_assert_eq(fgt_get(c, &k, &got, NULL, 0), 1);
  fgt_release(&got);

  char path[1200], want[1200];
  snprintf(path, sizeof path, "%s", fg_cache_path(c));
  fg_cache_close(c);

  size_t n1;
  unsigned char *after = slurp_bytes(victim, &n1);
  cr_assert(n0 == n1 && memcmp(before, after, n0) == 0, "the file the URI names was written");
  char side[600];
  snprintf(side, sizeof side, "%s-wal", victim);
  cr_assert(!exists(side), "%s appeared", side);
  free(before);
  free(after);

  snprintf(want, sizeof want, "%s/%s/flashgen.sqlite3", g_tmp, env);
  cr_assert_str_eq(path, want, "the database must be <dir>/flashgen.sqlite3, <dir> absolute");
  struct stat st;
  cr_assert_eq(lstat(want, &st), 0, "no database at %s", want);
  cr_assert(S_ISREG(st.st_mode));
  sqlite3 *db = raw_open(want);
  sqlite3_stmt *q = NULL;
  cr_assert_eq(sqlite3_prepare_v2(db, "SELECT count(*) FROM kernels", -1, &q, NULL), SQLITE_OK);
  cr_assert_eq(sqlite3_step(q), SQLITE_ROW);
  cr_assert_eq(sqlite3_column_int(q, 0), 1, "the kernel must be in <dir>/flashgen.sqlite3");
  sqlite3_finalize(q);
  sqlite3_close(db);
  fgt_release(&img);
}

Test(cache_integrity, uri_like_dir_argument_with_a_query_is_a_plain_directory) {
  /* '?mode=memory' would make SQLite keep the cache in memory; '?vfs=...' choose another VFS. */
  cr_assert_eq(chdir(g_tmp), 0);
  fg_cache *c = fgt_open_ok("file:cachedb?mode=memory");
  char want[256];
  snprintf(want, sizeof want, "%s/file:cachedb?mode=memory/flashgen.sqlite3", g_tmp);
  cr_assert_str_eq(fg_cache_path(c), want);
  fg_cache_close(c);
  struct stat st;
  cr_assert_eq(lstat(want, &st), 0, "the database was not written to %s", want);
  cr_assert(S_ISREG(st.st_mode) && st.st_size > 0);
}

Test(cache_integrity, uri_like_cache_dir_through_the_cli) {
  char victim[512];
  make_victim("victim2.db", victim, sizeof victim);
  size_t n0;
  unsigned char *before = slurp_bytes(victim, &n0);
  char env[700];
  snprintf(env, sizeof env, "FLASHGEN_CACHE_DIR='file:%s#'", victim);
  int rc = fg_test_run_cli(g_tmp, env, "cache stats");
  cr_assert_eq(rc, 0, "stderr: %s", fg_test_err);
  size_t n1;
  unsigned char *after = slurp_bytes(victim, &n1);
  cr_assert(n0 == n1 && memcmp(before, after, n0) == 0, "the file the URI names was written");
  char want[1200];
  snprintf(want, sizeof want, "%s/file:%s#/flashgen.sqlite3", g_tmp, victim);
  cr_assert(strstr(fg_test_out, want), "stats must name %s:\n%s", want, fg_test_out);
  cr_assert(exists(want));
  free(before);
  free(after);
}

Test(cache_integrity, symlinked_dir_is_refused_with_or_without_trailing_slashes) {
  char real[256], link[256];
  snprintf(real, sizeof real, "%s/real", g_tmp);
  snprintf(link, sizeof link, "%s/link", g_tmp);
  cr_assert_eq(mkdir(real, 0700), 0);
  cr_assert_eq(symlink(real, link), 0);

  char first[1024];
  cr_assert_null(fg_cache_open(link, first, sizeof first));
  cr_assert(strstr(first, "symbolic link") && strstr(first, "FLASHGEN_CACHE_DIR"), "%s", first);
  const char *tails[] = {"/", "//", "/.", "/./", "///.//"};
  for (size_t i = 0; i < sizeof tails / sizeof tails[0]; i++) {
    char p[300], warn[1024];
    snprintf(p, sizeof p, "%s%s", link, tails[i]);
    fg_cache *c = fg_cache_open(p, warn, sizeof warn);
    if (c) fg_cache_close(c);
    cr_assert_null(c, "%s (a symlink with '%s') was accepted", p, tails[i]);
    cr_assert_str_eq(warn, first, "'%s' must be refused as '%s' is", p, link);
    /* The same through the environment. */
    setenv("FLASHGEN_CACHE_DIR", p, 1);
    c = fg_cache_open(NULL, warn, sizeof warn);
    if (c) fg_cache_close(c);
    cr_assert_null(c, "FLASHGEN_CACHE_DIR=%s was accepted", p);
    cr_assert_str_eq(warn, first);
    unsetenv("FLASHGEN_CACHE_DIR");
  }
  char db[300];
  snprintf(db, sizeof db, "%s/flashgen.sqlite3", real);
  cr_assert(!exists(db), "nothing may be written through the link");

  /* The real directory with a trailing slash is fine, and its database path has no '//'. */
  char p[300], want[300];
  snprintf(p, sizeof p, "%s//", real);
  fg_cache *c = fgt_open_ok(p);
  snprintf(want, sizeof want, "%s/flashgen.sqlite3", real);
  cr_assert_str_eq(fg_cache_path(c), want);
  fg_cache_close(c);
}

/* The longest directory the cache accepts, read from the message about a path one byte too
 * long; -1 when the message gives none. */
static long limit_in(const char *warn) {
  const char *p = strstr(warn, "limit is ");
  return p ? strtol(p + strlen("limit is "), NULL, 10) : -1;
}

static void assert_too_long(const char *warn) {
  cr_assert(strstr(warn, "too long"), "must say the path is too long: %s", warn);
  cr_assert(strstr(warn, "FLASHGEN_CACHE_DIR"), "must say what to do: %s", warn);
  cr_assert_null(strstr(warn, "no cache directory"), "the directory is set: %s", warn);
  cr_assert_gt(limit_in(warn), 0, "must give the limit: %s", warn);
}

/* g_tmp/aaa.../bbb.../... of exactly len bytes (components of at most 200). */
static void long_dir(char *buf, size_t len) {
  snprintf(buf, len + 1, "%s", g_tmp);
  char fill = 'a';
  for (size_t n = strlen(buf); n < len; n = strlen(buf)) {
    size_t left = len - n - 1, k = left <= 200 ? left : (left - 200 >= 2 ? 200 : 150);
    buf[n] = '/';
    memset(buf + n + 1, fill++, k);
    buf[n + 1 + k] = '\0';
  }
  cr_assert_eq(strlen(buf), len);
}

Test(cache_integrity, path_longer_than_the_buffer_says_too_long) {
  size_t n = 5000;
  char *dir = malloc(n + 1);
  memset(dir, 'a', n);
  memcpy(dir, "/tmp/", 5);
  dir[n] = '\0';
  setenv("FLASHGEN_CACHE_DIR", dir, 1);
  char warn[1024];
  fg_cache *c = fg_cache_open(NULL, warn, sizeof warn);
  cr_assert_null(c);
  assert_too_long(warn);
  /* The same through the dir argument. */
  unsetenv("FLASHGEN_CACHE_DIR");
  cr_assert_null(fg_cache_open(dir, warn, sizeof warn));
  assert_too_long(warn);
  free(dir);
}

Test(cache_integrity, path_longer_than_sqlite_takes_says_too_long_at_the_limit) {
  /* Shorter than PATH_MAX, longer than SQLite's file names (512 bytes on Unix). */
  char dir[1024], warn[1024];
  long_dir(dir, 700);
  cr_assert_null(fg_cache_open(dir, warn, sizeof warn));
  assert_too_long(warn);
  long limit = limit_in(warn);
  char first[256];
  snprintf(first, sizeof first, "%s/a", g_tmp);
  cr_assert(!exists(first), "a refused path must not be created");

  /* Exactly at the limit the cache works; one byte more is refused with the same limit. */
  cr_assert_lt(limit, 1000);
  long_dir(dir, (size_t)limit);
  fg_cache *c = fgt_open_ok(dir);
  const char *v = "fwd_d64_br64_bc64_f16_causal_qouter_w4_s2_sm80";
  fg_kernel_image img = make_image(v, NULL, 2), got;
  fg_cache_key k = fgt_key_of(v);
  fgt_put_ok(c, &k, &img);
  fg_cache_close(c);
  c = fgt_open_ok(dir);
  cr_assert_eq(fgt_get(c, &k, &got, NULL, 0), 1, "the kernel must survive a reopen at the limit");
  fgt_release(&got);
  fgt_release(&img);
  fg_cache_close(c);
  long_dir(dir, (size_t)limit + 1);
  cr_assert_null(fg_cache_open(dir, warn, sizeof warn));
  assert_too_long(warn);
  cr_assert_eq(limit_in(warn), limit);
}

Test(cache_integrity, too_long_path_through_the_cli) {
  char dir[1024], env[1100];
  long_dir(dir, 700);
  snprintf(env, sizeof env, "FLASHGEN_CACHE_DIR='%s'", dir);
  cr_assert_eq(fg_test_run_cli(NULL, env, "cache stats"), 1);
  assert_too_long(fg_test_err);
}

/* ======================= Item 8: an entry must be its key's ======================= */

#define V32 "fwd_d32_br64_bc64_f16_causal_qouter_w4_s2_sm80"
#define V144 "fwd_d144_br64_bc32_f16_causal_qouter_w4_s2_sm80"

/* Overwrites the row of key dst with src's plan (entry point, launch meta) and blobs, and a checksum
 * recomputed with fg_cache_kernel_checksum over dst's key: a row that passes the checksum but
 * holds another variant's kernel. */
static void plant(const char *path, const fg_cache_key *dst, const fg_kernel_image *src) {
  sqlite3 *db = raw_open(path);
  uint64_t sum = fg_cache_kernel_checksum(dst->variant, fg_arch_name(dst->arch),
                                          dst->nvrtc_version, dst->template_hash,
                                          dst->flashgen_version, &src->meta, src->cubin,
                                          src->cubin_size, src->ptx, src->ptx_size);
  sqlite3_stmt *st = NULL;
  cr_assert_eq(sqlite3_prepare_v2(db,
                                  "UPDATE kernels SET plan = ?1,"
                                  " cubin = ?4, ptx = ?5, size = ?6, checksum = ?7"
                                  " WHERE variant = ?8",
                                  -1, &st, NULL),
               SQLITE_OK, "%s", sqlite3_errmsg(db));
  char plan[FG_CACHE_PLAN_MAX];
  fg_kernel_plan_format(&src->meta, plan, sizeof plan);
  sqlite3_bind_text(st, 1, plan, -1, SQLITE_TRANSIENT);
  sqlite3_bind_blob(st, 4, src->cubin, (int)src->cubin_size, SQLITE_STATIC);
  sqlite3_bind_blob(st, 5, src->ptx, (int)src->ptx_size, SQLITE_STATIC);
  sqlite3_bind_int64(st, 6, (sqlite3_int64)(src->cubin_size + src->ptx_size));
  sqlite3_bind_int64(st, 7, fg_cache_u64_to_i64(sum));
  sqlite3_bind_text(st, 8, dst->variant, -1, SQLITE_STATIC);
  cr_assert_eq(sqlite3_step(st), SQLITE_DONE);
  cr_assert_eq(sqlite3_changes(db), 1);
  sqlite3_finalize(st);
  sqlite3_close(db);
}

Test(cache_integrity, planted_row_with_a_recomputed_checksum_is_a_miss_and_evicted) {
  fg_variant pv;
  char err[256];
  cr_assert_eq(fg_variant_parse(V32, &pv, err, sizeof err), 0, "%s", err);
  cr_assert_eq(fg_variant_parse(V144, &pv, err, sizeof err), 0, "%s", err);
  char dir[256];
  snprintf(dir, sizeof dir, "%s/c", g_tmp);
  fg_cache *c = fgt_open_ok(dir);
  fg_kernel_image a = make_image(V32, NULL, 1), b = make_image(V144, NULL, 2), got;
  fg_cache_key ka = fgt_key_of(V32), kb = fgt_key_of(V144);
  fgt_put_ok(c, &ka, &a);
  fgt_put_ok(c, &kb, &b);
  cr_assert_eq(fg_cache_verify(c, NULL), 0);

  plant(fg_cache_path(c), &ka, &b);

  /* verify flags it (it said "all ok" before the fix). */
  char out[4096];
  cr_assert_eq(verify_text(c, out, sizeof out), 1, "verify must flag the planted row:\n%s", out);
  cr_assert(strstr(out, "BAD") && strstr(out, V32) && strstr(out, "fg_" V144), "%s", out);
  /* And so does `flashgen cache verify` (exit status 1). */
  char args[400];
  snprintf(args, sizeof args, "cache --dir '%s' verify", dir);
  cr_assert_eq(fg_test_run_cli(NULL, NULL, args), 1, "out: %s\nerr: %s", fg_test_out,
               fg_test_err);
  cr_assert(strstr(fg_test_out, "BAD") && strstr(fg_test_out, V32), "%s", fg_test_out);

  /* The lookup by d=32's key misses, warns, and evicts the row. */
  char warn[1024];
  cr_assert_eq(fgt_get(c, &ka, &got, warn, sizeof warn), 0, "d=144's kernel was served for d=32");
  cr_assert_null(got.cubin, "no bytes may be handed out for a mismatched entry");
  cr_assert(strstr(warn, V32) && strstr(warn, "fg_" V144) && strstr(warn, "deleted"),
            "the warning must name the key, the foreign entry point and the eviction: %s", warn);
  cr_assert_eq(fgt_kernel_count(c), 1, "the planted row must be gone, d=144's kept");
  cr_assert_eq(fgt_get(c, &ka, &got, warn, sizeof warn), 0);
  cr_assert_str_empty(warn, "after the eviction it is a plain miss: %s", warn);
  cr_assert_eq(fgt_get(c, &kb, &got, NULL, 0), 1, "d=144's own entry is untouched");
  cr_assert(same_bytes(&b, &got));
  fgt_release(&got);
  cr_assert_eq(fg_cache_verify(c, NULL), 0);

  /* Stored again (recompiled), d=32's own kernel is served. */
  fgt_put_ok(c, &ka, &a);
  cr_assert_eq(fgt_get(c, &ka, &got, NULL, 0), 1);
  cr_assert(same_bytes(&a, &got));
  fgt_release(&got);
  fgt_release(&a);
  fgt_release(&b);
  fg_cache_close(c);
}

Test(cache_integrity, planted_reference_kernel_is_a_miss) {
  char dir[256];
  snprintf(dir, sizeof dir, "%s/c", g_tmp);
  fg_cache *c = fgt_open_ok(dir);
  fg_kernel_image e = make_image("ref_f64_f16", NULL, 3), l = make_image("ref_lowp_f16", NULL, 4);
  fg_cache_key ke = fgt_key_of("ref_f64_f16"), kl = fgt_key_of("ref_lowp_f16");
  fgt_put_ok(c, &ke, &e);
  fgt_put_ok(c, &kl, &l);
  plant(fg_cache_path(c), &ke, &l); /* the low-precision reference as the fp64 one */
  cr_assert_eq(fg_cache_verify(c, NULL), 1);
  fg_kernel_image got;
  char warn[1024];
  cr_assert_eq(fgt_get(c, &ke, &got, warn, sizeof warn), 0, "the wrong reference was served");
  cr_assert(strstr(warn, "fg_ref_lowp_f16") && strstr(warn, "deleted"), "%s", warn);
  cr_assert_eq(fgt_get(c, &kl, &got, NULL, 0), 1);
  fgt_release(&got);
  fgt_release(&e);
  fgt_release(&l);
  fg_cache_close(c);
}

Test(cache_integrity, entry_points_not_named_after_a_variant_are_served) {
  /* Templates under FLASHGEN_TEMPLATE_DIR may name their kernels as they like: only an entry
   * point that names another variant is a mismatch. */
  char dir[256];
  snprintf(dir, sizeof dir, "%s/c", g_tmp);
  fg_cache *c = fgt_open_ok(dir);
  const char *entries[] = {"my_attention_kernel", "fg_fwd_custom", "fg_", "fg_" V32 "x"};
  for (size_t i = 0; i < sizeof entries / sizeof entries[0]; i++) {
    fg_kernel_image img = make_image(V32, entries[i], 5 + (unsigned)i), got;
    fg_cache_key k = fgt_key_of(V32);
    fgt_put_ok(c, &k, &img);
    char warn[1024];
    cr_assert_eq(fgt_get(c, &k, &got, warn, sizeof warn), 1, "entry %s: %s", entries[i], warn);
    cr_assert(same_bytes(&img, &got));
    cr_assert_eq(fg_cache_verify(c, NULL), 0, "entry %s", entries[i]);
    fgt_release(&got);
    fgt_release(&img);
  }
  fg_cache_close(c);
}

Test(cache_integrity, row_copied_under_another_key_fails_its_checksum) {
  /* Each key field is in the checksum: a row moved to another key without recomputing it (a
   * mix-up, not a forgery) is caught. */
  static const char *const moves[] = {
      "UPDATE kernels SET variant = '" V32 "'", "UPDATE kernels SET arch = 'sm_90a'",
      "UPDATE kernels SET nvrtc_version = 13000", "UPDATE kernels SET template_hash = 7",
      "UPDATE kernels SET flashgen_version = '9.9.9'"};
  for (size_t i = 0; i < sizeof moves / sizeof moves[0]; i++) {
    char dir[256];
    snprintf(dir, sizeof dir, "%s/c%zu", g_tmp, i);
    fg_cache *c = fgt_open_ok(dir);
    fg_kernel_image b = make_image(V144, i == 0 ? "fg_" V32 : NULL, 2), got;
    fg_cache_key kb = fgt_key_of(V144);
    fgt_put_ok(c, &kb, &b);
    sqlite3 *db = raw_open(fg_cache_path(c));
    raw_exec(db, moves[i]);
    sqlite3_close(db);
    fg_cache_key k = kb;
    if (i == 0) k.variant = V32;
    if (i == 1) k.arch = FG_ARCH_SM90A;
    if (i == 2) k.nvrtc_version = 13000;
    if (i == 3) k.template_hash = 7;
    if (i == 4) k.flashgen_version = "9.9.9";
    char warn[1024];
    cr_assert_eq(fgt_get(c, &k, &got, warn, sizeof warn), 0, "%s: a moved row was served", moves[i]);
    cr_assert(strstr(warn, "checksum") && strstr(warn, "deleted"), "%s: %s", moves[i], warn);
    cr_assert_eq(fgt_kernel_count(c), 0);
    fgt_release(&b);
    fg_cache_close(c);
  }
}

Test(cache_integrity, row_whose_recorded_key_differs_from_the_lookup_is_a_miss) {
  /* A table rebuilt with a case-insensitive variant column matches a key that differs from
   * the row's own; the row's checksum is recomputed over the lookup key, so only comparing the
   * recorded key with the key looked up catches it. */
  char dir[256];
  snprintf(dir, sizeof dir, "%s/c", g_tmp);
  fg_cache *c = fgt_open_ok(dir);
  fg_kernel_image img = make_image(V32, "fg_kernel", 1), got;
  fg_cache_key k = fgt_key_of(V32);
  fgt_put_ok(c, &k, &img);
  fg_cache_close(c);
  char path[300];
  snprintf(path, sizeof path, "%s/flashgen.sqlite3", dir);
  sqlite3 *db = raw_open(path);
  sqlite3_stmt *st = NULL;
  cr_assert_eq(sqlite3_prepare_v2(db, "SELECT sql FROM sqlite_master WHERE name = 'kernels'", -1,
                                  &st, NULL),
               SQLITE_OK);
  cr_assert_eq(sqlite3_step(st), SQLITE_ROW);
  char *sql = strdup((const char *)sqlite3_column_text(st, 0));
  sqlite3_finalize(st);
  char *at = strstr(sql, "variant TEXT NOT NULL");
  cr_assert_not_null(at, "%s", sql);
  char *nocase = sqlite3_mprintf("%.*svariant TEXT NOT NULL COLLATE NOCASE%s", (int)(at - sql), sql,
                                 at + strlen("variant TEXT NOT NULL"));
  raw_exec(db, "ALTER TABLE kernels RENAME TO old_kernels");
  raw_exec(db, nocase);
  raw_exec(db, "INSERT INTO kernels SELECT * FROM old_kernels; DROP TABLE old_kernels;");
  raw_exec(db, "UPDATE kernels SET variant = upper(variant)");
  sqlite3_free(nocase);
  free(sql);
  sqlite3_close(db);

  c = fgt_open_ok(dir);
  char warn[1024];
  cr_assert_eq(fgt_get(c, &k, &got, warn, sizeof warn), 0, "a row recorded as %s was served for %s",
               "FWD_D32_...", V32);
  cr_assert(strstr(warn, "recorded") && strstr(warn, "deleted"), "%s", warn);
  cr_assert_eq(fgt_kernel_count(c), 0);
  fgt_release(&img);
  fg_cache_close(c);
}
