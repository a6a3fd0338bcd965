// Postprocessing reductions on the GPU: the engine's outputs stay in device
// memory and only compact per-frame results are copied to the host.
//   db_*      text detection (DB): threshold -> 8-connected components (union-find)
//             -> per component bounding box, area, probability sum and pixel moments
//   topk      classification: row statistics + the k largest values per frame
//   yolo_*    detection: decode + score filter -> sort by score -> greedy
//             class-aware NMS, at most K detections per frame; yolo_carry gathers
//             each kept box's extra rows (pose keypoints)
//   seg_masks instance segmentation: each kept box's mask (coefficients x prototypes,
//             sampled up to network pixels, cut to its box), bit-packed
//   seg_outlines  each mask's largest outline, simplified, as OpenCV traces it (outline.cuh)
//   argmax    semantic segmentation: each class's pixels in the content, and the content's classes sampled
// The host finishes each (the task modules in jetpipe/tasks) with the same code
// as the CPU postprocessors, so both paths give the same results.

// ---------------------------------------------------------------- DB components
struct Component {        // 88 bytes; mirrors COMPONENT in postprocess_gpu.py
    int x0, y0, x1, y1;   // inclusive bounding box in network-input pixels
    int area;
    float angle;          // the direction db_extents measured along (radians; the host builds the quad on it)
    unsigned long long sum;  // probability sum in 32.32 fixed point: exact and order-independent
    // sums of x, y, x*x, y*y, x*y over the pixels (integers: exact): the region's orientation
    unsigned long long sx, sy, sxx, syy, sxy;
    // extent of the pixel centres along and across that orientation, 1/16 pixel (floor / ceil)
    int along_min, along_max, across_min, across_max;
};

__device__ __forceinline__ int find_root(const int* labels, int i) {
    int parent = labels[i];
    while (parent != i) {
        i = parent;
        parent = labels[i];
    }
    return i;
}

// Playne & Hawick's union: link the larger root under the smaller one, so every
// component's root ends as its first pixel in raster order.
__device__ void unite(int* labels, int a, int b) {
    bool done = false;
    while (!done) {
        a = find_root(labels, a);
        b = find_root(labels, b);
        if (a < b) {
            int old = atomicMin(&labels[b], a);
            done = old == b;
            b = old;
        } else if (b < a) {
            int old = atomicMin(&labels[a], b);
            done = old == a;
            a = old;
        } else {
            done = true;
        }
    }
}

extern "C" __global__ void db_init(const float* __restrict__ prob, int* __restrict__ labels, int* counts,
                                   int total, int batch, float threshold) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < batch) counts[i] = 0;
    if (i < total) labels[i] = prob[i] > threshold ? i : -1;
}

extern "C" __global__ void db_merge(int* labels, int height, int width) {
    int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
    if (x >= width || y >= height) return;
    int base = blockIdx.z * height * width, i = base + y * width + x;
    if (labels[i] < 0) return;
    if (x > 0 && labels[i - 1] >= 0) unite(labels, i, i - 1);
    if (y > 0) {
        int up = i - width;
        if (x > 0 && labels[up - 1] >= 0) unite(labels, i, up - 1);
        if (labels[up] >= 0) unite(labels, i, up);
        if (x + 1 < width && labels[up + 1] >= 0) unite(labels, i, up + 1);
    }
}

// Every root takes a slot in its frame's list (first come; the host sorts).
extern "C" __global__ void db_roots(const int* __restrict__ labels, int* __restrict__ slots, int* counts,
                                    Component* components, int total, int frame_pixels, int limit) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total || labels[i] != i) return;
    int frame = i / frame_pixels;
    int slot = atomicAdd(&counts[frame], 1);
    slots[i] = slot;
    if (slot < limit) {
        Component c = {0x7fffffff, 0x7fffffff, -1, -1, 0, 0.f, 0ull, 0ull, 0ull, 0ull, 0ull, 0ull,
                       0x7fffffff, -0x7fffffff, 0x7fffffff, -0x7fffffff};
        components[frame * limit + slot] = c;
    }
}

