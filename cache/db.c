/* db.c: the cache's database handle: opening it (WAL, busy timeout), the schema and its
 * version (migrate, or drop and rebuild), the write-transaction retry loop shared by every
 * writer, and how a failed write degrades the cache to read-only with one warning. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "fg_cache_internal.h"

/* Version 1. Blobs sit last in their rows so listing entries never reads them. Integers that
 * SQLite cannot hold unsigned (template_hash, checksum) are stored as their signed bit pattern. */
static const char schema_v1[] =
    "CREATE TABLE kernels("
    " id INTEGER PRIMARY KEY,"
    " variant TEXT NOT NULL, arch TEXT NOT NULL, nvrtc_version INTEGER NOT NULL,"
    " template_hash INTEGER NOT NULL, flashgen_version TEXT NOT NULL,"
    " entry TEXT NOT NULL, threads INTEGER NOT NULL, smem_bytes INTEGER NOT NULL,"
    " grid INTEGER NOT NULL, br INTEGER NOT NULL, workspace_floats_per_row INTEGER NOT NULL,"
    " regs INTEGER NOT NULL, spill_store_bytes INTEGER NOT NULL, spill_load_bytes INTEGER NOT NULL,"
    " stack_bytes INTEGER NOT NULL,"
    " size INTEGER NOT NULL, checksum INTEGER NOT NULL, created INTEGER NOT NULL,"
    " cubin BLOB, ptx BLOB,"
    " UNIQUE(variant, arch, nvrtc_version, template_hash, flashgen_version));"
    "CREATE TABLE devices("
    " id INTEGER PRIMARY KEY, name TEXT NOT NULL, cc_major INTEGER NOT NULL,"
    " cc_minor INTEGER NOT NULL, sm_count INTEGER NOT NULL, driver_version INTEGER NOT NULL,"
    " UNIQUE(name, cc_major, cc_minor, sm_count, driver_version));"
    "CREATE TABLE tuning("
    " device_id INTEGER NOT NULL, bucket TEXT NOT NULL, winner TEXT, updated INTEGER NOT NULL,"
    " PRIMARY KEY(device_id, bucket));"
    "CREATE TABLE candidates("
    " device_id INTEGER NOT NULL, bucket TEXT NOT NULL, variant TEXT NOT NULL,"
    " ok INTEGER NOT NULL, reason TEXT NOT NULL, ms REAL NOT NULL, tflops REAL NOT NULL,"
    " measured INTEGER NOT NULL,"
    " PRIMARY KEY(device_id, bucket, variant));";

/* migrations[v]: SQL that upgrades a version-v database to v+1 in place, or NULL when there is
 * no such path and the tables are dropped and rebuilt instead. Version 0 is an empty database
 * (or one from before versioning), so it is always rebuilt. */
static const char *const migrations[FG_CACHE_SCHEMA_VERSION] = {NULL};

int fg_cache_is_busy(int rc) {
  rc &= 0xff;
  return rc == SQLITE_BUSY || rc == SQLITE_LOCKED;
}

static void backoff(int attempt) {
  /* 1, 2, 4 ... 64 ms with jitter, so retrying processes do not march in step. */
  long ms = 1L << (attempt < 6 ? attempt : 6);
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  long jitter_us =
      (long)(((unsigned long)now.tv_nsec ^ (unsigned long)getpid() * 2654435761UL) % 1000);
  struct timespec ts = {0, ms * 1000000L + jitter_us * 1000L};
  while (ts.tv_nsec >= 1000000000L) {
    ts.tv_sec++;
    ts.tv_nsec -= 1000000000L;
  }
  nanosleep(&ts, NULL);
}

