/* flashgen_export.h: the layout of an exported kernel table, what `flashgen export` writes and
 * fg_register_export (flashgen.h) reads. A stable ABI: plain C structs that only grow by
 * appending fields; a table records the sizes it was written with, so a newer runtime reads an
 * older table, and an older runtime reads the fields it knows of a newer one.
 *
 * An application does not fill these structs itself. It runs
 *
 *     flashgen export --default --arch sm_80,sm_90a --prefix myapp -o gen/
 *
 * (the built-in rule's forward and backward kernels for every head_dim, dtype and masking),
 * compiles gen/myapp_kernels.c with its sources, links flashgen_runtime (no Lua, NVRTC or
 * SQLite) and registers the table once, before or after creating contexts:
 *
 *     #include "myapp_kernels.h"
 *     char err[512];
 *     if (fg_register_export(myapp_flashgen_export(), err, sizeof err) != FG_OK) { ... }
 *
 * Every pointer in a table, and everything it points to, must stay valid for the life of the
 * process (the generated file holds them in static storage). */
#ifndef FLASHGEN_EXPORT_H
#define FLASHGEN_EXPORT_H

#include <stddef.h>
#include <stdint.h>

#include "flashgen.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The layout version written into every table. Bumped only if a field changes meaning, which
 * the rule above forbids; appending fields does not bump it (the sizes tell), and neither does a
 * new value of a field (FG_EXPORT_GRID_KV_TILES, the backward pass, came in version 1: a
 * runtime older than it refuses a table holding a backward kernel, naming the kernel; export
 * with --no-backward for such a runtime, or link the runtime of the flashgen that exported). */
#define FG_EXPORT_ABI_VERSION 1
/* Plans (steps and workspaces, appended to the kernels) came later in version 1: a runtime that
 * reads them refuses a table written before them (its step_size is 0), saying to export again. */
/* A table holding a kernel that takes tensor maps (params FG_EXPORT_PARAMS_FWD_TMA: the Hopper
 * forward's loop order qtma; FG_EXPORT_PARAMS_BWD_TMA: the Hopper backward's kvtma) is written as
 * version 2, with version 1's layout: a runtime from before tensor maps reads only version 1, so
 * it refuses such a table (naming its version) rather than launch the kernel with the plain
 * parameter block. This runtime reads both. (A runtime that knows FWD_TMA but not BWD_TMA refuses
 * a table holding a BWD_TMA kernel by its parameter block, naming the kernel.) */
#define FG_EXPORT_ABI_VERSION_TMA 2

/* How a kernel's grid is formed from the problem (the values of the runtime's fg_grid_kind). */
#define FG_EXPORT_GRID_Q_TILES 1 /* (ceil(seqlen_q / br), batch * heads_q): one block per Q block */
#define FG_EXPORT_GRID_HEADS 2   /* (batch * heads_q): one block per head (Algorithm 1) */
#define FG_EXPORT_GRID_ROWS 3    /* (seqlen_q, batch * heads_q): one block per query row */
/* (ceil(seqlen_k / br), batch * heads_kv), one block per K/V block: the backward pass's main
 * kernel (a bwd_ variant), br holding the variant's Bc. */
#define FG_EXPORT_GRID_KV_TILES 4
/* (min(ceil(seqlen_q / br) * batch * heads_q, SMs)): one block per SM, each looping over tiles of
 * br query rows (the forward's persistent loop orders qtmap, qtmad and qtmadp). A runtime from
 * before it refuses a table holding such a kernel, naming the grid kind. A qtmad (or qtmadp)
 * kernel takes its tiles from a counter in its workspace ("tile_counter") with the launch's
 * number that the runtime writes into the parameter block's tile_epoch (templates/fg_params.h); a
 * runtime from before that field passes a block 8 bytes shorter: export qtmad and qtmadp kernels
 * for this runtime or a later one. */
#define FG_EXPORT_GRID_PERSISTENT 5
/* Q_TILES with x rounded up to even: clusters of two blocks along x, two query tiles of a head
 * sharing each K/V block (the loop order qtmac; the cluster shape is compiled into the kernel).
 * A runtime from before it refuses a table holding such a kernel, naming the grid kind. */
#define FG_EXPORT_GRID_Q_TILE_PAIRS 6

/* One kernel of a kernel's plan: a module holds every entry of its plan, run in order on the
 * caller's stream with the same parameter block (the backward: `<entry>_pre` D = rowsum(dO * O)
 * and the dQ accumulator zeroed, `<entry>` dK, dV and the dQ accumulator, `<entry>_post` dQ
 * converted; templates/bwd.lua). Laid out as written; fg_export.step_size records its size. */
