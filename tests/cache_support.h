/* cache_support.h: helpers the cache tests share (tests/support_cache.c): removing a test
 * directory, opening a cache that must open cleanly, a fixed key, storing and reading kernels. */
#ifndef FG_CACHE_SUPPORT_H
#define FG_CACHE_SUPPORT_H
#include <stddef.h>
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
#endif
