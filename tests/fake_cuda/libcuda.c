/* libcuda.c: a fake CUDA driver for testing `flashgen tune` end to end on a machine without a
 * GPU (tests/test_autotune.c builds it with `cc -shared` and points FLASHGEN_CUDA_LIBRARY at it).
 * One device with H100 limits; device memory is host memory; modules keep only their entry
 * names; a launch computes attention on the CPU from the fg_fwd_params block, as the kernel
 * named by its entry would: the references (fg_ref_f64_* exact, fg_ref_lowp_* rounded) write
 * fp64 (O, and the LSE when p.lse is set), the forward variants write f16/bf16 (and an fp32
 * LSE when p.lse is set: the gate checks it). Planted faults, so rejection is tested too:
 * kv_outer variants leave the last output unwritten (NaN), br128_bc128 variants are wrong by
 * 0.25 (neither with FAKE_CUDA_EXACT set); variants with w8 spin 5x longer (early stop). Events are host timestamps.
 * Backward kernels (entries fg_bwd_*): their launches are recorded (entry, grid, block, shared
 * memory, a copy of the fg_bwd_params block), and so are cuMemAlloc and cuMemFree (and
 * cuMemAllocAsync/cuMemFreeAsync, offered as memory pools when FAKE_CUDA_MEMORY_POOLS is set);
 * tests read the record through fake_launch_count, fake_launch_get, fake_mem_counts and
 * fake_async_counts (dlopen the same library) and clear it with fake_reset
 * (tests/test_backward.c). Then the plan is emulated by fake_backward.c, unless
 * FAKE_CUDA_BACKWARD_RECORD_ONLY is set (tests whose tensors are made-up addresses); with
 * FAKE_CUDA_BACKWARD_CLOBBER_DO set each backward launch also writes a NaN over dO's first element.
 * Tensor maps: cuTensorMapEncodeTiled checks what the real driver's documentation requires (rank,
 * dims, strides, box, alignment), records its arguments (fake_tmap_count, fake_tmap_get) and
 * writes them into the map's 128 bytes (fake_tmap_encoded; it fails when FAKE_CUDA_TMAP_FAIL is
 * set, and is left out when built with -DFAKE_CUDA_NO_TENSOR_MAP, as from a driver older than
 * CUDA 12). A forward kernel whose entry says qtma (or qtmap / qtmad, the same on a persistent
 * grid, or qtmac, on clusters of two blocks along x: refused, as by the driver, when the grid's x
 * is odd)
 * takes fg_fwd_tma_params: its launch is
 * recorded with the block (fake_tma_launch_count, fake_tma_launch_get) and computed reading Q, K
 * and V through its maps 0, 1 and 2 (rows past a map's end read as zeros), so a map that
 * describes its tensor wrongly gives a wrong O (tests/test_tma.c). A backward kernel whose entry
 * says kvtma (each step of its plan) takes fg_bwd_tma_params: recorded with the whole block
 * (fake_bwd_tma_launch_count, fake_bwd_tma_launch_get; fake_launch_get holds its inner block),
 * refused unless its maps are this launch's q, do, k, v (by base address) with its batch count,
 * and emulated reading Q, dO, K and V through them (tests/test_tma_bwd.c). */
#include <math.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../../templates/fg_params.h"
#include "fake_records.h"

typedef int CUresult;
typedef unsigned long long CUdeviceptr;

#define API __attribute__((visibility("default")))

typedef struct fake_fn {
  char name[160];
} fake_fn;

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