typedef struct fg_export_step {
  const char *entry;            /* kernel symbol (extern "C") in the module */
  int grid;                     /* FG_EXPORT_GRID_* */
  int br;                       /* rows per block along x (Q_TILES, KV_TILES) */
  int threads;                  /* threads per block */
  int smem_bytes;               /* dynamic shared memory per block */
  int split_rows;               /* the main step of a backward plan: past this many query rows
                                   per KV head (seqlen_q * heads_q / heads_kv) the grid gets z =
                                   ceil(rows / split_rows) splits (at most 65535); 0 = never.
                                   A table written before it reads it as 0 */
  int tail;                     /* 1: the main step of a backward plan may run with a tail (the
                                   grid's last partial wave split into pieces, which add their
                                   partial sums into the plan's tail workspace); 0 = never.
                                   A table written before it reads it as 0. It lies where the
                                   struct before it had its padding (on LP64), so step_size
                                   alone cannot tell: it is read only from a table whose
                                   workspace_desc_size covers fg_export_workspace.tail, which
                                   came with it */
} fg_export_step;

/* One workspace of a kernel's plan: `bytes` per `rows` query rows (rounded up) of each (batch,
 * query head), or (per_key) per `rows` key rows of each (batch, KV head) with seqlen_k rounded up
 * to the main step's br; batch-major, the workspaces one after the other with no padding; the parameter
 * block's field `param` points at it. fg_export.workspace_desc_size records its size: a table
 * written before per_key and min_group_rows reads them as 0 (what its workspaces were), and one
 * written before tail reads it as 0. A tail workspace (tail 1) is the exception to the layout:
 * `bytes` per key block of the launch's tail, in total, not per (batch, head). */
typedef struct fg_export_workspace {
  const char *name;             /* what it holds, e.g. "dq_accum" */
  const char *param;            /* the parameter-block field, e.g. "workspace", "dsum", "sem" */
  int bytes;                    /* per unit */
  int rows;                     /* query rows per unit (>= 1), or key rows (per_key) */
  int deterministic_only;       /* only in deterministic mode */
  int per_key;                  /* 1: units are `rows` key rows of each (batch, KV head),
                                   seqlen_k rounded up to the main step's br; 0: query rows */
  long long min_group_rows;     /* present only when seqlen_q * heads_q / heads_kv exceeds it;
                                   0 = always */
  int tail;                     /* 1: holds the launch's tail key blocks (fg_export_step.tail),
                                   `bytes` per tail key block in total; per_key 1, rows the main
                                   step's br, min_group_rows 0, deterministic_only 0. 0: a
                                   workspace as above */
} fg_export_workspace;

/* The parameter block a kernel's plan takes (fg_export_kernel.params; the runtime's
 * fg_param_block): the pass's usual block, or the pass's block behind four CUDA tensor maps that
 * the runtime encodes from each call (templates/fg_params.h; Hopper's TMA loads):
 * fg_fwd_tma_params for a forward kernel, fg_bwd_tma_params for every step of a backward one. */
#define FG_EXPORT_PARAMS_DEFAULT 0
#define FG_EXPORT_PARAMS_FWD_TMA 1
#define FG_EXPORT_PARAMS_BWD_TMA 2

/* The tensor a map views (fg_export_tmap.tensor; the runtime's fg_tmap_tensor): Q, K, V, O for a
 * FWD_TMA kernel, Q, K, V, DO (the backward's dO) for a BWD_TMA kernel. */
#define FG_EXPORT_TENSOR_Q 1
#define FG_EXPORT_TENSOR_K 2
#define FG_EXPORT_TENSOR_V 3
#define FG_EXPORT_TENSOR_O 4
#define FG_EXPORT_TENSOR_DO 5

/* One tensor map of a kernel's plan, passed as the i-th map of its parameter block: the tensor
 * viewed as {head_dim, rows, heads, batch}, loaded in boxes of 64 columns x `rows` rows.
 * fg_export.tmap_size records its size. */
typedef struct fg_export_tmap {
  int tensor;                   /* FG_EXPORT_TENSOR_* */
  int rows;                     /* rows of its box, 1 .. 256 */
} fg_export_tmap;

