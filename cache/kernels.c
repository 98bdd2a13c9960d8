/* kernels.c: compiled kernels in the cache: the entry checksum (over the key, the launch meta
 * and the blobs), the check that an entry is its key's (its recorded key is the key looked up;
 * its entry point is not named after another variant), looking an entry up (a failed check
 * deletes it and counts as a miss) and storing one (INSERT OR REPLACE, one entry per key
 * however many processes write it). */
#include <assert.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fg_cache_internal.h"
#include "fg_variant.h"

/* The header the checksum covers before the blobs: every field a fixed 8 bytes (strings 16:
 * length and hash), about 200 bytes in all. */
typedef struct hbuf {
  unsigned char b[256];
  size_t n;
} hbuf;

static void put_u64(hbuf *h, uint64_t v) {
  if (h->n + 8 > sizeof h->b) return;
  for (int i = 0; i < 8; i++) h->b[h->n++] = (unsigned char)(v >> (8 * i));
}

static void put_int(hbuf *h, long long v) { put_u64(h, fg_cache_i64_to_u64(v)); }

/* Strings are hashed length first, so "ab"+"c" and "a"+"bc" differ. Long strings are folded in
 * through their own hash. */
static void put_str(hbuf *h, const char *s) {
  size_t n = strlen(s);
  put_u64(h, n);
  put_u64(h, fg_cache_hash64(s, n, 0));
}

uint64_t fg_cache_kernel_checksum(const char *variant, const char *arch, int nvrtc_version,
                                  uint64_t template_hash, const char *flashgen_version,
                                  const fg_kernel_meta *m, const void *cubin, size_t cubin_size,
                                  const void *ptx, size_t ptx_size) {
  hbuf h = {.n = 0};
  put_u64(&h, 0x326b67662d6766ULL); /* "fg-fgk2": names this layout of the header */
  put_str(&h, variant);
  put_str(&h, arch);
  put_int(&h, nvrtc_version);
  put_u64(&h, template_hash);
  put_str(&h, flashgen_version);
  char plan[FG_CACHE_PLAN_MAX];
  fg_kernel_plan_format(m, plan, sizeof plan);
  put_str(&h, plan);
  put_int(&h, m->regs);
  put_int(&h, m->spill_store_bytes);
  put_int(&h, m->spill_load_bytes);
  put_int(&h, m->stack_bytes);
  put_u64(&h, cubin_size);
  put_u64(&h, ptx_size);
  uint64_t sum = fg_cache_hash64(h.b, h.n, 0);
  sum = fg_cache_hash64(cubin, cubin_size, sum);
  return fg_cache_hash64(ptx, ptx_size, sum);
}

static void check_key(const fg_cache_key *key) {
  assert(key && key->variant && key->flashgen_version);
  assert(key->arch >= 0 && key->arch < FG_ARCH_COUNT);
  (void)key;
}

static void bind_key(sqlite3_stmt *st, int first, const fg_cache_key *key) {
  sqlite3_bind_text(st, first, key->variant, -1, SQLITE_STATIC);
  sqlite3_bind_text(st, first + 1, fg_arch_name(key->arch), -1, SQLITE_STATIC);
  sqlite3_bind_int(st, first + 2, key->nvrtc_version);
  sqlite3_bind_int64(st, first + 3, fg_cache_u64_to_i64(key->template_hash));
  sqlite3_bind_text(st, first + 4, key->flashgen_version, -1, SQLITE_STATIC);
}

/* ---- get ---- */

const char *fg_cache_read_meta(sqlite3_stmt *st, int col, fg_kernel_meta *m) {
  memset(m, 0, sizeof *m);
  const char *plan = (const char *)sqlite3_column_text(st, col);
  if (!plan) return "plan missing";
  const char *why = fg_kernel_plan_parse(plan, m);
  if (why) return why;
  m->regs = sqlite3_column_int(st, col + 1);
  m->spill_store_bytes = sqlite3_column_int(st, col + 2);
  m->spill_load_bytes = sqlite3_column_int(st, col + 3);
  m->stack_bytes = sqlite3_column_int(st, col + 4);
  return NULL;
}

/* 1 if name is one of flashgen's kernels: a variant name, or a reference kernel's
 * (ref_f64_<dtype>, ref_lowp_<dtype>). */
static int is_kernel_name(const char *name) {
  fg_variant v;
  char err[160];
  if (fg_variant_parse(name, &v, err, sizeof err) == 0) return 1;
  fg_dtype t;
  if (strncmp(name, "ref_f64_", 8) == 0) return fg_dtype_parse(name + 8, &t) == 0;
  if (strncmp(name, "ref_lowp_", 9) == 0) return fg_dtype_parse(name + 9, &t) == 0;
  return 0;
}

