/* tuning.c: tuning records in the cache: per device (name, compute capability, SM count, driver)
 * and problem bucket, every measured candidate and the winner. New measurements merge with the
 * old ones, so adding a candidate later does not force a full retune. */
#include <assert.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fg_cache_internal.h"

static void bind_text_n(sqlite3_stmt *st, int i, const char *s, size_t max) {
  sqlite3_bind_text(st, i, s, (int)strnlen(s, max), SQLITE_STATIC);
}

static void bind_device(sqlite3_stmt *st, int first, const fg_device_id *dev) {
  bind_text_n(st, first, dev->name, sizeof dev->name);
  sqlite3_bind_int(st, first + 1, dev->cc_major);
  sqlite3_bind_int(st, first + 2, dev->cc_minor);
  sqlite3_bind_int(st, first + 3, dev->sm_count);
  sqlite3_bind_int(st, first + 4, dev->driver_version);
}

#define DEVICE_MATCH                                                                              \
  "d.name = ?1 AND d.cc_major = ?2 AND d.cc_minor = ?3 AND d.sm_count = ?4 AND d.driver_version " \
  "= ?5"

/* Runs a statement to its end; SQLITE_OK or the error. */
static int step_done(sqlite3_stmt *st) {
  int rc = sqlite3_step(st);
  return rc == SQLITE_DONE || rc == SQLITE_ROW ? SQLITE_OK : rc;
}

typedef struct put_args {
  const fg_device_id *dev;
  const char *bucket;
  const fg_tune_candidate *cands;
  int n;
  const char *winner;
  int bad_winner; /* set when the winner is not an accepted candidate of the bucket */
} put_args;

static int put_txn(fg_cache *c, void *ud) {
  put_args *a = ud;
  sqlite3_stmt *st = NULL;
  sqlite3_int64 dev_id = -1;
  time_t now = time(NULL);
  int rc = sqlite3_prepare_v2(c->db,
                              "INSERT OR IGNORE INTO devices(name, cc_major, cc_minor, sm_count,"
                              " driver_version) VALUES(?1, ?2, ?3, ?4, ?5)",
                              -1, &st, NULL);
  if (rc == SQLITE_OK) {
    bind_device(st, 1, a->dev);
    rc = step_done(st);
  }
  sqlite3_finalize(st);
  st = NULL;
  if (rc == SQLITE_OK)
    rc = sqlite3_prepare_v2(c->db, "SELECT id FROM devices d WHERE " DEVICE_MATCH, -1, &st, NULL);
  if (rc == SQLITE_OK) {
    bind_device(st, 1, a->dev);
    rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
      dev_id = sqlite3_column_int64(st, 0);
      rc = SQLITE_OK;
    } else if (rc == SQLITE_DONE) {
      rc = SQLITE_INTERNAL;
    }
  }
  sqlite3_finalize(st);
  st = NULL;
  if (rc == SQLITE_OK)
    rc = sqlite3_prepare_v2(c->db,
                            "INSERT OR REPLACE INTO candidates(device_id, bucket, variant, ok,"
                            " reason, ms, tflops, measured) VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                            -1, &st, NULL);
  for (int i = 0; rc == SQLITE_OK && i < a->n; i++) {
    const fg_tune_candidate *k = &a->cands[i];
    sqlite3_reset(st);
    sqlite3_bind_int64(st, 1, dev_id);
    sqlite3_bind_text(st, 2, a->bucket, -1, SQLITE_STATIC);
    bind_text_n(st, 3, k->variant, sizeof k->variant);
    sqlite3_bind_int(st, 4, k->ok ? 1 : 0);
    bind_text_n(st, 5, k->reason, sizeof k->reason);
    sqlite3_bind_double(st, 6, k->ms);
    sqlite3_bind_double(st, 7, k->tflops);
    sqlite3_bind_int64(st, 8, (sqlite3_int64)now);
    rc = step_done(st);
  }
  sqlite3_finalize(st);
  st = NULL;
  if (rc == SQLITE_OK && a->winner) {
    rc = sqlite3_prepare_v2(c->db,
                            "SELECT ok FROM candidates WHERE device_id = ?1 AND bucket = ?2"
                            " AND variant = ?3",
                            -1, &st, NULL);
    if (rc == SQLITE_OK) {
      sqlite3_bind_int64(st, 1, dev_id);
      sqlite3_bind_text(st, 2, a->bucket, -1, SQLITE_STATIC);
      sqlite3_bind_text(st, 3, a->winner, -1, SQLITE_STATIC);
      rc = sqlite3_step(st);
      if (rc == SQLITE_ROW) {
        rc = sqlite3_column_int(st, 0) ? SQLITE_OK : SQLITE_CONSTRAINT;
      } else if (rc == SQLITE_DONE) {
        rc = SQLITE_CONSTRAINT;
      }
      if (rc == SQLITE_CONSTRAINT) a->bad_winner = 1;
    }
    sqlite3_finalize(st);
    st = NULL;
  }
  if (rc == SQLITE_OK)
    rc = sqlite3_prepare_v2(c->db,
                            "INSERT OR REPLACE INTO tuning(device_id, bucket, winner, updated)"
                            " VALUES(?1, ?2, ?3, ?4)",
                            -1, &st, NULL);
  if (rc == SQLITE_OK) {
    sqlite3_bind_int64(st, 1, dev_id);
    sqlite3_bind_text(st, 2, a->bucket, -1, SQLITE_STATIC);
    if (a->winner)
      sqlite3_bind_text(st, 3, a->winner, -1, SQLITE_STATIC);
    else
      sqlite3_bind_null(st, 3);
    sqlite3_bind_int64(st, 4, (sqlite3_int64)now);
    rc = step_done(st);
  }
  sqlite3_finalize(st);
  return rc;
}

