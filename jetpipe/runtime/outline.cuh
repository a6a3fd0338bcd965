// Outlines of instance masks, traced and simplified as OpenCV does it, so that the GPU's outlines are the CPU
// path's point for point (jetpipe/tasks/segmentation_yolo.py: trace_outlines):
//   outline_candidate  findContours(RETR_EXTERNAL, CHAIN_APPROX_SIMPLE)'s raster scan, one start at a time, and
//                      the largest contour by area, then by points (Python's max over OpenCV's list, which
//                      holds the last found first); outline_largest: the whole scan (the kernel scans a warp's
//                      32 words at a time and hands the starts over in the same order)
//   outline_trace      Suzuki & Abe's border following of one outer border, as OpenCV's scanner follows it
//   outline_simplify   approxPolyDP(closed=True): Douglas-Peucker as OpenCV runs it, to the last clean-up pass
// The mask is held padded (outline_padded_word): pixel x of a row at bit x + 1, a zero bit before each row and
// a zero row above and below, OpenCV's zero border, so that a step reads its 3 x 3 neighbours without a bound
// to check. One thread traces a mask: border following is sequential, so each step is kept short.
//
// Written for both compilers: nvcc (the seg_outlines kernel in postprocess.cu) and a host C++ compiler (the
// tests compile it against OpenCV on the CPU machine, tests/runtime/test_outline_trace.py).
#pragma once

#ifdef __CUDACC__
#define OUTLINE_FN __device__
#define OUTLINE_FFS(v) __ffs(v)
#define OUTLINE_CLZ(v) __clz(v)
#define OUTLINE_FUNNEL(lo, hi, shift) __funnelshift_r(lo, hi, shift)
#else
#include <math.h>
#define OUTLINE_FN static
#define OUTLINE_FFS(v) __builtin_ffs(v)
#define OUTLINE_CLZ(v) __builtin_clz(v)
#define OUTLINE_FUNNEL(lo, hi, shift) ((unsigned)((((unsigned long long)(hi) << 32) | (lo)) >> (shift)))
#endif

// OpenCV's chain codes: 0 is right, then counter-clockwise on the screen (1 up-right, 2 up, ... 7 down-right);
// each code's dx + 1 and dy + 1 two bits apiece (a register, not a table in memory).
#define OUTLINE_DX(s) ((int)((36890u >> (2 * (s))) & 3u) - 1)
#define OUTLINE_DY(s) ((int)((43265u >> (2 * (s))) & 3u) - 1)

struct OutlineMask {
    const unsigned* words;  // the padded mask: height + 2 rows of `stride` words, and one word more
    unsigned* marked;       // the same layout, zeroed: border pixels a trace has passed
    unsigned* right;        // ... and those OpenCV flags as a right bound (its right neighbour is background)
    int width, height, stride;
};

struct OutlineTrace {
    int points;             // CHAIN_APPROX_SIMPLE points (where the direction changes)
    long long area2;        // twice the polygon's area (exact; OpenCV's contourArea in doubles is too)
};

struct OutlineRange {
    int start, end;
};

// The scan's state: the largest border so far, where it starts, and its chain while it fits `room` points
// (traces go to `spare`; the best's chain is in `kept`).
struct OutlineScan {
    OutlineTrace best;
    int bx, by, room;
    int* kept;
    int* spare;
};

OUTLINE_FN inline int outline_stride(int width) { return (width + 2 + 31) / 32; }

// Words of the padded layout: (height + 2) * stride, and one more that a step's reads may touch.
OUTLINE_FN inline int outline_padded_words(int width, int height) { return (height + 2) * outline_stride(width) + 1; }

// Word i of the padded layout of a mask bit-packed as seg_masks packs it (bit i of a word its i-th pixel from
// the left, rows of per_row words).
OUTLINE_FN inline unsigned outline_padded_word(const unsigned* words, int width, int height, int i) {
    int stride = outline_stride(width), per_row = (width + 31) / 32, row = i / stride - 1, w = i % stride;
    if (row < 0 || row >= height) return 0u;
    const unsigned* src = words + row * per_row;
    return (w < per_row ? src[w] << 1 : 0u) | (w > 0 ? src[w - 1] >> 31 : 0u);
}

