/*
 * stamp.c - UTC timestamps, and streams that stamp every line (stamp.h).
 * The stream is a glibc cookie stream (fopencookie) over the descriptor:
 * stdio's buffering decides when bytes come out, and a line is stamped
 * when its first byte does, so with line buffering the time is the time
 * the line was printed; the stamp goes out in the same write(2) as the
 * line (up to 4 KB), so stdout's and stderr's lines sharing one file
 * never split a stamp from its line. Write errors (a full disk, a closed pipe) are
 * returned to stdio as the descriptor's, so ferror/fflush see them.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* fopencookie */
#endif
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "stamp.h"

void stamp_now(char *buf, size_t len)
{
	struct timeval tv;
	struct tm tm;
	gettimeofday(&tv, NULL);
	gmtime_r(&tv.tv_sec, &tm);
	size_t n = strftime(buf, len, "%Y-%m-%dT%H:%M:%S", &tm);
	snprintf(buf + n, len - n, ".%03dZ", (int)(tv.tv_usec / 1000));
}

typedef struct {
	int fd;
	int midline; /* the last byte written was not a newline */
} Stamped;

static int write_all(int fd, const char *p, size_t n)
{
	while (n > 0) {
		ssize_t k = write(fd, p, n);
		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0)
			return -1;
		p += k;
		n -= (size_t)k;
	}
	return 0;
}

static ssize_t stamped_write(void *cookie, const char *buf, size_t size)
{
	Stamped *s = cookie;
	size_t done = 0;
	while (done < size) {
		const char *nl = memchr(buf + done, '\n', size - done);
		size_t n = nl ? (size_t)(nl - (buf + done)) + 1 : size - done;
		if (!s->midline) { /* the stamp and the line in one write, when it fits */
			char line[4096];
			stamp_now(line, STAMP_LEN);
			size_t k = strlen(line);
			line[k++] = ' ';
			size_t m = n <= sizeof line - k ? n : 0;
			memcpy(line + k, buf + done, m);
			if (write_all(s->fd, line, k + m) < 0)
				return done ? (ssize_t)done : -1;
			s->midline = 1;
			done += m;
			n -= m;
		}
		if (n && write_all(s->fd, buf + done, n) < 0)
			return done ? (ssize_t)done : -1;
		done += n;
		s->midline = !nl;
	}
	return (ssize_t)size;
}

static int stamped_close(void *cookie)
{
	free(cookie); /* the descriptor is not ours */
	return 0;
}

FILE *stamp_stream(int fd)
{
	Stamped *s = calloc(1, sizeof *s);
	if (!s)
		return NULL;
	s->fd = fd;
	cookie_io_functions_t io = {.write = stamped_write, .close = stamped_close};
	FILE *f = fopencookie(s, "w", io);
	if (!f) {
		free(s);
		return NULL;
	}
	setvbuf(f, NULL, _IOLBF, 0);
	return f;
}
