/* fake_records.h: the layouts of what the fake CUDA driver (libcuda.c) records, which the tests
 * read back through its fake_*_get functions: backward launches with their parameter blocks, the
 * tensor maps its cuTensorMapEncodeTiled writes, TMA launches of either pass. Included by the fake
 * driver and by the tests, after templates/fg_params.h, so the two agree on every field. */
#ifndef FAKE_RECORDS_H
#define FAKE_RECORDS_H

/* A backward launch: its entry, grid, block and fg_bwd_params (the inner block of a TMA one). */
typedef struct fake_launch {
  char entry[160];
  unsigned grid[3], block[3], smem;
  fg_bwd_params params;
} fake_launch;

/* A call of cuTensorMapEncodeTiled, and what the fake writes into the map's opaque bytes (the
 * first fields of this struct; 128 bytes at most). */
typedef struct fake_tmap {
  unsigned long long magic; /* FAKE_TMAP_MAGIC */
  int data_type;
  unsigned rank;
  unsigned long long address;
  unsigned long long dims[5], strides[4];
  unsigned short box[5];
  unsigned char element_strides[5];
  signed char interleave, swizzle, l2_promotion, oob_fill;
} fake_tmap;
#define FAKE_TMAP_MAGIC 0x70616d746b6166ull /* "faketmap" */

/* Launches of kernels that take tensor maps, with their whole block: forward (entries with
 * _qtma_) and backward (entries with _kvtma_, every step of the plan). */
typedef struct fake_tma_launch {
  char entry[160];
  unsigned grid[3], block[3], smem;
  fg_fwd_tma_params params;
} fake_tma_launch;
typedef struct fake_bwd_tma_launch {
  char entry[160];
  unsigned grid[3], block[3], smem;
  fg_bwd_tma_params params;
} fake_bwd_tma_launch;
#endif
