/* db.c: the cache's database handle: opening it (WAL, bounded lock waits), the schema and its
 * version (migrate, or drop and rebuild), the write-transaction retry loop shared by every
 * writer, how a failed write degrades the cache to read-only with one warning, and the lock file
 * (flashgen.sqlite3.lock) under which one process at a time rebuilds a damaged database. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

#include "fg_cache_internal.h"

/* Version 2 (version 1 kept a one-kernel launch contract, entry ... workspace_floats_per_row, in
 * place of the plan). Blobs sit last in their rows so listing entries never reads them. Integers that
 * SQLite cannot hold unsigned (template_hash, checksum) are stored as their signed bit pattern. */
#define FG_KERNELS_TABLE_SQL \
    "CREATE TABLE kernels(" \
    " id INTEGER PRIMARY KEY," \
    " variant TEXT NOT NULL, arch TEXT NOT NULL, nvrtc_version INTEGER NOT NULL," \
    " template_hash INTEGER NOT NULL, flashgen_version TEXT NOT NULL," \
    " plan TEXT NOT NULL," \
    " regs INTEGER NOT NULL, spill_store_bytes INTEGER NOT NULL, spill_load_bytes INTEGER NOT NULL," \
    " stack_bytes INTEGER NOT NULL," \
    " size INTEGER NOT NULL, checksum INTEGER NOT NULL, created INTEGER NOT NULL," \
    " cubin BLOB, ptx BLOB," \
    " UNIQUE(variant, arch, nvrtc_version, template_hash, flashgen_version));"

static const char schema_v2[] =
    FG_KERNELS_TABLE_SQL
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
static const char *const migrations[FG_CACHE_SCHEMA_VERSION] = {
    NULL,
    /* 1 -> 2: kernels now carry their plan. Version-1 rows cannot be read as plans: they are
     * dropped (a miss, so they are compiled again); the tuning results are kept. */
    "DROP TABLE kernels;" FG_KERNELS_TABLE_SQL};

int fg_cache_is_busy(int rc) {
  rc &= 0xff;
  return rc == SQLITE_BUSY || rc == SQLITE_LOCKED;
}

int fg_cache_is_damaged(int rc) {
  rc &= 0xff;
  return rc == SQLITE_CORRUPT || rc == SQLITE_NOTADB;
}

static long long now_ms(void) {
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return (long long)now.tv_sec * 1000 + now.tv_nsec / 1000000;
}

static void sleep_ms(long ms, long jitter_us) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L + jitter_us * 1000L};
  while (ts.tv_nsec >= 1000000000L) {
    ts.tv_sec++;
    ts.tv_nsec -= 1000000000L;
  }
  nanosleep(&ts, NULL);
}

static void backoff(int attempt) {
  /* 1, 2, 4 ... 64 ms with jitter, so retrying processes do not march in step. */
  long ms = 1L << (attempt < 6 ? attempt : 6);
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  long jitter_us =
      (long)(((unsigned long)now.tv_nsec ^ (unsigned long)getpid() * 2654435761UL) % 1000);
  sleep_ms(ms, jitter_us);
}

/* SQLite's busy handler: waits for a lock held by another connection at most
 * FG_CACHE_LOCK_WAIT_MS per locking event, and not at all once the handle has given up. */
static int busy_wait(void *ud, int n) {
  fg_cache *c = ud;
  if (c->lock_gave_up) return 0;
  long long now = now_ms();
  if (n == 0) c->busy_since_ms = now;
  if (now - c->busy_since_ms >= FG_CACHE_LOCK_WAIT_MS) return 0;
  static const long delays[] = {1, 2, 5, 10, 15, 20, 25, 25, 25, 50, 50, 100};
  sleep_ms(delays[n < 12 ? n : 11], 0);
  return 1;
}

/* ---- Who holds a lock ---- */

/* The pid of a process other than this one that holds a lock on path overlapping bytes
 * [start, end] (write locks only when write_only), from /proc/locks (Linux); 0 if none found.
 * Reading /proc/locks opens none of the locked files: closing a descriptor of a file would drop
 * every POSIX lock this process holds on it, SQLite's included. */
