// The outline tracing of jetpipe/runtime/outline.cuh built for the host, so that the tests compare it with
// OpenCV on the CPU machine (tests/runtime/test_outline_trace.py). Mirrors what the seg_outlines kernel does
// with one box: the mask padded, the scan keeping the largest border's chain while it fits `room` points (else
// traced again), the chain simplified.
#include <vector>

#include "outline.cuh"

extern "C" int outline_of(const unsigned* words, int width, int height, double eps, int segment, int room, int* out,
                          long long* area2) {
    int total = outline_padded_words(width, height);
    std::vector<unsigned> padded(total), marked(total), right(total);
    for (int i = 0; i < total; i++) padded[i] = outline_padded_word(words, width, height, i);
    OutlineMask m = {padded.data(), marked.data(), right.data(), width, height, outline_stride(width)};
    std::vector<int> first(2 * room + 2), second(2 * room + 2);
    OutlineScan scan = {{-1, -1}, 0, 0, room, first.data(), second.data()};
    outline_largest(m, &scan);
    *area2 = scan.best.area2;
    int count = scan.best.points;
    if (count < 0) return 0;
    std::vector<int> chain;
    const int* traced = scan.kept;
    if (count > room) {  // the largest did not fit: traced again
        chain.resize(2 * count);
        outline_trace(m, scan.bx, scan.by, false, chain.data(), count);
        traced = chain.data();
    }
    if (eps <= 0) {
        for (int i = 0; i < 2 * count; i++) out[i] = traced[i];
        return count;
    }
    std::vector<OutlineRange> stack(count + 1);
    return outline_simplify(traced, count, out, stack.data(), eps, segment != 0);
}

extern "C" int simplified(const int* points, int count, double eps, int segment, int* out) {
    std::vector<OutlineRange> stack(count + 1);
    return outline_simplify(points, count, out, stack.data(), eps, segment != 0);
}
