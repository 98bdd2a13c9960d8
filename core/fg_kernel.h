/* fg_kernel.h: a compiled kernel and its launch contract: what the generator produces, the cache
 * stores, export writes out and the runtime launches. */
#ifndef FG_KERNEL_H
#define FG_KERNEL_H
#include <stddef.h>
#include <stdint.h>
#include "fg_variant.h"

/* How the grid is formed from the problem. */
typedef enum fg_grid_kind {
  FG_GRID_Q_TILES = 1, /* (ceil(seqlen_q / br), batch * heads_q): one block per br query rows
                          (q_outer; the backward's _pre and _post kernels, br = 64 rows) */
  FG_GRID_HEADS = 2,   /* (batch * heads_q): one block per head, Algorithm 1 (kv_outer) */
  FG_GRID_ROWS = 3,    /* (seqlen_q, batch * heads_q): one block per query row (reference) */
  FG_GRID_KV_TILES = 4, /* (ceil(seqlen_k / br), batch * heads_kv): one block per K/V block
                          (the backward's main kernel; br holds its Bc) */
  FG_GRID_PERSISTENT = 5, /* (min(ceil(seqlen_q / br) * batch * heads_q, SMs)): one block per SM
                            (at most one per tile), each looping over tiles of br query rows
                            (q_tma_p; the order is the kernel's, templates/common.cuh) */
  FG_GRID_Q_TILE_PAIRS = 6 /* q_tiles with x rounded up to even: clusters of two blocks along x
                              (compiled into the kernel, __cluster_dims__), two query tiles of a
                              head, the second past the rows when their count is odd (q_tma_c) */
} fg_grid_kind;

/* The manifest's launch(v) (templates/fwd.lua, bwd.lua) returns a plan: kernels of one module
 * run in order on the caller's stream, each with the same parameter block, and the workspaces
 * they share. At most this many of each. */
#define FG_PLAN_MAX_STEPS 4
#define FG_PLAN_MAX_WORKSPACES 6

/* One kernel of a plan. */
typedef struct fg_plan_step {
  char entry[64];        /* kernel symbol (extern "C") */
  fg_grid_kind grid;
  int br;                /* rows per block along x (FG_GRID_Q_TILES, FG_GRID_Q_TILE_PAIRS,
                            FG_GRID_KV_TILES), rows per tile (FG_GRID_PERSISTENT) */
  int threads;           /* threads per block */
  int smem_bytes;        /* dynamic shared memory per block */
  /* A kv_tiles main step only (the backward's): when the query rows one KV head's dK/dV sum over,
   * seqlen_q * (heads_q / heads_kv), exceed split_rows, its grid gets a z dimension of
   * ceil(those rows / split_rows) splits (at most 65535), each a contiguous part of every key
   * block's query blocks, which add their partial dK/dV into the plan's per-key workspace of the
   * same threshold (min_group_rows == split_rows). 0: never split. */
  int split_rows;
  /* 1: the main step may run with a tail (the grid's last partial wave, whose key blocks the
   * runtime splits into pieces so that the wave's SMs share them; runtime's fg_plan_step_tail
   * chooses it per problem). Only on a kv_tiles main step, and then the plan has a tail workspace
   * for the pieces' partial sums. 0: every block one key block. */
  int tail;
} fg_plan_step;

/* One workspace of a plan: `bytes` per unit of each (batch, head), laid out batch-major, one
 * workspace after the other in the order of the plan, with no padding between them (so its size
 * is a function of the problem's shape and the plan only). A unit is `rows` query rows (rounded
 * up) of a query head, or (per_key) `rows` key rows of a KV head, seqlen_k rounded up to the main
 * step's br (its Bc: the main step's grid is kv_tiles; rows divides it). A workspace with
 * min_group_rows > 0
 * exists only when seqlen_q * (heads_q / heads_kv) > min_group_rows (the backward's dK/dV
 * partial sums, for long query ranges). A tail workspace (tail 1) is the exception: not per
 * (batch, head) but `bytes` per key block of the launch's tail, in total; it keeps its place in
 * the order (fg_plan_workspace_bytes_tail). The parameter-block field `param` points at it. */
typedef struct fg_plan_workspace {
  char name[24];         /* what it holds, for messages ("dq_accum") */
  char param[16];        /* the parameter-block field it is passed in ("workspace", "dsum") */
  int bytes;             /* per unit */
  int rows;              /* query rows per unit (>= 1), or key rows (per_key; divides main br) */
  int deterministic_only; /* only in deterministic mode (the backward's semaphores) */
  int per_key;           /* 1: units are key rows of each (batch, KV head); 0: query rows */
  long long min_group_rows; /* exists only when seqlen_q * heads_q / heads_kv exceeds it; 0 =
                               always */
  /* 1: holds the launch's tail key blocks (fg_plan_step.tail), `bytes` per tail key block in
   * total, not per (batch, head): its size depends on the launch, not on the problem's shape
   * alone, so fg_plan_workspace_units gives it 0 units and fg_plan_workspace_bytes_tail sizes it.
   * It must have per_key 1, rows equal to the main step's br (a unit is a key block),
   * min_group_rows 0 and deterministic_only 0. */
  int tail;
} fg_plan_workspace;

