/* The fs tier's batched block read: the system calls of a whole chunk of loads in one foreign call.
 *
 * Contract (kvtier/tiers/fs/batchread.py is the caller and the Python twin's owner):
 * the arguments come packed (one Python struct.pack per block, no per-call array objects: for
 * one-block jobs the marshalling of ~15 arrays cost more than the read's own system calls).
 * items[i] describes block i (struct item below); names, keys and check-level names live in blob
 * (names NUL-terminated); chk[] holds the directory levels to re-check. For block i of n, with
 * the shard directory already located by the caller (leaf_fd, name):
 *   1. re-check the cached directory chain: for each of its levels (chk[first .. first+levels)),
 *      fstatat(fd, name, ..., AT_SYMLINK_NOFOLLOW) must name the same inode (a shard directory
 *      swapped for another since it was cached fails here);
 *   2. openat(leaf_fd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
 *   3. fstat: a regular file, owned by one of the n_owners uids (n_owners < 0: any owner), exactly
 *      hlen + plen bytes long;
 *   4. stop if *abandon_epoch moved from epoch0 (the tier gave a job up: nothing may be read into
 *      a slot the engine may already reuse);
 *   5. O_DIRECT switched on with fcntl when direct (after the checks, as the Python path does);
 *   6. one preadv of the header into hdr + i * hlen and the payload into dst;
 *   7. when touch, futimens(fd, NULL) (the access order a restart reads from mtimes);
 *   8. the two checksums the header is verified against: out[3i+1] = low 32 bits of
 *      xxh3(header[0:36] || key) and, when verify, out[3i+2] = xxh3(payload, seed) with
 *      seed = xxh3(key || tail).
 *   9. the header compared with what kvtier.codec.parse_header checks: magic "KVTB", version 1,
 *      checksum kind 1, key length, header length hlen, the header check (out[3i+1]), the key,
 *      namespace tag ns_tag, payload length plen, and with verify the payload checksum (out[3i+2]).
 * out[3i] (the status) is 0 when every step passed (the block is loaded and verified), 2 when the
 * bytes were read but the header disagrees (the caller parses it in Python, which names the
 * corruption), and 1 otherwise: the caller then redoes block i on its Python path, which
 * classifies the failure (missing, foreign, corrupt, I/O error) exactly as it always has. Blocks
 * after an abandon are 1 too. Returns the number of blocks attempted.
 *
 * xxh3 comes as a function pointer (XXH3_64bits_withSeed of the xxhash module the Python side
 * already imports), so this file needs no header or library of its own.
 *
 * Why C: each system call a Python thread makes releases the GIL and must take it back; in an
 * engine whose scheduler loop keeps the GIL busy, every retake waits, and a 62-block load made of
 * ~7 calls per block took 20x its I/O time. ctypes releases the GIL once for this whole function.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

typedef uint64_t (*xxh3_fn)(const void *data, size_t len, uint64_t seed);

#define FIXED_LEN 36 /* header bytes covered by header_check, before the check itself */
#define TAIL_LEN 16  /* namespace tag + payload length, appended to the key for the seed */

struct item { /* 40 bytes: struct.pack("<iiiIIIBB6xQ") in batchread.py */
    int32_t leaf_fd; /* < 0: shard not cached, the caller walks the tree */
    int32_t levels, chk_first;
    uint32_t name_off, key_off, key_len;
    uint8_t direct, touch, pad[6];
    uint64_t dst;
};

struct level { /* 16 bytes: struct.pack("<iIQ") */
    int32_t fd;
    uint32_t name_off;
    uint64_t ino;
};

static int chain_ok(const struct level *lv, int levels, const unsigned char *blob) {
    for (int j = 0; j < levels; j++) {
        struct stat st;
        if (fstatat(lv[j].fd, (const char *)blob + lv[j].name_off, &st, AT_SYMLINK_NOFOLLOW) != 0) return 0;
        if ((uint64_t)st.st_ino != lv[j].ino) return 0;
    }
    return 1;
}

static uint64_t get(const unsigned char *p, int n) {
    uint64_t v = 0;
    for (int j = n - 1; j >= 0; j--) v = (v << 8) | p[j];
    return v;
}