static long lock_holder(const char *path, long long start, long long end, int write_only) {
  struct stat st;
  if (stat(path, &st) != 0) return 0;
  FILE *f = fopen("/proc/locks", "re");
  if (!f) return 0;
  char line[256];
  long found = 0;
  while (!found && fgets(line, sizeof line, f)) {
    char kind[16], rw[16], s[24], e[24];
    long pid;
    unsigned maj, min;
    unsigned long ino;
    if (sscanf(line, "%*d: %15s %*s %15s %ld %x:%x:%lu %23s %23s", kind, rw, &pid, &maj, &min,
               &ino, s, e) != 8)
      continue; /* "->" lines are waiters, not holders, and do not match either */
    if (ino != (unsigned long)st.st_ino || maj != major(st.st_dev) || min != minor(st.st_dev))
      continue;
    if (pid <= 0 || pid == (long)getpid()) continue;
    if (write_only && strcmp(rw, "WRITE") != 0) continue;
    long long ls = atoll(s), le = strcmp(e, "EOF") == 0 ? -1 : atoll(e);
    if ((le < 0 || le >= start) && (end < 0 || ls <= end)) found = pid;
  }
  fclose(f);
  return found;
}

/* " (held by process 123, name)" for the process holding the lock on the database's writes or
 * the lock file, else " (open in process 123, name)" for one that has the database open, or ""
 * when none can be found (another connection of this process, or not Linux). */
static void describe_holder(const fg_cache *c, char *buf, size_t len) {
  char p[PATH_MAX + 8];
  snprintf(p, sizeof p, "%s-shm", c->path);
  const char *how = "held by";
  long pid = lock_holder(p, 120, 120, 1); /* the WAL write lock */
  if (!pid) pid = lock_holder(c->path, 0x40000000LL, 0x40000000LL + 511, 1); /* rollback mode */
  if (!pid) pid = lock_holder(c->lock_path, 0, -1, 1);
  if (!pid) {
    /* No writer: a reader, or a connection that is only open (the WAL's "dead man switch"). */
    how = "open in";
    pid = lock_holder(p, 120, 128, 0);
  }
  buf[0] = '\0';
  if (!pid) return;
  char comm[64] = "", cp[64];
  snprintf(cp, sizeof cp, "/proc/%ld/comm", pid);
  FILE *f = fopen(cp, "re");
  if (f) {
    if (fgets(comm, sizeof comm, f)) comm[strcspn(comm, "\n")] = '\0';
    fclose(f);
  }
  snprintf(buf, len, " (%s process %ld%s%s)", how, pid, comm[0] ? ", " : "", comm);
}

/* ---- The lock file ---- */

