/* fg_jit.h: what the full library adds to the runtime (jit/loader.c): the loader that reads the
 * disk cache and compiles with NVRTC, and the context's generator, cache and reference kernels
 * for autotune/, cli/, bench/ and the tests. Not in flashgen_runtime. May include core/,
 * runtime/, generator/ and cache/. */
#ifndef FG_JIT_H
#define FG_JIT_H
#include "fg_cache.h"
#include "fg_gen.h"
#include "fg_runtime_internal.h"

/* The context's device as the generator and the cache describe it (name points into ctx). */
void fg_context_device_limits(const fg_context *ctx, fg_device_limits *out);
void fg_context_device_id(const fg_context *ctx, fg_device_id *out);
/* The generator, created on first use. On failure returns FG_ERROR_INTERNAL with the message
 * in the last error (and the same answer on every later call). */
fg_status fg_context_generator(fg_context *ctx, fg_generator **out);
/* The on-disk cache, opened on first use; NULL when the policy or the options forbid it or it
 * cannot be used (one warning on stderr unless quiet, the first time). */
fg_cache *fg_context_cache(fg_context *ctx);
/* Fills the parts of a cache key that do not depend on the variant (template hash, NVRTC version,
 * flashgen version). Returns 0, or -1 with the reason in why (NVRTC or the generator missing). */
int fg_context_cache_key(fg_context *ctx, fg_cache_key *key, char *why, size_t whylen);
/* The same for kernels g renders, with no context (flashgen build-default --cache); arch is the
 * key's until the caller sets each image's. */
int fg_generator_cache_key(fg_generator *g, fg_arch arch, fg_cache_key *key, char *why, size_t whylen);

/* The reference kernel for dtype (exact = 1: fp64; 0: naive same-dtype), compiled on first use
 * (through the disk cache when the policy allows) and kept like a variant. */
fg_status fg_registry_get_reference(fg_context *ctx, fg_dtype dtype, int exact,
                                    const fg_loaded_kernel **out);
#endif
