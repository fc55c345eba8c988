/*
 * init.c - counter-based parameter initialisation.
 *
 * Element i of the full tensor `name` gets a value that depends only on
 * (seed, name, i): no generator state is carried from one element to the
 * next, so a rank that holds elements [base, base+count) of a sharded tensor
 * produces exactly the numbers of that slice of the unsharded tensor, and
 * tests/torch_ref.py (numpy, uint64 arithmetic) can reproduce them.
 *
 * The formulas (docs/DATA.md repeats them):
 *   mix64(x)  = splitmix64's finaliser
 *   hash(s)   = FNV-1a 64 of the bytes of s
 *   u         = mix64(seed ^ mix64(hash(name) + i * GOLDEN))      (mod 2^64)
 *   u1        = ((u >> 32)        + 0.5) / 2^32                 in (0, 1)
 *   u2        = ((u & 0xffffffff) + 0.5) / 2^32                 in (0, 1)
 *   uniform   = a + (b - a) * u1
 *   normal    = a + b * sqrt(-2 ln u1) * cos(2 pi u2)   (Box-Muller, cos branch only)
 * computed in double, stored as float.
 */
#include <math.h>

#include "powersgd.h"
#include "rt.h"

#define INIT_GOLDEN 0x9e3779b97f4a7c15ull /* 2^64 / golden ratio, splitmix64's increment */

uint64_t init_mix64(uint64_t x)
{
	return dp_psgd_mix64(x); /* one definition, device code's too */
}

uint64_t init_hash_name(const char *name)
{
	return dp_psgd_hash(name);
}

/* Two uniforms in (0, 1) from 64 bits; 0 and 1 never occur, so log(u1) is finite. */
static void init_uniforms(uint64_t u, double *u1, double *u2)
{
	const double scale = 1.0 / 4294967296.0; /* 2^-32 */

	*u1 = ((double)(u >> 32) + 0.5) * scale;
	*u2 = ((double)(u & 0xffffffffull) + 0.5) * scale;
}

void init_fill(DpInit kind, float a, float b, uint64_t seed, const char *name, int64_t base,
	       int64_t count, float *dst)
{
	uint64_t h = init_hash_name(name);
	double da = a, db = b;

	for (int64_t k = 0; k < count; k++) {
		uint64_t i = (uint64_t)(base + k);
		double u1, u2, v;

		switch (kind) {
		case DP_INIT_NONE:
		case DP_INIT_ZEROS:
			v = 0.0;
			break;
		case DP_INIT_ONES:
			v = 1.0;
			break;
		case DP_INIT_UNIFORM:
			init_uniforms(init_mix64(seed ^ init_mix64(h + i * INIT_GOLDEN)), &u1, &u2);
			v = da + (db - da) * u1;
			break;
		case DP_INIT_NORMAL:
			init_uniforms(init_mix64(seed ^ init_mix64(h + i * INIT_GOLDEN)), &u1, &u2);
			v = da + db * (sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
			break;
		case DP_INIT_ROPE_COS:
		case DP_INIT_ROPE_SIN: {
			/* b = half, the table's last dim; a = theta; in double so that
			 * the table equals the reference's to the last float bit */
			int64_t half = (int64_t)b > 0 ? (int64_t)b : 1;
			double t = (double)((int64_t)i / half), j = (double)((int64_t)i % half);
			double ang = t * pow(da, -j / (double)half);
			v = kind == DP_INIT_ROPE_COS ? cos(ang) : sin(ang);
			break;
		}
		default:
			v = 0.0; /* the step-file reader rejects unknown kinds */
			break;
		}
		dst[k] = (float)v;
	}
}

int64_t init_whole_dim(const DpStep *s, const DpTensor *t, int k)
{
	int64_t n = t->dims[k];
	for (int a = 0; a < DP_MAX_AXES; a++)
		if (t->place[a] == DP_PL_SHARD && t->place_dim[a] == k)
			n *= s->cfg.mesh[a];
	return n;
}
