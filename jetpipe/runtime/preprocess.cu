// Fused batch preprocessing: colour conversion + bilinear resize (letterbox or
// stretch) + scale/mean/std + channel order + NCHW, fp32 or fp16 output; or, for
// 1-channel networks (mode GRAY), the luma alone: a YUV frame's Y plane only.
// One launch per batch: grid.z = frame index, one thread per QUAD adjacent output
// pixels; each frame has its own source size, format, colour matrix and placement
// (FrameParams). The arithmetic mirrors jetpipe/frames.py + cv2.resize(INTER_LINEAR) on float images.
#include <cuda_fp16.h>

struct FrameParams {
    unsigned long long src;   // device-readable address of the frame (device or mapped host)
    int width, height, pitch, format;  // width, height: of what is read (the crop, or the whole frame)
    float scale_x, scale_y;   // source pixels per content pixel
    int pad_x, pad_y, content_w, content_h;
    float ky, y0, kc, rv, gu, gv, bu;
    int origin_x, origin_y;   // where what is read starts in the frame (a secondary model's crop)
    int plane_height;         // the frame's height: where its chroma planes start
    float hom[9];             // warp: content (u, v) -> what is read, H(u + 0.5, v + 0.5) - 0.5
    int warp;                 // 1: sample along hom (a secondary's quadrilateral), 0: resize
};

enum { NV12 = 0, I420 = 1, YUYV = 2, UYVY = 3, BGR = 4, RGB = 5 };
enum { MODE_RGB = 0, MODE_BGR = 1, MODE_GRAY = 2 };  // the network's channels

__device__ __forceinline__ float clamp255(float v) { return fminf(fmaxf(v, 0.f), 255.f); }

// x, y: in what is read (the crop); the frame's own coordinates add the origin. FMT: the frame's format, a
// template argument so that a thread's fetches carry no branch and their loads issue together.
template <int FMT>
__device__ __forceinline__ float3 fetch_rgb(const FrameParams& f, int x, int y) {
    const unsigned char* base = reinterpret_cast<const unsigned char*>(f.src);
    x += f.origin_x;
    y += f.origin_y;
    float Y, U, V;
    switch (FMT) {
    case NV12: {
        Y = base[y * f.pitch + x];
        const unsigned char* uv = base + f.pitch * f.plane_height + (y >> 1) * f.pitch + (x & ~1);
        U = uv[0]; V = uv[1];
        break;
    }
    case I420: {
        Y = base[y * f.pitch + x];
        const int cp = f.pitch >> 1;
        const unsigned char* u = base + f.pitch * f.plane_height;
        const unsigned char* v = u + cp * (f.plane_height >> 1);
        const int ci = (y >> 1) * cp + (x >> 1);
        U = u[ci]; V = v[ci];
        break;
    }
    case YUYV: {
        const unsigned char* q = base + y * f.pitch + (x >> 1) * 4;
        Y = q[(x & 1) * 2]; U = q[1]; V = q[3];
        break;
    }
    case UYVY: {
        const unsigned char* q = base + y * f.pitch + (x >> 1) * 4;
        Y = q[1 + (x & 1) * 2]; U = q[0]; V = q[2];
        break;
    }
    case BGR: {
        const unsigned char* p = base + y * f.pitch + x * 3;
        return make_float3(p[2], p[1], p[0]);
    }
    default: {
        const unsigned char* p = base + y * f.pitch + x * 3;
        return make_float3(p[0], p[1], p[2]);
    }
    }
    const float yy = (Y - f.y0) * f.ky, cb = (U - 128.f) * f.kc, cr = (V - 128.f) * f.kc;
    return make_float3(clamp255(yy + f.rv * cr), clamp255(yy + f.gu * cb + f.gv * cr),
                       clamp255(yy + f.bu * cb));
}

