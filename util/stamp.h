/*
 * stamp.h - UTC timestamps for logs: ISO 8601 with milliseconds
 * ("2026-11-27T04:21:52.123Z", what --log-json's "time" holds), and a
 * stream that puts one, and a space, at the start of every line written
 * to a file descriptor (dpexec's console unless --no-timestamps; dprun's
 * own lines).
 */
#ifndef DP_STAMP_H
#define DP_STAMP_H

#include <stdio.h>

#define STAMP_LEN 32 /* room for a timestamp and its NUL */

/* The time now into buf (at least STAMP_LEN bytes). */
void stamp_now(char *buf, size_t len);

/* A line-buffered stream writing to fd that starts every line with the
 * time it is written and a space; NULL when it cannot be made (errno).
 * A line split over several writes gets one timestamp, at its start. */
FILE *stamp_stream(int fd);

#endif