/* Step 9: the checks of kvtier.codec.parse_header (+ the payload digest with verify). */
static int header_ok(const unsigned char *h, int64_t hlen, int64_t plen, const unsigned char *key, size_t klen,
                     uint64_t ns_tag, uint64_t hcheck, int verify, uint64_t pcheck) {
    return memcmp(h, "KVTB", 4) == 0 && h[4] == 1 && h[5] == 1 && get(h + 6, 2) == klen &&
           get(h + 8, 4) == (uint64_t)hlen && get(h + 12, 8) == (uint64_t)plen && get(h + 20, 8) == ns_tag &&
           get(h + FIXED_LEN, 4) == hcheck && (int64_t)(FIXED_LEN + 4 + klen) <= hlen &&
           memcmp(h + FIXED_LEN + 4, key, klen) == 0 && (!verify || get(h + 28, 8) == pcheck);
}

static int owner_ok(uid_t uid, int n_owners, const int64_t *owners) {
    if (n_owners < 0) return 1;
    for (int j = 0; j < n_owners; j++)
        if ((int64_t)uid == owners[j]) return 1;
    return 0;
}

int64_t kvt_read_blocks(
    int64_t n, const struct item *items, const struct level *chk, const unsigned char *blob,
    unsigned char *hdr, int64_t hlen, int64_t plen, const unsigned char *tail, uint64_t ns_tag,
    int n_owners, const int64_t *owners, int verify,
    const volatile int64_t *abandon_epoch, int64_t epoch0, xxh3_fn xxh3, uint64_t *out) {
    /* Scratch for header[0:36] || key and key || tail (keys are at most 65535 bytes). */
    size_t max_key = 0;
    for (int64_t i = 0; i < n; i++) {
        if ((size_t)items[i].key_len > max_key) max_key = (size_t)items[i].key_len;
        out[3 * i] = 1;
    }
    unsigned char *scratch = malloc(max_key + FIXED_LEN + TAIL_LEN);
    if (scratch == NULL) return 0;
    int64_t i = 0;
    for (; i < n; i++) {
        const struct item *it = &items[i];
        if (it->leaf_fd < 0) continue; /* shard not cached: the caller walks the tree */
        if (!chain_ok(chk + it->chk_first, it->levels, blob)) continue;
        int fd = openat(it->leaf_fd, (const char *)blob + it->name_off, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
        if (fd < 0) continue;
        struct stat st;
        int ok = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && owner_ok(st.st_uid, n_owners, owners) &&
                 st.st_size == hlen + plen;
        if (ok && *abandon_epoch != epoch0) {
            close(fd);
            break; /* this block and every later one stay 1: the caller decides with the job's flag */
        }
        if (ok && it->direct) ok = fcntl(fd, F_SETFL, O_NONBLOCK | O_DIRECT) == 0;
        if (ok) {
            unsigned char *h = hdr + i * hlen;
            unsigned char *dst = (unsigned char *)(uintptr_t)it->dst;
            struct iovec iov[2] = {{h, (size_t)hlen}, {dst, (size_t)plen}};
            ok = preadv(fd, iov, 2, 0) == hlen + plen;
            if (ok && it->touch) futimens(fd, NULL); /* best effort, as on the Python path */
            if (ok) {
                const unsigned char *key = blob + it->key_off;
                size_t klen = (size_t)it->key_len;
                memcpy(scratch, h, FIXED_LEN);
                memcpy(scratch + FIXED_LEN, key, klen);
                out[3 * i + 1] = xxh3(scratch, FIXED_LEN + klen, 0) & 0xFFFFFFFFu;
                if (verify) {
                    memcpy(scratch, key, klen);
                    memcpy(scratch + klen, tail, TAIL_LEN);
                    uint64_t seed = xxh3(scratch, klen + TAIL_LEN, 0);
                    out[3 * i + 2] = xxh3(dst, (size_t)plen, seed);
                }
                out[3 * i] = header_ok(h, hlen, plen, key, klen, ns_tag, out[3 * i + 1], verify, out[3 * i + 2]) ? 0 : 2;
            }
        }
        close(fd);
    }
    free(scratch);
    return i;
}
