/* fg_cache.h: the on-disk store: one SQLite database holding compiled kernels and tuning
 * records. Nothing stale is ever returned (every key input is part of the key); nothing corrupt
 * is ever returned (checksums); a cache that cannot be used degrades to "no cache" with one
 * warning. See DESIGN.md, "Cache". */
#ifndef FG_CACHE_H
#define FG_CACHE_H
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include "fg_kernel.h"

typedef struct fg_cache fg_cache;

/* Everything that decides whether a cached kernel may be used. */
typedef struct fg_cache_key {
  const char *variant;        /* canonical variant name (or reference name) */
  fg_arch arch;
  int nvrtc_version;          /* major*1000 + minor*10 */
  uint64_t template_hash;
  const char *flashgen_version;
} fg_cache_key;

/* Identity of the GPU a tuning record was measured on. */
typedef struct fg_device_id {
  char name[128];
  int cc_major, cc_minor, sm_count, driver_version;
} fg_device_id;

/* The directory the cache uses: dir if not NULL, else $FLASHGEN_CACHE_DIR, else
 * $XDG_CACHE_HOME/flashgen, else $HOME/.cache/flashgen; made absolute (a relative path is taken
 * from the current directory) and without trailing slashes. Writes into buf; 0, or -1 when
 * there is none or it is longer than buf or than the cache can use (SQLite's file names).
 * fg_cache_resolve_dir_why also writes why (what is wrong, the limit, what to do) on -1. */
int fg_cache_resolve_dir(const char *dir, char *buf, size_t len);
int fg_cache_resolve_dir_why(const char *dir, char *buf, size_t len, char *why, size_t whylen);

/* Opens (creating with mode 0700 when missing) the cache in dir (NULL: fg_cache_resolve_dir).
 * Returns the cache, or NULL with the reason in warn when the cache cannot be used: directory
 * missing and uncreatable, not writable, group- or world-writable, a symlink, owned by another
 * user, or a database that cannot be opened. The caller then works from memory. */
fg_cache *fg_cache_open(const char *dir, char *warn, size_t warnlen);
void fg_cache_close(fg_cache *c); /* NULL is a no-op */
const char *fg_cache_path(const fg_cache *c); /* the database file */

/* Looks a kernel up. Returns 1 and fills img (caller frees with fg_kernel_image_free) on a hit;
 * 0 on a miss. An entry that is damaged (its checksum fails) or is not the key's (the key
 * recorded in its row differs, or its entry point is named after another kernel: "fg_" + that
 * kernel's variant name) is deleted, counts as a miss and sets warn. This guards against
 * mix-ups, not against someone who can write to the cache directory. */
int fg_cache_get_kernel(fg_cache *c, const fg_cache_key *key, fg_kernel_image *img, char *warn,
                        size_t warnlen);
/* Stores a kernel (replacing an entry with the same key). Safe when several processes write
 * the same key at once. Returns 0, or -1 with warn filled (disk full, read-only...). */
int fg_cache_put_kernel(fg_cache *c, const fg_cache_key *key, const fg_kernel_image *img,
                        char *warn, size_t warnlen);

/* One measured candidate of a tuning run. */
typedef struct fg_tune_candidate {
  char variant[FG_VARIANT_NAME_MAX];
  int ok;              /* 1: correct and timed; 0: rejected (reason says why) */
  char reason[256];
  double ms;           /* median time, when ok */
  double tflops;
} fg_tune_candidate;

/* Records the candidates measured for one problem bucket on a device, and the winner (NULL:
 * none). Candidates already recorded for that bucket and device are kept unless measured again
 * (same variant), so adding candidates later does not force a full retune. Returns 0 or -1. */
int fg_cache_put_tuning(fg_cache *c, const fg_device_id *dev, const char *bucket,
                        const fg_tune_candidate *cands, int n, const char *winner, char *warn,
                        size_t warnlen);

/* The winner of bucket on dev: returns 1 and writes the variant name and its TFLOP/s, 0 if no
 * record. */
int fg_cache_get_winner(fg_cache *c, const fg_device_id *dev, const char *bucket, char *variant,
                        size_t len, double *tflops);

/* Calls fn for every bucket with a winner on dev whose name starts with prefix. */
typedef void (*fg_cache_bucket_fn)(void *ud, const char *bucket, const char *winner, double tflops);
int fg_cache_each_winner(fg_cache *c, const fg_device_id *dev, const char *prefix,
                         fg_cache_bucket_fn fn, void *ud);

/* ---- Additions: queries for the tuner, the CLI (`flashgen cache ...`) and tests. ---- */

/* Threads and processes: one handle may be used from several threads at once (each call is one
 * transaction); every process opens its own handle (a handle must not cross fork()). Writes
 * from several processes to one directory are safe. */

