/* kvtier simulate fast path: the engine's per-request step for LRU, SIEVE, S3-FIFO, ARC on dense ids.
 *
 * Contract (kvtier.sim.fastcore is the only caller; its pure-Python twin is the specification, and
 * kvtier.policies.* the policies it reproduces):
 *   per request r (blocks ids[offs[r] .. offs[r+1]) ):
 *     lookup: every resident block hits and is touched, in key order;
 *     store : the distinct non-resident blocks, in key order; when they do not fit, evict
 *             min(need - free, resident) victims first (one evict call, "incoming" = the first of
 *             them), then insert the first min(need, free) of them.
 *   outputs: per request its hits, its leading-hit run length and whether its last block hit;
 *   counters[0..2] += evictions, stores, dropped stores.
 *   params: S3-FIFO's small-queue capacity, ghost capacity and move-to-main threshold (computed by
 *   the caller exactly as S3FIFOPolicy computes them); unused otherwise.
 * Ids are 0..nuniq-1. No pins exist on this path (no loads, no tiers), so nothing is protected.
 * Returns 0, or -1 when memory is short (the caller falls back to Python).
 */
#include <stdint.h>
#include <stdlib.h>

#define POLICY_LRU 0
#define POLICY_SIEVE 1
#define POLICY_S3FIFO 2
#define POLICY_ARC 3

/* Where an id is: not cached, or in one of the lists (LRU and SIEVE use Q_MAIN only; ARC's T1, T2
 * are lists 1, 2 and its ghosts B1, B2 lists 3, 4). Lists 1 and 2 are the resident ones. */
#define Q_NONE 0
#define Q_SMALL 1
#define Q_MAIN 2
#define Q_GHOST 3
#define Q_T1 1
#define Q_T2 2
#define Q_B1 3
#define Q_B2 4
#define NLISTS 5
#define FREQ_CAP 3

typedef struct {
    int policy;
    int64_t n;       /* ids; sentinels of the lists are n + Q_SMALL, n + Q_MAIN, n + Q_GHOST */
    int32_t *prev;   /* towards the oldest end */
    int32_t *next;   /* towards the newest end: next[sentinel] = oldest, prev[sentinel] = newest */
    uint8_t *where;  /* Q_* */
    uint8_t *freq;   /* SIEVE: visited bit; S3-FIFO: hit counter */
    int64_t len[NLISTS]; /* per list */
    int64_t hand;    /* SIEVE: -1 = start from the oldest */
    int64_t small_cap, main_cap, ghost_cap, threshold;
    int has_evicted;  /* S3-FIFO: until the first eviction, a full small queue sends keys to main */
    int64_t pending;  /* S3-FIFO, ARC: ghost entry consumed by evict() for the incoming key, or -1 */
    int64_t cap;
    double p;         /* ARC: target size of T1 */
} state;

static void unlink_id(state *s, int64_t id) {
    s->next[s->prev[id]] = s->next[id];
    s->prev[s->next[id]] = s->prev[id];
    s->len[s->where[id]]--;
    s->where[id] = Q_NONE;
}

static void push_newest(state *s, int64_t id, int q) {
    int64_t sent = s->n + q;
    s->prev[id] = s->prev[sent];
    s->next[id] = (int32_t)sent;
    s->next[s->prev[sent]] = (int32_t)id;
    s->prev[sent] = (int32_t)id;
    s->where[id] = (uint8_t)q;
    s->len[q]++;
}

static int64_t oldest(state *s, int q) { return s->next[s->n + q]; }

static void touch(state *s, int64_t id) {
    if (s->policy == POLICY_LRU || s->policy == POLICY_ARC) {
        unlink_id(s, id); /* ARC: T1 -> T2, or to T2's MRU end */
        push_newest(s, id, s->policy == POLICY_ARC ? Q_T2 : Q_MAIN);
    } else if (s->policy == POLICY_SIEVE) {
        s->freq[id] = 1;
    } else if (s->freq[id] < FREQ_CAP) {
        s->freq[id]++;
    }
}

static void to_ghost(state *s, int64_t id) {
    if (s->ghost_cap <= 0) return;
    while (s->len[Q_GHOST] >= s->ghost_cap) unlink_id(s, oldest(s, Q_GHOST));
    push_newest(s, id, Q_GHOST);
}