// Luma in [0, 255], full range: the Y sample of a YUV frame (no chroma read), BT.601 weights for
// BGR / RGB as OpenCV's COLOR_BGR2GRAY. Mirrors jetpipe.frames.to_gray_float.
template <int FMT>
__device__ __forceinline__ float fetch_gray(const FrameParams& f, int x, int y) {
    const unsigned char* base = reinterpret_cast<const unsigned char*>(f.src);
    x += f.origin_x;
    y += f.origin_y;
    float Y;
    switch (FMT) {
    case NV12:
    case I420: Y = base[y * f.pitch + x]; break;
    case YUYV: Y = base[y * f.pitch + (x >> 1) * 4 + (x & 1) * 2]; break;
    case UYVY: Y = base[y * f.pitch + (x >> 1) * 4 + 1 + (x & 1) * 2]; break;
    case BGR: {
        const unsigned char* p = base + y * f.pitch + x * 3;
        return 0.114f * p[0] + 0.587f * p[1] + 0.299f * p[2];
    }
    default: {
        const unsigned char* p = base + y * f.pitch + x * 3;
        return 0.299f * p[0] + 0.587f * p[1] + 0.114f * p[2];
    }
    }
    return clamp255((Y - f.y0) * f.ky);
}

// Bilinear taps at source coordinate s (pixel indices), replicated border.
__device__ __forceinline__ void tap_at(float s, int size, int& i0, int& i1, float& a) {
    i0 = static_cast<int>(floorf(s));
    a = s - i0;
    if (i0 < 0) { i0 = 0; a = 0.f; }
    if (i0 >= size - 1) { i0 = size - 1; a = 0.f; }
    i1 = min(i0 + 1, size - 1);
}

// cv2.resize INTER_LINEAR source coordinate: half-pixel centres.
__device__ __forceinline__ void tap(float pos, float scale, int size, int& i0, int& i1, float& a) {
    tap_at((pos + 0.5f) * scale - 0.5f, size, i0, i1, a);
}

// A point of the content mapped through the warp's homography (mirrors preprocess.warp_quad).
__device__ __forceinline__ void warp_taps(const FrameParams& f, int cx, int cy, int& x0, int& x1, float& ax,
                                          int& y0, int& y1, float& ay) {
    const float u = cx + 0.5f, v = cy + 0.5f;
    const float w = f.hom[6] * u + f.hom[7] * v + f.hom[8];
    tap_at((f.hom[0] * u + f.hom[1] * v + f.hom[2]) / w - 0.5f, f.width, x0, x1, ax);
    tap_at((f.hom[3] * u + f.hom[4] * v + f.hom[5]) / w - 0.5f, f.height, y0, y1, ay);
}

__device__ __forceinline__ float3 lerp3(float3 p, float3 q, float a) {
    return make_float3(p.x + (q.x - p.x) * a, p.y + (q.y - p.y) * a, p.z + (q.z - p.z) * a);
}

// Bilinear sample. A weight of exactly 0 skips its neighbour's fetch: p + (q - p) * 0 == p for finite q, so the
// result is the same bit for bit, and at an integer ratio (1080p -> 640: every tap sits on a pixel) the kernel
// reads one source pixel per output pixel instead of four, and only the source rows it samples.
template <int FMT>
__device__ __forceinline__ float3 sample_rgb(const FrameParams& f, int x0, int x1, float ax, int y0, int y1,
                                             float ay) {
    float3 top = fetch_rgb<FMT>(f, x0, y0);
    if (ax != 0.f) top = lerp3(top, fetch_rgb<FMT>(f, x1, y0), ax);
    if (ay == 0.f) return top;
    float3 bottom = fetch_rgb<FMT>(f, x0, y1);
    if (ax != 0.f) bottom = lerp3(bottom, fetch_rgb<FMT>(f, x1, y1), ax);
    return lerp3(top, bottom, ay);
}

template <int FMT>
__device__ __forceinline__ float sample_gray(const FrameParams& f, int x0, int x1, float ax, int y0, int y1,
                                             float ay) {
    float top = fetch_gray<FMT>(f, x0, y0);
    if (ax != 0.f) top = top + (fetch_gray<FMT>(f, x1, y0) - top) * ax;
    if (ay == 0.f) return top;
    float bottom = fetch_gray<FMT>(f, x0, y1);
    if (ax != 0.f) bottom = bottom + (fetch_gray<FMT>(f, x1, y1) - bottom) * ax;
    return top + (bottom - top) * ay;
}

template <typename T> __device__ __forceinline__ T to_out(float v);
template <> __device__ __forceinline__ float to_out<float>(float v) { return v; }
template <> __device__ __forceinline__ __half to_out<__half>(float v) { return __float2half_rn(v); }

// Each thread makes QUAD adjacent output pixels of one row: the row's vertical taps and the frame's parameters
// are worked out once for the four, and each plane gets one 16-byte (fp32) or 8-byte (fp16) store, a warp's
// stores one contiguous run per plane.
constexpr int QUAD = 4;  // mirrors kernels.QUAD