API CUresult cuInit(unsigned int f) { (void)f; return 0; }
API CUresult cuDriverGetVersion(int *v) { *v = 13000; return 0; }
API CUresult cuDeviceGetCount(int *n) { *n = 1; return 0; }
API CUresult cuDeviceGet(int *d, int o) { *d = 0; return o == 0 ? 0 : 101; }
API CUresult cuDeviceGetName(char *name, int len, int d) {
  (void)d;
  strncpy(name, "Fake H100 (flashgen test driver)", (size_t)len);
  name[len - 1] = 0;
  return 0;
}
API CUresult cuDeviceGetAttribute(int *v, int a, int d) {
  (void)d;
  switch (a) {
  case 1: *v = 1024; break;
  case 5: *v = 2147483647; break;
  case 6: *v = 65535; break;
  case 16: *v = 132; break;
  case 38: *v = 50 << 20; break;
  case 39: *v = 2048; break;
  case 41: *v = 1; break;
  case 75: *v = 9; break;
  case 76: *v = 0; break;
  case 81: *v = 233472; break;
  case 82: *v = 65536; break;
  case 97: *v = 232448; break;
  case 115: *v = getenv("FAKE_CUDA_MEMORY_POOLS") != NULL; break; /* cuMemAllocAsync */
  default: *v = 0; break;
  }
  return 0;
}
API CUresult cuDeviceTotalMem_v2(size_t *b, int d) { (void)d; *b = (size_t)80 << 30; return 0; }
static int fake_ctx;
API CUresult cuDevicePrimaryCtxRetain(void **c, int d) { (void)d; *c = &fake_ctx; return 0; }
API CUresult cuDevicePrimaryCtxRelease_v2(int d) { (void)d; return 0; }
API CUresult cuCtxPushCurrent_v2(void *c) { (void)c; return 0; }
API CUresult cuCtxPopCurrent_v2(void **c) { if (c) *c = &fake_ctx; return 0; }
API CUresult cuCtxGetCurrent(void **c) { *c = NULL; return 0; } /* never current: always push */
/* FAKE_CUDA_HANG set: once a kernel has been launched, every wait for the GPU blocks for good,
 * as behind a kernel that deadlocks (the hang watchdog's test, tests/test_autotune.c). */
static int fake_launched;
static void fake_maybe_hang(void) {
  if (!fake_launched || !getenv("FAKE_CUDA_HANG")) return;
  for (;;) {
    struct timespec nap = {1, 0};
    nanosleep(&nap, NULL);
  }
}
/* With FAKE_CUDA_LOG set to a file's path, one line per kernel launch ("launch <entry>") and
 * per cuCtxSynchronize ("ctx_sync") is appended to it, so a test of a whole command can see the
 * order of its launches and device synchronisations. */
static void fake_log(const char *what, const char *name) {
  const char *path = getenv("FAKE_CUDA_LOG");
  if (!path || !*path) return;
  FILE *f = fopen(path, "a");
  if (!f) return;
  fprintf(f, "%s%s%s\n", what, name ? " " : "", name ? name : "");
  fclose(f);
}
API CUresult cuCtxSynchronize(void) {
  fake_log("ctx_sync", NULL);
  fake_maybe_hang();
  return 0;
}
/* A module owns the functions taken from it (freed with it, so leak checkers stay quiet). */
typedef struct fake_module {
  fake_fn **fns;
  int n;
} fake_module;
static int fake_n_module_loads; /* modules loaded since the process started (fake_module_loads) */
API int fake_module_loads(void) { return fake_n_module_loads; }
API CUresult cuModuleLoadDataEx(void **m, const void *img, unsigned n, int *o, void **v) {
  (void)img; (void)n; (void)o; (void)v;
  fake_n_module_loads++;
  *m = calloc(1, sizeof(fake_module));
  return *m ? 0 : 2;
}
API CUresult cuModuleGetFunction(void **fn, void *m, const char *name) {
  fake_module *mod = m;
  fake_fn **fns = realloc(mod->fns, (size_t)(mod->n + 1) * sizeof *fns);
  if (!fns) return 2;
  mod->fns = fns;
  fake_fn *f = calloc(1, sizeof *f);
  if (!f) return 2;
  strncpy(f->name, name, sizeof f->name - 1);
  mod->fns[mod->n++] = f;
  *fn = f;
  return 0;
}
API CUresult cuModuleUnload(void *m) {
  fake_module *mod = m;
  for (int i = 0; i < mod->n; i++) free(mod->fns[i]);
  free(mod->fns);
  free(mod);
  return 0;
}
API CUresult cuFuncSetAttribute(void *f, int a, int v) { (void)f; (void)a; (void)v; return 0; }
API CUresult cuFuncGetAttribute(int *v, int a, void *f) {
  (void)f;
  *v = a == 0 ? 1024 : a == 4 ? 128 : a == 8 ? 232448 : 0;
  return 0;
}
API CUresult cuPointerGetAttribute(void *data, int a, CUdeviceptr p) {
  (void)p;
  if (a == 2) *(unsigned *)data = 2; /* device memory */
  else if (a == 8) *(unsigned *)data = 0;
  else if (a == 9) *(int *)data = 0;
  else return 1;
  return 0;
}
/* The record of backward launches and of allocations. */
#define FAKE_LAUNCH_MAX 64
static fake_launch fake_launches[FAKE_LAUNCH_MAX];
static int fake_n_launches; /* may exceed FAKE_LAUNCH_MAX: only the first are kept */
/* The last cuMemsetD32Async: where, how many words, the value, the stream, and how many
 * backward launches came before it (fake_memset_async_last; fake_reset clears the count). */
