/* test_cache.c: tests of the on-disk cache (cache/): kernels round-trip exactly and every key
 * input misses; 8 processes writing the same entries, one handle shared by threads; tuning
 * records merge; ls / stats / verify / clear. Damaged entries, directories and schema versions
 * are test_cache_files.c's, damage under contention test_cache_damage.c's. No GPU.
 *
 * Build and run: cmake --build build --target test_cache && build/tests/test_cache */
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

/* ---- Kernels: round trip and keys ---- */

Test(cache, put_then_get_round_trips_bytes_and_meta_exactly) {
  fg_cache *c = fgt_open_ok(fgt_dir);
  const char *v = "fwd_d128_br128_bc64_bf16_causal_qouter_w4_s2_sm80";
  fg_kernel_image img = fgt_make_image(v, 7, 300000, 120000);
  fg_cache_key k = fgt_key_of(v);
  fgt_put_ok(c, &k, &img);
  fg_kernel_image got;
  char warn[1024];
  cr_assert_eq(fgt_get(c, &k, &got, warn, sizeof warn), 1, "miss right after put: %s", warn);
  cr_assert_str_empty(warn);
  cr_assert(fgt_same_image(&img, &got), "bytes or meta differ after the round trip");
  cr_assert_str_eq(got.variant, v);
  cr_assert_eq(got.arch, FG_ARCH_SM80);
  cr_assert_eq(got.compile_ms, 0.0, "a cached kernel was not compiled in this process");
  fgt_release(&got);
  fg_cache_close(c);

  /* And from a new handle (another process would see the same). */
  c = fgt_open_ok(fgt_dir);
  cr_assert_eq(fgt_get(c, &k, &got, warn, sizeof warn), 1);
  cr_assert(fgt_same_image(&img, &got));
  fgt_release(&got);
  fgt_release(&img);
  fg_cache_close(c);
}

Test(cache, empty_cubin_and_ptx_round_trip) {
  fg_cache *c = fgt_open_ok(fgt_dir);
  fg_kernel_image img = fgt_make_image("ref", 1, 0, 0);
  fg_cache_key k = fgt_key_of("ref");
  fgt_put_ok(c, &k, &img);
  fg_kernel_image got;
  cr_assert_eq(fgt_get(c, &k, &got, NULL, 0), 1);
  cr_assert_eq(got.cubin_size, 0);
  cr_assert_eq(got.ptx_size, 0);
  cr_assert_not_null(got.ptx);
  cr_assert_eq(got.ptx[0], '\0');
  fgt_release(&got);
  fgt_release(&img);
  fg_cache_close(c);
}

Test(cache, any_key_input_differing_is_a_miss) {
  fg_cache *c = fgt_open_ok(fgt_dir);
  const char *v = "fwd_d64_br64_bc64_f16_nocausal_qouter_w4_s2_sm80";
  fg_kernel_image img = fgt_make_image(v, 3, 5000, 3000);
  fg_cache_key k = fgt_key_of(v);
  fgt_put_ok(c, &k, &img);

  fg_cache_key variants[6];
  for (int i = 0; i < 6; i++) variants[i] = k;
  variants[0].variant = "fwd_d64_br64_bc64_f16_causal_qouter_w4_s2_sm80";
  variants[1].arch = FG_ARCH_SM90A;
  variants[2].nvrtc_version = 12050;
  variants[3].template_hash = k.template_hash ^ 1; /* template text changed */
  variants[4].flashgen_version = "0.1.1";
  variants[5].template_hash = k.template_hash ^ 0x8000000000000000ULL;
  const char *what[6] = {"variant",          "arch",
                         "nvrtc version",    "template hash",
                         "flashgen version", "template hash top bit"};
  for (int i = 0; i < 6; i++) {
    fg_kernel_image got;
    char warn[1024];
    cr_assert_eq(fgt_get(c, &variants[i], &got, warn, sizeof warn), 0,
                 "a different %s must miss, never give a stale kernel", what[i]);
    cr_assert_str_empty(warn, "a plain miss is not a warning: %s", warn);
  }
  fg_kernel_image got;
  cr_assert_eq(fgt_get(c, &k, &got, NULL, 0), 1, "the exact key must still hit");
  fgt_release(&got);
  fgt_release(&img);
  fg_cache_close(c);
}

