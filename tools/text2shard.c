/*
 * text2shard.c - turn text files into llm.c token shards, byte-level.
 *
 *   text2shard -o OUT.bin [--val VAL.bin --val-frac F] FILE...
 *
 * Every byte is one token (vocab 256, no tokenizer), the files concatenated in
 * argument order. With --val, the last F of the bytes (rounded down to whole
 * bytes) go to VAL.bin and the rest to OUT.bin. A shard is what runtime/data.c
 * reads (DP_SRC_TOKENS): 256 little-endian int32 (20240520, 1, n, zeros), then
 * n little-endian uint16. Each output is written to a temp file beside it and
 * renamed into place, so a failure leaves neither a partial shard nor a temp.
 *
 * It prints the token counts and the unigram (byte) entropy of the train
 * tokens, H = -sum_b p(b) ln p(b) in nats/token (the cross-entropy loss of the
 * best model that ignores context: a language model's loss should end well
 * below it) and H / ln 2 in bits/byte.
 */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SHARD_MAGIC 20240520
#define SHARD_VERSION 1
#define SHARD_HEADER_INTS 256
#define SHARD_MAX_TOKENS INT32_MAX /* the header's count is an int32 */

static const char usage[] =
	"usage: text2shard -o OUT.bin [--val VAL.bin --val-frac F] FILE...\n"
	"\n"
	"Concatenates the FILEs (in argument order) and writes them as a byte-level\n"
	"llm.c token shard (vocab 256: each byte is one uint16 token; header of 256\n"
	"int32: 20240520, 1, token count). dp reads it with tokens(\"OUT.bin\").\n"
	"\n"
	"  -o OUT.bin        the train shard (required)\n"
	"  --val VAL.bin     also write a validation shard: the last F of the bytes\n"
	"  --val-frac F      0 < F < 1 (required with --val; default none)\n"
	"  -h, --help        this text\n"
	"\n"
	"Outputs are written atomically (temp file + rename; nothing is left on error).\n"
	"Prints the token counts and the unigram entropy of the train tokens in\n"
	"nats/token (comparable to a cross-entropy loss) and in bits/byte.\n"
	"Exit status: 0 on success, 1 on an error, 2 on a usage error.\n";

/* Read a whole file, appending to *buf (grown as needed). 0 or -1 (message printed). */
static int append_file(const char *path, unsigned char **buf, size_t *len, size_t *cap)
{
	FILE *f = fopen(path, "rb");
	if (!f) {
		fprintf(stderr, "text2shard: cannot open %s: %s\n", path, strerror(errno));
		return -1;
	}
	for (;;) {
		if (*cap - *len < 65536) {
			size_t ncap = *cap ? *cap * 2 : 1 << 20;
			unsigned char *nb = realloc(*buf, ncap);
			if (!nb) {
				fprintf(stderr, "text2shard: out of memory reading %s\n", path);
				fclose(f);
				return -1;
			}
			*buf = nb;
			*cap = ncap;
		}
		size_t got = fread(*buf + *len, 1, *cap - *len, f);
		*len += got;
		if (got == 0)
			break;
	}
	if (ferror(f)) {
		fprintf(stderr, "text2shard: cannot read %s: %s\n", path, strerror(errno));
		fclose(f);
		return -1;
	}
	fclose(f);
	return 0;
}

/* Write bytes[0..n) as a shard into tmp (path's temp sibling, named into
 * tmp[0..tmplen)). 0 or -1 (message printed, nothing left behind). */
static int write_temp(const char *path, const unsigned char *bytes, size_t n, char *tmp,
		      size_t tmplen)
{
	uint32_t hdr[SHARD_HEADER_INTS] = {0};
	unsigned char h8[4 * SHARD_HEADER_INTS], buf[1 << 16];

	if (snprintf(tmp, tmplen, "%s.tmp.%ld", path, (long)getpid()) >= (int)tmplen) {
		fprintf(stderr, "text2shard: output path %s is too long\n", path);
		return -1;
	}
	FILE *f = fopen(tmp, "wb");
	if (!f) {
		fprintf(stderr, "text2shard: cannot create %s: %s\n", tmp, strerror(errno));
		return -1;
	}
	hdr[0] = SHARD_MAGIC;
	hdr[1] = SHARD_VERSION;
	hdr[2] = (uint32_t)n;
	for (int i = 0; i < SHARD_HEADER_INTS; i++) /* little-endian whatever the host */
		for (int k = 0; k < 4; k++)
			h8[4 * i + k] = (unsigned char)(hdr[i] >> (8 * k));
	int ok = fwrite(h8, 1, sizeof h8, f) == sizeof h8;
	for (size_t done = 0; ok && done < n;) {
		size_t chunk = n - done < sizeof buf / 2 ? n - done : sizeof buf / 2;
		for (size_t k = 0; k < chunk; k++) {
			buf[2 * k] = bytes[done + k];
			buf[2 * k + 1] = 0;
		}
		ok = fwrite(buf, 1, 2 * chunk, f) == 2 * chunk;
		done += chunk;
	}
	int err = errno;
	if (ok && fflush(f) != 0)
		ok = 0, err = errno;
	if (ok && fsync(fileno(f)) != 0)
		ok = 0, err = errno;
	if (fclose(f) != 0 && ok)
		ok = 0, err = errno;
	if (!ok) {
		fprintf(stderr, "text2shard: cannot write %s: %s\n", path, strerror(err));
		unlink(tmp);
		return -1;
	}
	return 0;
}