int fg_cache_write_txn(fg_cache *c, fg_cache_txn_fn fn, void *ud) {
  int rc = SQLITE_BUSY;
  /* The busy timeout already waits inside each step; this loop covers the cases where SQLite
   * returns BUSY without waiting (a deadlock it detects, a WAL restart). */
  for (int attempt = 0; attempt < 20; attempt++) {
    if (attempt > 0) backoff(attempt);
    rc = sqlite3_exec(c->db, "BEGIN IMMEDIATE", NULL, NULL, NULL);
    if (fg_cache_is_busy(rc)) continue;
    if (rc != SQLITE_OK) return rc;
    rc = fn(c, ud);
    if (rc == SQLITE_OK) rc = sqlite3_exec(c->db, "COMMIT", NULL, NULL, NULL);
    if (rc == SQLITE_OK) return SQLITE_OK;
    if (sqlite3_get_autocommit(c->db) == 0) sqlite3_exec(c->db, "ROLLBACK", NULL, NULL, NULL);
    if (!fg_cache_is_busy(rc)) return rc;
  }
  return rc;
}

void fg_cache_write_failed(fg_cache *c, int rc, const char *what, char *warn, size_t len) {
  int prim = rc & 0xff;
  const char *hint = "run `flashgen cache verify`, or set FLASHGEN_CACHE_DIR to another directory";
  int lasting = 1;
  switch (prim) {
    case SQLITE_FULL:
      hint =
          "the disk (or the database's size limit) is full: free space or run `flashgen cache "
          "clear`";
      break;
    case SQLITE_READONLY:
    case SQLITE_PERM:
    case SQLITE_CANTOPEN:
    case SQLITE_AUTH:
      hint =
          "the database is read-only: make it and its directory writable (chmod u+w), or set "
          "FLASHGEN_CACHE_DIR to a writable private directory";
      break;
    case SQLITE_IOERR:
      hint = "an I/O error: check the disk, or set FLASHGEN_CACHE_DIR to another directory";
      break;
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB:
      hint = "the database is damaged: run `flashgen cache clear` (or delete it)";
      break;
    default:
      lasting = 0;
      break;
  }
  if (lasting) c->write_failed = 1;
  fg_cache_warnf(warn, len, "flashgen: cache %s: %s failed (%s); %s; continuing from memory%s",
                 c->path, what, sqlite3_errstr(rc), hint,
                 lasting ? ", no more kernels will be stored in this process" : "");
}

/* Runs a statement that returns one integer (a PRAGMA); -1 on error with *rcp set. */
static long long query_int(sqlite3 *db, const char *sql, int *rcp) {
  sqlite3_stmt *st = NULL;
  long long v = -1;
  int rc = sqlite3_prepare_v2(db, sql, -1, &st, NULL);
  if (rc == SQLITE_OK) {
    rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
      v = sqlite3_column_int64(st, 0);
      rc = SQLITE_OK;
    } else if (rc == SQLITE_DONE) {
      rc = SQLITE_OK;
    }
  }
  sqlite3_finalize(st);
  if (rcp) *rcp = rc;
  return v;
}

static int drop_all_tables(sqlite3 *db) {
  for (;;) {
    sqlite3_stmt *st = NULL;
    int rc =
        sqlite3_prepare_v2(db,
                           "SELECT type, name FROM sqlite_master WHERE type IN ('table','view')"
                           " AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\' LIMIT 1",
                           -1, &st, NULL);
    if (rc != SQLITE_OK) return rc;
    rc = sqlite3_step(st);
    if (rc == SQLITE_DONE) {
      sqlite3_finalize(st);
      return SQLITE_OK;
    }
    if (rc != SQLITE_ROW) {
      sqlite3_finalize(st);
      return rc;
    }
    char *sql = sqlite3_mprintf(
        "DROP %s \"%w\"",
        strcmp((const char *)sqlite3_column_text(st, 0), "view") == 0 ? "VIEW" : "TABLE",
        (const char *)sqlite3_column_text(st, 1));
    sqlite3_finalize(st);
    if (!sql) return SQLITE_NOMEM;
    rc = sqlite3_exec(db, sql, NULL, NULL, NULL);
    sqlite3_free(sql);
    if (rc != SQLITE_OK) return rc;
  }
}

