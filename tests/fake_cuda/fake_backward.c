/* fake_backward.c: the backward plan on the fake driver (#included by libcuda.c, which owns the
 * rest): a launch of a kernel named fg_bwd_... computes what the plan computes, on the CPU, from
 * the fg_bwd_params block, reading Q, dO, K and V through the tensor maps given (a kvtma
 * kernel's: fake_tmap_read, rows past a map's end as zeros) or else through the block's pointers. The main entry does all of it in double: P recomputed from Q and K
 * (it does not read O or lse, so any forward run on this driver is enough),
 * dV = P^T dO, dS = P * (dO V^T - rowsum(dO * O)), dQ = scale dS K, dK = scale dS^T Q, dK and
 * dV summed over the query heads of a KV head, each written once in the variant's dtype; the
 * _pre and _post entries do nothing (their work, the workspace, is the main entry's here).
 * Masking and dtype come from the name, as the generated kernels fix them. */

/* 0, or a CUDA error for a block the emulation cannot read. maps: of q, do, k, v (each NULL:
 * read through p's pointer), or NULL. */
static CUresult fake_backward(const char *name, const fg_bwd_params *p,
                              const fake_tmap *const *maps) {
  const fake_tmap *mq = maps ? maps[0] : NULL, *mdo = maps ? maps[1] : NULL;
  const fake_tmap *mk = maps ? maps[2] : NULL, *mv = maps ? maps[3] : NULL;
  const size_t len = strlen(name);
  if ((len > 4 && strcmp(name + len - 4, "_pre") == 0) ||
      (len > 5 && strcmp(name + len - 5, "_post") == 0))
    return 0;
  const int bf16 = strstr(name, "_bf16_") != NULL, causal = strstr(name, "_causal_") != NULL;
  const long long d = p->head_dim, nq = p->seqlen_q, nk = p->seqlen_k;
  if (d <= 0 || p->hq_per_hkv <= 0) return 1;
  double *kd = calloc((size_t)(nk * d + 1), sizeof *kd), *vd = calloc((size_t)(nk * d + 1), sizeof *vd);
  double *dk = calloc((size_t)(nk * d + 1), sizeof *dk), *dv = calloc((size_t)(nk * d + 1), sizeof *dv);
  double *pr = calloc((size_t)(nk + 1), sizeof *pr), *ds = calloc((size_t)(nk + 1), sizeof *ds);
  double *qd = calloc((size_t)d, sizeof *qd), *dod = calloc((size_t)d, sizeof *dod);
  if (!kd || !vd || !dk || !dv || !pr || !ds || !qd || !dod) {
    free(kd), free(vd), free(dk), free(dv), free(pr), free(ds), free(qd), free(dod);
    return 2; /* out of memory */
  }
  for (long long b = 0; b < p->batch; b++)
    for (long long hk = 0; hk < p->heads_kv; hk++) {
      const uint16_t *k = (const uint16_t *)(uintptr_t)p->k + b * p->k_sb + hk * p->k_sh;
      const uint16_t *v = (const uint16_t *)(uintptr_t)p->v + b * p->v_sb + hk * p->v_sh;
      for (long long j = 0; j < nk; j++)
        for (long long c = 0; c < d; c++) {
          kd[j * d + c] =
              to_double(bf16, mk ? fake_tmap_read(mk, c, j, hk, b) : k[j * p->k_sn + c]);
          vd[j * d + c] =
              to_double(bf16, mv ? fake_tmap_read(mv, c, j, hk, b) : v[j * p->v_sn + c]);
          dk[j * d + c] = dv[j * d + c] = 0;
        }
      for (long long h = hk * p->hq_per_hkv; h < (hk + 1) * p->hq_per_hkv; h++) {
        const uint16_t *q = (const uint16_t *)(uintptr_t)p->q + b * p->q_sb + h * p->q_sh;
        const uint16_t *dO = (const uint16_t *)(uintptr_t)p->d_o + b * p->do_sb + h * p->do_sh;
        uint16_t *dq = (uint16_t *)(uintptr_t)p->dq + b * p->dq_sb + h * p->dq_sh;
        for (long long i = 0; i < nq; i++) {
          long long n = nk;
          if (causal && i + nk - nq + 1 < n) n = i + nk - nq + 1;
          if (n < 0) n = 0;
          for (long long c = 0; c < d; c++) {
            qd[c] = to_double(bf16, mq ? fake_tmap_read(mq, c, i, h, b) : q[i * p->q_sn + c]);
            dod[c] = to_double(bf16, mdo ? fake_tmap_read(mdo, c, i, h, b) : dO[i * p->do_sn + c]);
          }
          double mx = -INFINITY, sum = 0, dsum = 0;
          for (long long j = 0; j < n; j++) {
            double acc = 0;
            for (long long c = 0; c < d; c++) acc += qd[c] * kd[j * d + c];
            pr[j] = acc * p->scale;
            if (pr[j] > mx) mx = pr[j];
          }
          for (long long j = 0; j < n; j++) sum += (pr[j] = exp(pr[j] - mx));
          for (long long j = 0; j < n; j++) {
            pr[j] /= sum;
            double dp = 0;
            for (long long c = 0; c < d; c++) dp += dod[c] * vd[j * d + c];
            ds[j] = dp; /* dP for now */
            dsum += pr[j] * dp; /* rowsum(dO * O) = sum_j P_ij dP_ij */
          }
          for (long long j = 0; j < n; j++) ds[j] = pr[j] * (ds[j] - dsum);
          for (long long c = 0; c < d; c++) {
            double g = 0;
            for (long long j = 0; j < n; j++) {
              g += ds[j] * kd[j * d + c];
              dk[j * d + c] += p->scale * ds[j] * qd[c];
              dv[j * d + c] += pr[j] * dod[c];
            }
            dq[i * p->dq_sn + c] = from_double(bf16, p->scale * g);
          }
        }
      }
      uint16_t *dkw = (uint16_t *)(uintptr_t)p->dk + b * p->dk_sb + hk * p->dk_sh;
      uint16_t *dvw = (uint16_t *)(uintptr_t)p->dv + b * p->dv_sb + hk * p->dv_sh;
      for (long long j = 0; j < nk; j++)
        for (long long c = 0; c < d; c++) {
          dkw[j * p->dk_sn + c] = from_double(bf16, dk[j * d + c]);
          dvw[j * p->dv_sn + c] = from_double(bf16, dv[j * d + c]);
        }
    }
  free(kd), free(vd), free(dk), free(dv), free(pr), free(ds), free(qd), free(dod);
  return 0;
}