/* Notes on the calls above.
 * fg_cache_open also leaves a warning in warn on success when it found the database damaged
 * and rebuilt it empty (warn[0] == '\0' otherwise). One process rebuilds it, holding the lock
 * file flashgen.sqlite3.lock next to it exclusively; the others wait for it (at most 10 s) and
 * open the rebuilt database. A lock held by another process costs one wait of at most 3 s per
 * handle: the put that waited fails with a warning naming the database and, when it can be
 * found (Linux), the process holding the lock; writing is then off for that handle. A database
 * written by a newer schema is left untouched and refused; an older one is migrated, or dropped
 * and rebuilt.
 * fg_cache_put_kernel / fg_cache_put_tuning: a failure that will not go away by itself (disk
 * full, read-only database, I/O error, damage, a held lock) turns writing off for this handle,
 * so the caller warns once: later puts return -1 with warn set to "" (see fg_cache_writable).
 * fg_cache_put_tuning also fails (-1, warn) when winner is not a candidate recorded with ok = 1
 * for that bucket after the merge; nothing is stored then.
 * fg_cache_get_winner returns -1 when len cannot hold the name (FG_VARIANT_NAME_MAX always can);
 * tflops may be NULL. The winner's TFLOP/s are those recorded with its candidate.
 * fg_cache_each_winner returns the number of buckets passed to fn, or -1; prefix NULL or ""
 * matches every bucket. fn runs after the database is released, so it may call the cache.
 * A NULL cache is "no cache": lookups miss, puts return -1. The key's strings, the device and
 * the buckets must not be NULL (asserted). Of the calls below, fg_cache_writable and
 * fg_cache_get_tuning accept a NULL cache; the CLI's (ls, count, stats, verify, clear,
 * list_tuning) need an open one. */

/* 1 while puts are still attempted, 0 after a lasting write failure (or for NULL). */
int fg_cache_writable(const fg_cache *c);

/* Everything recorded for bucket on dev: returns 1 and sets *cands (a malloc'd array the caller
 * frees with free(), NULL when *n is 0), *n and the winner (into winner, "" when none; winner
 * may be NULL), 0 when there is no record, -1 on error. The tuner uses it to measure only the
 * candidates that are new. */
int fg_cache_get_tuning(fg_cache *c, const fg_device_id *dev, const char *bucket,
                        fg_tune_candidate **cands, int *n, char *winner, size_t winner_len);

/* Prints one line per kernel entry (variant, arch, NVRTC version, bytes, creation time) after a
 * header line to out (NULL: prints nothing). Returns the number of entries, or -1. */
int fg_cache_ls(fg_cache *c, FILE *out);

/* Counts, for `flashgen cache stats` and tests. */
typedef struct fg_cache_counts {
  long long kernels;        /* kernel entries */
  long long kernel_bytes;   /* cubin + PTX bytes of all entries */
  long long tuning_records; /* (device, bucket) records */
  long long candidates;     /* measured candidates over all records */
  long long devices;
  long long file_bytes; /* the database file and its write-ahead log */
} fg_cache_counts;
/* Fills *s. Returns 0 or -1. */
int fg_cache_count(fg_cache *c, fg_cache_counts *s);
/* Prints the database path, its size on disk, the schema version and the counts to out.
 * Returns 0 or -1. */
int fg_cache_stats(fg_cache *c, FILE *out);

/* Checks every kernel entry (each row is read on its own, so a damaged page costs the rows on
 * it, not the rest): its checksum, its size, and that its entry point is not named after another
 * kernel; and the file (SQLite's integrity check). Prints one line per bad entry (variant, arch,
 * NVRTC and flashgen versions, what is wrong), one line per problem of the file, and a summary
 * to out (NULL: prints nothing). Bad entries are reported, not deleted (a lookup deletes them).
 * Returns the number of bad entries (at least 1 when the file is damaged), or -1 when nothing in
 * the database can be read. */
int fg_cache_verify(fg_cache *c, FILE *out);

/* Deletes every kernel entry and tuning record, then gives the space back when no other process
 * is reading. A damaged database (one SQLite calls malformed) is emptied and rebuilt instead, so
 * clear always repairs the cache; it runs under the lock file, like a rebuild at open. Returns 0
 * (msg: "" or a note that the database was damaged and rebuilt), or -1 with what failed and what
 * to do in msg: locked (by which process, when it can be found), disk full, read-only... msg may
 * be NULL. */
int fg_cache_clear(fg_cache *c, char *msg, size_t len);

/* Prints one line per tuning record (device, bucket, winner, its TFLOP/s, candidates measured
 * and how many were rejected) after a header line to out (NULL: prints nothing). Returns the
 * number of records, or -1. */
int fg_cache_list_tuning(fg_cache *c, FILE *out);

/* For tests only: caps the database at pages pages (<= 0: its current size), so the next write
 * that needs to grow it fails with SQLITE_FULL as on a full disk. Applies to this handle only.
 * Returns the cap in force, or -1. */
int fg_cache_debug_set_max_pages(fg_cache *c, int pages);
#endif