static int fake_n_memsets, fake_memset_launches_before;
static CUdeviceptr fake_memset_ptr;
static size_t fake_memset_count;
static unsigned fake_memset_value;
static void *fake_memset_stream;
static int fake_n_allocs, fake_n_frees, fake_n_async_allocs, fake_n_async_frees;
static size_t fake_last_alloc_bytes;
static void *fake_last_async_stream;

static int fake_n_tmaps, fake_n_tma_launches, fake_n_bwd_tma_launches;
API void fake_reset(void) {
  fake_n_launches = fake_n_allocs = fake_n_frees = fake_n_async_allocs = fake_n_async_frees = 0;
  fake_n_tmaps = fake_n_tma_launches = fake_n_bwd_tma_launches = 0;
  fake_last_alloc_bytes = 0;
  fake_last_async_stream = NULL;
  fake_n_memsets = 0;
}
API int fake_launch_count(void) { return fake_n_launches; }
API const fake_launch *fake_launch_get(int i) {
  return i >= 0 && i < fake_n_launches && i < FAKE_LAUNCH_MAX ? &fake_launches[i] : NULL;
}
API void fake_mem_counts(int *allocs, int *frees, size_t *last_alloc_bytes) {
  *allocs = fake_n_allocs;
  *frees = fake_n_frees;
  *last_alloc_bytes = fake_last_alloc_bytes;
}

API CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t b) {
  fake_n_allocs++;
  fake_last_alloc_bytes = b;
  void *m = aligned_alloc(256, (b + 255) / 256 * 256);
  if (!m) return 2;
  *p = (CUdeviceptr)(uintptr_t)m;
  return 0;
}
API CUresult cuMemFree_v2(CUdeviceptr p) {
  fake_n_frees++;
  free((void *)(uintptr_t)p);
  return 0;
}
API void fake_async_counts(int *allocs, int *frees, void **last_stream) {
  *allocs = fake_n_async_allocs;
  *frees = fake_n_async_frees;
  *last_stream = fake_last_async_stream;
}
API CUresult cuMemAllocAsync(CUdeviceptr *p, size_t b, void *st) {
  CUresult r = cuMemAlloc_v2(p, b);
  fake_n_allocs--; /* counted as asynchronous */
  fake_n_async_allocs++;
  fake_last_async_stream = st;
  return r;
}
API CUresult cuMemFreeAsync(CUdeviceptr p, void *st) {
  fake_n_async_frees++;
  fake_last_async_stream = st;
  free((void *)(uintptr_t)p);
  return 0;
}
API CUresult cuMemGetInfo_v2(size_t *f, size_t *t) { *f = *t = (size_t)80 << 30; return 0; }
API CUresult cuMemcpyHtoD_v2(CUdeviceptr d, const void *s, size_t b) {
  memcpy((void *)(uintptr_t)d, s, b);
  return 0;
}
API CUresult cuMemcpyDtoH_v2(void *d, CUdeviceptr s, size_t b) {
  fake_maybe_hang();
  memcpy(d, (const void *)(uintptr_t)s, b);
  return 0;
}
API CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void *s, size_t b, void *st) {
  (void)st;
  return cuMemcpyHtoD_v2(d, s, b);
}
API CUresult cuMemcpyDtoHAsync_v2(void *d, CUdeviceptr s, size_t b, void *st) {
  (void)st;
  return cuMemcpyDtoH_v2(d, s, b);
}
API CUresult cuMemsetD8_v2(CUdeviceptr d, unsigned char v, size_t n) {
  memset((void *)(uintptr_t)d, v, n);
  return 0;
}
API CUresult cuMemsetD32Async(CUdeviceptr d, unsigned int v, size_t n, void *st) {
  for (size_t i = 0; i < n; i++) ((unsigned int *)(uintptr_t)d)[i] = v;
  fake_n_memsets++;
  fake_memset_launches_before = fake_n_launches;
  fake_memset_ptr = d, fake_memset_count = n, fake_memset_value = v, fake_memset_stream = st;
  return 0;
}
API int fake_memset_async_last(unsigned long long *ptr, size_t *count, unsigned *value,
                               void **stream, int *launches_before) {
  *ptr = fake_memset_ptr, *count = fake_memset_count, *value = fake_memset_value;
  *stream = fake_memset_stream, *launches_before = fake_memset_launches_before;
  return fake_n_memsets;
}
API CUresult cuMemsetD16_v2(CUdeviceptr d, unsigned short v, size_t n) {
  unsigned short *p = (unsigned short *)(uintptr_t)d;
  for (size_t i = 0; i < n; i++) p[i] = v;
  return 0;
}
API CUresult cuMemsetD32_v2(CUdeviceptr d, unsigned int v, size_t n) {
  unsigned int *p = (unsigned int *)(uintptr_t)d;
  for (size_t i = 0; i < n; i++) p[i] = v;
  return 0;
}
API CUresult cuStreamCreate(void **s, unsigned f) { (void)f; *s = malloc(1); return 0; }
API CUresult cuStreamDestroy_v2(void *s) { free(s); return 0; }
/* The streams synchronised, in order (the last 8; fake_stream_syncs). */
static void *fake_syncs[8];
static int fake_n_syncs;
API CUresult cuStreamSynchronize(void *s) {
  fake_syncs[fake_n_syncs++ % 8] = s;
  fake_maybe_hang();
  return 0;
}
API int fake_stream_syncs(void **last) {
  *last = fake_n_syncs ? fake_syncs[(fake_n_syncs - 1) % 8] : NULL;
  return fake_n_syncs;
}
API CUresult cuEventCreate(void **e, unsigned f) { (void)f; *e = calloc(1, sizeof(double)); return 0; }
API CUresult cuEventRecord(void *e, void *s) { (void)s; *(double *)e = now_ms(); return 0; }
API CUresult cuEventSynchronize(void *e) {
  (void)e;
  fake_maybe_hang();
  return 0;
}
API CUresult cuEventElapsedTime(float *ms, void *a, void *b) {
  double d = *(double *)b - *(double *)a;
  *ms = (float)(d < 1e-3 ? 1e-3 : d);
  return 0;
}
API CUresult cuEventDestroy_v2(void *e) { free(e); return 0; }
API CUresult cuGetErrorName(CUresult r, const char **n) { (void)r; *n = "FAKE_CUDA_ERROR"; return 0; }
API CUresult cuGetErrorString(CUresult r, const char **t) { (void)r; *t = "fake driver error"; return 0; }

static double to_double(int bf16, uint16_t h) {
  if (bf16) {
    uint32_t x = (uint32_t)h << 16;
    float f;
    memcpy(&f, &x, 4);
    return f;
  }
  const uint32_t e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
  double v = e == 0 ? ldexp(m, -24) : e == 31 ? NAN : ldexp(m | 0x400u, (int)e - 25);
  return (h & 0x8000u) ? -v : v;
}