static int upgrade_txn(fg_cache *c, void *ud) {
  (void)ud;
  int rc;
  long long v = query_int(c->db, "PRAGMA user_version", &rc);
  if (rc != SQLITE_OK) return rc;
  if (v == FG_CACHE_SCHEMA_VERSION) return SQLITE_OK; /* another process got here first */
  if (v > FG_CACHE_SCHEMA_VERSION) return SQLITE_SCHEMA;
  while (v >= 0 && v < FG_CACHE_SCHEMA_VERSION && migrations[v]) {
    rc = sqlite3_exec(c->db, migrations[v], NULL, NULL, NULL);
    if (rc != SQLITE_OK) return rc;
    v++;
  }
  if (v != FG_CACHE_SCHEMA_VERSION) {
    rc = drop_all_tables(c->db);
    if (rc == SQLITE_OK) rc = sqlite3_exec(c->db, schema_v1, NULL, NULL, NULL);
    if (rc != SQLITE_OK) return rc;
  }
  char sql[64];
  snprintf(sql, sizeof sql, "PRAGMA user_version = %d", FG_CACHE_SCHEMA_VERSION);
  return sqlite3_exec(c->db, sql, NULL, NULL, NULL);
}

/* Sets up an open connection: timeouts, WAL, the schema. Returns an SQLite code; a database
 * written by a newer flashgen gives SQLITE_SCHEMA. */
static int setup(fg_cache *c) {
  int rc = sqlite3_busy_timeout(c->db, FG_CACHE_BUSY_TIMEOUT_MS);
  if (rc != SQLITE_OK) return rc;
  /* Reading the version first also makes SQLite read the header: a file that is not a database
   * fails here with SQLITE_NOTADB. */
  long long v = -1;
  for (int attempt = 0; attempt < 20; attempt++) {
    if (attempt > 0) backoff(attempt);
    v = query_int(c->db, "PRAGMA user_version", &rc);
    if (!fg_cache_is_busy(rc)) break;
  }
  if (rc != SQLITE_OK) return rc;
  if (v > FG_CACHE_SCHEMA_VERSION) return SQLITE_SCHEMA;
  /* WAL lets readers and one writer proceed at once across processes. Switching needs an
   * exclusive lock, hence the retries; a file system without shared memory keeps the rollback
   * journal, which is slower but correct. */
  for (int attempt = 0; attempt < 20; attempt++) {
    if (attempt > 0) backoff(attempt);
    rc = sqlite3_exec(c->db, "PRAGMA journal_mode=WAL", NULL, NULL, NULL);
    if (!fg_cache_is_busy(rc)) break;
  }
  if (rc != SQLITE_OK && (rc & 0xff) != SQLITE_READONLY) return rc;
  sqlite3_exec(c->db, "PRAGMA synchronous=NORMAL", NULL, NULL, NULL);
  if (v == FG_CACHE_SCHEMA_VERSION) return SQLITE_OK;
  return fg_cache_write_txn(c, upgrade_txn, NULL);
}

static int open_db(fg_cache *c) {
  int rc = sqlite3_open_v2(c->path, &c->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, NULL);
  if (rc == SQLITE_OK) rc = setup(c);
  if (rc != SQLITE_OK) {
    sqlite3_close(c->db);
    c->db = NULL;
  }
  return rc;
}

static void remove_db_files(const char *path) {
  char p[PATH_MAX + 8];
  unlink(path);
  snprintf(p, sizeof p, "%s-wal", path);
  unlink(p);
  snprintf(p, sizeof p, "%s-shm", path);
  unlink(p);
  snprintf(p, sizeof p, "%s-journal", path);
  unlink(p);
}