int fg_cache_put_tuning(fg_cache *c, const fg_device_id *dev, const char *bucket,
                        const fg_tune_candidate *cands, int n, const char *winner, char *warn,
                        size_t warnlen) {
  if (warn && warnlen) warn[0] = '\0';
  if (!c) return -1;
  assert(dev && bucket && n >= 0 && (cands || n == 0));
  pthread_mutex_lock(&c->mu);
  if (c->write_failed) {
    pthread_mutex_unlock(&c->mu);
    return -1;
  }
  put_args a = {dev, bucket, cands, n, winner, 0};
  int rc = fg_cache_write_txn(c, put_txn, &a);
  if (rc != SQLITE_OK && a.bad_winner) {
    fg_cache_warnf(warn, warnlen,
                   "flashgen: tuning record for %s on %s not stored: winner %s is not an accepted "
                   "candidate of that bucket (a winner must have been measured with ok = 1); this "
                   "is a bug in the caller",
                   bucket, dev->name, winner);
  } else if (rc != SQLITE_OK) {
    char what[512];
    snprintf(what, sizeof what, "storing the tuning record for %s", bucket);
    fg_cache_write_failed(c, rc, what, warn, warnlen);
  }
  pthread_mutex_unlock(&c->mu);
  return rc == SQLITE_OK ? 0 : -1;
}

#define WINNER_SQL                                                               \
  "SELECT t.bucket, t.winner, COALESCE(k.tflops, 0) FROM tuning t"               \
  " JOIN devices d ON d.id = t.device_id"                                        \
  " LEFT JOIN candidates k ON k.device_id = t.device_id AND k.bucket = t.bucket" \
  " AND k.variant = t.winner"                                                    \
  " WHERE " DEVICE_MATCH " AND t.winner IS NOT NULL"

int fg_cache_get_winner(fg_cache *c, const fg_device_id *dev, const char *bucket, char *variant,
                        size_t len, double *tflops) {
  if (!c) return 0;
  assert(dev && bucket && variant && len > 0);
  pthread_mutex_lock(&c->mu);
  sqlite3_stmt *st = NULL;
  int found = 0;
  int rc = sqlite3_prepare_v2(c->db, WINNER_SQL " AND t.bucket = ?6", -1, &st, NULL);
  if (rc == SQLITE_OK) {
    bind_device(st, 1, dev);
    sqlite3_bind_text(st, 6, bucket, -1, SQLITE_STATIC);
    if (sqlite3_step(st) == SQLITE_ROW) {
      const char *w = (const char *)sqlite3_column_text(st, 1);
      if (w && strlen(w) < len) {
        memcpy(variant, w, strlen(w) + 1);
        if (tflops) *tflops = sqlite3_column_double(st, 2);
        found = 1;
      } else {
        found = -1; /* the buffer is too small for the name */
      }
    }
  }
  sqlite3_finalize(st);
  pthread_mutex_unlock(&c->mu);
  return found;
}

typedef struct winner_row {
  char *bucket, *winner;
  double tflops;
} winner_row;

