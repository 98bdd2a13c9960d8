/* cache_support.h: helpers the cache tests share (tests/support_cache.c): a fresh directory per
 * test, removing it, opening a cache that must open cleanly or be refused, a fixed key, made-up
 * kernels, storing, reading and comparing them, damaging the database on purpose. */
#ifndef FG_CACHE_SUPPORT_H
#define FG_CACHE_SUPPORT_H
#include <stddef.h>
#include <stdio.h>
#include "fg_cache.h"

/* Removes path and everything under it (making directories writable first); missing: no-op. */
void fgt_rm_rf(const char *path);
/* fg_cache_open(dir), asserting it opened with no warning. */
fg_cache *fgt_open_ok(const char *dir);
/* A key for variant: sm_80, NVRTC 12.4, a fixed template hash, flashgen 0.1.0. */
fg_cache_key fgt_key_of(const char *variant);
/* Frees an image's cubin and PTX (and NULLs them). */
void fgt_release(fg_kernel_image *img);
/* fg_cache_put_kernel, asserting success with no warning. */
void fgt_put_ok(fg_cache *c, const fg_cache_key *k, const fg_kernel_image *img);
/* Stores under k (fgt_put_ok) an sm_90a image of k->variant with the plan meta, a 64-byte cubin
 * and a line of PTX. */
void fgt_put_image(fg_cache *c, const fg_cache_key *k, const fg_kernel_meta *meta);
/* fg_cache_get_kernel into a zeroed *out. */
int fgt_get(fg_cache *c, const fg_cache_key *k, fg_kernel_image *out, char *warn, size_t len);
/* The number of kernel entries, asserting the count succeeded. */
long long fgt_kernel_count(fg_cache *c);
/* The fixture of test_cache*.c's suite `cache`: a fresh private directory per test (fgt_tmp), the
 * cache in fgt_tmp/c (fgt_dir), FLASHGEN_CACHE_DIR unset; the teardown removes it all. */
extern char fgt_tmp[64], fgt_dir[128];
void fgt_cache_setup(void);
void fgt_cache_teardown(void);
/* fg_cache_open(dir) refused, with a warning that holds expect_in_warn and names
 * FLASHGEN_CACHE_DIR (what to do). */
void fgt_open_refused(const char *dir, const char *expect_in_warn);
/* An image of variant (sm_80) with cubin_size bytes of cubin and ptx_size letters of PTX (then
 * a NUL), both from an LCG seeded by seed; no plan yet. */
fg_kernel_image fgt_image_bytes(const char *variant, unsigned seed, size_t cubin_size,
                                size_t ptx_size);
/* fgt_image_bytes with a plan, a backward one (three steps, four workspaces) on odd seeds, a
 * forward one on even, and made-up resource counts. */
fg_kernel_image fgt_make_image(const char *variant, unsigned seed, size_t cubin_size,
                               size_t ptx_size);
/* Every field of two plans (steps and workspaces) equal. */
int fgt_same_plan(const fg_kernel_meta *a, const fg_kernel_meta *b);
/* Two images equal: bytes, plan and resource counts (b's PTX NUL-terminated). */
int fgt_same_image(const fg_kernel_image *a, const fg_kernel_image *b);
/* Runs sql on the database at path through a connection of its own (to damage it on purpose). */
void fgt_db_exec(const char *path, const char *sql);
/* Flips bit `bit` of byte `byte` of the cubin (column "cubin") or ptx of variant's entry. */
void fgt_flip_bit(const char *path, const char *variant, const char *column, size_t byte, int bit);
/* What fn (a printing function of the cache: ls, stats, verify) writes, malloc'd; its return
 * value into *ret. */
char *fgt_capture(int (*fn)(fg_cache *, FILE *), fg_cache *c, int *ret);
#endif
