/* fg_gen.h: the generator: templates rendered by a sandboxed Lua 5.4 into CUDA C, the resource
 * formula and fit rule, and compilation with NVRTC (loaded with dlopen). */
#ifndef FG_GEN_H
#define FG_GEN_H
#include <stddef.h>
#include <stdint.h>
#include "fg_kernel.h"

/* ---- device limits and the fit rule ---- */
typedef struct fg_device_limits {
  const char *name;          /* for messages, e.g. "NVIDIA H100" */
  int cc_major, cc_minor;
  int smem_optin_per_block;  /* bytes a block may opt into (cudaDevAttrMaxSharedMemoryPerBlockOptin) */
  int smem_per_sm;           /* bytes */
  int regs_per_sm;           /* 32-bit registers */
  int max_threads_per_block;
  int sm_count;
} fg_device_limits;

/* Well-known limits, for tests and for `flashgen list --arch` without a GPU. */
extern const fg_device_limits fg_limits_a100, fg_limits_h100, fg_limits_rtx4090;
/* Limits typical of an arch (A100 for sm_80, RTX 3090 for sm_86, RTX 4090 for sm_89, H100 for sm_90/90a). */
const fg_device_limits *fg_limits_for_arch(fg_arch a);

/* What a variant needs, from the formula kept with its template (templates/fwd.lua). */
typedef struct fg_resources {
  int threads;
  int smem_bytes;       /* dynamic shared memory per block */
  int regs_estimate;    /* registers per thread the template expects to need */
} fg_resources;

typedef struct fg_generator fg_generator;

/* Creates a generator: a sandboxed Lua state with the templates, embedded or, when
 * FLASHGEN_TEMPLATE_DIR is set, every regular file of that directory, read once here (so what
 * is hashed is what is rendered; at most 1024 files, 16 MiB each, 64 MiB in all). The sandbox
 * has base, string, table and math, text chunks only, and per call (render, resources, fit,
 * loading engine.lua and fwd.lua) a budget of Lua instructions (100 times what the largest
 * real variant needs), 256 MiB of Lua memory and 16 MiB of output; a call that passes one
 * fails with "template:line: ..." naming the limit. Returns 0, or -1 with err filled.
 * A generator is safe to use from several threads (calls are serialised inside). */
int fg_generator_create(fg_generator **out, char *err, size_t errlen);
void fg_generator_destroy(fg_generator *g);

/* 64-bit hash of every file the renderer can read (a cache-key input): the embedded table or
 * the directory's files, sorted by name, each file's name, length and text. A directory
 * holding exactly the embedded files hashes like the embedded table. */
uint64_t fg_generator_template_hash(const fg_generator *g);
/* Where the templates come from: "embedded" or the directory. */
const char *fg_generator_template_source(const fg_generator *g);

/* Resource needs of a variant. Returns 0, or -1 with err filled. */
int fg_generator_resources(fg_generator *g, const fg_variant *v, fg_resources *out, char *err,
                           size_t errlen);

/* Whether v fits a device. Returns 1 if it fits, 0 if not, with the reason in words and
 * numbers in why ("needs 180224 B of shared memory, device allows 101376 B per block"), -1 on
 * a generator error (message in why). */
int fg_variant_fits(fg_generator *g, const fg_variant *v, const fg_device_limits *lim, char *why,
                    size_t whylen);

/* Renders the CUDA source of v. On success returns 0, *src is malloc'd (caller frees) and *meta
 * holds the launch contract (resource fields -1). The source carries #line directives naming
 * the template file and line wherever its lines stop following one template line by line (not
 * before its first line, the header comment), so NVRTC's diagnostics name template lines.
 * On failure returns -1 and err holds "template:line: message" or the rule that rejected the
 * variant. */
int fg_generator_render(fg_generator *g, const fg_variant *v, char **src, fg_kernel_meta *meta,
                        char *err, size_t errlen);

/* The reference kernels (templates/reference.cu): plain arithmetic, one block per query row,
 * any head_dim. exact = 1: fp64 throughout, the yardstick. exact = 0: the naive same-dtype
 * computation (scores, probabilities and output rounded to dtype), whose error sets the
 * tolerance. Both write fp64 O and LSE. Name of the result: "ref_f64_bf16" / "ref_lowp_bf16". */
int fg_generator_render_reference(fg_generator *g, fg_dtype dtype, int exact, char **src,
                                  fg_kernel_meta *meta, char *err, size_t errlen);

/* ---- NVRTC ---- */
/* Loads NVRTC once per process: $FLASHGEN_NVRTC_LIBRARY, else libnvrtc.so.13, then .12 (also
 * under /usr/local/cuda/lib64). Returns 0, or -1 with where it looked in err. Thread-safe. */
int fg_nvrtc_load(char *err, size_t errlen);
/* Starts fg_nvrtc_load on a detached thread (once per process) and returns at once; a later
 * fg_nvrtc_load waits for it. Used where the load can overlap other slow work. */
void fg_nvrtc_preload(void);
/* Waits until a load fg_nvrtc_preload started has finished (at once if none was started). The
 * process must not exit during that load: NVRTC's initialisers racing exit's destructors crashed
 * or hung short runs (`flashgen check` with no case to run: 3 in 40 crashed, one spun for good),
 * so destroying a context waits for it (jit/loader.c). */
void fg_nvrtc_preload_wait(void);
/* Version of the loaded NVRTC as major*1000 + minor*10 (13000 for 13.0), or 0 if not loaded. */
int fg_nvrtc_version(void);
/* The path NVRTC was loaded from, or "" */
const char *fg_nvrtc_path(void);

/* Compiles src for arch into img (cubin + PTX + ptxas resource usage + compile time); img->meta
 * must already hold the launch contract (it is copied in from meta). name names the program in
 * messages (the variant name). Returns 0; or -1 with err holding the variant name, each
 * diagnostic located as "template:line (generated line N)" (from src's #line directives), the
 * options and the full NVRTC log (err is malloc'd into *errlog when errlog is not NULL). */
int fg_nvrtc_compile(const char *src, const char *name, fg_arch arch, const fg_kernel_meta *meta,
                     fg_kernel_image *img, char **errlog);

/* Render + compile in one step (what the JIT path of the runtime calls). Same conventions. */
int fg_generator_build(fg_generator *g, const fg_variant *v, fg_kernel_image *img, char **errlog);
int fg_generator_build_reference(fg_generator *g, fg_dtype dtype, int exact, fg_arch arch,
                                 fg_kernel_image *img, char **errlog);

/* The default kernel set: for every d (32..256 step 8), dtype, causal, the variants the built-in
 * rule picks for arch at any length (fg_builtin_variants); with with_kv_outer also the kv_outer
 * variant, and the q_outer one where the rule picks a wgmma kernel (sm_90a), so the portable path
 * is always in the set. Returns the count written (at most cap: callers pass
 * FG_DEFAULT_VARIANTS_MAX, which tests/test_compile.c checks the set stays under; it passed 512
 * when q_tma_d came, and a cap of 512 then cut the set short without a word). */
#define FG_DEFAULT_VARIANTS_MAX 1024
int fg_default_variants(fg_arch arch, int with_kv_outer, fg_variant *out, int cap);
/* The backward's default set: for every d (32..256 step 8), dtype, causal, the built-in rule's
 * backward variant for arch (what fg_attention_backward runs without a tuning record). Returns the
 * count written (at most cap). */
int fg_default_backward_variants(fg_arch arch, fg_variant *out, int cap);
#endif
