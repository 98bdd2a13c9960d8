/* test_cache_damage.c: the cache under damage and contention (issue 11): 8 processes opening a
 * garbage database at once lose no store (FG_TEST_RACE_ROUNDS rounds, default 50); a held write
 * lock costs one bounded wait and one warning naming the holder; verify names every unreadable
 * row; clear repairs a zeroed page and says "full" on a full disk. No GPU.
 *
 * Build and run: cmake --build build --target test_cache_damage && build/tests/test_cache_damage */
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

TestSuite(cache, .init = fgt_cache_setup, .fini = fgt_cache_teardown);

/* ---- Damage under contention, held locks, repair (issue 11, items 3-5) ---- */

static void db_file(char *buf, size_t len) { snprintf(buf, len, "%s/flashgen.sqlite3", fgt_dir); }

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
  fg_cache *c = fg_cache_open(fgt_dir, warn, sizeof warn);
  if (!c) {
    fprintf(stderr, "racer %d: open: %s\n", id, warn);
    return 10;
  }
  int rc = 0;
  for (int j = 0; j < RACE_PUTS; j++) {
    char name[64];
    snprintf(name, sizeof name, "race_p%d_k%d", id, j);
    fg_cache_key k = fgt_key_of(name);
    fg_kernel_image img = fgt_make_image(name, (unsigned)(id * 10 + j), 6000, 2000);
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
  cr_assert_eq(mkdir(fgt_dir, 0700), 0);
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
  fg_cache *c = fgt_open_ok(fgt_dir);
  fg_cache_key k0 = fgt_key_of("before_the_lock");
  fg_kernel_image img0 = fgt_make_image("before_the_lock", 1, 3000, 1000);
  fgt_put_ok(c, &k0, &img0);
  fg_cache_close(c);
  int rel;
  pid_t holder = hold_write_lock(&rel);
  double t0 = now_s();
  c = fgt_open_ok(fgt_dir);
  char warn[1024], first[1024] = "";
  int warnings = 0;
  for (int i = 0; i < 5; i++) {
    char name[64];
    snprintf(name, sizeof name, "under_the_lock_%d", i);
    fg_cache_key k = fgt_key_of(name);
    fg_kernel_image img = fgt_make_image(name, (unsigned)i + 2, 3000, 1000);
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
  snprintf(args, sizeof args, "cache --dir '%s' clear", fgt_dir);
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
  c = fgt_open_ok(fgt_dir);
  cr_assert_eq(fg_cache_writable(c), 1);
  fg_cache_key k1 = fgt_key_of("after_the_lock");
  fgt_put_ok(c, &k1, &img0);
  fgt_release(&img0);
  fg_cache_close(c);
}

/* Stores n kernels of about 40 KB each (several overflow pages each) and closes the cache, so
 * everything is in the database file. */
static void store_big_kernels(const char *const *names, int n) {
  fg_cache *c = fgt_open_ok(fgt_dir);
  for (int i = 0; i < n; i++) {
    fg_cache_key k = fgt_key_of(names[i]);
    fg_kernel_image img = fgt_make_image(names[i], (unsigned)(100 + i), 40000, 3000);
    fgt_put_ok(c, &k, &img);
    fgt_release(&img);
  }
  fg_cache_close(c);
}

/* Zeroes the page of the database file holding byte 20000 of names's cubin: a page in the middle
 * of its overflow chain, so that row (and no other) can no longer be read. */
static void zero_page_of(const char *name, unsigned seed) {
  fg_kernel_image img = fgt_make_image(name, seed, 40000, 3000);
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
  fg_cache *c = fgt_open_ok(fgt_dir);
  int ret;
  char *out = fgt_capture(fg_cache_verify, c, &ret);
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
  fg_cache *c = fgt_open_ok(fgt_dir);
  fgt_db_exec(fg_cache_path(c), "UPDATE kernels SET checksum = checksum + 1"
                            " WHERE variant IN ('sum_a', 'sum_c', 'sum_e')");
  int ret;
  char *out = fgt_capture(fg_cache_verify, c, &ret);
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
  snprintf(args, sizeof args, "cache --dir '%s' verify", fgt_dir);
  int st = fg_test_run_cli(NULL, NULL, args);
  cr_assert_eq(st, 1, "%s%s", fg_test_out, fg_test_err);
  cr_assert(strstr(fg_test_out, "damaged") && strstr(fg_test_out, "zp_one") &&
                strstr(fg_test_out, "zp_two") && strstr(fg_test_out, "zp_three") &&
                strstr(fg_test_out, "flashgen cache clear"),
            "verify reports the damage and each lost row: %s%s", fg_test_out, fg_test_err);
  fprintf(stderr, "zeroed page, verify:\n%s", fg_test_out);

  snprintf(args, sizeof args, "cache --dir '%s' clear", fgt_dir);
  st = fg_test_run_cli(NULL, NULL, args);
  cr_assert_eq(st, 0, "clear must repair a damaged cache: %s%s", fg_test_out, fg_test_err);
  fprintf(stderr, "zeroed page, clear: %s%s", fg_test_out, fg_test_err);

  fg_cache *c = fgt_open_ok(fgt_dir);
  cr_assert_eq(fg_cache_verify(c, NULL), 0);
  cr_assert_eq(fgt_kernel_count(c), 0);
  fg_cache_key k = fgt_key_of("after_repair");
  fg_kernel_image img = fgt_make_image("after_repair", 9, 40000, 3000), got;
  fgt_put_ok(c, &k, &img);
  cr_assert_eq(fgt_get(c, &k, &got, NULL, 0), 1);
  cr_assert(fgt_same_image(&img, &got));
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
  fg_cache *c = fgt_open_ok(fgt_dir);
  cr_assert_eq(fgt_kernel_count(c), 2);
  char out[300];
  snprintf(out, sizeof out, "%s/out.txt", fgt_tmp);
  pid_t pid = fork();
  cr_assert_geq(pid, 0);
  if (pid == 0) {
    int fd = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0 || dup2(fd, 1) < 0 || dup2(fd, 2) < 0) _exit(126);
    if (fill_the_disk() != 0) _exit(125);
    execl(cli, cli, "cache", "--dir", fgt_dir, "clear", (char *)NULL);
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