/* The reasons below name the entry point; one buffer per thread, read before the next check. */
static _Thread_local char g_why[FG_VARIANT_NAME_MAX + sizeof ((fg_plan_step *)0)->entry + 96];

/* The templates name a kernel's entry point "fg_" + its variant (templates/fwd.lua, M.entry):
 * an entry point named after another kernel means the row holds that kernel (a mix-up, or a
 * planted row whose checksum was recomputed), and its launch contract is that kernel's too.
 * Entry points not named after any kernel (a template of one's own) are not judged. */
static const char *entry_of_another_kernel(const char *variant, const fg_kernel_meta *m) {
  const fg_plan_step *s = fg_kernel_main(m);
  char entry[sizeof s->entry + 1];
  memcpy(entry, s->entry, sizeof s->entry);
  entry[sizeof s->entry] = '\0';
  if (strncmp(entry, "fg_", 3) != 0 || strcmp(entry + 3, variant) == 0) return NULL;
  if (!is_kernel_name(entry + 3)) return NULL;
  snprintf(g_why, sizeof g_why, "its entry point %s is another kernel's", entry);
  return g_why;
}

const char *fg_cache_check_entry(const char *variant, const char *arch, int nvrtc_version,
                                 uint64_t template_hash, const char *flashgen_version,
                                 const fg_kernel_meta *m, const void *cubin, size_t cubin_size,
                                 const void *ptx, size_t ptx_size, long long size,
                                 uint64_t checksum) {
  const char *why = entry_of_another_kernel(variant, m);
  if (why) return why;
  if ((long long)(cubin_size + ptx_size) != size)
    return "size differs from the recorded size (truncated?)";
  uint64_t got = fg_cache_kernel_checksum(variant, arch, nvrtc_version, template_hash,
                                          flashgen_version, m, cubin, cubin_size, ptx, ptx_size);
  return got == checksum ? NULL : "checksum mismatch";
}

/* The blobs are not selected: they are read straight into the caller's buffers (incremental
 * blob I/O), which saves a copy of each through SQLite's own buffer. */
static const char select_sql[] =
    "SELECT id, " FG_CACHE_META_COLS
    ", size, checksum,"
    " typeof(cubin) = 'blob' AND typeof(ptx) = 'blob',"
    " variant, arch, nvrtc_version, template_hash, flashgen_version FROM kernels"
    " WHERE variant = ?1 AND arch = ?2 AND nvrtc_version = ?3 AND template_hash = ?4"
    " AND flashgen_version = ?5";

/* Reads column col of kernel row id into a malloc'd buffer, with a NUL byte after it (so the
 * PTX is a C string). */
static int read_blob(sqlite3 *db, const char *col, sqlite3_int64 id, unsigned char **out,
                     size_t *n) {
  sqlite3_blob *b = NULL;
  *out = NULL;
  *n = 0;
  int rc = sqlite3_blob_open(db, "main", "kernels", col, id, 0, &b);
  if (rc != SQLITE_OK) {
    sqlite3_blob_close(b);
    return rc;
  }
  int len = sqlite3_blob_bytes(b);
  unsigned char *buf = malloc((size_t)len + 1);
  if (!buf)
    rc = SQLITE_NOMEM;
  else if (len > 0)
    rc = sqlite3_blob_read(b, buf, len, 0);
  sqlite3_blob_close(b);
  if (rc != SQLITE_OK) {
    free(buf);
    return rc;
  }
  buf[len] = '\0';
  *out = buf;
  *n = (size_t)len;
  return SQLITE_OK;
}

enum { LOOKUP_MISS, LOOKUP_HIT, LOOKUP_BAD };

static int text_is(sqlite3_stmt *st, int col, const char *want) {
  const char *s = (const char *)sqlite3_column_text(st, col);
  return s && strcmp(s, want) == 0;
}

/* The key recorded in the row (columns 9..13 of select_sql) against the key it was found by.
 * The WHERE clause makes them equal in a database flashgen wrote; a table rebuilt with another
 * collation, say, would match rows of other keys (and the checksum, computed over the key
 * looked up, would not notice). Returns NULL, or what differs. */
static const char *recorded_key_differs(sqlite3_stmt *st, const fg_cache_key *key) {
  if (!text_is(st, 9, key->variant)) {
    const char *rec = (const char *)sqlite3_column_text(st, 9);
    snprintf(g_why, sizeof g_why, "its recorded variant %.*s differs from the key's",
             FG_VARIANT_NAME_MAX, rec ? rec : "(none)");
    return g_why;
  }
  if (!text_is(st, 10, fg_arch_name(key->arch))) return "its recorded arch differs from the key's";
  if (sqlite3_column_type(st, 11) != SQLITE_INTEGER ||
      sqlite3_column_int64(st, 11) != key->nvrtc_version)
    return "its recorded NVRTC version differs from the key's";
  if (sqlite3_column_type(st, 12) != SQLITE_INTEGER ||
      fg_cache_i64_to_u64(sqlite3_column_int64(st, 12)) != key->template_hash)
    return "its recorded template hash differs from the key's";
  if (!text_is(st, 13, key->flashgen_version))
    return "its recorded flashgen version differs from the key's";
  return NULL;
}

