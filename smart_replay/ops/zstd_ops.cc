// zstd compression of string tensors as TensorFlow ops, so compressed frames
// are inflated inside the tf.data graph (no Python in the sampling pipeline).
//
//   SmartReplayZstdEncode(data: string, level: int = 3) -> string
//   SmartReplayZstdDecode(blobs: string, max_size: int = 64 MiB) -> string
//
// Both map element-wise over a string tensor of any shape; the output has the
// input's shape. Both are stateless: each call makes its own zstd context
// (one per call, reused over the call's elements), so concurrent calls (tf.data
// `num_parallel_calls`, inter-op threads) share nothing.
//
// Format: each encoded element is exactly one zstd frame that records its
// content size and carries a content checksum (XXH64), so a damaged blob is
// refused instead of decoding to wrong bytes. The decoder accepts any single
// zstd frame with a recorded content size (what `ZSTD_compress`, the zstd CLI
// on a file, `zstandard` and `cramjam` write); a checksum is verified when the
// frame has one.
//
// Decode refuses, with an InvalidArgumentError naming the element's flat index
// (`blobs[i]`) and the reason, and never crashes:
//   * an empty string (it is not a zstd frame: empty data encodes to a frame
//     of 9 bytes, 13 with the checksum, which decodes to the empty string);
//   * a frame whose content size is not recorded, a skippable frame (no data),
//     or bytes that are not a zstd frame;
//   * a content size over `max_size`, or over what a frame of its size can
//     hold (at most 128 KiB per 3 bytes: a forged header), checked before
//     anything is allocated;
//   * anything after the first frame (concatenated frames, trailing bytes);
//   * any zstd decoding error (corruption, checksum mismatch, dictionary).
// Decoding is bounded by the input and `max_size`: it cannot hang.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <zstd.h>  // Only its stable API.

#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/platform/errors.h"
#include "tensorflow/core/platform/tstring.h"

namespace smart_replay {
namespace {

using ::tensorflow::DEVICE_CPU;
using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
using ::tensorflow::tstring;

struct DCtxDeleter {
  void operator()(ZSTD_DCtx* dctx) const { ZSTD_freeDCtx(dctx); }
};
struct CCtxDeleter {
  void operator()(ZSTD_CCtx* cctx) const { ZSTD_freeCCtx(cctx); }
};

constexpr int64_t kDefaultMaxSize = int64_t{64} << 20;  // 64 MiB.
constexpr uint64_t kBlockSizeMax = uint64_t{128} << 10;  // ZSTD_BLOCKSIZE_MAX.

}  // namespace

REGISTER_OP("SmartReplayZstdDecode")
    .Input("blobs: string")
    .Output("data: string")
    .Attr("max_size: int >= 0 = 67108864")
    .SetShapeFn(::tensorflow::shape_inference::UnchangedShape)
    .Doc(R"doc(
Decompresses each element of `blobs`, one zstd frame with a recorded content
size each. An element that is empty, not one complete frame, damaged, or
larger than `max_size` bytes decoded is an InvalidArgumentError naming its
flat index.
)doc");

REGISTER_OP("SmartReplayZstdEncode")
    .Input("data: string")
    .Output("blobs: string")
    .Attr("level: int = 3")
    .SetShapeFn(::tensorflow::shape_inference::UnchangedShape)
    .Doc(R"doc(
Compresses each element of `data` into one zstd frame that records its content
size and a checksum. `level` is a zstd level, ZSTD_minCLevel()..
ZSTD_maxCLevel() (0 means zstd's default, 3).
)doc");

class ZstdDecodeOp : public OpKernel {
 public:
  explicit ZstdDecodeOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("max_size", &max_size_));
    OP_REQUIRES(context, max_size_ >= 0,
                ::tensorflow::errors::InvalidArgument(
                    "max_size must be >= 0, got ", max_size_));
  }