OUTLINE_FN inline int outline_at(const OutlineMask& m, int x, int y) { return (y + 1) * m.stride * 32 + x + 1; }

OUTLINE_FN inline int outline_bit(const unsigned* bits, int at) { return (bits[at >> 5] >> (at & 31)) & 1u; }

OUTLINE_FN inline void outline_set(unsigned* bits, int at) { bits[at >> 5] |= 1u << (at & 31); }

// The 8 neighbours of (x, y) as bits by chain code (bit s: the neighbour in direction s is foreground): three
// rows of three pixels, six independent reads, what each step of a trace waits on.
OUTLINE_FN inline unsigned outline_neighbours(const OutlineMask& m, int x, int y) {
    int row = m.stride * 32, at = y * row + x;  // pixel (x - 1, y - 1)
    unsigned a = OUTLINE_FUNNEL(m.words[at >> 5], m.words[(at >> 5) + 1], at & 31);
    at += row;
    unsigned h = OUTLINE_FUNNEL(m.words[at >> 5], m.words[(at >> 5) + 1], at & 31);
    at += row;
    unsigned b = OUTLINE_FUNNEL(m.words[at >> 5], m.words[(at >> 5) + 1], at & 31);
    return ((h >> 2) & 1u) | ((a >> 1) & 2u) | ((a << 1) & 4u) | ((a << 3) & 8u) | ((h << 4) & 16u) |
           ((b << 5) & 32u) | ((b << 5) & 64u) | ((b << 5) & 128u);
}

// Follows the outer border that starts at (sx, sy) (its left neighbour is background) as OpenCV's
// icvFetchContourEx does. mark: flag its pixels as OpenCV's scanner does (right bound, else "new" where not
// flagged yet). xy: where to write its first `room` points (2 ints a point), or null. Returns all its points'
// count (more than `room`: the chain did not fit) and twice its area.
OUTLINE_FN OutlineTrace outline_trace(const OutlineMask& m, int sx, int sy, bool mark, int* xy, int room) {
    OutlineTrace t = {0, 0};
    unsigned around = outline_neighbours(m, sx, sy);
    int s = 4;
    do {  // clockwise from the left neighbour: the first foreground neighbour
        s = (s - 1) & 7;
    } while (!((around >> s) & 1u) && s != 4);
    if (s == 4) {  // a pixel alone
        if (mark) {
            outline_set(m.marked, outline_at(m, sx, sy));
            outline_set(m.right, outline_at(m, sx, sy));
        }
        if (xy && room > 0) {
            xy[0] = sx;
            xy[1] = sy;
        }
        t.points = 1;
        return t;
    }
    int x1 = sx + OUTLINE_DX(s), y1 = sy + OUTLINE_DY(s);
    int x3 = sx, y3 = sy, prev_s = s ^ 4;
    int fx = 0, fy = 0, lx = 0, ly = 0;  // the first and the last point written (the area's closing edge)
    for (;;) {
        int s_end = s;
        // counter-clockwise from the pixel it came from (direction s_end, foreground): the first foreground
        // neighbour after s_end, at s_end + 8 at the latest
        unsigned twice = around | (around << 8);
        s = (s_end + OUTLINE_FFS((int)(twice >> (s_end + 1)))) & 7;
        int x4 = x3 + OUTLINE_DX(s), y4 = y3 + OUTLINE_DY(s);
        if (mark) {
            int at = outline_at(m, x3, y3);
            if ((unsigned)(s - 1) < (unsigned)s_end) {  // the search passed the right neighbour: background
                outline_set(m.marked, at);
                outline_set(m.right, at);
            } else {
                outline_set(m.marked, at);  // "new" where it was not flagged yet; a right bound stays one
            }
        }
        if (s != prev_s) {
            if (t.points < room) {
                xy[2 * t.points] = x3;
                xy[2 * t.points + 1] = y3;
            }
            if (t.points == 0) {
                fx = x3;
                fy = y3;
            } else {
                t.area2 += (long long)lx * y3 - (long long)x3 * ly;
            }
            lx = x3;
            ly = y3;
            t.points++;
        }
        prev_s = s;
        if (x4 == sx && y4 == sy && x3 == x1 && y3 == y1) break;
        x3 = x4;
        y3 = y4;
        around = outline_neighbours(m, x3, y3);
        s = (s + 4) & 7;
    }
    t.area2 += (long long)lx * fy - (long long)fx * ly;
    if (t.area2 < 0) t.area2 = -t.area2;
    return t;
}

