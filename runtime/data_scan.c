/*
 * data_scan.c - one pass over a token shard at load: every token id below
 * the model's vocabulary, so that a bad id is an error before step 1, not
 * when (or whether) its window happens to be drawn thousands of steps in.
 * A streaming read in 1 MiB pieces (no memory beyond that, no mmap: a shard
 * cut short meanwhile is a short read, an error); at several GB/s it costs
 * a fraction of a second per GB, once. Called by data.c when it opens a
 * shard; the check as a window is read stays (a shard may change later).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rt.h"

#define SCAN_CHUNK (1 << 20) /* bytes per read: an even number */

int data_scan_tokens(int fd, const char *path, int64_t at, int64_t ntok, int64_t limit,
		     const char *where, RtErr *e)
{
	if (limit <= 0 || limit > 65535)
		return 0; /* every uint16 fits */
	unsigned char *buf = malloc(SCAN_CHUNK);
	if (!buf)
		return RT_FAIL(e, "out of memory scanning token shard %s (%s)", path, where);
	int64_t done = 0;
	int rc = 0;
	while (rc == 0 && done < ntok) {
		size_t want = ntok - done < SCAN_CHUNK / 2 ? (size_t)(ntok - done) * 2 : SCAN_CHUNK;
		ssize_t got = pread(fd, buf, want, at + 2 * done);
		if (got < 0 && errno == EINTR)
			continue;
		if (got <= 0 || got % 2) {
			rc = RT_FAIL(e, "cannot read token shard %s: %s (%s)", path,
				     got < 0 ? strerror(errno) : "shorter than its header says", where);
			break;
		}
		int64_t n = got / 2;
		unsigned max = 0;
		for (int64_t k = 0; k < n; k++) { /* the largest first: a vector loop */
			unsigned v = (unsigned)buf[2 * k] | (unsigned)buf[2 * k + 1] << 8;
			max = v > max ? v : max;
		}
		if (max >= (unsigned)limit)
			for (int64_t k = 0; k < n; k++) {
				unsigned v = (unsigned)buf[2 * k] | (unsigned)buf[2 * k + 1] << 8;
				if (v >= (unsigned)limit) {
					rc = RT_FAIL(e, "token shard %s: token %u at index %lld is outside the "
						     "model's vocabulary of %lld (%s)", path, v,
						     (long long)(done + k), (long long)limit, where);
					break;
				}
			}
		done += n;
	}
	free(buf);
	return rc;
}