/* One try at reading key's entry, in a read transaction so the row and its blobs are one
 * snapshot. Sets *state (and fills img on a hit; *bad_id and bad_why, what is wrong, for a bad
 * entry); returns an SQLite code. */
static int lookup(fg_cache *c, const fg_cache_key *key, fg_kernel_image *img, int *state,
                  sqlite3_int64 *bad_id, char *bad_why, size_t bad_why_len) {
  *state = LOOKUP_MISS;
  int rc = sqlite3_exec(c->db, "BEGIN", NULL, NULL, NULL);
  if (rc != SQLITE_OK) return rc;
  sqlite3_stmt *st = NULL;
  unsigned char *cubin = NULL, *ptx = NULL;
  size_t cubin_size = 0, ptx_size = 0;
  rc = sqlite3_prepare_v2(c->db, select_sql, -1, &st, NULL);
  if (rc == SQLITE_OK) {
    bind_key(st, 1, key);
    rc = sqlite3_step(st);
  }
  if (rc == SQLITE_DONE) {
    rc = SQLITE_OK;
  } else if (rc == SQLITE_ROW) {
    rc = SQLITE_OK;
    sqlite3_int64 id = sqlite3_column_int64(st, 0);
    fg_kernel_meta m;
    const char *why = recorded_key_differs(st, key);
    if (!why) why = fg_cache_read_meta(st, 1, &m);
    if (!why && !sqlite3_column_int(st, 8)) why = "cubin or PTX missing";
    if (!why) rc = read_blob(c->db, "cubin", id, &cubin, &cubin_size);
    if (!why && rc == SQLITE_OK) rc = read_blob(c->db, "ptx", id, &ptx, &ptx_size);
    if (!why && rc == SQLITE_OK)
      why = fg_cache_check_entry(key->variant, fg_arch_name(key->arch), key->nvrtc_version,
                                 key->template_hash, key->flashgen_version, &m, cubin, cubin_size,
                                 ptx, ptx_size, sqlite3_column_int64(st, 6),
                                 fg_cache_i64_to_u64(sqlite3_column_int64(st, 7)));
    if (rc == SQLITE_OK && why) {
      *state = LOOKUP_BAD;
      *bad_id = id;
      snprintf(bad_why, bad_why_len, "%s", why);
    } else if (rc == SQLITE_OK) {
      *state = LOOKUP_HIT;
      memset(img, 0, sizeof *img);
      snprintf(img->variant, sizeof img->variant, "%s", key->variant);
      img->arch = key->arch;
      img->cubin = cubin;
      img->cubin_size = cubin_size;
      img->ptx = (char *)ptx; /* NUL-terminated by read_blob */
      img->ptx_size = ptx_size;
      img->meta = m;
      img->compile_ms = 0;
      cubin = NULL;
      ptx = NULL;
    }
  }
  free(cubin);
  free(ptx);
  sqlite3_finalize(st);
  sqlite3_exec(c->db, rc == SQLITE_OK ? "COMMIT" : "ROLLBACK", NULL, NULL, NULL);
  return rc;
}

static int delete_bad_txn(fg_cache *c, void *ud) {
  sqlite3_stmt *st = NULL;
  /* By row id: a process that has meanwhile replaced the entry gave it a new id, and its good
   * entry is left alone. */
  int rc = sqlite3_prepare_v2(c->db, "DELETE FROM kernels WHERE id = ?1", -1, &st, NULL);
  if (rc == SQLITE_OK) {
    sqlite3_bind_int64(st, 1, *(const sqlite3_int64 *)ud);
    rc = sqlite3_step(st);
    if (rc == SQLITE_DONE) rc = SQLITE_OK;
  }
  sqlite3_finalize(st);
  return rc;
}

