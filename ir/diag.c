/*
 * diag.c - user-error reporting (chibicc/gcc style) and internal-bug aborts,
 * below the front end, the IR and the passes, which all report through it.
 *
 *   model.dp:7:12: error: unknown identifier 'h9'
 *       logits = linear(h9, w, b)
 *                       ^
 *
 * die("out of memory ...") is not a bug: it exits 1 with the message.
 *
 * A Loc with line 0 has no position (a file that cannot be opened): only
 * "file: error: message" is printed. Warnings (warning_at: a data file dpc
 * cannot see) have the same form and count as no error. The source line is quoted only when the
 * Loc is in the file whose text Diag holds. Columns count bytes; the caret
 * line copies tabs from the source line so it lines up in a terminal.
 */
#include <stdlib.h>
#include <string.h>

#include "ir.h"

void diag_init(Diag *d, FILE *out, const char *file, const char *src)
{
	d->out = out;
	d->file = file;
	d->src = src;
	d->nerrors = 0;
	d->max_errors = 0;
}

/* Print line `line` of src (1-based) and a caret under column col. */
static void quote_line(FILE *out, const char *src, int line, int col)
{
	const char *p = src;
	for (int l = 1; l < line; l++) {
		p = strchr(p, '\n');
		if (!p)
			return;
		p++;
	}
	size_t len = strcspn(p, "\n");
	if (len > 0 && p[len - 1] == '\r')
		len--;
	fputs("    ", out);
	for (size_t i = 0; i < len; i++) {
		unsigned char c = (unsigned char)p[i];
		/* control bytes would garble the terminal; keep tabs and UTF-8 */
		fputc(c == '\t' || (c >= 0x20 && c != 0x7f) ? c : '?', out);
	}
	fputc('\n', out);
	if (col < 1)
		col = 1;
	if ((size_t)col > len + 1)
		col = (int)len + 1;
	fputs("    ", out);
	for (int i = 0; i < col - 1; i++)
		fputc(p[i] == '\t' ? '\t' : ' ', out);
	fputs("^\n", out);
}

/* "file:line:col: KIND: message", the line and the caret. */
static void report(Diag *d, Loc loc, const char *kind, const char *fmt, va_list ap)
{
	const char *file = loc.file ? loc.file : d->file ? d->file : "dpc";
	if (loc.line > 0)
		fprintf(d->out, "%s:%d:%d: %s: ", file, loc.line, loc.col, kind);
	else
		fprintf(d->out, "%s: %s: ", file, kind);
	vfprintf(d->out, fmt, ap);
	fputc('\n', d->out);
	int same_file = !loc.file || (d->file && strcmp(loc.file, d->file) == 0);
	if (loc.line > 0 && d->src && same_file)
		quote_line(d->out, d->src, loc.line, loc.col);
}

void verror_at(Diag *d, Loc loc, const char *fmt, va_list ap)
{
	d->nerrors++;
	if (!d->out || (d->max_errors > 0 && d->nerrors > d->max_errors))
		return;
	report(d, loc, "error", fmt, ap);
	if (d->max_errors > 0 && d->nerrors == d->max_errors)
		fprintf(d->out, "%s: error: too many errors, stopping\n",
			loc.file ? loc.file : d->file ? d->file : "dpc");
}

void warning_at(Diag *d, Loc loc, const char *fmt, ...)
{
	va_list ap;
	if (!d->out)
		return;
	va_start(ap, fmt);
	report(d, loc, "warning", fmt, ap);
	va_end(ap);
}

void error_at(Diag *d, Loc loc, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	verror_at(d, loc, fmt, ap);
	va_end(ap);
}

_Noreturn void die(const char *fmt, ...)
{
	va_list ap;
	fflush(stdout);
	/* Running out of memory is the machine's limit, not a compiler bug: a
	 * message and exit status 1, like a user error, instead of an abort */
	if (strncmp(fmt, "out of memory", 13) == 0) {
		fputs("dpc: error: ", stderr);
		va_start(ap, fmt);
		vfprintf(stderr, fmt, ap);
		va_end(ap);
		fputs(": more than this process may use (see ulimit -v)\n", stderr);
		exit(1);
	}
	fputs("dpc: internal error: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	abort();
}
