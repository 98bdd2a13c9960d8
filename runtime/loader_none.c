/* loader_none.c: flashgen_runtime's loader: none. Kernels come from exported tables only; the
 * full library links jit/loader.c, which defines fg_builtin_loader instead of this file. */
#include "fg_runtime_internal.h"

const fg_loader *fg_builtin_loader(void) { return NULL; }