static int lock_file_open(fg_cache *c) {
  c->lock_fd = open(c->lock_path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (c->lock_fd < 0) return -1;
  struct stat st;
  if (fstat(c->lock_fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid()) {
    close(c->lock_fd);
    c->lock_fd = -1;
    errno = EPERM;
    return -1;
  }
  return 0;
}

/* flock(op) with a bounded wait. 0, or -1 when it ran out. */
static int lock_file_take(fg_cache *c, int op, int wait_ms) {
  long long until = now_ms() + wait_ms;
  for (int attempt = 0;; attempt++) {
    if (flock(c->lock_fd, op | LOCK_NB) == 0) return 0;
    if (errno != EWOULDBLOCK && errno != EINTR) return 0; /* no locking here: go on without */
    if (now_ms() >= until) return -1;
    backoff(attempt < 4 ? attempt : 4);
  }
}

static void lock_file_busy(fg_cache *c, char *why, size_t len) {
  char holder[128];
  describe_holder(c, holder, sizeof holder);
  fg_cache_warnf(why, len,
                 "the cache is locked: its lock file %s has been held for more than %d s by "
                 "another flashgen process%s that is rebuilding or clearing it; wait for it to "
                 "finish (end it if it is stuck) and run again",
                 c->lock_path, FG_CACHE_REBUILD_WAIT_MS / 1000, holder);
}

int fg_cache_lock_file(fg_cache *c, char *why, size_t len) {
  if (lock_file_take(c, LOCK_EX, FG_CACHE_REBUILD_WAIT_MS) != 0) {
    lock_file_busy(c, why, len);
    return -1;
  }
  /* Who holds it, for a person looking at the file (the lock itself is what counts). */
  char pid[32];
  int n = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
  if (ftruncate(c->lock_fd, 0) == 0 && pwrite(c->lock_fd, pid, (size_t)n, 0) != n) {
    /* a full disk: the lock holds all the same */
  }
  return 0;
}

void fg_cache_unlock_file(fg_cache *c) { flock(c->lock_fd, LOCK_UN); }

/* ---- Writing ---- */

static int open_db(fg_cache *c);

/* When the database file was replaced under this handle (removed and recreated by another
 * process because even SQLite's reset failed, or deleted by hand), writes would go to the old
 * file: open the one at the path first. On failure the old connection is kept. */
static void reopen_if_replaced(fg_cache *c) {
  struct stat st;
  if (stat(c->path, &st) == 0 && c->db_ino == (unsigned long long)st.st_ino &&
      c->db_dev == (unsigned long long)st.st_dev)
    return;
  if (lock_file_take(c, LOCK_SH, FG_CACHE_REBUILD_WAIT_MS) != 0) return;
  sqlite3 *old = c->db;
  c->db = NULL;
  if (open_db(c) == SQLITE_OK)
    sqlite3_close(old);
  else
    c->db = old;
  fg_cache_unlock_file(c);
}

int fg_cache_write_txn(fg_cache *c, fg_cache_txn_fn fn, void *ud) {
  if (c->lock_gave_up) return SQLITE_BUSY;
  reopen_if_replaced(c);
  int rc = SQLITE_BUSY;
  long long start = now_ms();
  /* The busy handler waits inside each step; this loop covers the cases where SQLite returns
   * BUSY without waiting (a deadlock it detects, a WAL restart). Both together stay within one
   * FG_CACHE_LOCK_WAIT_MS: after that the lock counts as held, and this handle stops waiting. */
  for (int attempt = 0;; attempt++) {
    if (attempt > 0) {
      if (now_ms() - start >= FG_CACHE_LOCK_WAIT_MS) break;
      backoff(attempt);
    }
    rc = sqlite3_exec(c->db, "BEGIN IMMEDIATE", NULL, NULL, NULL);
    if (fg_cache_is_busy(rc)) continue;
    if (rc != SQLITE_OK) return rc;
    rc = fn(c, ud);
    /* Only a COMMIT that returns SQLITE_OK makes the write done. */
    if (rc == SQLITE_OK) rc = sqlite3_exec(c->db, "COMMIT", NULL, NULL, NULL);
    if (rc == SQLITE_OK) return SQLITE_OK;
    if (sqlite3_get_autocommit(c->db) == 0) sqlite3_exec(c->db, "ROLLBACK", NULL, NULL, NULL);
    if (!fg_cache_is_busy(rc)) return rc;
  }
  c->lock_gave_up = 1;
  return rc;
}

void fg_cache_describe_failure(fg_cache *c, int rc, char *buf, size_t len) {
  char holder[128] = "";
  switch (rc & 0xff) {
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
      describe_holder(c, holder, sizeof holder);
      fg_cache_warnf(buf, len,
                     "the database is locked by another process%s, which kept it for more than "
                     "%d s; if that process is stuck, end it, otherwise run this again when it "
                     "is done (or set FLASHGEN_CACHE_DIR to another directory)",
                     holder[0] ? holder : " (the holder could not be found)",
                     FG_CACHE_LOCK_WAIT_MS / 1000);
      break;
    case SQLITE_FULL:
      fg_cache_warnf(buf, len,
                     "the disk (or the database's size limit) is full: free space on it or run "
                     "`flashgen cache clear`; if clearing fails too, remove the directory %s, "
                     "which holds nothing that cannot be compiled again",
                     c->dir);
      break;
    case SQLITE_READONLY:
    case SQLITE_PERM:
    case SQLITE_CANTOPEN:
    case SQLITE_AUTH:
      fg_cache_warnf(buf, len,
                     "the database is read-only: make it and its directory writable (chmod u+w), "
                     "or set FLASHGEN_CACHE_DIR to a writable private directory");
      break;
    case SQLITE_IOERR:
      fg_cache_warnf(buf, len,
                     "an I/O error: check the disk, or set FLASHGEN_CACHE_DIR to another "
                     "directory");
      break;
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB:
      fg_cache_warnf(buf, len,
                     "the database is damaged: run `flashgen cache clear` (it empties a damaged "
                     "cache)");
      break;
    default:
      fg_cache_warnf(buf, len,
                     "run `flashgen cache verify`, or set FLASHGEN_CACHE_DIR to another "
                     "directory");
      break;
  }
}

void fg_cache_write_failed(fg_cache *c, int rc, const char *what, char *warn, size_t len) {
  int prim = rc & 0xff;
  /* Failures that will not go away by themselves switch writing off; so does a held lock, which
   * has already cost this process its one bounded wait. */
  int lasting = prim == SQLITE_FULL || prim == SQLITE_READONLY || prim == SQLITE_PERM ||
                prim == SQLITE_CANTOPEN || prim == SQLITE_AUTH || prim == SQLITE_IOERR ||
                fg_cache_is_damaged(prim) || fg_cache_is_busy(prim);
  char hint[768];
  fg_cache_describe_failure(c, rc, hint, sizeof hint);
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
    if (rc == SQLITE_OK) rc = sqlite3_exec(c->db, schema_v2, NULL, NULL, NULL);
    if (rc != SQLITE_OK) return rc;
  }
  char sql[64];
  snprintf(sql, sizeof sql, "PRAGMA user_version = %d", FG_CACHE_SCHEMA_VERSION);
  return sqlite3_exec(c->db, sql, NULL, NULL, NULL);
}

/* Retries stmt while another connection holds a lock, within one FG_CACHE_LOCK_WAIT_MS. */
static int exec_retrying(fg_cache *c, const char *sql, long long *v) {
  int rc = SQLITE_BUSY;
  long long start = now_ms();
  for (int attempt = 0; !c->lock_gave_up; attempt++) {
    if (attempt > 0) {
      if (now_ms() - start >= FG_CACHE_LOCK_WAIT_MS) break;
      backoff(attempt);
    }
    if (v)
      *v = query_int(c->db, sql, &rc);
    else
      rc = sqlite3_exec(c->db, sql, NULL, NULL, NULL);
    if (!fg_cache_is_busy(rc)) return rc;
  }
  return rc;
}

/* Sets up an open connection: lock waits, WAL, the schema (after emptying the database first
 * when c->reset_next_open is set). Returns an SQLite code; a database written by a newer
 * flashgen gives SQLITE_SCHEMA. */
static int setup(fg_cache *c) {
  struct stat st;
  if (stat(c->path, &st) == 0) {
    c->db_dev = (unsigned long long)st.st_dev;
    c->db_ino = (unsigned long long)st.st_ino;
  }
  int rc = sqlite3_busy_handler(c->db, busy_wait, c);
  if (rc != SQLITE_OK) return rc;
  if (c->reset_next_open) {
    /* SQLite's documented way to empty a database however damaged. It goes through SQLite's
     * locks, so other processes' connections see an empty database, never a file removed or
     * replaced under them. */
    c->reset_next_open = 0;
    sqlite3_db_config(c->db, SQLITE_DBCONFIG_RESET_DATABASE, 1, 0);
    rc = exec_retrying(c, "VACUUM", NULL);
    sqlite3_db_config(c->db, SQLITE_DBCONFIG_RESET_DATABASE, 0, 0);
    if (rc != SQLITE_OK) return rc;
  }
  /* Reading the version first also makes SQLite read the header: a file that is not a database
   * fails here with SQLITE_NOTADB. */
  long long v = -1;
  rc = exec_retrying(c, "PRAGMA user_version", &v);
  if (rc != SQLITE_OK) return rc;
  if (v > FG_CACHE_SCHEMA_VERSION) return SQLITE_SCHEMA;
  /* WAL lets readers and one writer proceed at once across processes. Switching needs an
   * exclusive lock, hence the retries; a file system without shared memory keeps the rollback
   * journal, which is slower but correct. */
  rc = exec_retrying(c, "PRAGMA journal_mode=WAL", NULL);
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
  char p[PATH_MAX + 16];
  unlink(path);
  static const char *const side[] = {"-wal", "-shm", "-journal"};
  for (int i = 0; i < 3; i++) {
    snprintf(p, sizeof p, "%s%s", path, side[i]);
    unlink(p);
  }
}

int fg_cache_rebuild_locked(fg_cache *c) {
  /* SQLite's reset needs the only connection to the file (another one, in any process, makes it
   * fail with SQLITE_BUSY): this handle's goes first. */
  sqlite3_close(c->db);
  c->db = NULL;
  c->reset_next_open = 1;
  int rc = open_db(c);
  c->reset_next_open = 0;
  if (rc != SQLITE_OK && !fg_cache_is_busy(rc) && (rc & 0xff) != SQLITE_SCHEMA) {
    /* Even the reset failed, with no other connection in the way. Every process opens under
     * the lock file, which this one holds, so none is half-way through opening these files;
     * removing them is the last resort. */
    remove_db_files(c->path);
    rc = open_db(c);
  }
  if (rc != SQLITE_OK && open_db(c) != SQLITE_OK) {
    /* The handle must keep a connection: an empty in-memory one, where every lookup misses. */
    sqlite3_open_v2(":memory:", &c->db, SQLITE_OPEN_READWRITE, NULL);
    c->write_failed = 1;
  }
  return rc;
}

fg_cache *fg_cache_open(const char *dir, char *warn, size_t warnlen) {
  if (warn && warnlen) warn[0] = '\0';
  fg_cache *c = calloc(1, sizeof *c);
  if (!c) {
    fg_cache_warnf(warn, warnlen, "flashgen: out of memory opening the cache; compiling in memory");
    return NULL;
  }
  c->lock_fd = -1;
  char dir_why[512];
  if (fg_cache_resolve_dir_why(dir, c->dir, sizeof c->dir, dir_why, sizeof dir_why) != 0) {
    fg_cache_warnf(warn, warnlen, "flashgen: %s; compiling in memory", dir_why);
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
  snprintf(c->lock_path, sizeof c->lock_path, "%s.lock", c->path);
  if (lock_file_open(c) != 0) {
    fg_cache_warnf(warn, warnlen,
                   "flashgen: cannot open the cache's lock file %s (%s); remove it if it is not a "
                   "regular file of yours, or set FLASHGEN_CACHE_DIR to a private directory; "
                   "compiling in memory",
                   c->lock_path, strerror(errno));
    free(c);
    return NULL;
  }
  /* Every process opens the database holding the lock file shared, and one that finds it
   * damaged rebuilds it holding the lock file exclusively: nobody opens a database that is
   * being rebuilt, and a database is rebuilt once, not once per process that saw it damaged. */
  char why[768] = "";
  int rc = SQLITE_BUSY, rebuilt = 0;
  if (lock_file_take(c, LOCK_SH, FG_CACHE_REBUILD_WAIT_MS) == 0) {
    rc = open_db(c);
    fg_cache_unlock_file(c);
  } else {
    lock_file_busy(c, why, sizeof why);
  }
  if (fg_cache_is_damaged(rc)) {
    /* Nothing in it can be trusted or read; everything in it can be rebuilt. */
    if (fg_cache_lock_file(c, why, sizeof why) == 0) {
      rc = open_db(c); /* another process may have rebuilt it meanwhile */
      if (fg_cache_is_damaged(rc)) {
        rc = fg_cache_rebuild_locked(c);
        rebuilt = rc == SQLITE_OK;
      }
      fg_cache_unlock_file(c);
    } else {
      rc = SQLITE_BUSY;
    }
  }
  if (rebuilt)
    fg_cache_warnf(warn, warnlen,
                   "flashgen: cache database %s was damaged and has been rebuilt empty; kernels "
                   "will be compiled again",
                   c->path);
  if (rc != SQLITE_OK) {
    if ((rc & 0xff) == SQLITE_SCHEMA)
      fg_cache_warnf(warn, warnlen,
                     "flashgen: cache database %s was written by a newer flashgen (schema newer "
                     "than %d), left untouched; set FLASHGEN_CACHE_DIR to another directory or "
                     "upgrade flashgen; compiling in memory",
                     c->path, FG_CACHE_SCHEMA_VERSION);
    else if (why[0])
      fg_cache_warnf(warn, warnlen, "flashgen: cannot open cache database %s: %s; compiling in "
                     "memory", c->path, why);
    else if (fg_cache_is_busy(rc) || (rc & 0xff) == SQLITE_FULL) {
      fg_cache_describe_failure(c, rc, why, sizeof why);
      fg_cache_warnf(warn, warnlen, "flashgen: cannot open cache database %s (%s): %s; compiling "
                     "in memory", c->path, sqlite3_errstr(rc), why);
    } else
      fg_cache_warnf(warn, warnlen,
                     "flashgen: cannot open cache database %s (%s); check the directory's "
                     "permissions and free space, delete the file, or set FLASHGEN_CACHE_DIR to "
                     "a private directory; compiling in memory",
                     c->path, sqlite3_errstr(rc));
    close(c->lock_fd);
    free(c);
    return NULL;
  }
  if (pthread_mutex_init(&c->mu, NULL) != 0) {
    sqlite3_close(c->db);
    close(c->lock_fd);
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
  close(c->lock_fd); /* after the database: closing it also releases its flock */
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
