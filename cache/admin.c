/* admin.c: what `flashgen cache ls | stats | verify | clear` and `flashgen tune --list` show and
 * do: list the kernel entries and tuning records, count and size them, check every row (and the
 * file) for damage, empty the cache (rebuilding it when it is damaged). */
#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "fg_cache_internal.h"

static void format_time(sqlite3_int64 t, char *buf, size_t len) {
  time_t tt = (time_t)t;
  struct tm tm;
  if (!localtime_r(&tt, &tm) || strftime(buf, len, "%Y-%m-%d %H:%M:%S", &tm) == 0)
    snprintf(buf, len, "%lld", (long long)t);
}

static const char *text_or(sqlite3_stmt *st, int i, const char *dflt) {
  const char *s = (const char *)sqlite3_column_text(st, i);
  return s ? s : dflt;
}

int fg_cache_ls(fg_cache *c, FILE *out) {
  assert(c);
  pthread_mutex_lock(&c->mu);
  sqlite3_stmt *st = NULL;
  int n = 0;
  int rc = sqlite3_prepare_v2(c->db,
                              "SELECT variant, arch, nvrtc_version, size, created FROM kernels"
                              " ORDER BY variant, arch, nvrtc_version, flashgen_version",
                              -1, &st, NULL);
  if (rc == SQLITE_OK) {
    if (out)
      fprintf(out, "%-64s %-7s %-6s %10s  %s\n", "VARIANT", "ARCH", "NVRTC", "BYTES", "CREATED");
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
      int nv = sqlite3_column_int(st, 2);
      char nvs[32], when[32];
      snprintf(nvs, sizeof nvs, "%d.%d", nv / 1000, (nv % 1000) / 10);
      format_time(sqlite3_column_int64(st, 4), when, sizeof when);
      if (out)
        fprintf(out, "%-64s %-7s %-6s %10lld  %s\n", text_or(st, 0, "?"), text_or(st, 1, "?"), nvs,
                (long long)sqlite3_column_int64(st, 3), when);
      n++;
    }
    if (rc == SQLITE_DONE) rc = SQLITE_OK;
  }
  sqlite3_finalize(st);
  pthread_mutex_unlock(&c->mu);
  return rc == SQLITE_OK ? n : -1;
}

static long long count(sqlite3 *db, const char *sql, int *rcp) {
  sqlite3_stmt *st = NULL;
  long long v = 0;
  int rc = sqlite3_prepare_v2(db, sql, -1, &st, NULL);
  if (rc == SQLITE_OK && (rc = sqlite3_step(st)) == SQLITE_ROW) {
    v = sqlite3_column_int64(st, 0);
    rc = SQLITE_OK;
  }
  sqlite3_finalize(st);
  if (rc != SQLITE_OK && *rcp == SQLITE_OK) *rcp = rc;
  return v;
}

static long long file_size(const char *path, const char *suffix) {
  char p[PATH_MAX + 16];
  struct stat st;
  snprintf(p, sizeof p, "%s%s", path, suffix);
  return stat(p, &st) == 0 ? (long long)st.st_size : 0;
}

int fg_cache_count(fg_cache *c, fg_cache_counts *s) {
  assert(c && s);
  memset(s, 0, sizeof *s);
  pthread_mutex_lock(&c->mu);
  int rc = SQLITE_OK;
  s->kernels = count(c->db, "SELECT count(*) FROM kernels", &rc);
  s->kernel_bytes = count(c->db, "SELECT COALESCE(sum(size), 0) FROM kernels", &rc);
  s->tuning_records = count(c->db, "SELECT count(*) FROM tuning", &rc);
  s->candidates = count(c->db, "SELECT count(*) FROM candidates", &rc);
  s->devices = count(c->db, "SELECT count(*) FROM devices", &rc);
  pthread_mutex_unlock(&c->mu);
  s->file_bytes = file_size(c->path, "") + file_size(c->path, "-wal");
  return rc == SQLITE_OK ? 0 : -1;
}

