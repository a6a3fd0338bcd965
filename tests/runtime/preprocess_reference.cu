// The one-pixel-a-thread preprocessing kernel as of 2026-11-24 (jetpipe/runtime/preprocess.cu before the
// pixel-quad rewrite for issue 27), kept as the reference the faster kernel must equal bit for bit
// (tests/runtime/test_gpu.py). Not used by jetpipe itself.
// Fused batch preprocessing: colour conversion + bilinear resize (letterbox or
// stretch) + scale/mean/std + channel order + NCHW, fp32 or fp16 output; or, for
// 1-channel networks (mode GRAY), the luma alone: a YUV frame's Y plane only.
// One launch per batch: grid.z = frame index; each frame has its own source
// size, format, colour matrix and placement (FrameParams). The arithmetic
// mirrors jetpipe/frames.py + cv2.resize(INTER_LINEAR) on float images.
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

// x, y: in what is read (the crop); the frame's own coordinates add the origin.
__device__ __forceinline__ float3 fetch_rgb(const FrameParams& f, int x, int y) {
    const unsigned char* base = reinterpret_cast<const unsigned char*>(f.src);
    x += f.origin_x;
    y += f.origin_y;
    float Y, U, V;
    switch (f.format) {
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
__device__ __forceinline__ float fetch_gray(const FrameParams& f, int x, int y) {
    const unsigned char* base = reinterpret_cast<const unsigned char*>(f.src);
    x += f.origin_x;
    y += f.origin_y;
    float Y;
    switch (f.format) {
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

template <typename T> __device__ __forceinline__ T to_out(float v);
template <> __device__ __forceinline__ float to_out<float>(float v) { return v; }
template <> __device__ __forceinline__ __half to_out<__half>(float v) { return __float2half_rn(v); }

// mul/add per *output* channel: out = pixel * mul + add (scale, mean, std folded in);
// mode BGR: output channel 0 takes blue; GRAY: one output channel, the luma (m0, a0).
template <typename T>
__device__ void preprocess(const FrameParams* __restrict__ params, T* __restrict__ out,
                           int out_w, int out_h, int batch, float pad,
                           float m0, float m1, float m2, float a0, float a1, float a2, int mode) {
    const int x = blockIdx.x * blockDim.x + threadIdx.x;
    const int y = blockIdx.y * blockDim.y + threadIdx.y;
    const int b = blockIdx.z;
    if (x >= out_w || y >= out_h || b >= batch) return;
    const FrameParams f = params[b];
    const int cx = x - f.pad_x, cy = y - f.pad_y;
    const bool inside = cx >= 0 && cy >= 0 && cx < f.content_w && cy < f.content_h;
    int x0 = 0, x1 = 0, y0 = 0, y1 = 0;
    float ax = 0.f, ay = 0.f;
    if (inside && f.warp) {
        warp_taps(f, cx, cy, x0, x1, ax, y0, y1, ay);
    } else if (inside) {
        tap(cx, f.scale_x, f.width, x0, x1, ax);
        tap(cy, f.scale_y, f.height, y0, y1, ay);
    }
    const size_t plane = static_cast<size_t>(out_w) * out_h;
    if (mode == MODE_GRAY) {
        float g = pad;
        if (inside) {
            const float top = fetch_gray(f, x0, y0) + (fetch_gray(f, x1, y0) - fetch_gray(f, x0, y0)) * ax;
            const float bottom = fetch_gray(f, x0, y1) + (fetch_gray(f, x1, y1) - fetch_gray(f, x0, y1)) * ax;
            g = top + (bottom - top) * ay;
        }
        out[static_cast<size_t>(b) * plane + static_cast<size_t>(y) * out_w + x] = to_out<T>(g * m0 + a0);
        return;
    }
    float3 rgb = make_float3(pad, pad, pad);
    if (inside) {
        const float3 top = lerp3(fetch_rgb(f, x0, y0), fetch_rgb(f, x1, y0), ax);
        const float3 bottom = lerp3(fetch_rgb(f, x0, y1), fetch_rgb(f, x1, y1), ax);
        rgb = lerp3(top, bottom, ay);
    }
    const bool swap_rb = mode == MODE_BGR;
    const float c0 = swap_rb ? rgb.z : rgb.x, c2 = swap_rb ? rgb.x : rgb.z;
    T* dst = out + static_cast<size_t>(b) * 3 * plane + static_cast<size_t>(y) * out_w + x;
    dst[0] = to_out<T>(c0 * m0 + a0);
    dst[plane] = to_out<T>(rgb.y * m1 + a1);
    dst[2 * plane] = to_out<T>(c2 * m2 + a2);
}

extern "C" __global__ void preprocess_f32(const FrameParams* params, float* out, int out_w, int out_h,
                                          int batch, float pad, float m0, float m1, float m2,
                                          float a0, float a1, float a2, int mode) {
    preprocess<float>(params, out, out_w, out_h, batch, pad, m0, m1, m2, a0, a1, a2, mode);
}

extern "C" __global__ void preprocess_f16(const FrameParams* params, __half* out, int out_w, int out_h,
                                          int batch, float pad, float m0, float m1, float m2,
                                          float a0, float a1, float a2, int mode) {
    preprocess<__half>(params, out, out_w, out_h, batch, pad, m0, m1, m2, a0, a1, a2, mode);
}
