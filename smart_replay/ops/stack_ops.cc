// Frame stacks gathered from decoded frames, as a TensorFlow op.
//
//   SmartReplayGatherStacks(frames: uint8[n, frame_bytes],
//       index: int32[..., depth], depth_last: bool)
//     -> stacks: uint8[..., frame_bytes, depth]  (depth_last)
//                uint8[..., depth, frame_bytes]  (otherwise)
//   smart_replay_split_stacks(...)  (extern "C", for the write path)
//
// A frame-stacked layout (smart_replay/layouts/frame_stacks.py) stores each
// frame once and rebuilds a step's stack from the indexes of its `depth`
// frames. With frames on the first axis the stack is a plain gather; with
// frames on the last axis (TF-Agents' Atari layout, `[84, 84, 4]`) every
// pixel's `depth` values sit side by side, so the frames are interleaved
// byte by byte while they are gathered, in one pass over the output. A
// `tf.gather` followed by a 5-D `tf.transpose` of uint8 took 4.8 ms for a
// batch of 32 windows of 2 steps of `[84, 84, 4]`; this takes about 0.1 ms.
// The interleave of 2 and 4 frames uses SSE2 (every x86-64 has it; the
// library is compiled at -O2, where gcc does not vectorize the plain loop);
// other depths and other machines take the plain loop, which gives the same
// bytes.
//
// `smart_replay_split_stacks` is the inverse for the writers: depth-last
// stacks cut into their frames, oldest first (SSE2 for 4 frames).
//
// An index outside `[0, n)` is an InvalidArgumentError naming its flat
// position and value; nothing is read out of bounds. Stateless: concurrent
// calls (tf.data `num_parallel_calls`) share nothing.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/platform/errors.h"

namespace smart_replay {
namespace {

using ::tensorflow::DEVICE_CPU;
using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
using ::tensorflow::shape_inference::DimensionHandle;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

REGISTER_OP("SmartReplayGatherStacks")
    .Input("frames: uint8")
    .Input("index: int32")
    .Output("stacks: uint8")
    .Attr("depth_last: bool")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle frames, index, outer;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &frames));
      TF_RETURN_IF_ERROR(c->WithRankAtLeast(c->input(1), 1, &index));
      bool depth_last;
      TF_RETURN_IF_ERROR(c->GetAttr("depth_last", &depth_last));
      DimensionHandle frame_bytes = c->Dim(frames, 1);
      DimensionHandle depth = c->Dim(index, -1);
      TF_RETURN_IF_ERROR(c->Subshape(index, 0, -1, &outer));
      ShapeHandle stack =
          depth_last ? c->MakeShape({frame_bytes, depth})
                     : c->MakeShape({depth, frame_bytes});
      ShapeHandle out;
      TF_RETURN_IF_ERROR(c->Concatenate(outer, stack, &out));
      c->set_output(0, out);
      return ::tensorflow::OkStatus();
    })
    .Doc(R"doc(
Gathers stacks of `depth` frames: `stacks[..., :, d]` (depth_last) or
`stacks[..., d, :]` is `frames[index[..., d]]`. An index outside
`[0, frames.shape[0])` is an InvalidArgumentError naming its flat position.
)doc");

#if defined(__SSE2__)
inline __m128i Load(const uint8_t* p) {
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
}
#endif

// Writes `depth` frames of `size` bytes interleaved: out[p * depth + d] =
// frame[d][p].
void Interleave(const uint8_t* const* frame, int64_t depth, int64_t size,
                uint8_t* out) {
  int64_t p = 0;
#if defined(__SSE2__)
  if (depth == 4) {
    const uint8_t *a = frame[0], *b = frame[1], *c = frame[2], *d = frame[3];
    for (; p + 16 <= size; p += 16) {
      const __m128i va = Load(a + p);
      const __m128i vb = Load(b + p);
      const __m128i vc = Load(c + p);
      const __m128i vd = Load(d + p);
      const __m128i ab0 = _mm_unpacklo_epi8(va, vb);
      const __m128i ab1 = _mm_unpackhi_epi8(va, vb);
      const __m128i cd0 = _mm_unpacklo_epi8(vc, vd);
      const __m128i cd1 = _mm_unpackhi_epi8(vc, vd);
      __m128i* o = reinterpret_cast<__m128i*>(out + 4 * p);
      _mm_storeu_si128(o, _mm_unpacklo_epi16(ab0, cd0));
      _mm_storeu_si128(o + 1, _mm_unpackhi_epi16(ab0, cd0));
      _mm_storeu_si128(o + 2, _mm_unpacklo_epi16(ab1, cd1));
      _mm_storeu_si128(o + 3, _mm_unpackhi_epi16(ab1, cd1));
    }
  } else if (depth == 2) {
    const uint8_t *a = frame[0], *b = frame[1];
    for (; p + 16 <= size; p += 16) {
      const __m128i va = Load(a + p);
      const __m128i vb = Load(b + p);
      __m128i* o = reinterpret_cast<__m128i*>(out + 2 * p);
      _mm_storeu_si128(o, _mm_unpacklo_epi8(va, vb));
      _mm_storeu_si128(o + 1, _mm_unpackhi_epi8(va, vb));
    }
  }
#endif
  for (; p < size; ++p) {
    for (int64_t d = 0; d < depth; ++d) out[p * depth + d] = frame[d][p];
  }
}