__device__ __forceinline__ void store_quad(float* dst, const float* v, int n) {
    if (n == QUAD && (reinterpret_cast<size_t>(dst) & 15) == 0) {
        *reinterpret_cast<float4*>(dst) = make_float4(v[0], v[1], v[2], v[3]);
        return;
    }
    for (int q = 0; q < n; ++q) dst[q] = v[q];
}

__device__ __forceinline__ void store_quad(__half* dst, const float* v, int n) {
    if (n == QUAD && (reinterpret_cast<size_t>(dst) & 7) == 0) {
        const __half2 lo = __halves2half2(to_out<__half>(v[0]), to_out<__half>(v[1]));
        const __half2 hi = __halves2half2(to_out<__half>(v[2]), to_out<__half>(v[3]));
        uint2 bits;
        bits.x = *reinterpret_cast<const unsigned int*>(&lo);
        bits.y = *reinterpret_cast<const unsigned int*>(&hi);
        *reinterpret_cast<uint2*>(dst) = bits;
        return;
    }
    for (int q = 0; q < n; ++q) dst[q] = to_out<__half>(v[q]);
}

// The batch's pad value, per-channel mul / add and channel mode (kernel arguments, shared by its frames).
struct Affine { float pad, m0, m1, m2, a0, a1, a2; int mode; };

// mul/add per *output* channel: out = pixel * mul + add (scale, mean, std folded in);
// mode BGR: output channel 0 takes blue; GRAY: one output channel, the luma (m0, a0).
template <typename T, int FMT>
__device__ __forceinline__ void quad_pixels(const FrameParams& f, T* __restrict__ out, int out_w, int out_h,
                                            int b, int y, int x_first, const Affine& k) {
    const int n = min(QUAD, out_w - x_first);
    const int cy = y - f.pad_y;
    const bool row_inside = cy >= 0 && cy < f.content_h;
    int ry0 = 0, ry1 = 0;
    float ray = 0.f;
    if (row_inside && !f.warp) tap(cy, f.scale_y, f.height, ry0, ry1, ray);
    const bool gray = k.mode == MODE_GRAY, swap_rb = k.mode == MODE_BGR;
    float c0[QUAD], c1[QUAD], c2[QUAD];
#pragma unroll
    for (int q = 0; q < QUAD; ++q) {
        const int cx = x_first + q - f.pad_x;
        const bool inside = row_inside && q < n && cx >= 0 && cx < f.content_w;
        int x0 = 0, x1 = 0, y0 = ry0, y1 = ry1;
        float ax = 0.f, ay = ray;
        if (inside && f.warp) {
            warp_taps(f, cx, cy, x0, x1, ax, y0, y1, ay);
        } else if (inside) {
            tap(cx, f.scale_x, f.width, x0, x1, ax);
        }
        if (gray) {
            const float g = inside ? sample_gray<FMT>(f, x0, x1, ax, y0, y1, ay) : k.pad;
            c0[q] = g * k.m0 + k.a0;
            continue;
        }
        const float3 rgb = inside ? sample_rgb<FMT>(f, x0, x1, ax, y0, y1, ay) : make_float3(k.pad, k.pad, k.pad);
        c0[q] = (swap_rb ? rgb.z : rgb.x) * k.m0 + k.a0;
        c1[q] = rgb.y * k.m1 + k.a1;
        c2[q] = (swap_rb ? rgb.x : rgb.z) * k.m2 + k.a2;
    }
    const size_t plane = static_cast<size_t>(out_w) * out_h;
    T* dst = out + static_cast<size_t>(b) * (gray ? 1 : 3) * plane + static_cast<size_t>(y) * out_w + x_first;
    store_quad(dst, c0, n);
    if (gray) return;
    store_quad(dst + plane, c1, n);
    store_quad(dst + 2 * plane, c2, n);
}