Test(cache, put_replaces_the_entry_of_the_same_key) {
  fg_cache *c = fgt_open_ok(fgt_dir);
  fg_cache_key k = fgt_key_of("v1");
  fg_kernel_image a = fgt_make_image("v1", 1, 1000, 500), b = fgt_make_image("v1", 2, 2000, 700);
  fgt_put_ok(c, &k, &a);
  fgt_put_ok(c, &k, &b);
  cr_assert_eq(fgt_kernel_count(c), 1);
  fg_kernel_image got;
  cr_assert_eq(fgt_get(c, &k, &got, NULL, 0), 1);
  cr_assert(fgt_same_image(&b, &got), "the second put must win");
  fgt_release(&got);
  fgt_release(&a);
  fgt_release(&b);
  fg_cache_close(c);
}

Test(cache, null_cache_misses_and_refuses_puts) {
  fg_cache_key k = fgt_key_of("v");
  fg_kernel_image img = fgt_make_image("v", 1, 10, 10), got;
  cr_assert_eq(fg_cache_get_kernel(NULL, &k, &got, NULL, 0), 0);
  cr_assert_eq(fg_cache_put_kernel(NULL, &k, &img, NULL, 0), -1);
  cr_assert_eq(fg_cache_writable(NULL), 0);
  fg_cache_close(NULL);
  fgt_release(&img);
}

/* ---- Concurrency ---- */

#define NPROC 8
#define NKEYS 20

static void key_name(int i, char *buf, size_t len) {
  snprintf(buf, len, "fwd_d%d_br64_bc64_bf16_causal_qouter_w4_s2_sm80", 32 + 8 * i);
}

/* One writer process: waits for the start signal, opens the cache, puts all keys twice (in an
 * order of its own), then reads every one back. Returns an exit code. */
static int writer(int id, int start_fd) {
  char b;
  if (read(start_fd, &b, 1) < 0) return 2;
  char warn[1024];
  fg_cache *c = fg_cache_open(fgt_dir, warn, sizeof warn);
  if (!c) {
    fprintf(stderr, "writer %d: open: %s\n", id, warn);
    return 10;
  }
  for (int round = 0; round < 2; round++) {
    for (int j = 0; j < NKEYS; j++) {
      int i = (j + id * 3) % NKEYS;
      char name[FG_VARIANT_NAME_MAX];
      key_name(i, name, sizeof name);
      fg_cache_key k = fgt_key_of(name);
      fg_kernel_image img = fgt_make_image(name, (unsigned)i, 50000 + 1000 * (size_t)i, 20000);
      int rc = fg_cache_put_kernel(c, &k, &img, warn, sizeof warn);
      fgt_release(&img);
      if (rc != 0) {
        fprintf(stderr, "writer %d: put %s: %s\n", id, name, warn);
        return 20;
      }
    }
  }
  for (int i = 0; i < NKEYS; i++) {
    char name[FG_VARIANT_NAME_MAX];
    key_name(i, name, sizeof name);
    fg_cache_key k = fgt_key_of(name);
    fg_kernel_image want = fgt_make_image(name, (unsigned)i, 50000 + 1000 * (size_t)i, 20000), got;
    memset(&got, 0, sizeof got);
    int hit = fg_cache_get_kernel(c, &k, &got, warn, sizeof warn);
    int same = hit == 1 && fgt_same_image(&want, &got);
    fgt_release(&want);
    fgt_release(&got);
    if (!same) {
      fprintf(stderr, "writer %d: get %s: hit %d, warn %s\n", id, name, hit, warn);
      return 30;
    }
  }
  fg_cache_close(c);
  return 0;
}