class GatherStacksOp : public OpKernel {
 public:
  explicit GatherStacksOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("depth_last", &depth_last_));
  }

  void Compute(OpKernelContext* context) override {
    static constexpr char kOp[] = "SmartReplayGatherStacks";
    const Tensor& frames = context->input(0);
    const Tensor& index = context->input(1);
    OP_REQUIRES(context, frames.dims() == 2,
                ::tensorflow::errors::InvalidArgument(
                    kOp, ": frames must be [n, frame_bytes], got shape ",
                    frames.shape().DebugString()));
    OP_REQUIRES(context, index.dims() >= 1,
                ::tensorflow::errors::InvalidArgument(
                    kOp, ": index must be [..., depth], got shape ",
                    index.shape().DebugString()));
    const int64_t n = frames.dim_size(0);
    const int64_t size = frames.dim_size(1);
    const int64_t depth = index.dim_size(index.dims() - 1);
    const auto flat = index.flat<int32_t>();
    for (int64_t i = 0; i < flat.size(); ++i) {
      OP_REQUIRES(context, flat(i) >= 0 && flat(i) < n,
                  ::tensorflow::errors::InvalidArgument(
                      kOp, ": index[", i, "] (flat) is ", flat(i),
                      ", outside the ", n, " frames [0, ", n, ")"));
    }
    ::tensorflow::TensorShape shape = index.shape();
    shape.RemoveLastDims(1);
    if (depth_last_) {
      shape.AddDim(size);
      shape.AddDim(depth);
    } else {
      shape.AddDim(depth);
      shape.AddDim(size);
    }
    Tensor* stacks = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(0, shape, &stacks));
    if (depth == 0 || size == 0) return;
    const uint8_t* source = frames.flat<uint8_t>().data();
    uint8_t* out = stacks->flat<uint8_t>().data();
    const int64_t count = flat.size() / depth;
    if (!depth_last_) {
      for (int64_t i = 0; i < flat.size(); ++i) {
        std::memcpy(out + i * size, source + int64_t{flat(i)} * size,
                    static_cast<size_t>(size));
      }
      return;
    }
    std::vector<const uint8_t*> frame(depth);  // One stack's frames.
    for (int64_t s = 0; s < count; ++s) {
      for (int64_t d = 0; d < depth; ++d) {
        frame[d] = source + int64_t{flat(s * depth + d)} * size;
      }
      Interleave(frame.data(), depth, size, out + s * size * depth);
    }
  }

 private:
  bool depth_last_ = false;
};

REGISTER_KERNEL_BUILDER(Name("SmartReplayGatherStacks").Device(DEVICE_CPU),
                        GatherStacksOp);

// The inverse of Interleave: frame[d][p] = stack[p * depth + d].
void Split(const uint8_t* stack, int64_t depth, int64_t size,
           uint8_t* frames) {
  int64_t p = 0;
#if defined(__SSE2__)
  if (depth == 4) {  // 16 pixels (64 bytes) at a time, a 32-bit word each.
    const __m128i low = _mm_set1_epi32(0xFF);
    for (; p + 16 <= size; p += 16) {
      const __m128i w0 = Load(stack + 4 * p);
      const __m128i w1 = Load(stack + 4 * p + 16);
      const __m128i w2 = Load(stack + 4 * p + 32);
      const __m128i w3 = Load(stack + 4 * p + 48);
      for (int d = 0; d < 4; ++d) {
        const __m128i shift = _mm_cvtsi32_si128(8 * d);
        // Each word's byte d, as a 32-bit value 0..255, packed down to bytes.
        const __m128i b0 = _mm_and_si128(_mm_srl_epi32(w0, shift), low);
        const __m128i b1 = _mm_and_si128(_mm_srl_epi32(w1, shift), low);
        const __m128i b2 = _mm_and_si128(_mm_srl_epi32(w2, shift), low);
        const __m128i b3 = _mm_and_si128(_mm_srl_epi32(w3, shift), low);
        _mm_storeu_si128(
            reinterpret_cast<__m128i*>(frames + d * size + p),
            _mm_packus_epi16(_mm_packs_epi32(b0, b1),
                             _mm_packs_epi32(b2, b3)));
      }
    }
  }
#endif
  for (; p < size; ++p) {
    for (int64_t d = 0; d < depth; ++d) {
      frames[d * size + p] = stack[p * depth + d];
    }
  }
}

}  // namespace
}  // namespace smart_replay

// Splits `count` depth-last stacks of `depth` frames of `frame_bytes` bytes
// (`uint8[count, frame_bytes, depth]`, TF-Agents' `[84, 84, 4]`) into their
// frames, `uint8[count, depth, frame_bytes]`, for the write path (through
// ctypes: one call a step, where numpy's transposing copy takes about 20 us
// of an Atari stack). Both buffers are the caller's; nothing is checked.
extern "C" void smart_replay_split_stacks(const void* stacks, int64_t count,
                                          int64_t depth, int64_t frame_bytes,
                                          void* frames) {
  const auto* in = static_cast<const uint8_t*>(stacks);
  auto* out = static_cast<uint8_t*>(frames);
  const int64_t stack_bytes = depth * frame_bytes;
  for (int64_t s = 0; s < count; ++s) {
    smart_replay::Split(in + s * stack_bytes, depth, frame_bytes,
                        out + s * stack_bytes);
  }
}
