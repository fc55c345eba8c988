/*
 * data_npy.c - .npy sources (format 1.0/2.0/3.0, C order; gzip or plain).
 *
 * The header is parsed and checked against the declaration by
 * util/datafile.c (as dpc does): '<f4' for an f32 tensor, '<i4' or '<i8' for
 * an i32 one, the first dim the samples, the product of the rest the
 * elements per sample. The data is read whole; '<i8' is narrowed in chunks,
 * every value checked to fit int32 (labels: and to be >= 0).
 */
#include <limits.h>

#include "data_int.h"

static DfDtype df_dtype(int dtype)
{
	return dtype == DP_F32 ? DF_F32 : dtype == DP_I32 ? DF_I32 : DF_OTHER;
}

static int load_npy_body(LoadCtx *c, gzFile gz, const DpSource *rec, int dtype, DataSource *d)
{
	NpyHeader h;
	char msg[DATA_MSG];
	int esize;
	int64_t n;

	if (npy_read_header(gz, c->path, &h, msg, sizeof msg) ||
	    npy_check(c->path, &h, df_dtype(dtype), data_dtype_name(dtype), rec->role == 1,
		      rec->sample_elems, &esize, &n, msg, sizeof msg))
		return data_df_fail(c, msg);
	int64_t elems = rec->sample_elems;
	RT_CHECK(data_alloc(c, d, n, elems, 4));

	int64_t total = n * elems;
	if (esize == 4) {
		RT_CHECK(data_read_exact(c, gz, d->data, total * 4, "the array data"));
		if (rec->role == 1) {
			const int32_t *v = d->data;
			for (int64_t k = 0; k < total; k++)
				if (v[k] < 0)
					return RT_FAIL(c->e, "data file %s: label %d at element %lld is negative (%s)",
						       c->path, v[k], (long long)k, c->where);
		}
		return 0;
	}
	/* '<i8' into int32, in chunks, every value checked. */
	int64_t buf[4096], done = 0;
	int32_t *v = d->data;
	while (done < total) {
		int64_t chunk = total - done < 4096 ? total - done : 4096;
		RT_CHECK(data_read_exact(c, gz, buf, chunk * 8, "the array data"));
		for (int64_t k = 0; k < chunk; k++) {
			int64_t x = buf[k];
			if (x < INT32_MIN || x > INT32_MAX || (rec->role == 1 && x < 0))
				return RT_FAIL(c->e,
					       "data file %s: value %lld at element %lld does not fit %s (%s)",
					       c->path, (long long)x, (long long)(done + k),
					       rec->role == 1 ? "a label (0 .. 2^31-1)" : "int32", c->where);
			v[done + k] = (int32_t)x;
		}
		done += chunk;
	}
	return 0;
}

int data_load_npy(LoadCtx *c, const DpSource *rec, int dtype, DataSource *d)
{
	gzFile gz;

	RT_CHECK(data_gzopen(c, &gz));
	int rc = load_npy_body(c, gz, rec, dtype, d);
	gzclose(gz);
	return rc;
}