int fg_cache_stats(fg_cache *c, FILE *out) {
  fg_cache_counts s;
  if (fg_cache_count(c, &s) != 0) return -1;
  if (out) {
    fprintf(out, "database:        %s\n", c->path);
    fprintf(out, "file size:       %lld bytes (with its write-ahead log)\n", s.file_bytes);
    fprintf(out, "schema version:  %d\n", FG_CACHE_SCHEMA_VERSION);
    fprintf(out, "kernels:         %lld entries, %lld bytes of cubin and PTX\n", s.kernels,
            s.kernel_bytes);
    fprintf(out, "tuning records:  %lld buckets on %lld devices, %lld candidates measured\n",
            s.tuning_records, s.devices, s.candidates);
  }
  return 0;
}

/* One kernel row as listed by verify: its id and the key columns that name it. */
typedef struct vrow {
  sqlite3_int64 id;
  int nvrtc;
  char variant[FG_VARIANT_NAME_MAX], arch[16], fgver[32];
} vrow;

typedef struct vrows {
  vrow *v;
  size_t n, cap;
} vrows;

/* Appends the rows sql lists (id, variant, arch, nvrtc_version, flashgen_version) until the end
 * or the first error, which it returns (SQLITE_OK at the end). */
static int list_rows(sqlite3 *db, const char *sql, vrows *r) {
  sqlite3_stmt *st = NULL;
  int rc = sqlite3_prepare_v2(db, sql, -1, &st, NULL);
  while (rc == SQLITE_OK && (rc = sqlite3_step(st)) == SQLITE_ROW) {
    rc = SQLITE_OK;
    if (r->n == r->cap) {
      size_t cap = r->cap ? 2 * r->cap : 64;
      vrow *v = realloc(r->v, cap * sizeof *v);
      if (!v) {
        rc = SQLITE_NOMEM;
        break;
      }
      r->v = v;
      r->cap = cap;
    }
    vrow *w = &r->v[r->n++];
    w->id = sqlite3_column_int64(st, 0);
    snprintf(w->variant, sizeof w->variant, "%s", text_or(st, 1, "?"));
    snprintf(w->arch, sizeof w->arch, "%s", text_or(st, 2, "?"));
    w->nvrtc = sqlite3_column_int(st, 3);
    snprintf(w->fgver, sizeof w->fgver, "%s", text_or(st, 4, "?"));
  }
  if (rc == SQLITE_DONE) rc = SQLITE_OK;
  sqlite3_finalize(st);
  return rc;
}

static int by_id(const void *a, const void *b) {
  sqlite3_int64 x = ((const vrow *)a)->id, y = ((const vrow *)b)->id;
  return (x > y) - (x < y);
}

static int by_name(const void *a, const void *b) {
  const vrow *x = a, *y = b;
  int d = strcmp(x->variant, y->variant);
  if (!d) d = strcmp(x->arch, y->arch);
  return d ? d : by_id(a, b);
}

/* Checks the row with id; returns NULL when it is whole, else what is wrong (in buf). */
static const char *check_row(sqlite3_stmt *st, sqlite3_int64 id, int *gone, char *buf,
                             size_t len) {
  *gone = 0;
  sqlite3_reset(st);
  sqlite3_bind_int64(st, 1, id);
  int rc = sqlite3_step(st);
  if (rc == SQLITE_DONE) {
    *gone = 1; /* deleted since it was listed */
    return NULL;
  }
  if (rc != SQLITE_ROW) {
    snprintf(buf, len, "cannot be read (%s)", sqlite3_errstr(rc));
    return buf;
  }
  fg_kernel_meta m;
  const char *why = fg_cache_read_meta(st, 5, &m);
  if (!why &&
      (sqlite3_column_type(st, 12) != SQLITE_BLOB || sqlite3_column_type(st, 13) != SQLITE_BLOB))
    why = "cubin or PTX missing";
  if (!why)
    why = fg_cache_check_entry(
        text_or(st, 0, "?"), text_or(st, 1, "?"), sqlite3_column_int(st, 2),
        fg_cache_i64_to_u64(sqlite3_column_int64(st, 3)), text_or(st, 4, ""), &m,
        sqlite3_column_blob(st, 12), (size_t)sqlite3_column_bytes(st, 12),
        sqlite3_column_blob(st, 13), (size_t)sqlite3_column_bytes(st, 13),
        sqlite3_column_int64(st, 10), fg_cache_i64_to_u64(sqlite3_column_int64(st, 11)));
  return why;
}

