/* The fs tier's batched block read: the system calls of a whole chunk of loads in one foreign call.
 *
 * Contract (kvtier/tiers/fs/batchread.py is the caller and the Python twin's owner):
 * for block i of n, with the shard directory already located by the caller (leaf_fd[i], name[i]),
 *   1. re-check the cached directory chain: for each of its chk_n[i] levels (chk_fd, chk_name,
 *      chk_ino), fstatat(..., AT_SYMLINK_NOFOLLOW) must name the same inode (a shard directory
 *      swapped for another since it was cached fails here);
 *   2. openat(leaf_fd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
 *   3. fstat: a regular file, owned by one of the n_owners uids (n_owners < 0: any owner), exactly
 *      hlen + plen bytes long;
 *   4. stop if *abandon_epoch moved from epoch0 (the tier gave a job up: nothing may be read into
 *      a slot the engine may already reuse);
 *   5. O_DIRECT switched on with fcntl when direct[i] (after the checks, as the Python path does);
 *   6. one preadv of the header into hdr + i * hlen and the payload into dst[i];
 *   7. when touch[i], futimens(fd, NULL) (the access order a restart reads from mtimes);
 *   8. the two checksums the header is verified against: hcheck[i] = low 32 bits of
 *      xxh3(header[0:36] || key) and, when verify, pcheck[i] = xxh3(payload, seed) with
 *      seed = xxh3(key || tail), key = keys[key_off[i] : key_off[i] + key_len[i]].
 * status[i] is 0 when every step passed (the caller still compares the header with the key,
 * namespace, lengths and these checksums) and 1 otherwise: the caller then redoes block i on its
 * Python path, which classifies the failure (missing, foreign, corrupt, I/O error) exactly as it
 * always has. Blocks after an abandon are 1 too. Returns the number of blocks attempted.
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

static int chain_ok(int levels, const int *fds, const char *const *names, const uint64_t *inos) {
    for (int j = 0; j < levels; j++) {
        struct stat st;
        if (fstatat(fds[j], names[j], &st, AT_SYMLINK_NOFOLLOW) != 0) return 0;
        if ((uint64_t)st.st_ino != inos[j]) return 0;
    }
    return 1;
}

static int owner_ok(uid_t uid, int n_owners, const int64_t *owners) {
    if (n_owners < 0) return 1;
    for (int j = 0; j < n_owners; j++)
        if ((int64_t)uid == owners[j]) return 1;
    return 0;
}

int64_t kvt_read_blocks(
    int64_t n, const int32_t *leaf_fd, const char *const *name,
    const int32_t *chk_n, const int32_t *chk_fd, const char *const *chk_name, const uint64_t *chk_ino,
    unsigned char *hdr, int64_t hlen, unsigned char *const *dst, int64_t plen,
    const uint8_t *direct, const uint8_t *touch,
    const unsigned char *keys, const int64_t *key_off, const int32_t *key_len, const unsigned char *tail,
    int n_owners, const int64_t *owners, int verify,
    const volatile int64_t *abandon_epoch, int64_t epoch0, xxh3_fn xxh3,
    uint8_t *status, uint64_t *hcheck, uint64_t *pcheck) {
    /* Scratch for header[0:36] || key and key || tail (keys are at most 65535 bytes). */
    size_t max_key = 0;
    for (int64_t i = 0; i < n; i++)
        if ((size_t)key_len[i] > max_key) max_key = (size_t)key_len[i];
    unsigned char *scratch = malloc(max_key + FIXED_LEN + TAIL_LEN);
    for (int64_t i = 0; i < n; i++) status[i] = 1;
    if (scratch == NULL) return 0;
    int64_t i = 0;
    for (; i < n; i++) {
        if (leaf_fd[i] < 0) continue; /* shard not cached: the caller walks the tree */
        const int levels = chk_n[2 * i];
        const int first = chk_n[2 * i + 1];
        if (!chain_ok(levels, chk_fd + first, chk_name + first, chk_ino + first)) continue;
        int fd = openat(leaf_fd[i], name[i], O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
        if (fd < 0) continue;
        struct stat st;
        int ok = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && owner_ok(st.st_uid, n_owners, owners) &&
                 st.st_size == hlen + plen;
        if (ok && *abandon_epoch != epoch0) {
            close(fd);
            break; /* this block and every later one stay 1: the caller decides with the job's flag */
        }
        if (ok && direct[i]) ok = fcntl(fd, F_SETFL, O_NONBLOCK | O_DIRECT) == 0;
        if (ok) {
            unsigned char *h = hdr + i * hlen;
            struct iovec iov[2] = {{h, (size_t)hlen}, {dst[i], (size_t)plen}};
            ok = preadv(fd, iov, 2, 0) == hlen + plen;
            if (ok && touch[i]) futimens(fd, NULL); /* best effort, as on the Python path */
            if (ok) {
                const unsigned char *key = keys + key_off[i];
                size_t klen = (size_t)key_len[i];
                memcpy(scratch, h, FIXED_LEN);
                memcpy(scratch + FIXED_LEN, key, klen);
                hcheck[i] = xxh3(scratch, FIXED_LEN + klen, 0) & 0xFFFFFFFFu;
                if (verify) {
                    memcpy(scratch, key, klen);
                    memcpy(scratch + klen, tail, TAIL_LEN);
                    uint64_t seed = xxh3(scratch, klen + TAIL_LEN, 0);
                    pcheck[i] = xxh3(dst[i], (size_t)plen, seed);
                }
                status[i] = 0;
            }
        }
        close(fd);
    }
    free(scratch);
    return i;
}