Test(cache, eight_processes_writing_the_same_entries) {
  /* The directory does not exist yet: creating it and the schema is part of the race. */
  int fds[2];
  cr_assert_eq(pipe(fds), 0);
  pid_t pids[NPROC];
  for (int p = 0; p < NPROC; p++) {
    pids[p] = fork();
    cr_assert_geq(pids[p], 0, "fork: %s", strerror(errno));
    if (pids[p] == 0) {
      close(fds[1]);
      _exit(writer(p, fds[0]));
    }
  }
  close(fds[0]);
  close(fds[1]); /* start: every reader sees end of file at once */
  for (int p = 0; p < NPROC; p++) {
    int status = 0;
    cr_assert_eq(waitpid(pids[p], &status, 0), pids[p]);
    cr_assert(
        WIFEXITED(status) && WEXITSTATUS(status) == 0, "writer %d failed (exit %d, signal %d)", p,
        WIFEXITED(status) ? WEXITSTATUS(status) : -1, WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  }
  fg_cache *c = fgt_open_ok(fgt_dir);
  cr_assert_eq(fgt_kernel_count(c), NKEYS, "one entry per key");
  cr_assert_eq(fg_cache_verify(c, NULL), 0, "every entry valid");
  cr_assert_eq(fg_cache_ls(c, NULL), NKEYS);
  for (int i = 0; i < NKEYS; i++) {
    char name[FG_VARIANT_NAME_MAX];
    key_name(i, name, sizeof name);
    fg_cache_key k = fgt_key_of(name);
    fg_kernel_image want = fgt_make_image(name, (unsigned)i, 50000 + 1000 * (size_t)i, 20000), got;
    cr_assert_eq(fgt_get(c, &k, &got, NULL, 0), 1, "%s missing", name);
    cr_assert(fgt_same_image(&want, &got), "%s differs", name);
    fgt_release(&want);
    fgt_release(&got);
  }
  fg_cache_close(c);
}

typedef struct thread_arg {
  fg_cache *c;
  int id, failures;
} thread_arg;

static void *thread_main(void *p) {
  thread_arg *a = p;
  for (int i = 0; i < 10; i++) {
    char name[64];
    snprintf(name, sizeof name, "t%d_k%d", a->id, i);
    fg_cache_key k = fgt_key_of(name);
    fg_kernel_image img = fgt_make_image(name, (unsigned)(a->id * 100 + i), 20000, 5000), got;
    memset(&got, 0, sizeof got);
    if (fg_cache_put_kernel(a->c, &k, &img, NULL, 0) != 0) a->failures++;
    if (fg_cache_get_kernel(a->c, &k, &got, NULL, 0) != 1 || !fgt_same_image(&img, &got)) a->failures++;
    fgt_release(&img);
    fgt_release(&got);
  }
  return NULL;
}

Test(cache, one_handle_shared_by_threads) {
  fg_cache *c = fgt_open_ok(fgt_dir);
  pthread_t t[4];
  thread_arg a[4];
  for (int i = 0; i < 4; i++) {
    a[i] = (thread_arg){c, i, 0};
    cr_assert_eq(pthread_create(&t[i], NULL, thread_main, &a[i]), 0);
  }
  for (int i = 0; i < 4; i++) {
    pthread_join(t[i], NULL);
    cr_assert_eq(a[i].failures, 0, "thread %d", i);
  }
  cr_assert_eq(fgt_kernel_count(c), 40);
  fg_cache_close(c);
}

/* ---- Tuning records ---- */

static fg_tune_candidate cand(const char *v, int ok, double ms, double tflops, const char *why) {
  fg_tune_candidate k;
  memset(&k, 0, sizeof k);
  snprintf(k.variant, sizeof k.variant, "%s", v);
  snprintf(k.reason, sizeof k.reason, "%s", why);
  k.ok = ok;
  k.ms = ms;
  k.tflops = tflops;
  return k;
}

static const fg_tune_candidate *find_cand(const fg_tune_candidate *c, int n, const char *v) {
  for (int i = 0; i < n; i++)
    if (strcmp(c[i].variant, v) == 0) return &c[i];
  return NULL;
}

static fg_device_id h100(void) {
  fg_device_id d;
  memset(&d, 0, sizeof d);
  snprintf(d.name, sizeof d.name, "NVIDIA H100 80GB HBM3");
  d.cc_major = 9;
  d.cc_minor = 0;
  d.sm_count = 132;
  d.driver_version = 12040;
  return d;
}

Test(cache, tuning_merge_keeps_old_candidates_and_updates_the_winner) {
  fg_cache *c = fgt_open_ok(fgt_dir);
  fg_device_id dev = h100();
  const char *bucket = "fwd_d128_bf16_causal_n4096";
  fg_tune_candidate first[3] = {cand("A", 1, 1.0, 100.0, ""), cand("B", 1, 2.0, 50.0, ""),
                                cand("C", 0, 0, 0, "wrong result: max error 0.5")};
  char warn[1024];
  cr_assert_eq(fg_cache_put_tuning(c, &dev, bucket, first, 3, "A", warn, sizeof warn), 0, "%s",
               warn);
  char w[FG_VARIANT_NAME_MAX];
  double tf = 0;
  cr_assert_eq(fg_cache_get_winner(c, &dev, bucket, w, sizeof w, &tf), 1);
  cr_assert_str_eq(w, "A");
  cr_assert_eq(tf, 100.0);

  fg_tune_candidate second[2] = {cand("D", 1, 0.5, 200.0, ""), cand("B", 1, 0.9, 110.0, "")};
  cr_assert_eq(fg_cache_put_tuning(c, &dev, bucket, second, 2, "D", warn, sizeof warn), 0, "%s",
               warn);
  cr_assert_eq(fg_cache_get_winner(c, &dev, bucket, w, sizeof w, &tf), 1);
  cr_assert_str_eq(w, "D");
  cr_assert_eq(tf, 200.0);

  fg_tune_candidate *all = NULL;
  int n = 0;
  char winner[FG_VARIANT_NAME_MAX];
  cr_assert_eq(fg_cache_get_tuning(c, &dev, bucket, &all, &n, winner, sizeof winner), 1);
  cr_assert_eq(n, 4, "3 old + 1 new, the re-measured one replaced");
  cr_assert_str_eq(winner, "D");
  const fg_tune_candidate *a = find_cand(all, n, "A"), *b = find_cand(all, n, "B"),
                          *cc = find_cand(all, n, "C"), *d = find_cand(all, n, "D");
  cr_assert(a && b && cc && d);
  cr_assert(a->ok && a->ms == 1.0 && a->tflops == 100.0, "A kept as measured");
  cr_assert(b->ok && b->ms == 0.9 && b->tflops == 110.0, "B replaced by its new measurement");
  cr_assert(!cc->ok && strcmp(cc->reason, "wrong result: max error 0.5") == 0,
            "C keeps its reason");
  cr_assert(d->ok && d->ms == 0.5);
  free(all);

  cr_assert_eq(fg_cache_get_tuning(c, &dev, "fwd_other", &all, &n, winner, sizeof winner), 0);
  cr_assert_eq(n, 0);
  cr_assert_null(all);
  fg_cache_close(c);
}

Test(cache, a_rejected_candidate_never_becomes_the_winner) {
  fg_cache *c = fgt_open_ok(fgt_dir);
  fg_device_id dev = h100();
  fg_tune_candidate k[2] = {cand("A", 1, 1.0, 100.0, ""), cand("C", 0, 0, 0, "launch failed")};
  char warn[1024];
  cr_assert_eq(fg_cache_put_tuning(c, &dev, "b", k, 2, "C", warn, sizeof warn), -1);
  cr_assert(strstr(warn, "not an accepted candidate"), "%s", warn);
  cr_assert_eq(fg_cache_put_tuning(c, &dev, "b", k, 2, "Z", warn, sizeof warn), -1, "unmeasured");
  char w[FG_VARIANT_NAME_MAX];
  cr_assert_eq(fg_cache_get_winner(c, &dev, "b", w, sizeof w, NULL), 0, "nothing stored");
  cr_assert_eq(fg_cache_writable(c), 1, "a caller's mistake does not turn the cache off");
  /* No winner at all is a valid record (every candidate rejected). */
  cr_assert_eq(fg_cache_put_tuning(c, &dev, "b", k + 1, 1, NULL, warn, sizeof warn), 0, "%s", warn);
  cr_assert_eq(fg_cache_get_winner(c, &dev, "b", w, sizeof w, NULL), 0);
  fg_tune_candidate *all = NULL;
  int n = 0;
  cr_assert_eq(fg_cache_get_tuning(c, &dev, "b", &all, &n, w, sizeof w), 1);
  cr_assert_eq(n, 1);
  cr_assert_str_empty(w);
  free(all);
  fg_cache_close(c);
}

typedef struct seen {
  int n;
  char buckets[8][64];
  char winners[8][64];
  double tflops[8];
} seen;

static void collect(void *ud, const char *bucket, const char *winner, double tflops) {
  seen *s = ud;
  if (s->n < 8) {
    snprintf(s->buckets[s->n], 64, "%s", bucket);
    snprintf(s->winners[s->n], 64, "%s", winner);
    s->tflops[s->n] = tflops;
  }
  s->n++;
}

Test(cache, each_winner_filters_by_prefix_and_device) {
  fg_cache *c = fgt_open_ok(fgt_dir);
  fg_device_id dev = h100(), newer_driver = h100(), fewer_sms = h100();
  newer_driver.driver_version = 12050;
  fewer_sms.sm_count = 114;
  struct {
    const fg_device_id *dev;
    const char *bucket, *winner;
    double tf;
  } recs[] = {{&dev, "fwd_d64_f16_causal_n1024", "W1", 10},
              {&dev, "fwd_d64_f16_causal_n512", "W2", 20},
              {&dev, "fwd_d128_f16_causal_n512", "W3", 30},
              {&newer_driver, "fwd_d64_f16_causal_n512", "W4", 40}};
  for (size_t i = 0; i < sizeof recs / sizeof recs[0]; i++) {
    fg_tune_candidate k = cand(recs[i].winner, 1, 1, recs[i].tf, "");
    cr_assert_eq(
        fg_cache_put_tuning(c, recs[i].dev, recs[i].bucket, &k, 1, recs[i].winner, NULL, 0), 0);
  }
  seen s = {0};
  cr_assert_eq(fg_cache_each_winner(c, &dev, "fwd_d64_", collect, &s), 2);
  cr_assert_eq(s.n, 2);
  cr_assert_str_eq(s.buckets[0], "fwd_d64_f16_causal_n1024");
  cr_assert_str_eq(s.winners[0], "W1");
  cr_assert_eq(s.tflops[0], 10.0);
  cr_assert_str_eq(s.buckets[1], "fwd_d64_f16_causal_n512");
  cr_assert_str_eq(s.winners[1], "W2");

  memset(&s, 0, sizeof s);
  cr_assert_eq(fg_cache_each_winner(c, &dev, NULL, collect, &s), 3);
  memset(&s, 0, sizeof s);
  cr_assert_eq(fg_cache_each_winner(c, &newer_driver, "fwd_d64_", collect, &s), 1);
  cr_assert_str_eq(s.winners[0], "W4", "records of another driver are another device's");
  memset(&s, 0, sizeof s);
  cr_assert_eq(fg_cache_each_winner(c, &fewer_sms, "", collect, &s), 0);

  char w[FG_VARIANT_NAME_MAX];
  cr_assert_eq(fg_cache_get_winner(c, &fewer_sms, "fwd_d64_f16_causal_n512", w, sizeof w, NULL), 0,
               "a different SM count is a different device");
  fg_device_id other_name = h100();
  snprintf(other_name.name, sizeof other_name.name, "NVIDIA H100 PCIe");
  cr_assert_eq(fg_cache_get_winner(c, &other_name, "fwd_d64_f16_causal_n512", w, sizeof w, NULL),
               0);
  fg_device_id other_cc = h100();
  other_cc.cc_minor = 1;
  cr_assert_eq(fg_cache_get_winner(c, &other_cc, "fwd_d64_f16_causal_n512", w, sizeof w, NULL), 0);
  cr_assert_eq(fg_cache_get_winner(c, &dev, "fwd_d64_f16_causal_n512", w, 2, NULL), -1,
               "a buffer too small for the name");
  fg_cache_close(c);
}

/* ---- ls, stats, verify, clear ---- */

Test(cache, verify_reports_each_bad_entry) {
  fg_cache *c = fgt_open_ok(fgt_dir);
  const char *names[3] = {"kern_alpha", "kern_beta", "kern_gamma"};
  fg_kernel_image imgs[3];
  for (int i = 0; i < 3; i++) {
    imgs[i] = fgt_make_image(names[i], (unsigned)i, 3000, 2000);
    fg_cache_key k = fgt_key_of(names[i]);
    fgt_put_ok(c, &k, &imgs[i]);
    fgt_release(&imgs[i]);
  }
  int ret;
  char *out = fgt_capture(fg_cache_verify, c, &ret);
  cr_assert_eq(ret, 0);
  cr_assert(strstr(out, "all 3 entries ok"), "%s", out);
  free(out);

  fgt_flip_bit(fg_cache_path(c), "kern_alpha", "cubin", 10, 0);
  fgt_db_exec(fg_cache_path(c),
          "UPDATE kernels SET ptx = substr(ptx, 1, 5) WHERE variant = 'kern_gamma'");
  out = fgt_capture(fg_cache_verify, c, &ret);
  cr_assert_eq(ret, 2, "two bad entries: %s", out);
  cr_assert(strstr(out, "kern_alpha") && strstr(out, "kern_gamma") && !strstr(out, "kern_beta"),
            "each bad entry named, the good one not: %s", out);
  cr_assert(strstr(out, "2 of 3 entries bad"), "%s", out);
  free(out);
  cr_assert_eq(fgt_kernel_count(c), 3, "verify reports, it does not delete");
  fg_cache_close(c);
}

Test(cache, ls_stats_list_tuning_and_clear) {
  fg_cache *c = fgt_open_ok(fgt_dir);
  fg_kernel_image img =
      fgt_make_image("fwd_d64_br64_bc64_f16_nocausal_qouter_w4_s2_sm80", 1, 4000, 1000);
  fg_cache_key k = fgt_key_of(img.variant);
  fgt_put_ok(c, &k, &img);
  k.arch = FG_ARCH_SM90A;
  fgt_put_ok(c, &k, &img);
  fgt_release(&img);
  fg_device_id dev = h100();
  fg_tune_candidate cs[2] = {cand("fwd_d64_x", 1, 0.25, 321.5, ""),
                             cand("fwd_d64_y", 0, 0, 0, "smem")};
  cr_assert_eq(fg_cache_put_tuning(c, &dev, "fwd_d64_f16_n4096", cs, 2, "fwd_d64_x", NULL, 0), 0);

  int ret;
  char *out = fgt_capture(fg_cache_ls, c, &ret);
  cr_assert_eq(ret, 2);
  cr_assert(strstr(out, "fwd_d64_br64_bc64_f16_nocausal_qouter_w4_s2_sm80") &&
                strstr(out, "sm_80") && strstr(out, "sm_90a") && strstr(out, "12.4") &&
                strstr(out, "5000"),
            "ls shows variant, arch, NVRTC version and size: %s", out);
  free(out);

  out = fgt_capture(fg_cache_stats, c, &ret);
  cr_assert_eq(ret, 0);
  cr_assert(strstr(out, fg_cache_path(c)), "%s", out);
  cr_assert(strstr(out, "2 entries, 10000 bytes"), "%s", out);
  cr_assert(strstr(out, "1 buckets on 1 devices, 2 candidates"), "%s", out);
  free(out);
  fg_cache_counts n;
  cr_assert_eq(fg_cache_count(c, &n), 0);
  cr_assert_eq(n.kernels, 2);
  cr_assert_eq(n.kernel_bytes, 10000);
  cr_assert_eq(n.tuning_records, 1);
  cr_assert_eq(n.candidates, 2);
  cr_assert_gt(n.file_bytes, 10000);

  out = fgt_capture(fg_cache_list_tuning, c, &ret);
  cr_assert_eq(ret, 1);
  cr_assert(strstr(out, "NVIDIA H100 80GB HBM3") && strstr(out, "fwd_d64_f16_n4096") &&
                strstr(out, "fwd_d64_x") && strstr(out, "321.5") && strstr(out, "2 (1)"),
            "device, bucket, winner, TFLOP/s, candidates (rejected): %s", out);
  free(out);

  cr_assert_eq(fg_cache_clear(c, NULL, 0), 0);
  cr_assert_eq(fg_cache_count(c, &n), 0);
  cr_assert_eq(n.kernels + n.tuning_records + n.candidates + n.devices, 0);
  cr_assert_eq(fg_cache_ls(c, NULL), 0);
  char w[FG_VARIANT_NAME_MAX];
  cr_assert_eq(fg_cache_get_winner(c, &dev, "fwd_d64_f16_n4096", w, sizeof w, NULL), 0);
  fg_cache_close(c);
}