// Whether a candidate start (foreground, background to its left, not flagged) lies inside a border traced
// before it: OpenCV's RETR_EXTERNAL skips it when the last flagged pixel left of it on its row is not a right
// bound (the scan crossed into a traced component and has not crossed out of it).
OUTLINE_FN inline bool outline_inside(const OutlineMask& m, int x, int y) {
    int at = outline_at(m, x, y), first = (y + 1) * m.stride, w = at >> 5;
    unsigned bits = m.marked[w] & ((1u << (at & 31)) - 1u);
    while (!bits && w > first) bits = m.marked[--w];
    if (!bits) return false;
    return !outline_bit(m.right, w * 32 + 31 - OUTLINE_CLZ(bits));
}

// A start of the raster scan (foreground, background to its left), in raster order: traced unless it is on or
// inside a border traced before it; the largest kept (by area, then points; of equals the later).
OUTLINE_FN inline void outline_candidate(const OutlineMask& m, int x, int y, OutlineScan* scan) {
    if (outline_bit(m.marked, outline_at(m, x, y)) || outline_inside(m, x, y)) return;
    OutlineTrace t = outline_trace(m, x, y, true, scan->spare, scan->room);
    if (t.area2 > scan->best.area2 || (t.area2 == scan->best.area2 && t.points >= scan->best.points)) {
        scan->best = t;
        scan->bx = x;
        scan->by = y;
        int* kept = scan->kept;
        scan->kept = scan->spare;
        scan->spare = kept;
    }
}

// The starts of row y's padded word w (bit i: pixel w * 32 + i - 1).
OUTLINE_FN inline unsigned outline_starts(const OutlineMask& m, int i) {
    unsigned bits = m.words[i], before = i % m.stride ? m.words[i - 1] >> 31 : 0u;
    return bits & ~((bits << 1) | before);  // foreground with background to its left
}

// The whole scan (scan->best.points -1 after it: the mask is empty).
OUTLINE_FN void outline_largest(const OutlineMask& m, OutlineScan* scan) {
    for (int y = 0; y < m.height; y++) {
        for (int w = 0; w < m.stride; w++) {
            unsigned starts = outline_starts(m, (y + 1) * m.stride + w);
            while (starts) {
                outline_candidate(m, w * 32 + OUTLINE_FFS((int)starts) - 2, y, scan);
                starts &= starts - 1;
            }
        }
    }
}

