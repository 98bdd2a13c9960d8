/* fg_kernel.h: a compiled kernel and its launch contract: what the generator produces, the cache
 * stores, export writes out and the runtime launches. */
#ifndef FG_KERNEL_H
#define FG_KERNEL_H
#include <stddef.h>
#include "fg_variant.h"

/* How the grid is formed from the problem. */
typedef enum fg_grid_kind {
  FG_GRID_Q_TILES = 1, /* (ceil(seqlen_q / br), batch * heads_q): one block per Q block (q_outer) */
  FG_GRID_HEADS = 2,   /* (batch * heads_q): one block per head, Algorithm 1 (kv_outer) */
  FG_GRID_ROWS = 3,    /* (seqlen_q, batch * heads_q): one block per query row (reference) */
  FG_GRID_KV_TILES = 4 /* (ceil(seqlen_k / br), batch * heads_kv): one block per K/V block
                          (the backward's main kernel; br holds its Bc) */
} fg_grid_kind;

/* The launch contract a template declares for a variant. */
typedef struct fg_kernel_meta {
  char entry[64];        /* kernel symbol (extern "C") */
  int threads;           /* threads per block */
  int smem_bytes;        /* dynamic shared memory per block */
  fg_grid_kind grid;
  int br;                /* rows per Q block (grid FG_GRID_Q_TILES) */
  int workspace_floats_per_row; /* fp32 workspace per (batch, head, query row); 0 = none */
  /* Resource usage reported by ptxas when it was compiled (-1 when unknown). */
  int regs, spill_store_bytes, spill_load_bytes, stack_bytes;
} fg_kernel_meta;

/* A compiled kernel: cubin for one arch, with its PTX so a newer GPU can JIT it. */
typedef struct fg_kernel_image {
  char variant[FG_VARIANT_NAME_MAX]; /* canonical variant name, or the reference's name */
  fg_arch arch;
  unsigned char *cubin;
  size_t cubin_size;
  char *ptx;             /* NUL-terminated */
  size_t ptx_size;       /* bytes, without the NUL */
  fg_kernel_meta meta;
  double compile_ms;     /* NVRTC wall time; 0 when loaded from a cache or an export */
} fg_kernel_image;

/* Frees the buffers of an image (not the struct). NULL is a no-op. */
void fg_kernel_image_free(fg_kernel_image *img);
#endif
