/* The portable backward's swizzled tiles (templates/bwd.lua swz, bwd.cu SWZ, common.cuh load_tile
 * SW): where load_tile puts each 16-byte chunk, where bwd.cu's ldmatrix addresses (tile_at) read
 * it, transcribed below in C (change them together), and the template's choice of the layout.
 * Checked: the stores fill every slot of the tile once, every lane of every ldmatrix reads the
 * chunk of its row and column, and each 8-lane phase touches 8 different 16-byte bank groups (no
 * bank conflict), for the head dims that take the layout. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fg_gen.h"
#include "tma_support.h"

/* load_tile<..., SW = true>: chunk c of row r (row stride d elements) */
static uint32_t stored_at(int d, int r, int c) { return (uint32_t)(r * d * 2 + ((c ^ (r & 7)) << 4)); }

/* bwd.cu tile_at with SWZ: the lane's row lr and column lc (elements), at tile rows r (a multiple
 * of 8) and columns c (a multiple of 16) */
static uint32_t read_at(int d, int lane, int lr, int lc, int r, int c) {
  const uint32_t t0 = (uint32_t)(lr * d * 2 + (((lc / 8) ^ (lane & 7)) << 4));
  return (t0 ^ (uint32_t)((c / 8 % 8) << 4)) + (uint32_t)(r * d * 2 + c / 64 * 128);
}

Test(swizzle, stores_fill_the_tile_and_ldmatrix_reads_them_without_conflicts) {
  static const int ds[] = {64, 128, 192, 256};
  const int rows = 64;
  for (size_t i = 0; i < sizeof ds / sizeof ds[0]; i++) {
    const int d = ds[i], chunks = d / 8;
    unsigned char *seen = calloc((size_t)rows * chunks, 1);
    cr_assert(seen);
    for (int r = 0; r < rows; r++)
      for (int c = 0; c < chunks; c++) {
        const uint32_t a = stored_at(d, r, c);
        cr_assert(a % 16 == 0 && a < (uint32_t)(rows * d * 2), "d %d row %d chunk %d", d, r, c);
        cr_assert_eq(a / (uint32_t)(d * 2), (uint32_t)r, "d %d: chunk %d stays in row %d", d, c, r);
        cr_assert_not(seen[a / 16], "d %d: slot %u stored twice", d, a / 16);
        seen[a / 16] = 1;
      }
    free(seen);
    /* the two lane patterns of bwd.cu: A (a_row, a_col) and B (k_row, k_col) */
    for (int pat = 0; pat < 2; pat++)
      for (int r = 0; r + 16 <= rows; r += 8)
        for (int c = 0; c + 16 <= d; c += 16) {
          unsigned groups[4] = {0};
          for (int lane = 0; lane < 32; lane++) {
            const int lr = pat ? lane % 8 + (lane / 16) * 8 : lane % 8 + ((lane / 8) % 2) * 8;
            const int lc = pat ? ((lane / 8) % 2) * 8 : (lane / 16) * 8;
            const uint32_t a = read_at(d, lane, lr, lc, r, c);
            cr_assert_eq(a, stored_at(d, r + lr, (c + lc) / 8), "d %d pattern %d rows %d cols %d lane %d",
                         d, pat, r, c, lane);
            groups[lane / 8] |= 1u << (a / 16 % 8);
          }
          for (int ph = 0; ph < 4; ph++)
            cr_assert_eq(groups[ph], 0xffu, "d %d pattern %d rows %d cols %d: phase %d conflicts", d, pat,
                         r, c, ph);
        }
  }
}

/* bwd.lua takes the layout on sm_90 / sm_90a where d is a multiple of 64 (rows of d elements),
 * and keeps the padded rows (d + 8) elsewhere. */
Test(swizzle, the_template_takes_it_on_sm90_at_multiples_of_64) {
  fg_generator *g = fgt_generator();
  static const struct {
    const char *name;
    const char *swz, *row;
  } cases[] = {
      {"bwd_d128_br64_bc128_bf16_causal_kvouter_w8_s2_sm90a", "SWZ = true;", "ROW = 128;"},
      {"bwd_d64_br128_bc128_f16_noncausal_kvouter_w8_s2_sm90", "SWZ = true;", "ROW = 64;"},
      {"bwd_d256_br64_bc64_bf16_noncausal_kvouter_w8_s2_sm90a", "SWZ = true;", "ROW = 256;"},
      {"bwd_d128_br64_bc128_bf16_causal_kvouter_w8_s1_sm80", "SWZ = false;", "ROW = 136;"},
      {"bwd_d96_br64_bc128_bf16_noncausal_kvouter_w8_s2_sm90a", "SWZ = false;", "ROW = 136;"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    fg_variant v = fgt_variant(cases[i].name);
    char *src = NULL, err[4096];
    fg_kernel_meta meta;
    cr_assert_eq(fg_generator_render(g, &v, &src, &meta, err, sizeof err), 0, "%s: %s", cases[i].name, err);
    cr_assert(strstr(src, cases[i].swz), "%s: no '%s'", cases[i].name, cases[i].swz);
    cr_assert(strstr(src, cases[i].row), "%s: no '%s'", cases[i].name, cases[i].row);
    free(src);
  }
  fg_generator_destroy(g);
}