int fg_cache_verify(fg_cache *c, FILE *out) {
  assert(c);
  pthread_mutex_lock(&c->mu);
  /* One read transaction: a consistent snapshot of the rows and of the file. */
  sqlite3_exec(c->db, "BEGIN", NULL, NULL, NULL);
  /* The rows are listed twice, from the unique index and from the table, and then read one by
   * one: damage to a page of the table (even its root) costs the rows on that page, which are
   * still named from the index, and not every row after it. */
  vrows rows = {NULL, 0, 0};
  int rc_index = list_rows(c->db,
                           "SELECT id, variant, arch, nvrtc_version, flashgen_version FROM kernels"
                           " INDEXED BY sqlite_autoindex_kernels_1",
                           &rows);
  int rc_table = list_rows(c->db,
                           "SELECT id, variant, arch, nvrtc_version, flashgen_version FROM kernels"
                           " NOT INDEXED",
                           &rows);
  if (rows.n) qsort(rows.v, rows.n, sizeof *rows.v, by_id);
  size_t n = 0;
  for (size_t i = 0; i < rows.n; i++)
    if (n == 0 || rows.v[n - 1].id != rows.v[i].id) rows.v[n++] = rows.v[i];
  rows.n = n;
  if (rows.n) qsort(rows.v, rows.n, sizeof *rows.v, by_name);

  sqlite3_stmt *st = NULL;
  int rc = sqlite3_prepare_v2(
      c->db,
      "SELECT variant, arch, nvrtc_version, template_hash, flashgen_version, " FG_CACHE_META_COLS
      ", size, checksum, cubin, ptx FROM kernels WHERE id = ?1",
      -1, &st, NULL);
  int bad = 0;
  long long checked = 0;
  for (size_t i = 0; rc == SQLITE_OK && i < rows.n; i++) {
    char buf[128];
    int gone;
    const char *why = check_row(st, rows.v[i].id, &gone, buf, sizeof buf);
    if (gone) continue;
    checked++;
    if (why) {
      bad++;
      if (out)
        fprintf(out, "BAD  %s %s nvrtc %d flashgen %s: %s\n", rows.v[i].variant, rows.v[i].arch,
                rows.v[i].nvrtc, rows.v[i].fgver, why);
    }
  }
  sqlite3_finalize(st);

  /* The file as a whole: pages no row leads to, broken indexes, tuning tables. */
  int problems = 0;
  int rc_check = sqlite3_prepare_v2(c->db, "PRAGMA integrity_check(20)", -1, &st, NULL);
  while (rc_check == SQLITE_OK && (rc_check = sqlite3_step(st)) == SQLITE_ROW) {
    rc_check = SQLITE_OK;
    const char *msg = text_or(st, 0, "?");
    if (strcmp(msg, "ok") == 0) continue;
    problems++;
    if (out) fprintf(out, "DAMAGED  %s\n", msg);
  }
  if (rc_check == SQLITE_DONE) rc_check = SQLITE_OK;
  sqlite3_finalize(st);
  sqlite3_exec(c->db, "COMMIT", NULL, NULL, NULL);
  pthread_mutex_unlock(&c->mu);
  free(rows.v);

  int first_err = rc_index != SQLITE_OK ? rc_index : rc_table != SQLITE_OK ? rc_table : rc;
  if (first_err == SQLITE_OK) first_err = rc_check;
  int damaged = problems > 0 || first_err != SQLITE_OK;
  if (out) {
    if (damaged)
      fprintf(out,
              "%d of %lld entries bad; the database file %s is damaged (%s); run `flashgen "
              "cache clear` (it empties a damaged cache)\n",
              bad, checked, c->path,
              first_err != SQLITE_OK ? sqlite3_errstr(first_err)
                                     : "SQLite's integrity check failed");
    else if (bad)
      fprintf(out,
              "%d of %lld entries bad; they are deleted and recompiled when next used, or run "
              "`flashgen cache clear`\n",
              bad, checked);
    else
      fprintf(out, "all %lld entries ok\n", checked);
  }
  /* Nothing could be read at all (not even the list of tables). */
  if (rc_index != SQLITE_OK && rc_table != SQLITE_OK && rc_check != SQLITE_OK && !rows.n)
    return -1;
  return bad ? bad : damaged;
}

static int clear_txn(fg_cache *c, void *ud) {
  (void)ud;
  return sqlite3_exec(c->db,
                      "DELETE FROM kernels; DELETE FROM candidates; DELETE FROM tuning;"
                      " DELETE FROM devices;",
                      NULL, NULL, NULL);
}