// approxPolyDP(src, eps, closed=True) as OpenCV computes it, into dst (2 ints a point, room for `count`);
// stack: room for `count` ranges. segment: OpenCV's newer distance of a point to the chord's segment (4.13 on)
// instead of to its line. Returns the points written.
OUTLINE_FN int outline_simplify(const int* src, int count, int* dst, OutlineRange* stack, double eps, bool segment) {
    if (count == 0) return 0;
    OutlineRange slice = {0, 0}, right_slice = {0, 0};
    int sx = 0, sy = 0, ex = 0, ey = 0, px = 0, py = 0;
    int pos = 0, new_count = 0, top = 0;
    bool le_eps = false;
#define OUTLINE_READ(X, Y, AT) X = src[2 * (AT)]; Y = src[2 * (AT) + 1]; if (++(AT) >= count) (AT) = 0
#define OUTLINE_READ_DST(X, Y, AT) X = dst[2 * (AT)]; Y = dst[2 * (AT) + 1]; if (++(AT) >= count) (AT) = 0
#define OUTLINE_WRITE(X, Y) dst[2 * new_count] = X; dst[2 * new_count + 1] = Y; new_count++
    eps *= eps;
    right_slice.start = 0;
    for (int i = 0; i < 3; i++) {  // two points about the farthest apart
        double max_dist = 0;
        pos = (pos + right_slice.start) % count;
        OUTLINE_READ(sx, sy, pos);
        for (int j = 1; j < count; j++) {
            OUTLINE_READ(px, py, pos);
            double dx = px - sx, dy = py - sy, dist = dx * dx + dy * dy;
            if (dist > max_dist) {
                max_dist = dist;
                right_slice.start = j;
            }
        }
        le_eps = max_dist <= eps;
    }
    if (!le_eps) {
        right_slice.end = slice.start = pos % count;
        slice.end = right_slice.start = (right_slice.start + slice.start) % count;
        stack[top++] = right_slice;
        stack[top++] = slice;
    } else {
        OUTLINE_WRITE(sx, sy);
    }
    while (top > 0) {
        slice = stack[--top];
        ex = src[2 * slice.end];
        ey = src[2 * slice.end + 1];
        pos = slice.start;
        OUTLINE_READ(sx, sy, pos);
        if (pos != slice.end) {
            double dx = ex - sx, dy = ey - sy, length2 = dx * dx + dy * dy, max_dist = 0;
            while (pos != slice.end) {
                OUTLINE_READ(px, py, pos);
                double dist;
                if (segment) {
                    double projection = (px - sx) * dx + (py - sy) * dy;
                    if (projection < 0) {
                        dist = (double)((px - sx) * (px - sx) + (py - sy) * (py - sy)) * length2;
                    } else if (projection > length2) {
                        dist = (double)((px - ex) * (px - ex) + (py - ey) * (py - ey)) * length2;
                    } else {
                        double cross = (py - sy) * dx - (px - sx) * dy;
                        dist = cross * cross;
                    }
                } else {
                    dist = fabs((py - sy) * dx - (px - sx) * dy);
                }
                if (dist > max_dist) {
                    max_dist = dist;
                    right_slice.start = (pos + count - 1) % count;
                }
            }
            le_eps = segment ? max_dist <= eps * length2 : max_dist * max_dist <= eps * length2;
        } else {
            le_eps = true;
            sx = src[2 * slice.start];
            sy = src[2 * slice.start + 1];
        }
        if (le_eps) {
            OUTLINE_WRITE(sx, sy);
        } else {
            right_slice.end = slice.end;
            slice.end = right_slice.start;
            stack[top++] = right_slice;
            stack[top++] = slice;
        }
    }
    // OpenCV's last pass: drop points on [almost] straight lines, in place (reading what it has rewritten)
    count = new_count;
    pos = count - 1;
    OUTLINE_READ_DST(sx, sy, pos);
    int wpos = pos;
    OUTLINE_READ_DST(px, py, pos);
    for (int i = 0; i < count && new_count > 2; i++) {
        OUTLINE_READ_DST(ex, ey, pos);
        double dx = ex - sx, dy = ey - sy;
        double dist = fabs((px - sx) * dy - (py - sy) * dx);
        double inner = (double)((px - sx) * (ex - px) + (py - sy) * (ey - py));
        if (dist * dist <= 0.5 * eps * (dx * dx + dy * dy) && dx != 0 && dy != 0 && inner >= 0) {
            new_count--;
            dst[2 * wpos] = sx = ex;
            dst[2 * wpos + 1] = sy = ey;
            if (++wpos >= count) wpos = 0;
            OUTLINE_READ_DST(px, py, pos);
            i++;
            continue;
        }
        dst[2 * wpos] = sx = px;
        dst[2 * wpos + 1] = sy = py;
        if (++wpos >= count) wpos = 0;
        px = ex;
        py = ey;
    }
#undef OUTLINE_READ
#undef OUTLINE_READ_DST
#undef OUTLINE_WRITE
    return new_count;
}
