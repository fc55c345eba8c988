/*
 * data_idx.c - IDX (MNIST) sources, and reading data files through zlib
 * (gzip or plain), which .npy sources share.
 *
 * An IDX file is the magic 00 00 08 ndim, ndim big-endian u32 dims (parsed by
 * util/datafile.c, as dpc does), then u8 data: the first dim is the sample
 * count, the product of the rest must equal the .dp file's elements per
 * sample. Features become (float)byte / 255.0f and need an f32 tensor: the
 * bytes are kept as they are and converted sample by sample as a batch is
 * filled (data_copy_sample), so a rank holds Fashion-MNIST's 47 MB of
 * training images, not 188 MB of floats, and loading writes each byte
 * once. Labels become int32 (converted in chunks, never held twice) and
 * need an i32 tensor.
 */
#include <errno.h>
#include <string.h>

#include "data_int.h"

int data_df_fail(LoadCtx *c, const char *msg)
{
	return RT_FAIL(c->e, "%s (%s)", msg, c->where);
}

int data_gzopen(LoadCtx *c, gzFile *out)
{
	errno = 0;
	*out = gzopen(c->path, "rb");
	if (!*out)
		return RT_FAIL(c->e, "cannot open data file %s: %s (%s)", c->path,
			       errno ? strerror(errno) : "out of memory", c->where);
	return 0;
}

/* Read exactly len bytes or fail with "truncated" naming what was being read. */
int data_read_exact(LoadCtx *c, gzFile gz, void *buf, int64_t len, const char *what)
{
	char msg[DATA_MSG];
	if (df_read_exact(gz, c->path, buf, len, what, msg, sizeof msg))
		return data_df_fail(c, msg);
	return 0;
}

static int load_idx_body(LoadCtx *c, gzFile gz, const DpSource *rec, DataSource *d)
{
	IdxHeader h;
	char msg[DATA_MSG];

	if (idx_read_header(gz, c->path, &h, msg, sizeof msg) ||
	    df_check_samples(c->path, h.n, h.elems, rec->sample_elems, msg, sizeof msg))
		return data_df_fail(c, msg);
	int64_t n = h.n, elems = h.elems;
	d->bytes = rec->role == 0;
	RT_CHECK(data_alloc(c, d, n, elems, d->bytes ? 1 : 4));

	/* Images are read in place; labels converted in chunks, so the bytes
	 * never need a second full-size buffer. */
	unsigned char buf[1 << 16];
	int64_t total = n * elems, done = 0;
	while (done < total) {
		int64_t chunk = total - done < (int64_t)sizeof buf ? total - done : (int64_t)sizeof buf;
		unsigned char *to = d->bytes ? (unsigned char *)d->data + done : buf;
		int64_t got = df_gz_read(gz, to, chunk);
		if (got < 0)
			return RT_FAIL(c->e, "cannot read data file %s: %s (%s)", c->path,
				       df_gz_error(gz), c->where);
		if (got < chunk)
			return RT_FAIL(c->e,
				       "data file %s is truncated: %lld samples of %lld bytes need %lld bytes of data, found %lld (%s)",
				       c->path, (long long)n, (long long)elems, (long long)total,
				       (long long)(done + got), c->where);
		if (!d->bytes) {
			int32_t *v = (int32_t *)d->data + done;
			for (int64_t k = 0; k < chunk; k++)
				v[k] = buf[k];
		}
		done += chunk;
	}
	return 0;
}

int data_load_idx(LoadCtx *c, const DpSource *rec, int dtype, DataSource *d)
{
	gzFile gz;

	if (rec->role == 0 && dtype != DP_F32)
		return RT_FAIL(c->e,
			       "data file %s holds images (read as f32 in [0, 1]) but the .dp file declares %s (%s)",
			       c->path, data_dtype_name(dtype), c->where);
	if (rec->role == 1 && dtype != DP_I32)
		return RT_FAIL(c->e, "data file %s holds labels (read as i32) but the .dp file declares %s (%s)",
			       c->path, data_dtype_name(dtype), c->where);
	RT_CHECK(data_gzopen(c, &gz));
	int rc = load_idx_body(c, gz, rec, d);
	gzclose(gz);
	return rc;
}
