/* kvtier simulate fast path: the engine's per-request step for LRU and SIEVE on dense block ids.
 *
 * Contract (kvtier.sim.fastcore is the only caller; its pure-Python twin is the specification):
 *   per request r (blocks ids[offs[r] .. offs[r+1]) ):
 *     lookup: every resident block hits and is touched, in key order;
 *     store : the distinct non-resident blocks, in key order; when they do not fit, evict
 *             min(need - free, resident) victims first, then insert the first min(need, free) of them.
 *   outputs: per request its hits, its leading-hit run length and whether its last block hit;
 *   counters[0..2] += evictions, stores, dropped stores.
 * Ids are 0..nuniq-1. No pins exist on this path (no loads, no tiers), so nothing is protected.
 * Returns 0, or -1 when memory is short (the caller falls back to Python).
 */
#include <stdint.h>
#include <stdlib.h>

#define POLICY_LRU 0
#define POLICY_SIEVE 1

int kv_simulate(int policy, const int32_t *ids, const int64_t *offs, int64_t nreq, int32_t nuniq,
                int64_t cap, int32_t *out_hits, int32_t *out_plen, uint8_t *out_last,
                int64_t *counters) {
    /* One doubly linked list over ids with a sentinel S: next[S] = oldest, prev[S] = newest, and
     * next[x] is x's newer neighbour (SIEVE's hand walks along next, wrapping to the oldest). */
    int64_t S = nuniq;
    int32_t *prev = malloc(sizeof(int32_t) * (size_t)(nuniq + 1));
    int32_t *next = malloc(sizeof(int32_t) * (size_t)(nuniq + 1));
    uint8_t *flag = calloc((size_t)(nuniq + 1), 1); /* bit0 resident, bit1 visited (SIEVE) */
    int64_t *stamp = calloc((size_t)(nuniq + 1), sizeof(int64_t));
    int64_t maxn = 0;
    for (int64_t r = 0; r < nreq; r++) {
        int64_t n = offs[r + 1] - offs[r];
        if (n > maxn) maxn = n;
    }
    int32_t *miss = malloc(sizeof(int32_t) * (size_t)(maxn + 1));
    if (!prev || !next || !flag || !stamp || !miss) {
        free(prev); free(next); free(flag); free(stamp); free(miss);
        return -1;
    }
    prev[S] = (int32_t)S;
    next[S] = (int32_t)S;
    int64_t size = 0, evictions = 0, stores = 0, dropped = 0;
    int64_t hand = -1; /* SIEVE: -1 = start from the oldest */
    for (int64_t r = 0; r < nreq; r++) {
        int64_t s = offs[r], e = offs[r + 1], n = e - s;
        int32_t hits = 0, plen = -1;
        uint8_t last = 0;
        for (int64_t j = 0; j < n; j++) {
            int32_t id = ids[s + j];
            if (flag[id] & 1) {
                hits++;
                if (j == n - 1) last = 1;
                if (policy == POLICY_LRU) { /* move to newest */
                    next[prev[id]] = next[id];
                    prev[next[id]] = prev[id];
                    prev[id] = prev[S];
                    next[id] = (int32_t)S;
                    next[prev[S]] = id;
                    prev[S] = id;
                } else {
                    flag[id] |= 2;
                }
            } else if (plen < 0) {
                plen = (int32_t)j;
            }
        }
        out_hits[r] = hits;
        out_plen[r] = plen < 0 ? (int32_t)n : plen;
        out_last[r] = last;
        if (hits == n) continue;
        int64_t need = 0;
        for (int64_t j = 0; j < n; j++) {
            int32_t id = ids[s + j];
            if (!(flag[id] & 1) && stamp[id] != r + 1) {
                stamp[id] = r + 1;
                miss[need++] = id;
            }
        }
        int64_t fr = cap - size;
        if (need > fr) {
            int64_t ne = need - fr;
            if (ne > size) ne = size;
            for (int64_t k = 0; k < ne; k++) {
                int32_t v;
                if (policy == POLICY_LRU) {
                    v = next[S];
                } else {
                    int64_t node = hand >= 0 ? hand : next[S];
                    while (flag[node] & 2) {
                        flag[node] &= (uint8_t)~2;
                        int64_t nw = next[node]; /* next = the newer neighbour */
                        node = nw != S ? nw : next[S];
                    }
                    v = (int32_t)node;
                    hand = next[v] != S ? next[v] : -1;
                }
                next[prev[v]] = next[v];
                prev[next[v]] = prev[v];
                flag[v] = 0;
            }
            size -= ne;
            evictions += ne;
        }
        int64_t take = need < cap - size ? need : cap - size;
        for (int64_t k = 0; k < take; k++) {
            int32_t id = miss[k];
            flag[id] = 1;
            prev[id] = prev[S];
            next[id] = (int32_t)S;
            next[prev[S]] = id;
            prev[S] = id;
        }
        size += take;
        stores += take;
        dropped += need - take;
    }
    counters[0] += evictions;
    counters[1] += stores;
    counters[2] += dropped;
    free(prev); free(next); free(flag); free(stamp); free(miss);
    return 0;
}
