/*
 * cmdline.h - command lines as text a shell reads back: the command dpexec
 * prints to resume a run (runtime/command.c). util/cmdline.c.
 *
 * A word is left bare when it holds only characters no shell treats
 * specially (letters, digits and -_./=:,+@%); otherwise it is put in single
 * quotes, a quote inside written '\''. So pasting what cmd_append wrote
 * passes the same words to the program, whatever they hold.
 */
#ifndef DP_CMDLINE_H
#define DP_CMDLINE_H

#include <stddef.h>

/* Append word (quoted when needed) to the string in buf, after a space
 * unless buf is empty. Returns 0, or -1 when it does not fit (buf is then
 * left as it was). */
int cmd_append(char *buf, size_t len, const char *word);

/* The words of the n bytes of NUL-separated words in buf (as
 * /proc/PID/cmdline holds them); buf[n] must be '\0'. *argv malloc'd (free
 * it; the words point into buf), *argc their count. 0, or -1 out of memory. */
int cmd_split_nul(char *buf, size_t n, int *argc, char ***argv);

#endif