int fg_cache_clear(fg_cache *c, char *msg, size_t len) {
  assert(c);
  if (msg && len) msg[0] = '\0';
  pthread_mutex_lock(&c->mu);
  /* Under the lock file, so no process opens the database while a damaged one is rebuilt. */
  char why[768];
  if (fg_cache_lock_file(c, why, sizeof why) != 0) {
    fg_cache_warnf(msg, len, "clearing %s failed: %s", c->path, why);
    pthread_mutex_unlock(&c->mu);
    return -1;
  }
  int rc = fg_cache_write_txn(c, clear_txn, NULL);
  if (rc == SQLITE_OK) {
    /* Give the space back; both fail harmlessly while another process is reading. VACUUM reads
     * every page, so it also finds damage that the DELETEs did not touch. */
    sqlite3_exec(c->db, "PRAGMA wal_checkpoint(TRUNCATE)", NULL, NULL, NULL);
    int vrc = sqlite3_exec(c->db, "VACUUM", NULL, NULL, NULL);
    if (fg_cache_is_damaged(vrc)) rc = vrc;
  }
  int rebuilt = 0;
  if (fg_cache_is_damaged(rc)) {
    rc = fg_cache_rebuild_locked(c);
    rebuilt = rc == SQLITE_OK;
  }
  fg_cache_unlock_file(c);
  if (rc != SQLITE_OK) {
    fg_cache_describe_failure(c, rc, why, sizeof why);
    fg_cache_warnf(msg, len, "clearing %s failed (%s): %s", c->path, sqlite3_errstr(rc), why);
  } else if (rebuilt) {
    fg_cache_warnf(msg, len, "%s was damaged: it has been emptied and rebuilt", c->path);
  }
  pthread_mutex_unlock(&c->mu);
  return rc == SQLITE_OK ? 0 : -1;
}

int fg_cache_list_tuning(fg_cache *c, FILE *out) {
  assert(c);
  pthread_mutex_lock(&c->mu);
  sqlite3_stmt *st = NULL;
  int n = 0;
  int rc = sqlite3_prepare_v2(
      c->db,
      "SELECT d.name, d.cc_major, d.cc_minor, d.sm_count, d.driver_version, t.bucket, t.winner,"
      " (SELECT k.tflops FROM candidates k WHERE k.device_id = t.device_id"
      "  AND k.bucket = t.bucket AND k.variant = t.winner),"
      " (SELECT count(*) FROM candidates k WHERE k.device_id = t.device_id AND k.bucket = "
      "t.bucket),"
      " (SELECT count(*) FROM candidates k WHERE k.device_id = t.device_id AND k.bucket = t.bucket"
      "  AND k.ok = 0)"
      " FROM tuning t JOIN devices d ON d.id = t.device_id ORDER BY d.name, d.id, t.bucket",
      -1, &st, NULL);
  if (rc == SQLITE_OK) {
    if (out)
      fprintf(out, "%-40s %-32s %-64s %8s %s\n", "DEVICE", "BUCKET", "WINNER", "TFLOP/s",
              "CANDIDATES (REJECTED)");
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
      char dev[256];
      snprintf(dev, sizeof dev, "%s (cc %d.%d, %d SMs, driver %d)", text_or(st, 0, "?"),
               sqlite3_column_int(st, 1), sqlite3_column_int(st, 2), sqlite3_column_int(st, 3),
               sqlite3_column_int(st, 4));
      if (out) {
        char tf[32];
        if (sqlite3_column_type(st, 7) == SQLITE_NULL)
          snprintf(tf, sizeof tf, "-");
        else
          snprintf(tf, sizeof tf, "%.1f", sqlite3_column_double(st, 7));
        fprintf(out, "%-40s %-32s %-64s %8s %d (%d)\n", dev, text_or(st, 5, "?"),
                text_or(st, 6, "(none)"), tf, sqlite3_column_int(st, 8), sqlite3_column_int(st, 9));
      }
      n++;
    }
    if (rc == SQLITE_DONE) rc = SQLITE_OK;
  }
  sqlite3_finalize(st);
  pthread_mutex_unlock(&c->mu);
  return rc == SQLITE_OK ? n : -1;
}
