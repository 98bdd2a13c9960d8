/* hash.c: the cache's checksum, XXH64 (the public xxHash 64-bit algorithm, written out here so
 * the library has no extra dependency), and the signed/unsigned 64-bit conversions SQLite needs. */
#include <string.h>

#include "fg_cache_internal.h"

#define P1 11400714785074694791ULL
#define P2 14029467366897019727ULL
#define P3 1609587929392839161ULL
#define P4 9650029242287828579ULL
#define P5 2870177450012600261ULL

static uint64_t rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

/* Little-endian loads; memcpy compiles to one unaligned load. */
static uint64_t read64(const unsigned char *p) {
  uint64_t v;
  memcpy(&v, p, sizeof v);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  v = __builtin_bswap64(v);
#endif
  return v;
}

static uint64_t read32(const unsigned char *p) {
  uint32_t v;
  memcpy(&v, p, sizeof v);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  v = __builtin_bswap32(v);
#endif
  return v;
}

static uint64_t xxh_round(uint64_t acc, uint64_t input) {
  acc += input * P2;
  acc = rotl64(acc, 31);
  return acc * P1;
}

static uint64_t xxh_merge(uint64_t acc, uint64_t val) {
  acc ^= xxh_round(0, val);
  return acc * P1 + P4;
}

uint64_t fg_cache_hash64(const void *data, size_t len, uint64_t seed) {
  /* An empty piece may come as NULL (SQLite returns NULL for an empty blob). */
  const unsigned char *p = len ? (const unsigned char *)data : (const unsigned char *)"";
  const unsigned char *end = p + len;
  uint64_t h;
  if (len >= 32) {
    uint64_t v1 = seed + P1 + P2, v2 = seed + P2, v3 = seed, v4 = seed - P1;
    const unsigned char *limit = end - 32;
    do {
      v1 = xxh_round(v1, read64(p));
      v2 = xxh_round(v2, read64(p + 8));
      v3 = xxh_round(v3, read64(p + 16));
      v4 = xxh_round(v4, read64(p + 24));
      p += 32;
    } while (p <= limit);
    h = rotl64(v1, 1) + rotl64(v2, 7) + rotl64(v3, 12) + rotl64(v4, 18);
    h = xxh_merge(h, v1);
    h = xxh_merge(h, v2);
    h = xxh_merge(h, v3);
    h = xxh_merge(h, v4);
  } else {
    h = seed + P5;
  }
  h += (uint64_t)len;
  for (; end - p >= 8; p += 8) {
    h ^= xxh_round(0, read64(p));
    h = rotl64(h, 27) * P1 + P4;
  }
  if (end - p >= 4) {
    h ^= read32(p) * P1;
    h = rotl64(h, 23) * P2 + P3;
    p += 4;
  }
  for (; p < end; p++) {
    h ^= (uint64_t)*p * P5;
    h = rotl64(h, 11) * P1;
  }
  h ^= h >> 33;
  h *= P2;
  h ^= h >> 29;
  h *= P3;
  h ^= h >> 32;
  return h;
}

int64_t fg_cache_u64_to_i64(uint64_t v) {
  int64_t r;
  memcpy(&r, &v, sizeof r);
  return r;
}

uint64_t fg_cache_i64_to_u64(int64_t v) {
  uint64_t r;
  memcpy(&r, &v, sizeof r);
  return r;
}