int fg_cache_get_kernel(fg_cache *c, const fg_cache_key *key, fg_kernel_image *img, char *warn,
                        size_t warnlen) {
  if (warn && warnlen) warn[0] = '\0';
  if (!c) return 0;
  check_key(key);
  pthread_mutex_lock(&c->mu);
  int state = LOOKUP_MISS, rc = SQLITE_OK;
  sqlite3_int64 bad_id = -1;
  char why[sizeof g_why] = "";
  for (int attempt = 0; attempt < 5; attempt++) {
    rc = lookup(c, key, img, &state, &bad_id, why, sizeof why);
    if (!fg_cache_is_busy(rc)) break;
  }
  if (state == LOOKUP_BAD) {
    int drc = fg_cache_write_txn(c, delete_bad_txn, &bad_id);
    fg_cache_warnf(warn, warnlen,
                   "flashgen: cache entry %s (%s) in %s failed its checksum and key check (%s) "
                   "and %s; it counts as a miss and will be compiled again (`flashgen cache "
                   "verify` checks every entry)",
                   key->variant, fg_arch_name(key->arch), c->path, why,
                   drc == SQLITE_OK ? "was deleted" : "could not be deleted");
  } else if (rc != SQLITE_OK) {
    fg_cache_warnf(warn, warnlen,
                   "flashgen: cache %s: looking up %s failed (%s); treated as a miss; run "
                   "`flashgen cache verify` or `flashgen cache clear` if this repeats",
                   c->path, key->variant, sqlite3_errstr(rc));
  }
  pthread_mutex_unlock(&c->mu);
  return state == LOOKUP_HIT;
}

/* ---- put ---- */

typedef struct put_args {
  const fg_cache_key *key;
  const fg_kernel_image *img;
  const fg_kernel_meta *meta;
  uint64_t sum;
} put_args;

static int put_txn(fg_cache *c, void *ud) {
  const put_args *a = ud;
  const fg_kernel_meta *m = a->meta;
  sqlite3_stmt *st = NULL;
  int rc = sqlite3_prepare_v2(
      c->db,
      "INSERT OR REPLACE INTO kernels(variant, arch, nvrtc_version, template_hash,"
      " flashgen_version, plan, regs, spill_store_bytes, spill_load_bytes, stack_bytes, size,"
      " checksum, created, cubin, ptx)"
      " VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15)",
      -1, &st, NULL);
  if (rc != SQLITE_OK) {
    sqlite3_finalize(st);
    return rc;
  }
  bind_key(st, 1, a->key);
  char plan[FG_CACHE_PLAN_MAX];
  fg_kernel_plan_format(m, plan, sizeof plan);
  sqlite3_bind_text(st, 6, plan, -1, SQLITE_TRANSIENT);
  sqlite3_bind_int(st, 7, m->regs);
  sqlite3_bind_int(st, 8, m->spill_store_bytes);
  sqlite3_bind_int(st, 9, m->spill_load_bytes);
  sqlite3_bind_int(st, 10, m->stack_bytes);
  sqlite3_bind_int64(st, 11, (sqlite3_int64)(a->img->cubin_size + a->img->ptx_size));
  sqlite3_bind_int64(st, 12, fg_cache_u64_to_i64(a->sum));
  sqlite3_bind_int64(st, 13, (sqlite3_int64)time(NULL));
  /* An empty cubin or PTX is stored as a zero-length blob, never as NULL. */
  sqlite3_bind_blob64(st, 14, a->img->cubin ? (const void *)a->img->cubin : "", a->img->cubin_size,
                      SQLITE_STATIC);
  sqlite3_bind_blob64(st, 15, a->img->ptx ? (const void *)a->img->ptx : "", a->img->ptx_size,
                      SQLITE_STATIC);
  rc = sqlite3_step(st);
  if (rc == SQLITE_DONE) rc = SQLITE_OK;
  sqlite3_finalize(st);
  return rc;
}

int fg_cache_put_kernel(fg_cache *c, const fg_cache_key *key, const fg_kernel_image *img,
                        char *warn, size_t warnlen) {
  if (warn && warnlen) warn[0] = '\0';
  if (!c) return -1;
  check_key(key);
  assert(img && (img->cubin || img->cubin_size == 0) && (img->ptx || img->ptx_size == 0));
  pthread_mutex_lock(&c->mu);
  if (c->write_failed) { /* already reported once */
    pthread_mutex_unlock(&c->mu);
    return -1;
  }
  fg_kernel_meta meta = img->meta;
  put_args a = {key, img, &meta, 0};
  a.sum = fg_cache_kernel_checksum(key->variant, fg_arch_name(key->arch), key->nvrtc_version,
                                   key->template_hash, key->flashgen_version, &meta, img->cubin,
                                   img->cubin_size, img->ptx, img->ptx_size);
  int rc = fg_cache_write_txn(c, put_txn, &a);
  if (rc != SQLITE_OK) {
    char what[FG_VARIANT_NAME_MAX + 32];
    snprintf(what, sizeof what, "storing kernel %s", key->variant);
    fg_cache_write_failed(c, rc, what, warn, warnlen);
  }
  pthread_mutex_unlock(&c->mu);
  return rc == SQLITE_OK ? 0 : -1;
}