/* The parameter block a plan's kernels take (launch(v).params): the pass's usual block
 * (fg_fwd_params, fg_bwd_params of templates/fg_params.h), or a TMA block: the plan's tensor
 * maps, encoded by the runtime from the call, then the pass's block (fg_fwd_tma_params for a
 * forward plan, fg_bwd_tma_params for every step of a backward plan). */
typedef enum fg_param_block {
  FG_PARAMS_DEFAULT = 0, /* "fwd" (or absent): the pass's own block */
  FG_PARAMS_FWD_TMA = 1, /* "fwd_tma": forward plans only */
  FG_PARAMS_BWD_TMA = 2  /* "bwd_tma": backward plans only */
} fg_param_block;

/* One tensor map of a plan (launch(v).tmaps[i], passed in the TMA block's tmap[i]): which
 * tensor of the call it views and the rows of its box (templates/fwd.lua, bwd.lua: launch). A
 * fwd_tma plan's maps view q, k, v or o; a bwd_tma plan's q, k, v or do (the backward's dO). */
#define FG_PLAN_MAX_TMAPS 4
typedef enum fg_tmap_tensor {
  FG_TMAP_Q = 1,
  FG_TMAP_K = 2,
  FG_TMAP_V = 3,
  FG_TMAP_O = 4,
  FG_TMAP_DO = 5
} fg_tmap_tensor;
typedef struct fg_plan_tmap {
  fg_tmap_tensor tensor;
  int rows;              /* rows of the box, 1 .. 256 (a TMA box's limit) */
} fg_plan_tmap;

/* The launch contract a template declares for a variant: its plan. */
typedef struct fg_kernel_meta {
  int n_steps;           /* 1 .. FG_PLAN_MAX_STEPS */
  int main_step;         /* the step named after the variant, which tuning measures */
  fg_plan_step steps[FG_PLAN_MAX_STEPS];
  int n_workspaces;      /* 0 .. FG_PLAN_MAX_WORKSPACES */
  fg_plan_workspace workspaces[FG_PLAN_MAX_WORKSPACES];
  /* Resource usage reported by ptxas when it was compiled (-1 when unknown). */
  int regs, spill_store_bytes, spill_load_bytes, stack_bytes;
  fg_param_block params; /* FG_PARAMS_DEFAULT unless the plan says otherwise */
  int n_tmaps;           /* 0 .. FG_PLAN_MAX_TMAPS; only with a TMA block (fwd_tma, bwd_tma) */
  fg_plan_tmap tmaps[FG_PLAN_MAX_TMAPS];
} fg_kernel_meta;

/* The step named after the variant (steps[main_step]). */
static inline const fg_plan_step *fg_kernel_main(const fg_kernel_meta *m) {
  return &m->steps[m->main_step];
}
static inline fg_plan_step *fg_kernel_main_mut(fg_kernel_meta *m) { return &m->steps[m->main_step]; }

/* A one-step plan without workspace (forward kernels, references, tests). */
void fg_kernel_meta_single(fg_kernel_meta *m, const char *entry, fg_grid_kind grid, int br,
                           int threads, int smem_bytes);

/* NULL when m is a well-formed plan (counts in range, entries set and NUL-terminated, grid kinds
 * known, br > 0 where the grid uses it, threads > 0, shared memory >= 0, workspaces with a name,
 * a param, bytes > 0, rows >= 1, min_group_rows >= 0, per_key 0 or 1 and only with a kv_tiles
 * main step whose br rows divides; split_rows >= 0, > 0 only on a kv_tiles main step and then
 * with a per-key workspace whose min_group_rows is split_rows; tail 0 or 1 on steps and
 * workspaces, a tail step only as a kv_tiles main step and then with a tail workspace (per_key,
 * rows the main step's br, min_group_rows 0, not deterministic_only), a tail workspace only with
 * a tail main step; a known parameter block, tensor
 * maps only with a TMA block, each with 1 .. 256 rows and of a tensor that block takes: q, k, v,
 * o for fwd_tma, q, k, v, do for bwd_tma), else what is wrong (a static string). */
const char *fg_kernel_meta_invalid(const fg_kernel_meta *m);
/* fg_kernel_meta_invalid, then whether m's parameter block is one a plan of pass `pass` may take
 * (fwd_tma forward plans only, bwd_tma backward plans only); NULL, or what is wrong. */
const char *fg_kernel_meta_invalid_for(const fg_kernel_meta *m, fg_pass pass);