/* One compiled kernel: the binary for one arch and its launch contract. */
typedef struct fg_export_kernel {
  const char *variant;          /* canonical variant name, e.g.
                                   "fwd_d128_br128_bc64_bf16_causal_qouter_w8_s2_sm80" or
                                   "bwd_d128_br32_bc64_bf16_causal_kvouter_w8_s2_sm80" */
  const char *arch;             /* the arch it was compiled for, "sm_80" ... "sm_90a" (the
                                   arch in the variant name) */
  const unsigned char *cubin;   /* ELF for exactly arch; may be NULL when ptx is set */
  size_t cubin_size;
  const char *ptx;              /* NUL-terminated PTX, so a newer GPU can JIT it; may be NULL */
  size_t ptx_size;              /* bytes without the NUL */
  /* The main kernel's launch contract, kept for runtimes from before plans (which run a backward
   * kernel as <entry>_pre, <entry>, <entry>_post); this runtime reads the plan below. */
  const char *entry;            /* the main step's kernel symbol */
  int threads;                  /* threads per block */
  int smem_bytes;               /* dynamic shared memory per block */
  int grid;                     /* FG_EXPORT_GRID_* */
  int br;                       /* rows per Q block (FG_EXPORT_GRID_Q_TILES), rows per K/V
                                   block (FG_EXPORT_GRID_KV_TILES) */
  int workspace_floats_per_row; /* fp32 workspace per (batch, head, query row); 0 = none */
  /* Resource usage ptxas reported at export time (-1 when unknown); informational. */
  int regs, spill_store_bytes, spill_load_bytes, stack_bytes;
  /* The plan (templates/fwd.lua, bwd.lua: launch): its kernels in order, which of them the
   * variant names, and its workspaces. A table without plans (step_size 0) is refused. */
  const fg_export_step *steps;
  int n_steps;                  /* 1 .. 4 */
  int main_step;                /* index into steps */
  const fg_export_workspace *workspaces;
  int n_workspaces;             /* 0 .. 6 (runtimes from before the backward's tail took 4 and
                                   refuse a kernel with more, saying to export again) */
  /* Tensor maps (came later in version 1; kernels of tables written before them read as
   * FG_EXPORT_PARAMS_DEFAULT with no maps). A table holding a kernel of FG_EXPORT_PARAMS_FWD_TMA
   * or _BWD_TMA is version FG_EXPORT_ABI_VERSION_TMA, which runtimes from before them refuse. */
  int params;                   /* FG_EXPORT_PARAMS_*: FWD_TMA forward kernels only, BWD_TMA
                                   backward kernels only */
  const fg_export_tmap *tmaps;  /* tmap[i] of the parameter block, in order */
  int n_tmaps;                  /* 0 .. 4; only with FG_EXPORT_PARAMS_FWD_TMA or _BWD_TMA */
} fg_export_kernel;

/* A tuned choice: for problems of this key, run this variant. The key is the runtime's problem
 * key, "fwd_d<d>_<dtype>_<causal|noncausal>_nk<bucket>" (bucket: seqlen_k rounded up to a power
 * of two in 512..16384); a problem with no choice of its own takes the nearest bucket of the
 * same (d, dtype, causal), else the built-in rule, else any exported kernel of the same
 * (d, dtype, causal) (see fg_register_export). The arch in the variant name says which GPUs
 * the choice is for. */
typedef struct fg_export_choice {
  const char *bucket;  /* e.g. "fwd_d128_bf16_causal_nk4096" */
  const char *variant; /* canonical variant name; must be one of the table's kernels */
  const char *device;  /* the GPU it was measured on, e.g. "NVIDIA H100 80GB HBM3 (cc 9.0,
                          132 SMs)"; informational */
} fg_export_choice;

/* A whole export. */
struct fg_export {
  uint32_t abi_version;          /* FG_EXPORT_ABI_VERSION, or _TMA when a kernel takes tensor maps */
  uint32_t size;                 /* sizeof(struct fg_export) as written */
  uint32_t kernel_size;          /* sizeof(fg_export_kernel) as written: the stride of kernels */
  uint32_t choice_size;          /* sizeof(fg_export_choice) as written: the stride of choices */
  const char *description;       /* one line: producer, version, template hash, NVRTC, tuning
                                    source; appears in fg_explain and in error messages */
  const char *flashgen_version;  /* of the flashgen that wrote it, e.g. "0.1.0" */
  const char *template_hash;     /* 16 hex digits */
  int nvrtc_version;             /* major*1000 + minor*10 */
  const char *tuned_on;          /* the GPU(s) the choices were measured on, or
                                    "none: built-in rule" */
  const fg_export_kernel *kernels; /* sorted by variant name */
  size_t n_kernels;
  const fg_export_choice *choices; /* sorted by bucket, then variant */
  size_t n_choices;
  uint32_t step_size;            /* sizeof(fg_export_step) as written; 0 in tables written before
                                    plans, which this runtime refuses (export them again) */
  uint32_t workspace_desc_size;  /* sizeof(fg_export_workspace) as written */
  uint32_t tmap_size;            /* sizeof(fg_export_tmap) as written; 0 in tables written
                                    before tensor maps (whose kernels have none) */
};

#ifdef __cplusplus
}
#endif
#endif /* FLASHGEN_EXPORT_H */
