/* workspace.c: the device scratch memory a plan needs for one call (the backward's dQ
 * accumulator, the kv_outer forward's row state): from the context's own memory pool,
 * stream-ordered and kept between calls (a pool whose memory the driver does not hand back at
 * every synchronisation), else from the device's default pool, else cuMemAlloc (freed after a
 * stream synchronisation). */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "fg_runtime_internal.h"

_Static_assert(sizeof(fg_mem_pool_props) == 88, "CUmemPoolProps of cuda.h 13.0 is 88 bytes");

/* The context's pool, created on first use; NULL when the driver has none (then the caller
 * falls back). Lock: ctx->lock. */
static CUmemoryPool fg_workspace_pool(fg_context *ctx) {
  pthread_mutex_lock(&ctx->lock);
  if (!ctx->ws_pool_tried) {
    ctx->ws_pool_tried = 1;
    if (ctx->limits.memory_pools && fg_cu.cuMemPoolCreate && fg_cu.cuMemPoolSetAttribute &&
        fg_cu.cuMemAllocFromPoolAsync && fg_cu.cuMemPoolDestroy) {
      fg_mem_pool_props props;
      memset(&props, 0, sizeof props);
      props.alloc_type = 1;
      props.location_type = 1;
      props.location_id = ctx->device;
      CUmemoryPool pool = NULL;
      if (fg_cu.cuMemPoolCreate(&pool, &props) == FG_CUDA_SUCCESS) {
        /* Keep what was allocated: a backward at N = 16k needs 100+ MB every call, and a pool
         * that releases at each synchronisation maps it anew each time. */
        unsigned long long keep = UINT64_MAX;
        (void)fg_cu.cuMemPoolSetAttribute(pool, FG_CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep);
        ctx->ws_pool = pool;
      }
    }
  }
  CUmemoryPool pool = ctx->ws_pool;
  pthread_mutex_unlock(&ctx->lock);
  return pool;
}

fg_status fg_workspace_alloc(fg_context *ctx, size_t bytes, CUstream s, const char *what,
                             fg_workspace *w) {
  memset(w, 0, sizeof *w);
  if (bytes == 0) return FG_OK;
  CUmemoryPool pool = fg_workspace_pool(ctx);
  CUresult r;
  const char *call;
  if (pool) {
    call = "cuMemAllocFromPoolAsync";
    r = fg_cu.cuMemAllocFromPoolAsync(&w->ptr, bytes, pool, s);
    w->async = 1;
  } else if (ctx->limits.memory_pools) {
    call = "cuMemAllocAsync";
    r = fg_cu.cuMemAllocAsync(&w->ptr, bytes, s);
    w->async = 1;
  } else {
    call = "cuMemAlloc";
    r = fg_cu.cuMemAlloc(&w->ptr, bytes);
  }
  if (r != FG_CUDA_SUCCESS) {
    char d[512];
    fg_cuda_describe(d, sizeof d, call, r);
    w->ptr = 0;
    return fg_fail(ctx, fg_cuda_status(r), "allocating the %.1f MiB workspace of %s: %s",
                   (double)bytes / (1024.0 * 1024.0), what, d);
  }
  if (ctx->poison_workspaces) { /* on s, before the plan; workspaces are whole floats */
    r = fg_cu.cuMemsetD32Async(w->ptr, 0xffffffffu, bytes / 4, s);
    if (r != FG_CUDA_SUCCESS) {
      char d[512];
      fg_cuda_describe(d, sizeof d, "cuMemsetD32Async", r);
      fg_workspace_free(ctx, w, s);
      return fg_fail(ctx, fg_cuda_status(r), "poisoning the workspace of %s: %s", what, d);
    }
  }
  return FG_OK;
}

void fg_context_poison_workspaces(fg_context *ctx, int on) { ctx->poison_workspaces = on != 0; }

void fg_workspace_free(fg_context *ctx, fg_workspace *w, CUstream s) {
  (void)ctx;
  if (!w->ptr) return;
  if (w->async) {
    fg_cu.cuMemFreeAsync(w->ptr, s);
  } else {
    /* No memory pools: free once the kernels are done. A wait for the GPU, so marked for the hang
     * watchdog (watchdog.c): unmarked, a kernel that never ends hung the tool here for good
     * (flashgen check of a q_tma_d kernel's workspace on a driver without pools). */
    fg_watchdog_wait_begin();
    fg_cu.cuStreamSynchronize(s);
    fg_watchdog_wait_end();
    fg_cu.cuMemFree(w->ptr);
  }
  w->ptr = 0;
}

void fg_workspace_pool_destroy(fg_context *ctx) {
  if (ctx->ws_pool && fg_cu.cuMemPoolDestroy) fg_cu.cuMemPoolDestroy(ctx->ws_pool);
  ctx->ws_pool = NULL;
}