int fg_cache_each_winner(fg_cache *c, const fg_device_id *dev, const char *prefix,
                         fg_cache_bucket_fn fn, void *ud) {
  if (!c) return 0;
  assert(dev && fn);
  size_t plen = prefix ? strlen(prefix) : 0;
  winner_row *rows = NULL;
  int n = 0, cap = 0, rc;
  /* Rows are collected first and fn called after the lock is released, so fn may use the cache. */
  pthread_mutex_lock(&c->mu);
  sqlite3_stmt *st = NULL;
  rc = sqlite3_prepare_v2(c->db, WINNER_SQL " ORDER BY t.bucket", -1, &st, NULL);
  if (rc == SQLITE_OK) {
    bind_device(st, 1, dev);
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
      const char *b = (const char *)sqlite3_column_text(st, 0);
      const char *w = (const char *)sqlite3_column_text(st, 1);
      if (!b || !w || strncmp(b, prefix ? prefix : "", plen) != 0) continue;
      if (n == cap) {
        int ncap = cap ? 2 * cap : 16;
        winner_row *nr = realloc(rows, (size_t)ncap * sizeof *rows);
        if (!nr) {
          rc = SQLITE_NOMEM;
          break;
        }
        rows = nr;
        cap = ncap;
      }
      rows[n].bucket = strdup(b);
      rows[n].winner = strdup(w);
      rows[n].tflops = sqlite3_column_double(st, 2);
      n++;
      if (!rows[n - 1].bucket || !rows[n - 1].winner) {
        rc = SQLITE_NOMEM;
        break;
      }
    }
    if (rc == SQLITE_DONE) rc = SQLITE_OK;
  }
  sqlite3_finalize(st);
  pthread_mutex_unlock(&c->mu);
  for (int i = 0; i < n; i++) {
    if (rc == SQLITE_OK) fn(ud, rows[i].bucket, rows[i].winner, rows[i].tflops);
    free(rows[i].bucket);
    free(rows[i].winner);
  }
  free(rows);
  return rc == SQLITE_OK ? n : -1;
}

int fg_cache_get_tuning(fg_cache *c, const fg_device_id *dev, const char *bucket,
                        fg_tune_candidate **cands, int *n, char *winner, size_t winner_len) {
  assert(dev && bucket && cands && n);
  *cands = NULL;
  *n = 0;
  if (winner && winner_len) winner[0] = '\0';
  if (!c) return 0;
  pthread_mutex_lock(&c->mu);
  int found = 0, cap = 0;
  sqlite3_stmt *st = NULL;
  int rc = sqlite3_prepare_v2(c->db,
                              "SELECT t.winner FROM tuning t JOIN devices d ON d.id = t.device_id"
                              " WHERE " DEVICE_MATCH " AND t.bucket = ?6",
                              -1, &st, NULL);
  if (rc == SQLITE_OK) {
    bind_device(st, 1, dev);
    sqlite3_bind_text(st, 6, bucket, -1, SQLITE_STATIC);
    rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
      found = 1;
      const char *w = (const char *)sqlite3_column_text(st, 0);
      if (w && winner && winner_len) snprintf(winner, winner_len, "%s", w);
      rc = SQLITE_OK;
    } else if (rc == SQLITE_DONE) {
      rc = SQLITE_OK;
    }
  }
  sqlite3_finalize(st);
  st = NULL;
  if (rc == SQLITE_OK && found)
    rc = sqlite3_prepare_v2(c->db,
                            "SELECT k.variant, k.ok, k.reason, k.ms, k.tflops FROM candidates k"
                            " JOIN devices d ON d.id = k.device_id"
                            " WHERE " DEVICE_MATCH " AND k.bucket = ?6 ORDER BY k.variant",
                            -1, &st, NULL);
  if (rc == SQLITE_OK && found) {
    bind_device(st, 1, dev);
    sqlite3_bind_text(st, 6, bucket, -1, SQLITE_STATIC);
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
      if (*n == cap) {
        int ncap = cap ? 2 * cap : 16;
        fg_tune_candidate *nc = realloc(*cands, (size_t)ncap * sizeof **cands);
        if (!nc) {
          rc = SQLITE_NOMEM;
          break;
        }
        *cands = nc;
        cap = ncap;
      }
      fg_tune_candidate *k = &(*cands)[(*n)++];
      memset(k, 0, sizeof *k);
      const char *v = (const char *)sqlite3_column_text(st, 0);
      const char *r = (const char *)sqlite3_column_text(st, 2);
      snprintf(k->variant, sizeof k->variant, "%s", v ? v : "");
      snprintf(k->reason, sizeof k->reason, "%s", r ? r : "");
      k->ok = sqlite3_column_int(st, 1);
      k->ms = sqlite3_column_double(st, 3);
      k->tflops = sqlite3_column_double(st, 4);
    }
    if (rc == SQLITE_DONE) rc = SQLITE_OK;
  }
  sqlite3_finalize(st);
  pthread_mutex_unlock(&c->mu);
  if (rc != SQLITE_OK) {
    free(*cands);
    *cands = NULL;
    *n = 0;
    return -1;
  }
  return found;
}
