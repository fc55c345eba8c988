/*
 * crc32c.c - CRC-32C (crc32c.h says why this one): the SSE4.2 instruction
 * when the CPU has it (chosen once, at the first call), else a
 * slicing-by-8 table walk; both give the same values.
 */
#include "crc32c.h"

#include <string.h>

#define CRC32C_POLY 0x82f63b78u /* reflected Castagnoli polynomial */

static uint32_t table[8][256];
static int have_table;

static void make_table(void)
{
	for (uint32_t i = 0; i < 256; i++) {
		uint32_t c = i;
		for (int k = 0; k < 8; k++)
			c = c & 1 ? (c >> 1) ^ CRC32C_POLY : c >> 1;
		table[0][i] = c;
	}
	for (uint32_t i = 0; i < 256; i++)
		for (int t = 1; t < 8; t++)
			table[t][i] = (table[t - 1][i] >> 8) ^ table[0][table[t - 1][i] & 0xff];
	have_table = 1;
}

static uint32_t crc_sw(uint32_t c, const unsigned char *p, size_t n)
{
	if (!have_table)
		make_table(); /* idempotent: a race writes the same values */
	while (n && ((uintptr_t)p & 7)) {
		c = (c >> 8) ^ table[0][(c ^ *p++) & 0xff];
		n--;
	}
	for (; n >= 8; n -= 8, p += 8) {
		uint64_t w;
		memcpy(&w, p, 8); /* little-endian hosts only (as the checkpoints) */
		w ^= c;
		c = table[7][w & 0xff] ^ table[6][(w >> 8) & 0xff] ^ table[5][(w >> 16) & 0xff] ^
		    table[4][(w >> 24) & 0xff] ^ table[3][(w >> 32) & 0xff] ^
		    table[2][(w >> 40) & 0xff] ^ table[1][(w >> 48) & 0xff] ^ table[0][w >> 56];
	}
	while (n--)
		c = (c >> 8) ^ table[0][(c ^ *p++) & 0xff];
	return c;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) static uint32_t crc_hw(uint32_t c, const unsigned char *p,
							   size_t n)
{
	uint64_t c64 = c;
	while (n && ((uintptr_t)p & 7)) {
		c64 = __builtin_ia32_crc32qi((uint32_t)c64, *p++);
		n--;
	}
	for (; n >= 8; n -= 8, p += 8) {
		uint64_t w;
		memcpy(&w, p, 8);
		c64 = __builtin_ia32_crc32di(c64, w);
	}
	while (n--)
		c64 = __builtin_ia32_crc32qi((uint32_t)c64, *p++);
	return (uint32_t)c64;
}

/* Three blocks of n bytes (n a multiple of 8), one stream each. */
__attribute__((target("sse4.2"))) static void crc_hw3(const unsigned char *a, size_t n,
							size_t stride, uint32_t *out)
{
	const unsigned char *b = a + stride, *c = b + stride;
	uint64_t x = 0xffffffffu, y = 0xffffffffu, z = 0xffffffffu;
	for (size_t i = 0; i < n; i += 8) {
		uint64_t u, v, w;
		memcpy(&u, a + i, 8);
		memcpy(&v, b + i, 8);
		memcpy(&w, c + i, 8);
		x = __builtin_ia32_crc32di(x, u);
		y = __builtin_ia32_crc32di(y, v);
		z = __builtin_ia32_crc32di(z, w);
	}
	out[0] = ~(uint32_t)x;
	out[1] = ~(uint32_t)y;
	out[2] = ~(uint32_t)z;
}
#endif

static int use_hw(void)
{
#if defined(__x86_64__)
	static int hw = -1;
	if (hw < 0) {
		__builtin_cpu_init();
		hw = __builtin_cpu_supports("sse4.2");
	}
	return hw;
#else
	return 0;
#endif
}

uint32_t crc32c(uint32_t crc, const void *buf, size_t n)
{
#if defined(__x86_64__)
	if (use_hw())
		return ~crc_hw(~crc, buf, n);
#endif
	return ~crc_sw(~crc, buf, n);
}

void crc32c_blocks(const void *buf, size_t n, size_t block, uint32_t *out)
{
	const unsigned char *p = buf;
	size_t k = 0;
#if defined(__x86_64__)
	if (use_hw() && block % 8 == 0)
		for (; k + 3 <= n; k += 3)
			crc_hw3(p + k * block, block, block, out + k);
#endif
	for (; k < n; k++)
		out[k] = crc32c(0, p + k * block, block);
}
