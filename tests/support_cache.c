/* support_cache.c: the helpers of cache_support.h (linked into every test; used by the cache
 * tests). */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cache_support.h"
#include "support_plan.h"

void fgt_rm_rf(const char *path) {
  struct stat st;
  if (lstat(path, &st) != 0) return;
  if (S_ISDIR(st.st_mode)) {
    chmod(path, 0700);
    DIR *d = opendir(path);
    if (d) {
      struct dirent *e;
      while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        size_t n = strlen(path) + strlen(e->d_name) + 2;
        char *p = malloc(n);
        if (!p) continue;
        snprintf(p, n, "%s/%s", path, e->d_name);
        fgt_rm_rf(p);
        free(p);
      }
      closedir(d);
    }
    rmdir(path);
  } else {
    unlink(path);
  }
}

fg_cache *fgt_open_ok(const char *dir) {
  char warn[1024];
  fg_cache *c = fg_cache_open(dir, warn, sizeof warn);
  cr_assert_not_null(c, "fg_cache_open(%s): %s", dir ? dir : "NULL", warn);
  cr_assert_str_empty(warn, "unexpected warning: %s", warn);
  return c;
}

fg_cache_key fgt_key_of(const char *variant) {
  fg_cache_key k = {variant, FG_ARCH_SM80, 12040, 0xF1E2D3C4B5A69788ULL, "0.1.0"};
  return k;
}

void fgt_release(fg_kernel_image *img) {
  free(img->cubin);
  free(img->ptx);
  img->cubin = NULL;
  img->ptx = NULL;
}

void fgt_put_ok(fg_cache *c, const fg_cache_key *k, const fg_kernel_image *img) {
  char warn[1024];
  cr_assert_eq(fg_cache_put_kernel(c, k, img, warn, sizeof warn), 0, "put %s: %s", k->variant,
               warn);
  cr_assert_str_empty(warn);
}

void fgt_put_image(fg_cache *c, const fg_cache_key *k, const fg_kernel_meta *meta) {
  fg_kernel_image img;
  memset(&img, 0, sizeof img);
  snprintf(img.variant, sizeof img.variant, "%s", k->variant);
  img.arch = FG_ARCH_SM90A;
  unsigned char cubin[64];
  for (size_t i = 0; i < sizeof cubin; i++) cubin[i] = (unsigned char)(i * 7);
  char ptx[] = "// ptx";
  img.cubin = cubin;
  img.cubin_size = sizeof cubin;
  img.ptx = ptx;
  img.ptx_size = strlen(ptx);
  img.meta = *meta;
  fgt_put_ok(c, k, &img);
}

int fgt_get(fg_cache *c, const fg_cache_key *k, fg_kernel_image *out, char *warn, size_t len) {
  memset(out, 0, sizeof *out);
  return fg_cache_get_kernel(c, k, out, warn, len);
}

long long fgt_kernel_count(fg_cache *c) {
  fg_cache_counts n;
  cr_assert_eq(fg_cache_count(c, &n), 0);
  return n.kernels;
}

char fgt_tmp[64], fgt_dir[128];

void fgt_cache_setup(void) {
  snprintf(fgt_tmp, sizeof fgt_tmp, "/tmp/fg-cache-test-XXXXXX");
  cr_assert_not_null(mkdtemp(fgt_tmp), "mkdtemp: %s", strerror(errno));
  snprintf(fgt_dir, sizeof fgt_dir, "%s/c", fgt_tmp);
  unsetenv("FLASHGEN_CACHE_DIR");
}

void fgt_cache_teardown(void) { fgt_rm_rf(fgt_tmp); }


void fgt_open_refused(const char *dir, const char *expect_in_warn) {
  char warn[1024];
  fg_cache *c = fg_cache_open(dir, warn, sizeof warn);
  cr_assert_null(c, "fg_cache_open(%s) accepted a directory it must refuse", dir);
  cr_assert(strstr(warn, expect_in_warn) != NULL, "warning lacks \"%s\": %s", expect_in_warn, warn);
  cr_assert(strstr(warn, "FLASHGEN_CACHE_DIR") != NULL, "warning says not what to do: %s", warn);
}

fg_kernel_image fgt_image_bytes(const char *variant, unsigned seed, size_t cubin_size,
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
  return img;
}

fg_kernel_image fgt_make_image(const char *variant, unsigned seed, size_t cubin_size,
                               size_t ptx_size) {
  fg_kernel_image img = fgt_image_bytes(variant, seed, cubin_size, ptx_size);
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
int fgt_same_plan(const fg_kernel_meta *a, const fg_kernel_meta *b) {
  if (a->n_steps != b->n_steps || a->main_step != b->main_step ||
      a->n_workspaces != b->n_workspaces)
    return 0;
  for (int i = 0; i < a->n_steps; i++) {
    const fg_plan_step *x = &a->steps[i], *y = &b->steps[i];
    if (strcmp(x->entry, y->entry) || x->grid != y->grid || x->br != y->br ||
        x->threads != y->threads || x->smem_bytes != y->smem_bytes ||
        x->split_rows != y->split_rows || x->tail != y->tail)
      return 0;
  }
  for (int i = 0; i < a->n_workspaces; i++) {
    const fg_plan_workspace *x = &a->workspaces[i], *y = &b->workspaces[i];
    if (strcmp(x->name, y->name) || strcmp(x->param, y->param) || x->bytes != y->bytes ||
        x->rows != y->rows || x->deterministic_only != y->deterministic_only ||
        x->per_key != y->per_key || x->min_group_rows != y->min_group_rows || x->tail != y->tail)
      return 0;
  }
  return 1;
}

/* The contract of fg_cache_get_kernel: the buffers come from malloc and free() releases them. */
int fgt_same_image(const fg_kernel_image *a, const fg_kernel_image *b) {
  return a->cubin_size == b->cubin_size && a->ptx_size == b->ptx_size &&
         memcmp(a->cubin, b->cubin, a->cubin_size) == 0 &&
         memcmp(a->ptx, b->ptx, a->ptx_size) == 0 && b->ptx[b->ptx_size] == '\0' &&
         fgt_same_plan(&a->meta, &b->meta) && a->meta.regs == b->meta.regs && a->meta.spill_store_bytes == b->meta.spill_store_bytes &&
         a->meta.spill_load_bytes == b->meta.spill_load_bytes &&
         a->meta.stack_bytes == b->meta.stack_bytes;
}

/* Runs sql on the cache's database through a separate connection (to damage it on purpose). */
void fgt_db_exec(const char *path, const char *sql) {
  sqlite3 *db = NULL;
  cr_assert_eq(sqlite3_open(path, &db), SQLITE_OK);
  sqlite3_busy_timeout(db, 5000);
  char *err = NULL;
  cr_assert_eq(sqlite3_exec(db, sql, NULL, NULL, &err), SQLITE_OK, "%s: %s", sql, err);
  sqlite3_close(db);
}

/* Flips one bit of the cubin (column "cubin") or ptx of variant's entry. */
void fgt_flip_bit(const char *path, const char *variant, const char *column, size_t byte,
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
char *fgt_capture(int (*fn)(fg_cache *, FILE *), fg_cache *c, int *ret) {
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  cr_assert_not_null(f);
  *ret = fn(c, f);
  fclose(f);
  return buf;
}