// Warp-wide reductions (a block row of 32 threads is one warp: 32 neighbouring pixels of a row).
__device__ __forceinline__ unsigned long long warp_sum(unsigned long long v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ int warp_min(int v) {
    for (int o = 16; o > 0; o >>= 1) v = min(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
__device__ __forceinline__ int warp_max(int v) {
    for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// The list slot of pixel (x, y)'s region, or -1 (background, outside the map, over the list's limit).
__device__ __forceinline__ int region_slot(int* labels, const int* __restrict__ slots, int height, int width,
                                           int limit, int x, int y, int& i) {
    i = blockIdx.z * height * width + y * width + x;
    if (x >= width || y >= height || labels[i] < 0) return -1;
    const int slot = slots[find_root(labels, i)];
    return slot < limit ? slot : -1;  // more components than the list holds: counted by the host
}

// One warp is one region more often than not inside a text line: then its 32 pixels are summed in
// registers and one thread updates the region (11 atomics instead of 352 on the same addresses).
__device__ __forceinline__ bool whole_warp(int slot) {
    return __all_sync(0xffffffffu, slot == __shfl_sync(0xffffffffu, slot, 0));
}

extern "C" __global__ void db_stats(const float* __restrict__ prob, int* labels, const int* __restrict__ slots,
                                    Component* components, int height, int width, int limit) {
    int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y, i;
    const int slot = region_slot(labels, slots, height, width, limit, x, y, i);
    const bool shared = whole_warp(slot);
    if (slot < 0) return;
    Component* c = components + blockIdx.z * limit + slot;
    const unsigned long long ux = x, uy = y;
    const unsigned long long p = __double2ull_rn((double)prob[i] * 4294967296.0);
    if (shared) {
        const int x0 = warp_min(x), x1 = warp_max(x);
        const unsigned long long sp = warp_sum(p), sx = warp_sum(ux), sxx = warp_sum(ux * ux);
        const unsigned long long sxy = warp_sum(ux * uy);
        if ((threadIdx.x & 31) != 0) return;
        atomicMin(&c->x0, x0);
        atomicMin(&c->y0, y);
        atomicMax(&c->x1, x1);
        atomicMax(&c->y1, y);
        atomicAdd(&c->area, 32);
        atomicAdd(&c->sum, sp);
        atomicAdd(&c->sx, sx);
        atomicAdd(&c->sy, 32ull * uy);
        atomicAdd(&c->sxx, sxx);
        atomicAdd(&c->syy, 32ull * uy * uy);
        atomicAdd(&c->sxy, sxy);
        return;
    }
    atomicMin(&c->x0, x);
    atomicMin(&c->y0, y);
    atomicMax(&c->x1, x);
    atomicMax(&c->y1, y);
    atomicAdd(&c->area, 1);
    atomicAdd(&c->sum, p);
    atomicAdd(&c->sx, ux);
    atomicAdd(&c->sy, uy);
    atomicAdd(&c->sxx, ux * ux);
    atomicAdd(&c->syy, uy * uy);
    atomicAdd(&c->sxy, ux * uy);
}

// The text's direction from a region's moments: the covariance's axis nearest horizontal, folded into
// [-pi/4, pi/4) (mirrors TextDetection's orientation() in jetpipe/tasks/text_detection.py).
__device__ double orientation(const Component& c) {
    const double n = c.area > 0 ? (double)c.area : 1.0;
    const double mx = c.sx / n, my = c.sy / n;
    const double cxx = c.sxx / n - mx * mx, cyy = c.syy / n - my * my, cxy = c.sxy / n - mx * my;
    const double quarter = 0.78539816339744830962;
    double a = 0.5 * atan2(2.0 * cxy, cxx - cyy) + quarter;
    a = fmod(a, 2.0 * quarter);
    if (a < 0) a += 2.0 * quarter;
    a -= quarter;
    // a region at 45 degrees folds either way on rounding (the device fuses multiply-adds, numpy does not):
    // both sides name it -45
    return a > quarter - 1e-6 ? a - 2.0 * quarter : a;
}

// After db_stats: each pixel's centre projected on its region's axes; the extremes in 1/16 pixel.
extern "C" __global__ void db_extents(int* labels, const int* __restrict__ slots, Component* components,
                                      int height, int width, int limit) {
    int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y, i;
    const int slot = region_slot(labels, slots, height, width, limit, x, y, i);
    const bool shared = whole_warp(slot);
    if (slot < 0) return;
    Component* c = components + blockIdx.z * limit + slot;
    // rounded to float, as it is stored: the host decides and builds on exactly this value
    const double a = (double)(float)orientation(*c), cs = cos(a), sn = sin(a);
    const double px = x + 0.5, py = y + 0.5;
    const double along = (px * cs + py * sn) * 16.0, across = (py * cs - px * sn) * 16.0;
    int a0 = (int)floor(along), a1 = (int)ceil(along), b0 = (int)floor(across), b1 = (int)ceil(across);
    if (shared) {
        a0 = warp_min(a0), a1 = warp_max(a1), b0 = warp_min(b0), b1 = warp_max(b1);
        if ((threadIdx.x & 31) != 0) return;
    }
    c->angle = (float)a;  // every writer writes the same value
    atomicMin(&c->along_min, a0);
    atomicMax(&c->along_max, a1);
    atomicMin(&c->across_min, b0);
    atomicMax(&c->across_max, b1);
}

// ---------------------------------------------------------------- classification top-k
// One block per frame. stats: max, min, sum, sum(exp(v - max)); ties go to the lower index.
#define TOPK_THREADS 256
#define INF_F __int_as_float(0x7f800000)

__device__ float block_reduce(float v, float* shared, int op) {  // op 0: max, 1: min, 2: sum
    for (int offset = 16; offset > 0; offset >>= 1) {
        float other = __shfl_down_sync(0xffffffff, v, offset);
        v = op == 0 ? fmaxf(v, other) : op == 1 ? fminf(v, other) : v + other;
    }
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    v = shared[0];
    for (int w = 1; w < TOPK_THREADS / 32; w++) {
        float other = shared[w];
        v = op == 0 ? fmaxf(v, other) : op == 1 ? fminf(v, other) : v + other;
    }
    return v;
}

extern "C" __global__ void topk(const float* __restrict__ logits, int classes, int k,
                                int* __restrict__ top_index, float* __restrict__ top_value,
                                float* __restrict__ stats) {
    __shared__ float scratch[TOPK_THREADS / 32];
    __shared__ float best_value[TOPK_THREADS];
    __shared__ int best_index[TOPK_THREADS];
    __shared__ int chosen[64];
    const float* row = logits + (size_t)blockIdx.x * classes;
    float mx = -INF_F, mn = INF_F, sum = 0.f;
    for (int c = threadIdx.x; c < classes; c += TOPK_THREADS) {
        float v = row[c];
        mx = fmaxf(mx, v); mn = fminf(mn, v); sum += v;
    }
    mx = block_reduce(mx, scratch, 0);
    mn = block_reduce(mn, scratch, 1);
    sum = block_reduce(sum, scratch, 2);
    float sum_exp = 0.f;
    for (int c = threadIdx.x; c < classes; c += TOPK_THREADS) sum_exp += expf(row[c] - mx);
    sum_exp = block_reduce(sum_exp, scratch, 2);
    for (int r = 0; r < k; r++) {
        float v = -INF_F;
        int index = 0x7fffffff;
        for (int c = threadIdx.x; c < classes; c += TOPK_THREADS) {
            bool taken = false;
            for (int j = 0; j < r; j++) taken |= chosen[j] == c;
            float value = row[c];
            if (!taken && (value > v || (value == v && c < index) || index == 0x7fffffff)) {
                v = value;
                index = c;
            }
        }
        best_value[threadIdx.x] = v;
        best_index[threadIdx.x] = index;
        __syncthreads();
        for (int stride = TOPK_THREADS / 2; stride > 0; stride >>= 1) {
            if (threadIdx.x < stride) {
                float ov = best_value[threadIdx.x + stride];
                int oi = best_index[threadIdx.x + stride];
                float mv = best_value[threadIdx.x];
                int mi = best_index[threadIdx.x];
                if (oi != 0x7fffffff && (mi == 0x7fffffff || ov > mv || (ov == mv && oi < mi))) {
                    best_value[threadIdx.x] = ov;
                    best_index[threadIdx.x] = oi;
                }
            }
            __syncthreads();
        }
        if (threadIdx.x == 0) {
            chosen[r] = best_index[0];
            top_index[blockIdx.x * k + r] = best_index[0];
            top_value[blockIdx.x * k + r] = best_value[0];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        float* s = stats + blockIdx.x * 4;
        s[0] = mx; s[1] = mn; s[2] = sum; s[3] = sum_exp;
    }
}

// ---------------------------------------------------------------- YOLO decode + NMS
enum { YOLOV8 = 0, YOLOV5 = 1, YOLOX = 2 };

struct YoloParams {       // mirrors YOLO_PARAMS in postprocess_gpu.py
    int layout, anchors, classes, limit;
    float score_threshold, iou_threshold;
    int input_h, input_w;
    int strides[4];
    int levels, keys_per_frame;
    int channels;         // rows a YOLOv8 anchor has (4 + classes + carried rows), values a YOLOv5 anchor has
};

__device__ __forceinline__ float channel(const float* out, const YoloParams& p, int anchor, int ch) {
    if (p.layout == YOLOV8) return out[(size_t)ch * p.anchors + anchor];      // [4 + C (+ carried), N]
    return out[(size_t)anchor * p.channels + ch];                               // [N, 5 + C]
}

__device__ float best_class(const float* out, const YoloParams& p, int anchor, int* cls) {
    int first = p.layout == YOLOV8 ? 4 : 5;
    float obj = p.layout == YOLOV8 ? 1.f : channel(out, p, anchor, 4);
    float best = channel(out, p, anchor, first) * obj;
    int best_c = 0;
    for (int c = 1; c < p.classes; c++) {
        float v = channel(out, p, anchor, first + c) * obj;
        if (v > best) { best = v; best_c = c; }
    }
    *cls = best_c;
    return best;
}

__device__ float4 box_xyxy(const float* out, const YoloParams& p, int anchor) {
    float cx = channel(out, p, anchor, 0), cy = channel(out, p, anchor, 1);
    float w = channel(out, p, anchor, 2), h = channel(out, p, anchor, 3);
    if (p.layout == YOLOX) {  // raw grid outputs: (offset + cell) * stride, exp(size) * stride
        int index = anchor;
        for (int level = 0; level < p.levels; level++) {
            int s = p.strides[level], gw = p.input_w / s, cells = (p.input_h / s) * gw;
            if (index < cells) {
                cx = (cx + index % gw) * s; cy = (cy + index / gw) * s;
                w = expf(w) * s; h = expf(h) * s;
                break;
            }
            index -= cells;
        }
    }
    return make_float4(cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2);
}

// keys: (inverted score bits << 32 | anchor): ascending order = score descending, then anchor.
extern "C" __global__ void yolo_candidates(const float* __restrict__ outputs, const YoloParams* params,
                                           int* counts, unsigned long long* keys, int* classes, float* scores) {
    const YoloParams p = *params;
    int anchor = blockIdx.x * blockDim.x + threadIdx.x, frame = blockIdx.y;
    if (anchor >= p.anchors) return;
    const float* out = outputs + (size_t)frame * p.anchors * p.channels;
    int cls;
    float score = best_class(out, p, anchor, &cls);
    if (!(score > p.score_threshold)) return;  // OpenCV's NMS keeps scores above the threshold
    size_t at = (size_t)frame * p.anchors + anchor;
    classes[at] = cls;
    scores[at] = score;
    int slot = atomicAdd(&counts[frame], 1);
    unsigned int bits = __float_as_uint(fmaxf(score, 0.f));
    keys[(size_t)frame * p.keys_per_frame + slot] = ((unsigned long long)(0xffffffffu - bits) << 32) | anchor;
}

#define NMS_THREADS 1024

// One block per frame: bitonic sort of its keys (in global memory), then greedy NMS.
// detections: [limit, 6] x0 y0 x1 y1 score class; kept_anchors: [limit] the anchor of each.
extern "C" __global__ void yolo_nms(const float* __restrict__ outputs, const YoloParams* params, const int* counts,
                                    unsigned long long* keys, const int* classes, const float* scores,
                                    int* kept_counts, float* detections, int* kept_anchors) {
    const YoloParams p = *params;
    __shared__ float4 kept_box[NMS_THREADS];
    __shared__ int kept_class[NMS_THREADS];
    int frame = blockIdx.x, count = counts[frame];
    unsigned long long* k = keys + (size_t)frame * p.keys_per_frame;
    const float* out = outputs + (size_t)frame * p.anchors * p.channels;
    int padded = 1;
    while (padded < count) padded <<= 1;
    for (int i = count + threadIdx.x; i < padded; i += NMS_THREADS) k[i] = ~0ull;
    __syncthreads();
    for (int size = 2; size <= padded; size <<= 1) {
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            for (int i = threadIdx.x; i < padded; i += NMS_THREADS) {
                int j = i ^ stride;
                if (j > i) {
                    bool ascending = (i & size) == 0;
                    unsigned long long a = k[i], b = k[j];
                    if ((a > b) == ascending) { k[i] = b; k[j] = a; }
                }
            }
            __syncthreads();
        }
    }
    int kept = 0;
    for (int r = 0; r < count && kept < p.limit; r++) {
        int anchor = (int)(k[r] & 0xffffffffu);
        size_t at = (size_t)frame * p.anchors + anchor;
        int cls = classes[at];
        float4 b = box_xyxy(out, p, anchor);
        bool suppress = false;
        for (int j = threadIdx.x; j < kept; j += NMS_THREADS) {
            if (kept_class[j] != cls) continue;
            float4 o = kept_box[j];
            float iw = fminf(b.z, o.z) - fmaxf(b.x, o.x), ih = fminf(b.w, o.w) - fmaxf(b.y, o.y);
            float inter = (iw > 0.f && ih > 0.f) ? iw * ih : 0.f;
            float areas = (b.z - b.x) * (b.w - b.y) + (o.z - o.x) * (o.w - o.y);
            float overlap = areas <= 1.1920929e-07f ? 1.f : inter / (areas - inter);
            suppress |= overlap > p.iou_threshold;
        }
        if (__syncthreads_or(suppress)) continue;
        if (threadIdx.x == 0) {
            kept_box[kept] = b;
            kept_class[kept] = cls;
            float* d = detections + ((size_t)frame * p.limit + kept) * 6;
            d[0] = b.x; d[1] = b.y; d[2] = b.z; d[3] = b.w; d[4] = scores[at]; d[5] = (float)cls;
            kept_anchors[(size_t)frame * p.limit + kept] = anchor;
        }
        kept++;
        __syncthreads();
    }
    if (threadIdx.x == 0) kept_counts[frame] = kept;
}

// One block per (kept box, frame): rows first .. first + carry - 1 of the box's anchor (YOLOv8 layout) to
// carried[frame, box, :]. `carried` is mapped host memory: only the kept boxes' rows cross the bus.
extern "C" __global__ void yolo_carry(const float* __restrict__ outputs, const YoloParams* params,
                                      const int* kept_counts, const int* kept_anchors, int first, int carry,
                                      float* carried) {
    const YoloParams p = *params;
    int box = blockIdx.x, frame = blockIdx.y;
    if (box >= kept_counts[frame]) return;
    const float* out = outputs + (size_t)frame * p.anchors * p.channels;
    int anchor = kept_anchors[(size_t)frame * p.limit + box];
    float* row = carried + ((size_t)frame * p.limit + box) * carry;
    for (int i = threadIdx.x; i < carry; i += blockDim.x) row[i] = channel(out, p, anchor, first + i);
}

// ---------------------------------------------------------------- instance masks (YOLOv8/11-seg)
struct SegParams {        // mirrors SEG_PARAMS in postprocess_gpu.py
    int coefficients, proto_h, proto_w, first;  // first: the head's row of the first mask coefficient
    int cap_words;        // mask words a frame holds; boxes past it get no mask (the host says so)
    float scale_x, scale_y;  // prototype pixels per network pixel
};

#define SEG_THREADS 256   // 8 warps: a tile of 32 x 8 network pixels, one mask word per warp
#define SEG_MAX_COEFFICIENTS 64
#define SEG_WINDOW 64     // prototype pixels a tile reads (10 x 4 at a quarter of the input's size)

// A box's region in network pixels (floor / ceil of its corners inside the input) and its mask words
// (32 pixels a word, rows padded to whole words): the rule the host lays the words out by, too.
__device__ int region_words(const float* d, const YoloParams& p, int* x0, int* y0, int* x1, int* y1) {
    *x0 = (int)floorf(fminf(fmaxf(d[0], 0.f), (float)p.input_w));
    *y0 = (int)floorf(fminf(fmaxf(d[1], 0.f), (float)p.input_h));
    *x1 = (int)ceilf(fminf(fmaxf(d[2], 0.f), (float)p.input_w));
    *y1 = (int)ceilf(fminf(fmaxf(d[3], 0.f), (float)p.input_h));
    if (*x1 <= *x0 || *y1 <= *y0) return 0;
    return (*y1 - *y0) * ((*x1 - *x0 + 31) / 32);
}

// Where a box's words start: the words of the frame's boxes before it, summed by a whole warp (every lane
// calls it) and known to all its lanes.
__device__ int words_before(const float* dets, const YoloParams& p, int box, int lane) {
    int x0, y0, x1, y1, sum = 0;
    for (int i = lane; i < box; i += 32) sum += region_words(dets + i * 6, p, &x0, &y0, &x1, &y1);
    for (int offset = 16; offset > 0; offset >>= 1) sum += __shfl_down_sync(0xffffffff, sum, offset);
    return __shfl_sync(0xffffffff, sum, 0);
}

__device__ __forceinline__ int clampi(int v, int lo, int hi) { return v < lo ? lo : (v > hi ? hi : v); }

// Grid (limit, frames, parts): the parts of a box's block share its tiles. Each box's mask is
// coefficients . prototypes at prototype pixels (a tile's window of them in shared memory), sampled
// bilinearly at the network pixels' centres (half-pixel, edges replicated), above 0 and inside the box.
// Words laid out box after box in NMS order from frame * cap_words; used[frame]: the words written.
extern "C" __global__ void seg_masks(const float* __restrict__ head, const float* __restrict__ protos,
                                     const YoloParams* params, const SegParams* seg_params, const int* kept_counts,
                                     const int* kept_anchors, const float* __restrict__ detections,
                                     unsigned* words, int* used) {
    const YoloParams p = *params;
    const SegParams s = *seg_params;
    __shared__ float coefficient[SEG_MAX_COEFFICIENTS];
    __shared__ float logit[SEG_WINDOW];
    __shared__ int start;
    int box = blockIdx.x, frame = blockIdx.y, lane = threadIdx.x & 31, row = threadIdx.x >> 5;
    if (box >= kept_counts[frame]) return;
    const float* dets = detections + (size_t)frame * p.limit * 6;
    int x0, y0, x1, y1;
    if (threadIdx.x < 32) {  // the first warp
        int before = words_before(dets, p, box, lane);
        if (lane == 0) start = before;
    }
    int anchor = kept_anchors[(size_t)frame * p.limit + box];
    const float* out = head + (size_t)frame * p.anchors * p.channels;
    for (int i = threadIdx.x; i < s.coefficients; i += SEG_THREADS) coefficient[i] = channel(out, p, anchor, s.first + i);
    __syncthreads();
    const float* d = dets + box * 6;
    int count = region_words(d, p, &x0, &y0, &x1, &y1);
    if (count == 0 || start + count > s.cap_words) return;
    if (blockIdx.z == 0 && threadIdx.x == 0) atomicMax(&used[frame], start + count);
    const size_t plane = (size_t)s.proto_h * s.proto_w;
    const float* proto = protos + (size_t)frame * s.coefficients * plane;
    unsigned* mask = words + (size_t)frame * s.cap_words + start;
    int per_row = (x1 - x0 + 31) / 32, tiles_x = per_row, tiles = tiles_x * ((y1 - y0 + 7) / 8);
    for (int tile = blockIdx.z; tile < tiles; tile += gridDim.z) {
        int tx = x0 + (tile % tiles_x) * 32, ty = y0 + (tile / tiles_x) * 8;
        int wx0 = clampi((int)floorf((tx + 0.5f) * s.scale_x - 0.5f), 0, s.proto_w - 1);
        int wx1 = clampi((int)floorf((tx + 31.5f) * s.scale_x - 0.5f) + 1, 0, s.proto_w - 1);
        int wy0 = clampi((int)floorf((ty + 0.5f) * s.scale_y - 0.5f), 0, s.proto_h - 1);
        int wy1 = clampi((int)floorf((ty + 7.5f) * s.scale_y - 0.5f) + 1, 0, s.proto_h - 1);
        int ww = wx1 - wx0 + 1, wh = wy1 - wy0 + 1;
        for (int i = threadIdx.x; i < ww * wh; i += SEG_THREADS) {
            const float* at = proto + (size_t)(wy0 + i / ww) * s.proto_w + wx0 + i % ww;
            float v = 0.f;
            for (int m = 0; m < s.coefficients; m++) v = fmaf(coefficient[m], at[m * plane], v);
            logit[i] = v;
        }
        __syncthreads();
        int px = tx + lane, py = ty + row;
        bool on = false;
        if (px < x1 && py < y1 && (float)px >= d[0] && (float)px < d[2] && (float)py >= d[1] && (float)py < d[3]) {
            float sx = (px + 0.5f) * s.scale_x - 0.5f, sy = (py + 0.5f) * s.scale_y - 0.5f;
            float fx = floorf(sx), fy = floorf(sy), ax = sx - fx, ay = sy - fy;
            int ix0 = clampi((int)fx, 0, s.proto_w - 1) - wx0, ix1 = clampi((int)fx + 1, 0, s.proto_w - 1) - wx0;
            int iy0 = clampi((int)fy, 0, s.proto_h - 1) - wy0, iy1 = clampi((int)fy + 1, 0, s.proto_h - 1) - wy0;
            float top = (1.f - ax) * logit[iy0 * ww + ix0] + ax * logit[iy0 * ww + ix1];
            float bottom = (1.f - ax) * logit[iy1 * ww + ix0] + ax * logit[iy1 * ww + ix1];
            on = (1.f - ay) * top + ay * bottom > 0.f;
        }
        unsigned bits = __ballot_sync(0xffffffff, on);
        if (lane == 0 && py < y1) mask[(size_t)(py - y0) * per_row + (tx - x0) / 32] = bits;
        __syncthreads();
    }
}

#include "outline.cuh"

#define OUTLINE_SHARED_WORDS 4096  // a box's padded words and flags held in shared memory (48 KB); more: the host's

// outline_largest by a warp: 32 words at a time find their starts together, and lane 0 takes them in raster
// order (the other lanes wait at the next shuffle).
__device__ void warp_largest(const OutlineMask& m, OutlineScan* scan) {
    int lane = threadIdx.x, first = m.stride, end = (m.height + 1) * m.stride;  // the rows past the zero row
    for (int base = first; base < end; base += 32) {
        unsigned starts = base + lane < end ? outline_starts(m, base + lane) : 0u;
        unsigned lanes = __ballot_sync(0xffffffff, starts != 0u);
        while (lanes) {
            int from = __ffs(lanes) - 1;
            lanes &= lanes - 1;
            unsigned word_starts = __shfl_sync(0xffffffff, starts, from);
            if (lane == 0) {
                int at = base + from, y = at / m.stride - 1, x0 = (at % m.stride) * 32 - 2;
                for (; word_starts; word_starts &= word_starts - 1)
                    outline_candidate(m, x0 + __ffs(word_starts), y, scan);
            }
            __syncwarp();
        }
    }
}

// Grid (limit, frames), one warp a box: each kept box's outline from its mask's words (seg_masks', in device
// memory): the largest outer border simplified to within `tolerance` pixels (0: as traced), the CPU path's
// trace_outlines point for point; segment: the installed OpenCV's Douglas-Peucker distance (to the chord's
// segment, else its line). The warp pads the box's mask into shared memory, clears its flags, counts its pixels
// and scans; lane 0 traces and simplifies, the chains in the frame's part of `chains` (chain_used: taken).
// outlines[frame, box] = {first point, points, pixels}; the points (network pixels) are at points[frame *
// point_cap + first], mapped host memory: only they cross the bus. Points -1: the mask was too large for shared
// memory or its outline did not fit the chains' or the points' room: the box's words are copied to
// spilled_words at their place in the frame's words for the host to trace (spilled[frame]: the words copied);
// -2: the mask did not fit the words (none).
extern "C" __global__ void seg_outlines(const YoloParams* params, const SegParams* seg_params, const int* kept_counts,
                                        const float* __restrict__ detections, const unsigned* __restrict__ words,
                                        int* chains, int chain_cap, int* chain_used, short2* points, int point_cap,
                                        int* point_used, int* outlines, unsigned* spilled_words, int* spilled,
                                        double tolerance, int segment) {
    extern __shared__ unsigned held[];  // the padded mask, then each flag, OUTLINE_SHARED_WORDS apiece
    const YoloParams p = *params;
    const SegParams s = *seg_params;
    int box = blockIdx.x, frame = blockIdx.y, lane = threadIdx.x;
    if (box >= kept_counts[frame]) return;
    const float* dets = detections + (size_t)frame * p.limit * 6;
    int x0, y0, x1, y1, start = words_before(dets, p, box, lane);
    int count = region_words(dets + box * 6, p, &x0, &y0, &x1, &y1);
    int* out = outlines + ((size_t)frame * p.limit + box) * 3;
    if (count == 0 || start + count > s.cap_words) {
        if (lane == 0) { out[0] = 0; out[1] = count ? -2 : 0; out[2] = 0; }
        return;
    }
    const unsigned* mask = words + (size_t)frame * s.cap_words + start;
    int width = x1 - x0, height = y1 - y0, total = outline_padded_words(width, height), pixels = 0;
    for (int i = lane; i < count; i += 32) pixels += __popc(mask[i]);
    for (int offset = 16; offset > 0; offset >>= 1) pixels += __shfl_down_sync(0xffffffff, pixels, offset);
    pixels = __shfl_sync(0xffffffff, pixels, 0);
    int spill = total > OUTLINE_SHARED_WORDS, first = 0, n = 0;
    if (pixels && !spill) {
        unsigned *marked = held + OUTLINE_SHARED_WORDS, *right = held + 2 * OUTLINE_SHARED_WORDS;
        for (int i = lane; i < total; i += 32) {
            held[i] = outline_padded_word(mask, width, height, i);
            marked[i] = 0u;
            right[i] = 0u;
        }
        // the chains of the scan (the best's and the one being traced) and the simplification's output and
        // stack: a border's points while they fit `room`; past it the best is traced again into room of its own
        int room = 2 * (width + height) + 64, part = 2 * room + 2, at = 0;
        if (lane == 0) at = atomicAdd(&chain_used[frame], 3 * part);
        at = __shfl_sync(0xffffffff, at, 0);
        spill = at + 3 * part > chain_cap;
        __syncwarp();
        if (!spill) {
            int* chain = chains + (size_t)frame * chain_cap + at;
            OutlineMask m = {held, marked, right, width, height, outline_stride(width)};
            OutlineScan scan = {{-1, -1}, 0, 0, room, chain, chain + part};
            warp_largest(m, &scan);
            if (lane == 0) {
                n = scan.best.points;
                int *traced = scan.kept, *simple = scan.spare, *stack = chain + 2 * part;
                if (n > room) {
                    int need = 6 * n + 2, again = atomicAdd(&chain_used[frame], need);
                    spill = again + need > chain_cap;
                    traced = chains + (size_t)frame * chain_cap + again;
                    simple = traced + 2 * n;
                    stack = simple + 2 * n;
                    if (!spill) outline_trace(m, scan.bx, scan.by, false, traced, n);
                }
                if (!spill && tolerance > 0) {
                    n = outline_simplify(traced, n, simple, (OutlineRange*)stack, tolerance, segment != 0);
                    traced = simple;
                }
                if (!spill) {
                    first = atomicAdd(&point_used[frame], n);
                    spill = first + n > point_cap;
                }
                if (!spill) {
                    short2* to = points + (size_t)frame * point_cap + first;
                    for (int i = 0; i < n; i++) to[i] = make_short2(traced[2 * i] + x0, traced[2 * i + 1] + y0);
                }
            }
        }
    }
    spill = __shfl_sync(0xffffffff, spill, 0);
    if (lane == 0) {
        out[0] = first;
        out[1] = spill ? -1 : n;
        out[2] = pixels;
    }
    if (spill) {
        for (int i = lane; i < count; i += 32) spilled_words[(size_t)frame * s.cap_words + start + i] = mask[i];
        if (lane == 0) atomicAdd(&spilled[frame], count);
    }
}

// ---------------------------------------------------------------- semantic segmentation
// [N, C, h, w] logits. Each frame's content on the map: MapContent {x0, y0, x1, y1, step} (the letterboxed
// part, and every how many pixels its outlines are read). The best class of a pixel is the first of equal
// values, as numpy's argmax.
__device__ __forceinline__ int best_class(const float* __restrict__ at, int classes, size_t pixels) {
    float top = at[0];
    int index = 0;
    for (int c = 1; c < classes; c++) {
        float v = at[(size_t)c * pixels];
        if (v > top) { top = v; index = c; }
    }
    return index;
}

// Grid (blocks over the map, frames), dynamic shared memory: one int a class. counts [N, C] zeroed before:
// each class's pixels inside the frame's content.
extern "C" __global__ void class_counts(const float* __restrict__ logits, int classes, int height, int width,
                                        const int* __restrict__ content, int* counts) {
    extern __shared__ int histogram[];
    int frame = blockIdx.y, pixels = height * width, i = blockIdx.x * blockDim.x + threadIdx.x;
    for (int c = threadIdx.x; c < classes; c += blockDim.x) histogram[c] = 0;
    __syncthreads();
    const int* r = content + frame * 5;
    int y = i / width, x = i - y * width;
    if (i < pixels && x >= r[0] && x < r[2] && y >= r[1] && y < r[3])
        atomicAdd(&histogram[best_class(logits + (size_t)frame * classes * pixels + i, classes, pixels)], 1);
    __syncthreads();
    for (int c = threadIdx.x; c < classes; c += blockDim.x)
        if (histogram[c]) atomicAdd(&counts[frame * classes + c], histogram[c]);
}

// Grid (blocks over side x side, frames): the content's best class every step pixels from step / 2, row by row
// into the frame's side x side array (what is past the content: 0).
template <typename T>
__device__ void sampled_classes(const float* __restrict__ logits, int classes, int height, int width,
                                const int* __restrict__ content, int side, T* sampled) {
    int frame = blockIdx.y, i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= side * side) return;
    const int* r = content + frame * 5;
    int step = r[4], row = i / side, column = i - row * side;
    int y = r[1] + step / 2 + row * step, x = r[0] + step / 2 + column * step;
    T value = 0;
    if (y < r[3] && x < r[2]) {
        size_t pixels = (size_t)height * width;
        value = (T)best_class(logits + frame * classes * pixels + (size_t)y * width + x, classes, pixels);
    }
    sampled[(size_t)frame * side * side + i] = value;
}

extern "C" __global__ void sampled_u8(const float* logits, int classes, int height, int width, const int* content,
                                      int side, unsigned char* sampled) {
    sampled_classes(logits, classes, height, width, content, side, sampled);
}

extern "C" __global__ void sampled_u16(const float* logits, int classes, int height, int width, const int* content,
                                       int side, unsigned short* sampled) {
    sampled_classes(logits, classes, height, width, content, side, sampled);
}