template <typename T>
__device__ void preprocess(const FrameParams* __restrict__ params, T* __restrict__ out, int out_w, int out_h,
                           int batch, const Affine& k) {
    const int b = blockIdx.z;
    if (b >= batch) return;  // the whole block: before the barrier
    // The frame's parameters, read once per block into shared memory (every thread reads most of them).
    __shared__ FrameParams frame;
    const int tid = threadIdx.y * blockDim.x + threadIdx.x;
    if (tid < static_cast<int>(sizeof(FrameParams) / sizeof(int)))
        reinterpret_cast<int*>(&frame)[tid] = reinterpret_cast<const int*>(params + b)[tid];
    __syncthreads();
    const int y = blockIdx.y * blockDim.y + threadIdx.y;
    const int x_first = (blockIdx.x * blockDim.x + threadIdx.x) * QUAD;
    if (y >= out_h || x_first >= out_w) return;
    switch (frame.format) {  // the same for the whole block: no divergence
    case NV12: quad_pixels<T, NV12>(frame, out, out_w, out_h, b, y, x_first, k); break;
    case I420: quad_pixels<T, I420>(frame, out, out_w, out_h, b, y, x_first, k); break;
    case YUYV: quad_pixels<T, YUYV>(frame, out, out_w, out_h, b, y, x_first, k); break;
    case UYVY: quad_pixels<T, UYVY>(frame, out, out_w, out_h, b, y, x_first, k); break;
    case BGR: quad_pixels<T, BGR>(frame, out, out_w, out_h, b, y, x_first, k); break;
    default: quad_pixels<T, RGB>(frame, out, out_w, out_h, b, y, x_first, k); break;
    }
}

// At least five blocks of 256 threads (kernels.BLOCK) resident per SM: the compiler keeps a thread within 48
// registers (56 unbounded: four blocks). The kernel waits on its gathers, and more warps in flight hide more of
// that: 1080p -> 640 at batch 8, H200 2.85 -> 2.75 us a frame, H100 unchanged; bounds of 6 or 8 blocks spill
// registers and ran 28-60 % slower (docs/lab/benchmarks.md, 2026-11-26).
#define RESIDENT_BLOCKS __launch_bounds__(256, 5)

extern "C" __global__ void RESIDENT_BLOCKS preprocess_f32(const FrameParams* params, float* out, int out_w, int out_h,
                                          int batch, float pad, float m0, float m1, float m2,
                                          float a0, float a1, float a2, int mode) {
    preprocess<float>(params, out, out_w, out_h, batch, Affine{pad, m0, m1, m2, a0, a1, a2, mode});
}

extern "C" __global__ void RESIDENT_BLOCKS preprocess_f16(const FrameParams* params, __half* out, int out_w, int out_h,
                                          int batch, float pad, float m0, float m1, float m2,
                                          float a0, float a1, float a2, int mode) {
    preprocess<__half>(params, out, out_w, out_h, batch, Affine{pad, m0, m1, m2, a0, a1, a2, mode});
}

// A frame, or a rectangle of it (origin, width x height in FrameParams), as 8-bit interleaved RGB at its own
// size, with boxes (x0, y0, x1, y1 in what is read, end exclusive) outlined in green: what a snapshot's JPEG is
// encoded from (runtime/jpeg.py). One thread a pixel; the colour arithmetic is the preprocessing's (fetch_rgb).
extern "C" __global__ void frame_to_rgb8(const FrameParams* __restrict__ params, unsigned char* __restrict__ out,
                                         int out_pitch, const int4* __restrict__ boxes, int n_boxes, int thickness) {
    const FrameParams& f = *params;
    const int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
    if (x >= f.width || y >= f.height) return;
    float3 c;
    switch (f.format) {
    case NV12: c = fetch_rgb<NV12>(f, x, y); break;
    case I420: c = fetch_rgb<I420>(f, x, y); break;
    case YUYV: c = fetch_rgb<YUYV>(f, x, y); break;
    case UYVY: c = fetch_rgb<UYVY>(f, x, y); break;
    case BGR: c = fetch_rgb<BGR>(f, x, y); break;
    default: c = fetch_rgb<RGB>(f, x, y); break;
    }
    for (int i = 0; i < n_boxes; ++i) {
        const int4 b = boxes[i];
        const bool outer = x >= b.x && x < b.z && y >= b.y && y < b.w;
        const bool inner = x >= b.x + thickness && x < b.z - thickness && y >= b.y + thickness && y < b.w - thickness;
        if (outer && !inner) c = make_float3(0.f, 255.f, 0.f);
    }
    unsigned char* p = out + static_cast<size_t>(y) * out_pitch + x * 3;
    p[0] = static_cast<unsigned char>(__float2uint_rn(c.x));
    p[1] = static_cast<unsigned char>(__float2uint_rn(c.y));
    p[2] = static_cast<unsigned char>(__float2uint_rn(c.z));
}
