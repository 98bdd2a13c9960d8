/* validate_support.h: the problem both argument-validation suites start from (test_validate.c,
 * test_validate_bwd.c): B 2, Hq 4, Hkv 2 (GQA), Nq 128, Nk 96, d 64, bf16, Q and K at fake
 * addresses, aligned and far apart (validation touches no memory). A macro, so that it fills the
 * forward's fg_attention_args and the backward's fg_attention_backward_args alike; each suite
 * sets its other pointers. Needs <stdint.h> and <string.h>. */
#ifndef FG_VALIDATE_SUPPORT_H
#define FG_VALIDATE_SUPPORT_H

#define FG_TEST_VALID_PROBLEM(a)                \
  do {                                          \
    memset(&(a), 0, sizeof(a));                 \
    (a).size = sizeof(a);                       \
    (a).dtype = FG_DTYPE_BF16;                  \
    (a).batch = 2;                              \
    (a).heads_q = 4;                            \
    (a).heads_kv = 2;                           \
    (a).seqlen_q = 128;                         \
    (a).seqlen_k = 96;                          \
    (a).head_dim = 64;                          \
    (a).q = (const void *)(uintptr_t)0x10000000; \
    (a).k = (const void *)(uintptr_t)0x20000000; \
  } while (0)

#endif