fg_cache *fg_cache_open(const char *dir, char *warn, size_t warnlen) {
  if (warn && warnlen) warn[0] = '\0';
  fg_cache *c = calloc(1, sizeof *c);
  if (!c) {
    fg_cache_warnf(warn, warnlen, "flashgen: out of memory opening the cache; compiling in memory");
    return NULL;
  }
  char why[512];
  if (fg_cache_resolve_dir_why(dir, c->dir, sizeof c->dir, why, sizeof why) != 0) {
    fg_cache_warnf(warn, warnlen, "flashgen: %s; compiling in memory", why);
    free(c);
    return NULL;
  }
  if (snprintf(c->path, sizeof c->path, "%s/%s", c->dir, FG_CACHE_DB_NAME) >= (int)sizeof c->path) {
    fg_cache_warnf(warn, warnlen,
                   "flashgen: cache directory path %s is too long; set FLASHGEN_CACHE_DIR to a "
                   "shorter private directory; compiling in memory",
                   c->dir);
    free(c);
    return NULL;
  }
  if (fg_cache_prepare_dir(c->dir, warn, warnlen) != 0) {
    free(c);
    return NULL;
  }
  struct stat st;
  if (lstat(c->path, &st) == 0 && (!S_ISREG(st.st_mode) || st.st_uid != geteuid())) {
    fg_cache_warnf(warn, warnlen,
                   "flashgen: cache database %s is %s, refused; remove it or set "
                   "FLASHGEN_CACHE_DIR to a private directory; compiling in memory",
                   c->path, !S_ISREG(st.st_mode) ? "not a regular file" : "owned by another user");
    free(c);
    return NULL;
  }
  int rc = open_db(c);
  int prim = rc & 0xff;
  if (prim == SQLITE_NOTADB || prim == SQLITE_CORRUPT) {
    /* Nothing in it can be trusted or read; everything in it can be rebuilt. */
    remove_db_files(c->path);
    rc = open_db(c);
    if (rc == SQLITE_OK)
      fg_cache_warnf(warn, warnlen,
                     "flashgen: cache database %s was damaged and has been rebuilt empty; kernels "
                     "will be compiled again",
                     c->path);
  }
  if (rc != SQLITE_OK) {
    if ((rc & 0xff) == SQLITE_SCHEMA)
      fg_cache_warnf(warn, warnlen,
                     "flashgen: cache database %s was written by a newer flashgen (schema newer "
                     "than %d), left untouched; set FLASHGEN_CACHE_DIR to another directory or "
                     "upgrade flashgen; compiling in memory",
                     c->path, FG_CACHE_SCHEMA_VERSION);
    else
      fg_cache_warnf(warn, warnlen,
                     "flashgen: cannot open cache database %s (%s); check the directory's "
                     "permissions and free space, delete the file, or set FLASHGEN_CACHE_DIR to "
                     "a private directory; compiling in memory",
                     c->path, sqlite3_errstr(rc));
    free(c);
    return NULL;
  }
  if (pthread_mutex_init(&c->mu, NULL) != 0) {
    sqlite3_close(c->db);
    free(c);
    fg_cache_warnf(warn, warnlen,
                   "flashgen: cannot create a mutex for the cache; compiling in memory");
    return NULL;
  }
  return c;
}

void fg_cache_close(fg_cache *c) {
  if (!c) return;
  sqlite3_close(c->db);
  pthread_mutex_destroy(&c->mu);
  free(c);
}

const char *fg_cache_path(const fg_cache *c) { return c ? c->path : NULL; }

int fg_cache_writable(const fg_cache *c) { return c && !c->write_failed; }

int fg_cache_debug_set_max_pages(fg_cache *c, int pages) {
  pthread_mutex_lock(&c->mu);
  int rc;
  long long cur = query_int(c->db, "PRAGMA page_count", &rc);
  long long v = -1;
  if (rc == SQLITE_OK) {
    char sql[64];
    snprintf(sql, sizeof sql, "PRAGMA max_page_count = %lld", pages > 0 ? (long long)pages : cur);
    v = query_int(c->db, sql, &rc);
  }
  pthread_mutex_unlock(&c->mu);
  return rc == SQLITE_OK ? (int)v : -1;
}