/* The names of parameter blocks and tensor-map tensors in manifests and plans ("fwd",
 * "fwd_tma", "bwd_tma"; "q", "k", "v", "o", "do"), and back (-1, 0 when unknown). */
const char *fg_param_block_name(fg_param_block p);
int fg_param_block_parse(const char *s);
const char *fg_tmap_tensor_name(fg_tmap_tensor t);
fg_tmap_tensor fg_tmap_tensor_parse(const char *s);

/* The grid kind's name in manifests and plans ("q_tiles", "heads", "rows", "kv_tiles",
 * "persistent", "q_tile_pairs"), and back (0 when unknown). */
const char *fg_grid_kind_name(fg_grid_kind g);
fg_grid_kind fg_grid_kind_parse(const char *s);

/* The heads of each batch that workspace w has units for: heads_kv when per_key, else heads_q. */
static inline int64_t fg_plan_workspace_heads(const fg_plan_workspace *w, int64_t heads_q,
                                              int64_t heads_kv) {
  return w->per_key ? heads_kv : heads_q;
}

/* Units of workspace w per (batch, head) (fg_plan_workspace_heads): ceil(seqlen_q / rows), or
 * (per_key) ceil(seqlen_k / main_br) * main_br / rows with main_br the main step's br (rows = 1:
 * key rows; rows = main_br: key blocks); 0 when it is not
 * used (deterministic_only and not deterministic, or seqlen_q * (heads_q / heads_kv) <=
 * min_group_rows) and for a tail workspace (not sized per head: fg_plan_workspace_bytes_tail). */
uint64_t fg_plan_workspace_units(const fg_plan_workspace *w, int main_br, int64_t heads_q,
                                 int64_t heads_kv, int64_t seqlen_q, int64_t seqlen_k,
                                 int deterministic);

/* The query rows one KV head's dK/dV sum over, seqlen_q * (heads_q / heads_kv) (saturating at
 * UINT64_MAX): what min_group_rows and split_rows compare with. */
uint64_t fg_plan_group_rows(int64_t heads_q, int64_t heads_kv, int64_t seqlen_q);

/* Splits of the query range (the grid's z) that step s takes for the problem: 1 unless
 * s->split_rows > 0 and fg_plan_group_rows exceeds it, then ceil(group rows / split_rows),
 * at most 65535 (CUDA's grid z limit; each split then covers more rows). */
uint64_t fg_plan_step_splits(const fg_plan_step *s, int64_t heads_q, int64_t heads_kv,
                             int64_t seqlen_q);

/* Bytes of all m's workspaces for (batch, heads_q, heads_kv, seqlen_q, seqlen_k), and where
 * workspace i starts (offsets[i], when offsets is not NULL; unused ones start where the next
 * would), for a launch without a tail (a tail workspace takes 0 bytes):
 * fg_plan_workspace_bytes_tail with tail_blocks 0. -1 on 64-bit overflow. */
int fg_plan_workspace_bytes(const fg_kernel_meta *m, int64_t batch, int64_t heads_q,
                            int64_t heads_kv, int64_t seqlen_q, int64_t seqlen_k, int deterministic,
                            uint64_t *bytes, uint64_t offsets[FG_PLAN_MAX_WORKSPACES]);
/* The same for a launch whose tail has tail_blocks key blocks (the runtime's choice,
 * fg_bwd_params.tail_blocks): each tail workspace takes tail_blocks * bytes, in total (not per
 * batch or head), and the workspaces after it start that much later. tail_blocks 0: no tail. */
int fg_plan_workspace_bytes_tail(const fg_kernel_meta *m, int64_t batch, int64_t heads_q,
                                 int64_t heads_kv, int64_t seqlen_q, int64_t seqlen_k,
                                 int deterministic, uint64_t tail_blocks, uint64_t *bytes,
                                 uint64_t offsets[FG_PLAN_MAX_WORKSPACES]);

/* The plan as text, one line per item ("main 1", "step <entry> <grid> <br> <threads> <smem>
 * [<split_rows> [<tail>]]" with split_rows written when it or tail is > 0 and tail only when it
 * is, "workspace <name> <param> <bytes> <rows> <deterministic_only> <per_key> <min_group_rows>
 * [<tail>, only when 1]", then only when the plan has them "params <block>" and "tmap <tensor>
 * <rows>", e.g. "params bwd_tma" and "tmap do 64"): what the cache stores. Text written before a
 * field reads as that field 0, what it meant: a step line without split_rows or tail, a workspace
 * line without tail (a workspace line without per_key and min_group_rows does not parse).
 * Returns the length (snprintf's), the text truncated at len. */
int fg_kernel_plan_format(const fg_kernel_meta *m, char *buf, size_t len);
/* Reads such text into m's plan (the other fields untouched). NULL, or what is wrong. */
const char *fg_kernel_plan_parse(const char *text, fg_kernel_meta *m);

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