static uint16_t from_double(int bf16, double v) {
  float f = (float)v;
  uint32_t x;
  memcpy(&x, &f, 4);
  if (bf16) return (uint16_t)((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
  /* f16 for |v| in the normal range (outputs of attention on inputs in [-6, 6]) */
  const uint32_t sign = (x >> 16) & 0x8000u;
  const int e = (int)((x >> 23) & 0xFF) - 127 + 15;
  if (e <= 0) return (uint16_t)sign;
  uint32_t h = sign | ((uint32_t)e << 10) | ((x & 0x7FFFFFu) >> 13);
  const uint32_t rem = x & 0x1FFFu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;
  return (uint16_t)h;
}

/* ---- tensor maps ---- */
/* A call of cuTensorMapEncodeTiled: fake_tmap (fake_records.h), written into the map's bytes. */
_Static_assert(sizeof(fake_tmap) <= sizeof(fg_tmap), "a fake map must fit in a CUtensorMap");
#define FAKE_TMAP_MAX 64
static fake_tmap fake_tmaps[FAKE_TMAP_MAX];
API int fake_tmap_count(void) { return fake_n_tmaps; }
API const fake_tmap *fake_tmap_get(int i) {
  return i >= 0 && i < fake_n_tmaps && i < FAKE_TMAP_MAX ? &fake_tmaps[i] : NULL;
}
/* The map as encoded into an fg_tmap, or NULL if it holds none. */
API const fake_tmap *fake_tmap_encoded(const fg_tmap *m) {
  const fake_tmap *t = (const fake_tmap *)m;
  return t->magic == FAKE_TMAP_MAGIC ? t : NULL;
}

#ifndef FAKE_CUDA_NO_TENSOR_MAP
API CUresult cuTensorMapEncodeTiled(void *map, int type, unsigned rank, void *address,
                                    const unsigned long long *dims,
                                    const unsigned long long *strides, const unsigned *box,
                                    const unsigned *estrides, int interleave, int swizzle,
                                    int l2, int oob) {
  if (getenv("FAKE_CUDA_TMAP_FAIL")) return 1;
  /* What the documentation of cuda.h 13.0 requires (the parts flashgen's maps touch). */
  const unsigned esize = type == 6 || type == 9 || type == 1 ? 2 : type == 0 ? 1 : 4;
  if (!map || ((uintptr_t)map & 63) || rank < 1 || rank > 5 || ((uintptr_t)address & 15) ||
      interleave != 0 || swizzle < 0 || swizzle > 3 || l2 < 0 || l2 > 3 || oob < 0 || oob > 1)
    return 1;
  for (unsigned i = 0; i < rank; i++) {
    if (dims[i] < 1 || dims[i] > (1ull << 32) || box[i] < 1 || box[i] > 256 || estrides[i] < 1 ||
        estrides[i] > 8)
      return 1;
    if (i + 1 < rank && (strides[i] % 16 || strides[i] >= (1ull << 40))) return 1;
  }
  if ((box[0] * esize) % 16 || (swizzle == 3 && box[0] * esize > 128)) return 1;
  fake_tmap t;
  memset(&t, 0, sizeof t);
  t.magic = FAKE_TMAP_MAGIC;
  t.data_type = type;
  t.rank = rank;
  t.address = (unsigned long long)(uintptr_t)address;
  for (unsigned i = 0; i < rank; i++) {
    t.dims[i] = dims[i];
    t.box[i] = (unsigned short)box[i];
    t.element_strides[i] = (unsigned char)estrides[i];
    if (i + 1 < rank) t.strides[i] = strides[i];
  }
  t.interleave = (signed char)interleave, t.swizzle = (signed char)swizzle;
  t.l2_promotion = (signed char)l2, t.oob_fill = (signed char)oob;
  if (fake_n_tmaps < FAKE_TMAP_MAX) fake_tmaps[fake_n_tmaps] = t;
  fake_n_tmaps++;
  memset(map, 0, sizeof(fg_tmap));
  memcpy(map, &t, sizeof t);
  return 0;
}
#endif

/* Element (c, row, head, batch) of a rank-4 map's tensor; 0 past its end (OOB fill none). */
static uint16_t fake_tmap_read(const fake_tmap *t, long long c, long long r, long long h,
                               long long b) {
  if (c >= (long long)t->dims[0] || r >= (long long)t->dims[1] || h >= (long long)t->dims[2] ||
      b >= (long long)t->dims[3])
    return 0;
  const unsigned char *p = (const unsigned char *)(uintptr_t)t->address + c * 2 +
                           r * (long long)t->strides[0] + h * (long long)t->strides[1] +
                           b * (long long)t->strides[2];
  uint16_t x;
  memcpy(&x, p, 2);
  return x;
}

#include "fake_backward.c" /* fake_backward: the fg_bwd_* kernels */

/* Backward launches of kernels that take fg_bwd_tma_params (entries fg_bwd_..._kvtma_..., every
 * step of the plan), with their whole block. */
#define FAKE_BWD_TMA_LAUNCH_MAX 16
static fake_bwd_tma_launch fake_bwd_tma_launches[FAKE_BWD_TMA_LAUNCH_MAX];
API int fake_bwd_tma_launch_count(void) { return fake_n_bwd_tma_launches; }
API const fake_bwd_tma_launch *fake_bwd_tma_launch_get(int i) {
  return i >= 0 && i < fake_n_bwd_tma_launches && i < FAKE_BWD_TMA_LAUNCH_MAX
             ? &fake_bwd_tma_launches[i]
             : NULL;
}

/* The maps of a kvtma block, by tensor (q, do, k, v), told apart by their base addresses, which
 * must be the block's own (this launch's batches); each of rank 4 with the block's head_dim and
 * batch count. NULL where the plan has no map of the tensor. -1 for a map that fits none: a map
 * the runtime described wrongly. K and V may be zero maps when there are no keys. */
static int fake_bwd_maps(const fg_bwd_tma_params *tp, const fake_tmap *out[4]) {
  const fg_bwd_params *p = &tp->p;
  const unsigned long long addr[4] = {p->q, p->d_o, p->k, p->v};
  out[0] = out[1] = out[2] = out[3] = NULL;
  for (int i = 0; i < 4; i++) {
    const fake_tmap *m = fake_tmap_encoded(&tp->tmap[i]);
    if (!m) continue;
    int which = -1;
    for (int t = 0; t < 4 && which < 0; t++)
      if (m->address == addr[t] && !out[t]) which = t;
    if (which < 0 || m->rank != 4 || m->dims[0] != (unsigned long long)p->head_dim ||
        m->dims[3] != (unsigned long long)p->batch)
      return -1;
    out[which] = m;
  }
  return 0;
}

/* Forward launches of kernels that take tensor maps (entries with _qtma_, _qtmap_, _qtmac_ or
 * _qtmad_). */
#define FAKE_TMA_LAUNCH_MAX 16
static fake_tma_launch fake_tma_launches[FAKE_TMA_LAUNCH_MAX];
API int fake_tma_launch_count(void) { return fake_n_tma_launches; }
API const fake_tma_launch *fake_tma_launch_get(int i) {
  return i >= 0 && i < fake_n_tma_launches && i < FAKE_TMA_LAUNCH_MAX ? &fake_tma_launches[i]
                                                                        : NULL;
}

API CUresult cuLaunchKernel(void *fnp, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                            unsigned by, unsigned bz, unsigned smem, void *st, void **params,
                            void **extra) {
  (void)gx; (void)gy; (void)gz; (void)bx; (void)by; (void)bz; (void)smem; (void)st; (void)extra;
  const fake_fn *f = fnp;
  fake_launched = 1;
  fake_log("launch", f->name);
  if (strncmp(f->name, "fg_bwd_", 7) == 0) {
    /* A kvtma kernel takes fg_bwd_tma_params: its maps, then the usual block. */
    const fg_bwd_tma_params *tp = strstr(f->name, "_kvtma_") ? params[0] : NULL;
    const fg_bwd_params *bp = tp ? &tp->p : params[0];
    if (fake_n_launches < FAKE_LAUNCH_MAX) {
      fake_launch *l = &fake_launches[fake_n_launches];
      strncpy(l->entry, f->name, sizeof l->entry - 1);
      l->grid[0] = gx, l->grid[1] = gy, l->grid[2] = gz;
      l->block[0] = bx, l->block[1] = by, l->block[2] = bz;
      l->smem = smem;
      memcpy(&l->params, bp, sizeof l->params);
    }
    fake_n_launches++;
    const fake_tmap *maps[4];
    if (tp) {
      if (fake_n_bwd_tma_launches < FAKE_BWD_TMA_LAUNCH_MAX) {
        fake_bwd_tma_launch *l = &fake_bwd_tma_launches[fake_n_bwd_tma_launches];
        strncpy(l->entry, f->name, sizeof l->entry - 1);
        l->grid[0] = gx, l->grid[1] = gy, l->grid[2] = gz;
        l->block[0] = bx, l->block[1] = by, l->block[2] = bz;
        l->smem = smem;
        memcpy(&l->params, tp, sizeof l->params);
      }
      fake_n_bwd_tma_launches++;
      if (fake_bwd_maps(tp, maps) != 0 || !maps[0] || !maps[1] ||
          (bp->seqlen_k > 0 && (!maps[2] || !maps[3])))
        return 1;
    }
    /* A stray write: the first element of dO becomes a bf16 NaN (the check's read-back of the
     * inputs after a non-finite result must see it). */
    if (getenv("FAKE_CUDA_BACKWARD_CLOBBER_DO") && bp->d_o)
      *(uint16_t *)(uintptr_t)bp->d_o = 0x7fc0;
    if (getenv("FAKE_CUDA_BACKWARD_RECORD_ONLY")) return 0;
    return fake_backward(f->name, bp, tp ? maps : NULL);
  }
  const fg_fwd_params *p = params[0];
  /* Q, K, V through maps 0, 1, 2 of an fg_fwd_tma_params block (NULL: through p's pointers). */
  const fake_tmap *mq = NULL, *mk = NULL, *mv = NULL;
  if (strstr(f->name, "_qtma_") || strstr(f->name, "_qtmap_") || strstr(f->name, "_qtmac_") ||
      strstr(f->name, "_qtmad_")) {
    const fg_fwd_tma_params *tp = params[0];
    if (strstr(f->name, "_qtmac_") && gx % 2 != 0) return 1; /* the cluster shape divides the grid */
    if (fake_n_tma_launches < FAKE_TMA_LAUNCH_MAX) {
      fake_tma_launch *l = &fake_tma_launches[fake_n_tma_launches];
      strncpy(l->entry, f->name, sizeof l->entry - 1);
      l->grid[0] = gx, l->grid[1] = gy, l->grid[2] = gz;
      l->block[0] = bx, l->block[1] = by, l->block[2] = bz;
      l->smem = smem;
      memcpy(&l->params, tp, sizeof l->params);
    }
    fake_n_tma_launches++;
    p = &tp->p;
    mq = fake_tmap_encoded(&tp->tmap[0]), mk = fake_tmap_encoded(&tp->tmap[1]);
    mv = fake_tmap_encoded(&tp->tmap[2]);
    /* The kernel's grid is the block's; its maps must cover its batches (and no more). Without
     * keys (seqlen_k = 0) the kernel reads no K/V block: their maps may be empty. */
    const int kv_read = p->seqlen_k > 0;
    if (!mq || mq->rank != 4 || mq->dims[3] != (unsigned long long)p->batch)
      return 1;
    if (kv_read && (!mk || !mv || mk->rank != 4 || mv->rank != 4 ||
                    mk->dims[3] != (unsigned long long)p->batch ||
                    mv->dims[3] != (unsigned long long)p->batch))
      return 1;
  }
  const double t0 = now_ms();
  const int is_ref = strncmp(f->name, "fg_ref_", 7) == 0;
  const int exact = strncmp(f->name, "fg_ref_f64_", 11) == 0;
  const int bf16 = strstr(f->name, "bf16") != NULL;
  const int exact_env = getenv("FAKE_CUDA_EXACT") != NULL; /* no planted errors */
  const int hole = !exact_env && strstr(f->name, "kvouter") != NULL;
  const double bias = !exact_env && strstr(f->name, "br128_bc128") ? 0.25 : 0.0;
  const long long d = p->head_dim, nq = p->seqlen_q, nk = p->seqlen_k;
  double *s = malloc(sizeof *s * (size_t)(nk ? nk : 1));
  double *kd = malloc(sizeof *kd * (size_t)(nk * d + 1)), *vd = malloc(sizeof *vd * (size_t)(nk * d + 1));
  double *qd = malloc(sizeof *qd * (size_t)d);
  for (long long b = 0; b < p->batch; b++)
    for (long long h = 0; h < p->heads_q; h++) {
      const long long hk = h / p->hq_per_hkv;
      const uint16_t *q = (const uint16_t *)(uintptr_t)p->q + b * p->q_sb + h * p->q_sh;
      const uint16_t *k = (const uint16_t *)(uintptr_t)p->k + b * p->k_sb + hk * p->k_sh;
      const uint16_t *v = (const uint16_t *)(uintptr_t)p->v + b * p->v_sb + hk * p->v_sh;
      for (long long j = 0; j < nk; j++)
        for (long long c = 0; c < d; c++) {
          kd[j * d + c] = to_double(bf16, mk ? fake_tmap_read(mk, c, j, hk, b) : k[j * p->k_sn + c]);
          vd[j * d + c] = to_double(bf16, mv ? fake_tmap_read(mv, c, j, hk, b) : v[j * p->v_sn + c]);
        }
      for (long long i = 0; i < nq; i++) {
        long long n = nk;
        if ((is_ref && p->causal) || (!is_ref && strstr(f->name, "_causal_")))
          n = i + nk - nq + 1 < nk ? i + nk - nq + 1 : nk;
        for (long long c = 0; c < d; c++)
          qd[c] = to_double(bf16, mq ? fake_tmap_read(mq, c, i, h, b) : q[i * p->q_sn + c]);
        double mx = -INFINITY, sum = 0;
        for (long long j = 0; j < n; j++) {
          double acc = 0;
          for (long long c = 0; c < d; c++) acc += qd[c] * kd[j * d + c];
          s[j] = acc * p->scale;
          if (s[j] > mx) mx = s[j];
        }
        for (long long j = 0; j < n; j++) sum += (s[j] = exp(s[j] - mx));
        if (p->lse) {
          const long long row = (b * p->heads_q + h) * nq + i;
          const double l = n > 0 ? mx + log(sum) : -INFINITY;
          if (is_ref) ((double *)(uintptr_t)p->lse)[row] = l;
          else ((float *)(uintptr_t)p->lse)[row] = (float)l;
        }
        for (long long c = 0; c < d; c++) {
          double o = 0;
          for (long long j = 0; j < n; j++) o += s[j] * vd[j * d + c];
          o = n > 0 ? o / sum : 0;
          if (is_ref) {
            if (!exact) o = to_double(bf16, from_double(bf16, o));
            ((double *)(uintptr_t)p->o)[((b * p->heads_q + h) * nq + i) * d + c] = o;
          } else {
            if (hole && b == p->batch - 1 && h == p->heads_q - 1 && i == nq - 1 && c == d - 1)
              continue;
            uint16_t *out = (uint16_t *)(uintptr_t)p->o + b * p->o_sb + h * p->o_sh + i * p->o_sn;
            out[c] = from_double(bf16, o + bias);
          }
        }
      }
    }
  free(kd);
  free(vd);
  free(qd);
  free(s);
  if (strstr(f->name, "_w8_")) { /* slower variants */
    const double spent = now_ms() - t0, until = now_ms() + 4 * spent;
    while (now_ms() < until) {
    }
  }
  return 0;
}