  void Compute(OpKernelContext* context) override {
    const Tensor& input = context->input(0);
    Tensor* output = nullptr;
    OP_REQUIRES_OK(context,
                   context->allocate_output(0, input.shape(), &output));
    const auto blobs = input.flat<tstring>();
    auto data = output->flat<tstring>();
    const int64_t n = blobs.size();
    if (n == 0) return;

    std::unique_ptr<ZSTD_DCtx, DCtxDeleter> dctx(ZSTD_createDCtx());
    OP_REQUIRES(context, dctx != nullptr,
                ::tensorflow::errors::ResourceExhausted(
                    "ZSTD_createDCtx failed (out of memory)"));

    for (int64_t i = 0; i < n; ++i) {
      const tstring& blob = blobs(i);
      const size_t blob_size = blob.size();
      if (blob_size == 0) {
        context->CtxFailure(__FILE__, __LINE__,
                            Refused(i, blob_size,
                                    "empty string, not a zstd frame (empty "
                                    "data encodes to a frame of 9 bytes or "
                                    "more)"));
        return;
      }
      if (IsSkippableFrame(blob)) {
        context->CtxFailure(__FILE__, __LINE__,
                            Refused(i, blob_size,
                                    "a skippable zstd frame, which holds no "
                                    "data"));
        return;
      }
      const unsigned long long content_size =  // NOLINT(runtime/int)
          ZSTD_getFrameContentSize(blob.data(), blob_size);
      if (content_size == ZSTD_CONTENTSIZE_ERROR) {
        context->CtxFailure(
            __FILE__, __LINE__,
            Refused(i, blob_size,
                    "not a zstd frame (bad magic number or truncated "
                    "header)"));
        return;
      }
      if (content_size == ZSTD_CONTENTSIZE_UNKNOWN) {
        context->CtxFailure(
            __FILE__, __LINE__,
            Refused(i, blob_size,
                    "the zstd frame does not record its content size "
                    "(streamed without a pledged size?); only frames with "
                    "a recorded content size are accepted"));
        return;
      }
      if (content_size > static_cast<uint64_t>(max_size_)) {
        context->CtxFailure(
            __FILE__, __LINE__,
            Refused(i, blob_size,
                    ::tensorflow::strings::StrCat(
                        "declared content size ", content_size,
                        " bytes exceeds max_size ", max_size_)));
        return;
      }
      const size_t frame_size = ZSTD_findFrameCompressedSize(blob.data(),
                                                              blob_size);
      if (ZSTD_isError(frame_size)) {
        context->CtxFailure(
            __FILE__, __LINE__,
            Refused(i, blob_size,
                    ::tensorflow::strings::StrCat(
                        "damaged zstd frame: ",
                        ZSTD_getErrorName(frame_size))));
        return;
      }
      if (frame_size != blob_size) {
        context->CtxFailure(
            __FILE__, __LINE__,
            Refused(i, blob_size,
                    ::tensorflow::strings::StrCat(
                        blob_size - frame_size,
                        " bytes after the zstd frame (of ", frame_size,
                        " bytes); exactly one frame is accepted")));
        return;
      }
      // Every block of a frame takes at least 3 bytes and holds at most
      // ZSTD_BLOCKSIZE_MAX (128 KiB): a larger declared size is a forged
      // header, refused before allocating (whatever max_size allows).
      const uint64_t most_possible =
          (static_cast<uint64_t>(blob_size) / 3 + 1) * kBlockSizeMax;
      if (content_size > most_possible) {
        context->CtxFailure(
            __FILE__, __LINE__,
            Refused(i, blob_size,
                    ::tensorflow::strings::StrCat(
                        "declared content size ", content_size,
                        " bytes is more than a frame this size can hold "
                        "(forged header)")));
        return;
      }

      tstring& out = data(i);
      const size_t out_size = static_cast<size_t>(content_size);
      out.resize_uninitialized(out_size);
      char scratch = 0;  // A valid destination for an empty frame.
      char* destination = out_size == 0 ? &scratch : out.mdata();
      const size_t written = ZSTD_decompressDCtx(
          dctx.get(), destination, out_size, blob.data(), blob_size);
      if (ZSTD_isError(written)) {
        out.clear();
        context->CtxFailure(
            __FILE__, __LINE__,
            Refused(i, blob_size,
                    ::tensorflow::strings::StrCat(
                        "damaged zstd frame: ", ZSTD_getErrorName(written))));
        return;
      }
      if (written != out_size) {
        out.clear();
        context->CtxFailure(
            __FILE__, __LINE__,
            Refused(i, blob_size,
                    ::tensorflow::strings::StrCat(
                        "decoded ", written, " bytes, the frame declares ",
                        out_size)));
        return;
      }
    }
  }

