/*
 * vector_types.h - the CUDA emulator's (tests/cuda_emu) vector types: dim3,
 * uint3 and the float2/float4/int4/... structs with CUDA's alignments, so a
 * kernel's float4 reinterpretation of a float pointer carries the 16-byte
 * alignment the hardware requires (kernels are built with
 * -fsanitize=alignment: a misaligned float4 access is reported, as on a GPU).
 * C and C++ (the backend's host code is C).
 */
#ifndef DPEMU_VECTOR_TYPES_H
#define DPEMU_VECTOR_TYPES_H

#define DPEMU_VEC2(T, name, al) typedef struct __attribute__((aligned(al))) name { T x, y; } name;
#define DPEMU_VEC3(T, name) typedef struct name { T x, y, z; } name;
#define DPEMU_VEC4(T, name, al) typedef struct __attribute__((aligned(al))) name { T x, y, z, w; } name;

DPEMU_VEC2(float, float2, 8)
DPEMU_VEC3(float, float3)
DPEMU_VEC4(float, float4, 16)
DPEMU_VEC2(double, double2, 16)
DPEMU_VEC2(int, int2, 8)
DPEMU_VEC3(int, int3)
DPEMU_VEC4(int, int4, 16)
DPEMU_VEC2(unsigned int, uint2, 8)
DPEMU_VEC4(unsigned int, uint4, 16)
DPEMU_VEC2(short, short2, 4)
DPEMU_VEC4(unsigned char, uchar4, 4)
DPEMU_VEC4(signed char, char4, 4)
DPEMU_VEC2(long long, longlong2, 16)

#ifdef __cplusplus
struct uint3 {
	unsigned int x, y, z;
};
struct dim3 {
	unsigned int x, y, z;
	constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1)
		: x(vx), y(vy), z(vz) {}
	constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
	constexpr operator uint3() const { return uint3{x, y, z}; }
};
#else
typedef struct uint3 { unsigned int x, y, z; } uint3;
typedef struct dim3 { unsigned int x, y, z; } dim3;
#endif

#ifdef __cplusplus
static inline float2 make_float2(float x, float y) { return float2{x, y}; }
static inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
static inline int2 make_int2(int x, int y) { return int2{x, y}; }
static inline int4 make_int4(int x, int y, int z, int w) { return int4{x, y, z, w}; }
static inline uint2 make_uint2(unsigned x, unsigned y) { return uint2{x, y}; }
static inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return uint4{x, y, z, w}; }
static inline double2 make_double2(double x, double y) { return double2{x, y}; }
static inline uint3 make_uint3(unsigned x, unsigned y, unsigned z) { return uint3{x, y, z}; }
#endif

#endif