static int64_t evict_small(state *s) {
    while (s->len[Q_SMALL]) {
        int64_t id = oldest(s, Q_SMALL);
        unlink_id(s, id);
        if (s->freq[id] >= s->threshold) {
            s->freq[id] = 0;
            push_newest(s, id, Q_MAIN);
        } else {
            to_ghost(s, id);
            return id;
        }
    }
    return -1;
}

static int64_t evict_main(state *s) {
    while (s->len[Q_MAIN]) {
        int64_t id = oldest(s, Q_MAIN);
        unlink_id(s, id);
        if (s->freq[id] >= 1) {
            s->freq[id] = (uint8_t)((s->freq[id] < FREQ_CAP ? s->freq[id] : FREQ_CAP) - 1);
            push_newest(s, id, Q_MAIN);
        } else {
            return id;
        }
    }
    return -1;
}

static void arc_adapt(state *s, int from_b1) {
    double b1 = (double)s->len[Q_B1], b2 = (double)s->len[Q_B2];
    if (from_b1) {
        double step = b2 / b1 > 1.0 ? b2 / b1 : 1.0;
        s->p = s->p + step < (double)s->cap ? s->p + step : (double)s->cap;
    } else {
        double step = b1 / b2 > 1.0 ? b1 / b2 : 1.0;
        s->p = s->p - step > 0.0 ? s->p - step : 0.0;
    }
}

/* ARC's REPLACE: demote the LRU of T1 or T2 to its ghost list. */
static int64_t arc_replace(state *s, int in_b2) {
    int64_t t1 = s->len[Q_T1];
    int prefer_t1 = (t1 > 0 && ((double)t1 > s->p || ((double)t1 == s->p && in_b2))) || s->len[Q_T2] == 0;
    int from = prefer_t1 ? Q_T1 : Q_T2;
    if (s->len[from] == 0) from = prefer_t1 ? Q_T2 : Q_T1;
    int64_t v = oldest(s, from);
    unlink_id(s, v);
    push_newest(s, v, from == Q_T1 ? Q_B1 : Q_B2);
    return v;
}

static void arc_evict_one(state *s, int64_t incoming) {
    if (incoming >= 0 && (s->where[incoming] == Q_B1 || s->where[incoming] == Q_B2)) {
        int b1 = s->where[incoming] == Q_B1;
        arc_adapt(s, b1);
        arc_replace(s, !b1);
        unlink_id(s, incoming);
        s->pending = incoming;
        return;
    }
    if (s->len[Q_T1] + s->len[Q_B1] + 1 > s->cap) {
        if (s->len[Q_B1]) {
            unlink_id(s, oldest(s, Q_B1));
            arc_replace(s, 0);
        } else if (s->len[Q_T1]) {
            unlink_id(s, oldest(s, Q_T1)); /* T1 fills the cache by itself: no ghost */
        } else {
            arc_replace(s, 0);
        }
        return;
    }
    if (s->len[Q_T1] + s->len[Q_T2] + s->len[Q_B1] + s->len[Q_B2] >= 2 * s->cap && s->len[Q_B2])
        unlink_id(s, oldest(s, Q_B2));
    arc_replace(s, 0);
}

static void evict_one(state *s) {
    if (s->policy == POLICY_LRU) {
        unlink_id(s, oldest(s, Q_MAIN));
    } else if (s->policy == POLICY_SIEVE) {
        int64_t sent = s->n + Q_MAIN;
        int64_t node = s->hand >= 0 ? s->hand : oldest(s, Q_MAIN);
        while (s->freq[node]) {
            s->freq[node] = 0;
            int64_t nw = s->next[node];
            node = nw != sent ? nw : oldest(s, Q_MAIN);
        }
        s->hand = s->next[node] != sent ? s->next[node] : -1;
        unlink_id(s, node);
    } else {
        s->has_evicted = 1;
        int main_first = s->len[Q_MAIN] > s->main_cap || s->len[Q_SMALL] == 0;
        int64_t v = main_first ? evict_main(s) : evict_small(s);
        if (v < 0) v = main_first ? evict_small(s) : evict_main(s);
        if (v >= 0 && s->where[v] != Q_GHOST) s->where[v] = Q_NONE;
    }
}

