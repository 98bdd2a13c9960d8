/* kernel.c: freeing kernel images (core/fg_kernel.h), shared by the generator that fills them,
 * the cache that reads them back and the runtime that loads them. */
#include <stdlib.h>

#include "fg_kernel.h"

void fg_kernel_image_free(fg_kernel_image *img) {
  if (!img) return;
  free(img->cubin);
  free(img->ptx);
  img->cubin = NULL;
  img->cubin_size = 0;
  img->ptx = NULL;
  img->ptx_size = 0;
}
