/* The fs tier's batched block write: checksum, header and temp file of a whole store chunk in one
 * foreign call (the store twin of batchread.c).
 *
 * Contract (kvtier/tiers/fs/batchwrite.py is the caller and the Python twin's owner):
 * items[i] describes block i (struct item below); names (NUL-terminated) and keys live in blob;
 * each names its temp file relative to its own directory descriptor (the tier's tmp/ shards).
 * For each block, in order:
 *   1. seed = xxh3(key || tail) and checksum = xxh3(payload, seed), payload = plen bytes at src;
 *   2. the header, exactly kvtier.codec.encode_header(key, plen, checksum, ns_tag, 4096): the
 *      36-byte fixed part ("KVTB", version 1, checksum kind 1, key length u16, header length u32,
 *      payload length u64, namespace tag u64, checksum u64, little-endian), the low 32 bits of
 *      xxh3(fixed || key), the key, zeros up to hlen (in a page-aligned buffer: O_DIRECT takes it);
 *   3. openat(dir_fd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC [| O_DIRECT],
 *      0600): never an existing file, never through a planted link;
 *   4. one pwritev of header + payload (a short write is finished with further pwritev calls);
 *   5. fsync when asked; close.
 * err[i] is 0 when every step passed, else the errno of the step that failed (the temp file may
 * then exist: the caller removes it and gives its reservation back, as for a Python write).
 * Returns the number of blocks attempted (all of them unless memory for the header ran out).
 *
 * Why C: a Python worker writing one block makes ~5 calls that each release and retake the GIL
 * (checksum, open, pwritev, close) and spends ~10 us building the header; here the whole chunk
 * is one release.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stddef.h>
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
#define ALIGN 4096

struct item { /* 32 bytes: struct.pack("<IIIiB7xQ") in batchwrite.py */
    uint32_t name_off, key_off, key_len;
    int32_t dir_fd;
    uint8_t direct, pad[7];
    uint64_t src;
};
/* The Python side packs items with struct "<IIIiB7xQ": fail the build if the layout ever drifts. */
_Static_assert(sizeof(struct item) == 32, "struct item must be 32 bytes");
_Static_assert(offsetof(struct item, dir_fd) == 12 && offsetof(struct item, src) == 24, "struct item layout");

static void put(unsigned char *p, uint64_t v, int n) {
    for (int j = 0; j < n; j++) p[j] = (unsigned char)(v >> (8 * j));
}

static int write_all(int fd, unsigned char *h, size_t hlen, unsigned char *src, size_t plen) {
    size_t done = 0, want = hlen + plen;
    while (done < want) {
        struct iovec iov[2];
        int k = 0;
        if (done < hlen) iov[k++] = (struct iovec){h + done, hlen - done};
        size_t pdone = done > hlen ? done - hlen : 0;
        iov[k++] = (struct iovec){src + pdone, plen - pdone};
        ssize_t got = pwritev(fd, iov, k, (off_t)done);
        if (got < 0) {
            if (errno == EINTR) continue;
            return errno;
        }
        if (got == 0) return EIO;
        done += (size_t)got;
    }
    return 0;
}

int64_t kvt_write_blocks(
    int64_t n, const struct item *items, const unsigned char *blob, int64_t hlen, int64_t plen,
    uint64_t ns_tag, const unsigned char *tail, int do_fsync, xxh3_fn xxh3, int64_t *err) {
    size_t max_key = 0;
    for (int64_t i = 0; i < n; i++) {
        if (items[i].key_len > max_key) max_key = items[i].key_len;
        err[i] = ENOMEM;
    }
    unsigned char *h = NULL;
    if (posix_memalign((void **)&h, ALIGN, (size_t)hlen) != 0) return 0;
    unsigned char *scratch = malloc(max_key + FIXED_LEN + TAIL_LEN);
    if (scratch == NULL) {
        free(h);
        return 0;
    }
    for (int64_t i = 0; i < n; i++) {
        const struct item *it = &items[i];
        const unsigned char *key = blob + it->key_off;
        size_t klen = it->key_len;
        unsigned char *src = (unsigned char *)(uintptr_t)it->src;
        if (FIXED_LEN + 4 + klen > (size_t)hlen) {
            err[i] = EINVAL;
            continue;
        }
        memcpy(scratch, key, klen);
        memcpy(scratch + klen, tail, TAIL_LEN);
        uint64_t seed = xxh3(scratch, klen + TAIL_LEN, 0);
        uint64_t sum = xxh3(src, (size_t)plen, seed);
        memset(h, 0, (size_t)hlen);
        memcpy(h, "KVTB", 4);
        h[4] = 1; /* format version */
        h[5] = 1; /* checksum kind: xxh3-64 */
        put(h + 6, klen, 2);
        put(h + 8, (uint64_t)hlen, 4);
        put(h + 12, (uint64_t)plen, 8);
        put(h + 20, ns_tag, 8);
        put(h + 28, sum, 8);
        memcpy(scratch, h, FIXED_LEN);
        memcpy(scratch + FIXED_LEN, key, klen);
        put(h + FIXED_LEN, xxh3(scratch, FIXED_LEN + klen, 0) & 0xFFFFFFFFu, 4);
        memcpy(h + FIXED_LEN + 4, key, klen);
        int flags = O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC | (it->direct ? O_DIRECT : 0);
        int fd = openat(it->dir_fd, (const char *)blob + it->name_off, flags, 0600);
        if (fd < 0) {
            err[i] = errno;
            continue;
        }
        int e = write_all(fd, h, (size_t)hlen, src, (size_t)plen);
        if (e == 0 && do_fsync && fsync(fd) != 0) e = errno;
        if (close(fd) != 0 && e == 0 && errno != EINTR) e = errno;
        err[i] = e;
    }
    free(scratch);
    free(h);
    return n;
}
