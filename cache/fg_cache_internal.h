/* fg_cache_internal.h: what the files of cache/ share and nothing outside cache/ may use: the
 * handle's layout, the schema version, the checksum, the write-transaction loop, the lock file
 * and the message helpers. */
#ifndef FG_CACHE_INTERNAL_H
#define FG_CACHE_INTERNAL_H
#include <limits.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdint.h>

#include "fg_cache.h"

#ifndef PATH_MAX
#define PATH_MAX 4096
#endif

/* Bump when the schema changes, and add the migration from the previous version to db.c (or let
 * it rebuild: every table is a cache of something that can be measured again). */
#define FG_CACHE_SCHEMA_VERSION 2
#define FG_CACHE_DB_NAME "flashgen.sqlite3"
#define FG_CACHE_LOCK_NAME FG_CACHE_DB_NAME ".lock"
/* The longest one wait for a lock held by another process may last. A handle gives up after the
 * first wait that runs out: its writes are switched off (one warning) and it never waits again,
 * so a held lock costs a process this much in all, not this much per kernel. */
#define FG_CACHE_LOCK_WAIT_MS 3000
/* The longest a process waits on the lock file while another one rebuilds or clears the
 * database (those are short; a holder that takes longer is stuck). */
#define FG_CACHE_REBUILD_WAIT_MS 10000

struct fg_cache {
  sqlite3 *db;
  pthread_mutex_t mu; /* one operation (and its transaction) at a time per handle */
  int write_failed;   /* a put failed for good (disk full, read-only): later puts are quiet */
  int lock_gave_up;   /* a lock wait ran out: lock waits return at once from then on */
  int lock_fd;        /* the lock file, flock()ed: shared to open, exclusive to rebuild */
  long long busy_since_ms; /* when the current wait for an SQLite lock began */
  unsigned long long db_dev, db_ino; /* the database file db has open */
  int reset_next_open; /* the next open_db empties the database first (a rebuild) */
  char dir[PATH_MAX];
  char path[PATH_MAX];          /* dir/flashgen.sqlite3 */
  char lock_path[PATH_MAX + 8]; /* dir/flashgen.sqlite3.lock */
};

/* snprintf into warn (NULL or 0 length: nothing). */
void fg_cache_warnf(char *warn, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* XXH64 of data with seed: chain calls (the result as the next seed) to hash several pieces. */
uint64_t fg_cache_hash64(const void *data, size_t len, uint64_t seed);

/* SQLite stores signed 64-bit integers; these convert without implementation-defined casts. */
int64_t fg_cache_u64_to_i64(uint64_t v);
uint64_t fg_cache_i64_to_u64(int64_t v);

/* Creates dir (mode 0700) when it is missing, then checks that it is a private directory of the
 * caller: not a symlink, owned by the effective uid, not group- or world-writable, writable.
 * Returns 0, or -1 with the reason and what to do in warn. */
int fg_cache_prepare_dir(const char *dir, char *warn, size_t len);

/* Runs fn inside BEGIN IMMEDIATE ... COMMIT, retrying the whole transaction when another
 * process holds the lock (SQLITE_BUSY / SQLITE_LOCKED). fn returns an SQLite code; anything but
 * SQLITE_OK rolls back. Returns the final code. Call with c->mu held. */
typedef int (*fg_cache_txn_fn)(fg_cache *c, void *ud);
int fg_cache_write_txn(fg_cache *c, fg_cache_txn_fn fn, void *ud);

/* Fills warn for a write that failed with SQLite code rc (what: "storing kernel X"); a failure
 * that will not go away by itself (disk full, read-only, I/O error) turns further writes off. */
void fg_cache_write_failed(fg_cache *c, int rc, const char *what, char *warn, size_t len);

/* 1 if rc (primary code) means "another connection holds a lock". */
int fg_cache_is_busy(int rc);

/* 1 if rc (primary code) means the database file is damaged (SQLITE_CORRUPT, SQLITE_NOTADB). */
int fg_cache_is_damaged(int rc);

/* Writes what failed with SQLite code rc and what to do into buf: a held lock names the process
 * holding it when it can be found, a full disk says so, a damaged file says `cache clear`. */
void fg_cache_describe_failure(fg_cache *c, int rc, char *buf, size_t len);

/* Takes the lock file exclusively (waiting at most FG_CACHE_REBUILD_WAIT_MS), so that no other
 * process opens, rebuilds or clears the database meanwhile. Returns 0, or -1 with the reason in
 * why. fg_cache_unlock_file releases it. */
int fg_cache_lock_file(fg_cache *c, char *why, size_t len);
void fg_cache_unlock_file(fg_cache *c);

/* With the lock file held: empties a damaged database in place (SQLite's reset, which keeps
 * other processes' connections consistent), or removes its files when even that fails, then
 * opens it anew with the schema. Call with c->mu held (or before the handle is shared). Returns
 * an SQLite code; c->db is the new connection on success, NULL otherwise. */
int fg_cache_rebuild_locked(fg_cache *c);

/* The checksum of a kernel entry: covers the key, every meta field, the cubin and the PTX. */
uint64_t fg_cache_kernel_checksum(const char *variant, const char *arch, int nvrtc_version,
                                  uint64_t template_hash, const char *flashgen_version,
                                  const fg_kernel_meta *m, const void *cubin, size_t cubin_size,
                                  const void *ptx, size_t ptx_size);

/* The launch-meta columns of a kernel row, in the order fg_cache_read_meta reads them: the plan
 * (fg_kernel_plan_format's text) and ptxas's resource usage. */
#define FG_CACHE_META_COLS "plan, regs, spill_store_bytes, spill_load_bytes, stack_bytes"
/* Room for a plan's text (FG_PLAN_MAX_STEPS steps and FG_PLAN_MAX_WORKSPACES workspaces): at
 * most about 1.5 KB, every field at its longest (4 step lines of up to 152 characters, 6
 * workspace lines of up to 133, the params and 4 tmap lines). */
#define FG_CACHE_PLAN_MAX 2048

/* Reads the FG_CACHE_META_COLS of the row st is on, from column col on, into *m. Returns NULL,
 * or what is wrong with them. */
const char *fg_cache_read_meta(sqlite3_stmt *st, int col, fg_kernel_meta *m);

/* Checks an entry as read against the size and checksum stored with it, and that its entry
 * point is not named after another kernel than variant. Returns NULL when it is whole and
 * variant's, or what is wrong with it (a static string, or one kept per thread until the next
 * call). */
const char *fg_cache_check_entry(const char *variant, const char *arch, int nvrtc_version,
                                 uint64_t template_hash, const char *flashgen_version,
                                 const fg_kernel_meta *m, const void *cubin, size_t cubin_size,
                                 const void *ptx, size_t ptx_size, long long size,
                                 uint64_t checksum);
#endif