static void insert(state *s, int64_t id) {
    s->freq[id] = 0;
    if (s->policy == POLICY_ARC) {
        if (s->pending == id) {
            s->pending = -1;
            push_newest(s, id, Q_T2);
        } else if (s->where[id] == Q_B1 || s->where[id] == Q_B2) {
            arc_adapt(s, s->where[id] == Q_B1);
            unlink_id(s, id);
            push_newest(s, id, Q_T2);
        } else {
            push_newest(s, id, Q_T1);
        }
        return;
    }
    if (s->policy != POLICY_S3FIFO) {
        push_newest(s, id, Q_MAIN);
        return;
    }
    int ghost_hit = s->pending == id;
    s->pending = -1;
    if (!ghost_hit && s->where[id] == Q_GHOST) {
        unlink_id(s, id);
        ghost_hit = 1;
    }
    if (ghost_hit || (!s->has_evicted && s->len[Q_SMALL] >= s->small_cap))
        push_newest(s, id, Q_MAIN);
    else
        push_newest(s, id, Q_SMALL);
}

static int resident(const state *s, int64_t id) {
    return s->where[id] == Q_SMALL || s->where[id] == Q_MAIN;
}

int kv_simulate(int policy, const int32_t *ids, const int64_t *offs, int64_t nreq, int32_t nuniq,
                int64_t cap, const int64_t *params, int32_t *out_hits, int32_t *out_plen,
                uint8_t *out_last, int64_t *counters) {
    state s = {0};
    s.policy = policy;
    s.n = nuniq;
    s.hand = -1;
    s.pending = -1;
    s.small_cap = params[0];
    s.main_cap = cap - params[0];
    s.ghost_cap = params[1];
    s.threshold = params[2];
    s.cap = cap;
    s.p = 0.0;
    size_t total = (size_t)nuniq + NLISTS;
    s.prev = malloc(sizeof(int32_t) * total);
    s.next = malloc(sizeof(int32_t) * total);
    s.where = calloc(total, 1);
    s.freq = calloc(total, 1);
    int64_t *stamp = calloc(total, sizeof(int64_t));
    int64_t maxn = 0;
    for (int64_t r = 0; r < nreq; r++) {
        int64_t n = offs[r + 1] - offs[r];
        if (n > maxn) maxn = n;
    }
    int32_t *miss = malloc(sizeof(int32_t) * (size_t)(maxn + 1));
    if (!s.prev || !s.next || !s.where || !s.freq || !stamp || !miss) {
        free(s.prev); free(s.next); free(s.where); free(s.freq); free(stamp); free(miss);
        return -1;
    }
    for (int q = 1; q < NLISTS; q++) {
        s.prev[nuniq + q] = nuniq + q;
        s.next[nuniq + q] = nuniq + q;
    }
    int64_t evictions = 0, stores = 0, dropped = 0;
    for (int64_t r = 0; r < nreq; r++) {
        int64_t b = offs[r], e = offs[r + 1], n = e - b;
        int32_t hits = 0, plen = -1;
        uint8_t last = 0;
        for (int64_t j = 0; j < n; j++) {
            int32_t id = ids[b + j];
            if (resident(&s, id)) {
                hits++;
                if (j == n - 1) last = 1;
                touch(&s, id);
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
            int32_t id = ids[b + j];
            if (!resident(&s, id) && stamp[id] != r + 1) {
                stamp[id] = r + 1;
                miss[need++] = id;
            }
        }
        int64_t size = s.len[Q_SMALL] + s.len[Q_MAIN];
        if (need > cap - size) {
            int64_t ne = need - (cap - size);
            if (ne > size) ne = size;
            if (policy == POLICY_S3FIFO && ne > 0 && s.where[miss[0]] == Q_GHOST) {
                unlink_id(&s, miss[0]); /* libCacheSim consumes the ghost entry before evicting */
                s.pending = miss[0];
            }
            for (int64_t k = 0; k < ne; k++) {
                if (policy == POLICY_ARC)
                    arc_evict_one(&s, k == 0 ? miss[0] : -1); /* "incoming" only for the first */
                else
                    evict_one(&s);
            }
            evictions += ne;
        }
        size = s.len[Q_SMALL] + s.len[Q_MAIN];
        int64_t take = need < cap - size ? need : cap - size;
        for (int64_t k = 0; k < take; k++) insert(&s, miss[k]);
        stores += take;
        dropped += need - take;
    }
    counters[0] += evictions;
    counters[1] += stores;
    counters[2] += dropped;
    free(s.prev); free(s.next); free(s.where); free(s.freq); free(stamp); free(miss);
    return 0;
}
