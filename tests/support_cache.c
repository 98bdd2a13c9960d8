/* support_cache.c: the helpers of cache_support.h (linked into every test; used by the cache
 * tests). */
#include <criterion/criterion.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cache_support.h"

void fgt_rm_rf(const char *path) {
  struct stat st;
  if (lstat(path, &st) != 0) return;
  if (S_ISDIR(st.st_mode)) {
    chmod(path, 0700);
    DIR *d = opendir(path);
    if (d) {
      struct dirent *e;
      while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        size_t n = strlen(path) + strlen(e->d_name) + 2;
        char *p = malloc(n);
        if (!p) continue;
        snprintf(p, n, "%s/%s", path, e->d_name);
        fgt_rm_rf(p);
        free(p);
      }
      closedir(d);
    }
    rmdir(path);
  } else {
    unlink(path);
  }
}

fg_cache *fgt_open_ok(const char *dir) {
  char warn[1024];
  fg_cache *c = fg_cache_open(dir, warn, sizeof warn);
  cr_assert_not_null(c, "fg_cache_open(%s): %s", dir ? dir : "NULL", warn);
  cr_assert_str_empty(warn, "unexpected warning: %s", warn);
  return c;
}

fg_cache_key fgt_key_of(const char *variant) {
  fg_cache_key k = {variant, FG_ARCH_SM80, 12040, 0xF1E2D3C4B5A69788ULL, "0.1.0"};
  return k;
}

void fgt_release(fg_kernel_image *img) {
  free(img->cubin);
  free(img->ptx);
  img->cubin = NULL;
  img->ptx = NULL;
}

void fgt_put_ok(fg_cache *c, const fg_cache_key *k, const fg_kernel_image *img) {
  char warn[1024];
  cr_assert_eq(fg_cache_put_kernel(c, k, img, warn, sizeof warn), 0, "put %s: %s", k->variant,
               warn);
  cr_assert_str_empty(warn);
}

void fgt_put_image(fg_cache *c, const fg_cache_key *k, const fg_kernel_meta *meta) {
  fg_kernel_image img;
  memset(&img, 0, sizeof img);
  snprintf(img.variant, sizeof img.variant, "%s", k->variant);
  img.arch = FG_ARCH_SM90A;
  unsigned char cubin[64];
  for (size_t i = 0; i < sizeof cubin; i++) cubin[i] = (unsigned char)(i * 7);
  char ptx[] = "// ptx";
  img.cubin = cubin;
  img.cubin_size = sizeof cubin;
  img.ptx = ptx;
  img.ptx_size = strlen(ptx);
  img.meta = *meta;
  fgt_put_ok(c, k, &img);
}

int fgt_get(fg_cache *c, const fg_cache_key *k, fg_kernel_image *out, char *warn, size_t len) {
  memset(out, 0, sizeof *out);
  return fg_cache_get_kernel(c, k, out, warn, len);
}

long long fgt_kernel_count(fg_cache *c) {
  fg_cache_counts n;
  cr_assert_eq(fg_cache_count(c, &n), 0);
  return n.kernels;
}