 private:
  // Skippable frames start with 0x184D2A50..0x184D2A5F (little-endian).
  static bool IsSkippableFrame(const tstring& blob) {
    if (blob.size() < 4) return false;
    const auto* b = reinterpret_cast<const unsigned char*>(blob.data());
    const uint32_t magic = uint32_t{b[0]} | (uint32_t{b[1]} << 8) |
                           (uint32_t{b[2]} << 16) | (uint32_t{b[3]} << 24);
    return (magic & 0xFFFFFFF0u) == 0x184D2A50u;
  }

  static ::tensorflow::Status Refused(int64_t index, size_t blob_size,
                                      const std::string& reason) {
    return ::tensorflow::errors::InvalidArgument(
        "SmartReplayZstdDecode: blobs[", index, "] (flat index; ", blob_size,
        " bytes): ", reason);
  }

  int64_t max_size_ = kDefaultMaxSize;
};

class ZstdEncodeOp : public OpKernel {
 public:
  explicit ZstdEncodeOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("level", &level_));
    OP_REQUIRES(context,
                level_ >= ZSTD_minCLevel() && level_ <= ZSTD_maxCLevel(),
                ::tensorflow::errors::InvalidArgument(
                    "SmartReplayZstdEncode: level must be in [",
                    ZSTD_minCLevel(), ", ", ZSTD_maxCLevel(), "], got ",
                    level_));
  }

  void Compute(OpKernelContext* context) override {
    const Tensor& input = context->input(0);
    Tensor* output = nullptr;
    OP_REQUIRES_OK(context,
                   context->allocate_output(0, input.shape(), &output));
    const auto data = input.flat<tstring>();
    auto blobs = output->flat<tstring>();
    const int64_t n = data.size();
    if (n == 0) return;

    std::unique_ptr<ZSTD_CCtx, CCtxDeleter> cctx(ZSTD_createCCtx());
    OP_REQUIRES(context, cctx != nullptr,
                ::tensorflow::errors::ResourceExhausted(
                    "ZSTD_createCCtx failed (out of memory)"));
    OP_REQUIRES_OK(context, Check(ZSTD_CCtx_setParameter(
                                      cctx.get(), ZSTD_c_compressionLevel,
                                      level_),
                                  "setting the level"));
    OP_REQUIRES_OK(context, Check(ZSTD_CCtx_setParameter(
                                      cctx.get(), ZSTD_c_contentSizeFlag, 1),
                                  "setting the content size flag"));
    OP_REQUIRES_OK(context, Check(ZSTD_CCtx_setParameter(
                                      cctx.get(), ZSTD_c_checksumFlag, 1),
                                  "setting the checksum flag"));

    std::vector<char> scratch;  // Reused: one bound-sized buffer per call.
    for (int64_t i = 0; i < n; ++i) {
      const tstring& element = data(i);
      const size_t bound = ZSTD_compressBound(element.size());
      OP_REQUIRES(context, !ZSTD_isError(bound),
                  ::tensorflow::errors::InvalidArgument(
                      "SmartReplayZstdEncode: data[", i, "] (flat index; ",
                      element.size(), " bytes) is too large for zstd: ",
                      ZSTD_getErrorName(bound)));
      if (scratch.size() < bound) scratch.resize(bound);
      // ZSTD_compress2 resets the session only: the parameters above stay.
      const size_t written = ZSTD_compress2(
          cctx.get(), scratch.data(), scratch.size(), element.data(),
          element.size());
      OP_REQUIRES(context, !ZSTD_isError(written),
                  ::tensorflow::errors::Internal(
                      "SmartReplayZstdEncode: data[", i, "] (flat index; ",
                      element.size(), " bytes): ",
                      ZSTD_getErrorName(written)));
      blobs(i).assign(scratch.data(), written);
    }
  }

 private:
  static ::tensorflow::Status Check(size_t result, const char* what) {
    if (!ZSTD_isError(result)) return ::tensorflow::OkStatus();
    return ::tensorflow::errors::Internal("SmartReplayZstdEncode: ", what,
                                          ": ", ZSTD_getErrorName(result));
  }

  int level_ = 3;
};

REGISTER_KERNEL_BUILDER(Name("SmartReplayZstdDecode").Device(DEVICE_CPU),
                        ZstdDecodeOp);
REGISTER_KERNEL_BUILDER(Name("SmartReplayZstdEncode").Device(DEVICE_CPU),
                        ZstdEncodeOp);

}  // namespace smart_replay