/* Unigram entropy of bytes[0..n) in nats. */
static double entropy_nats(const unsigned char *bytes, size_t n)
{
	uint64_t hist[256] = {0};
	double h = 0.0;

	for (size_t i = 0; i < n; i++)
		hist[bytes[i]]++;
	for (int b = 0; b < 256; b++)
		if (hist[b]) {
			double p = (double)hist[b] / (double)n;
			h -= p * log(p);
		}
	return h;
}

static int distinct_bytes(const unsigned char *bytes, size_t n)
{
	int seen[256] = {0}, k = 0;
	for (size_t i = 0; i < n; i++)
		if (!seen[bytes[i]])
			seen[bytes[i]] = 1, k++;
	return k;
}

int main(int argc, char **argv)
{
	const char *out = NULL, *val = NULL, *frac_arg = NULL;
	double frac = 0.0;
	int nfiles = 0;
	char **files = calloc((size_t)argc, sizeof *files);

	if (!files)
		return 1;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
			fputs(usage, stdout);
			free(files);
			return 0;
		} else if (!strcmp(a, "-o") || !strcmp(a, "--val") || !strcmp(a, "--val-frac")) {
			if (i + 1 >= argc) {
				fprintf(stderr, "text2shard: %s needs a value\n%s", a, usage);
				free(files);
				return 2;
			}
			const char *v = argv[++i];
			if (!strcmp(a, "-o"))
				out = v;
			else if (!strcmp(a, "--val"))
				val = v;
			else
				frac_arg = v;
		} else if (!strcmp(a, "--")) {
			while (++i < argc)
				files[nfiles++] = argv[i];
		} else if (a[0] == '-' && a[1]) {
			fprintf(stderr, "text2shard: unknown option %s\n%s", a, usage);
			free(files);
			return 2;
		} else {
			files[nfiles++] = argv[i];
		}
	}
	const char *why = NULL;
	if (!out)
		why = "-o OUT.bin is required";
	else if (!nfiles)
		why = "no input files";
	else if (val && !frac_arg)
		why = "--val needs --val-frac";
	else if (frac_arg && !val)
		why = "--val-frac needs --val";
	if (!why && frac_arg) {
		char *end;
		errno = 0;
		frac = strtod(frac_arg, &end);
		if (errno || end == frac_arg || *end || !(frac > 0.0 && frac < 1.0))
			why = "--val-frac must be a number strictly between 0 and 1";
	}
	if (!why && val && !strcmp(val, out))
		why = "--val and -o name the same file";
	if (why) {
		fprintf(stderr, "text2shard: %s\n%s", why, usage);
		free(files);
		return 2;
	}

	unsigned char *bytes = NULL;
	size_t len = 0, cap = 0;
	int rc = 1;
	for (int i = 0; i < nfiles; i++)
		if (append_file(files[i], &bytes, &len, &cap) != 0)
			goto done;
	size_t nval = val ? (size_t)((double)len * frac) : 0;
	size_t ntrain = len - nval;
	if (ntrain < 2 || (val && nval < 2)) {
		fprintf(stderr, "text2shard: %zu bytes of input make %zu train and %zu validation tokens; a shard needs at least 2\n",
			len, ntrain, nval);
		goto done;
	}
	if (ntrain > SHARD_MAX_TOKENS || nval > SHARD_MAX_TOKENS) {
		fprintf(stderr, "text2shard: %zu bytes are more than one shard holds (%d tokens)\n", len,
			SHARD_MAX_TOKENS);
		goto done;
	}
	/* Both temps first, then both renames: an error leaves no new file. */
	char tmp_out[4096], tmp_val[4096];
	if (write_temp(out, bytes, ntrain, tmp_out, sizeof tmp_out) != 0)
		goto done;
	if (val && write_temp(val, bytes + ntrain, nval, tmp_val, sizeof tmp_val) != 0) {
		unlink(tmp_out);
		goto done;
	}
	if (rename(tmp_out, out) != 0) {
		fprintf(stderr, "text2shard: cannot rename %s to %s: %s\n", tmp_out, out,
			strerror(errno));
		unlink(tmp_out);
		if (val)
			unlink(tmp_val);
		goto done;
	}
	if (val && rename(tmp_val, val) != 0) {
		fprintf(stderr, "text2shard: cannot rename %s to %s: %s\n", tmp_val, val,
			strerror(errno));
		unlink(tmp_val);
		unlink(out); /* all or nothing */
		goto done;
	}
	double h = entropy_nats(bytes, ntrain);
	printf("text2shard: %d file%s, %zu bytes\n", nfiles, nfiles == 1 ? "" : "s", len);
	printf("train: %s: %zu tokens (%d distinct)\n", out, ntrain, distinct_bytes(bytes, ntrain));
	if (val)
		printf("val:   %s: %zu tokens\n", val, nval);
	printf("unigram entropy of the train tokens: %.4f nats/token, %.4f bits/byte\n", h,
	       h / log(2.0));
	rc = 0;
done:
	free(bytes);
	free(files);
	return rc;
}
