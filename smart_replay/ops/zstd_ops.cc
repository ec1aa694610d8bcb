// zstd compression of string tensors as TensorFlow ops, so compressed frames
// are inflated inside the tf.data graph (no Python in the sampling pipeline).
//
//   SmartReplayZstdEncode(data: string, level: int = 3) -> string
//   SmartReplayZstdDecode(blobs: string, max_size: int = 64 MiB) -> string
//   SmartReplayZstdDecodeCells(blobs: string[windows, groups], cells,
//       row_bytes, frame_bytes, max_size) -> counts, rows, frames, offsets
//   smart_replay_zstd_compress(...)  (extern "C", for the write path)
//
// Encode and Decode map element-wise over a string tensor of any shape; the
// output has the input's shape. DecodeCells decodes groups of frame cells
// (smart_replay/layouts/frame_cells.py) and splits them into tensors in the
// same pass, instead of a chain of string ops. All are stateless: each call
// makes its own zstd context (one per call, reused over the call's elements),
// so concurrent calls (tf.data `num_parallel_calls`, inter-op threads) share
// nothing.
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
#include <cstring>
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

// Sets `cctx` to make our frames: `level`, the content size and a checksum
// recorded. Returns the first zstd error, or 0.
size_t MakeOurFrames(ZSTD_CCtx* cctx, int level) {
  const ZSTD_cParameter parameters[] = {ZSTD_c_compressionLevel,
                                        ZSTD_c_contentSizeFlag,
                                        ZSTD_c_checksumFlag};
  const int values[] = {level, 1, 1};
  for (int i = 0; i < 3; ++i) {
    const size_t result = ZSTD_CCtx_setParameter(cctx, parameters[i],
                                                 values[i]);
    if (ZSTD_isError(result)) return result;
  }
  return 0;
}
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

REGISTER_OP("SmartReplayZstdDecodeCells")
    .Input("blobs: string")
    .Output("counts: int32")
    .Output("rows: uint8")
    .Output("frames: uint8")
    .Output("offsets: int32")
    .Attr("cells: int >= 1")
    .Attr("row_bytes: int >= 0")
    .Attr("frame_bytes: int >= 1")
    .Attr("max_size: int >= 0 = 67108864")
    .SetShapeFn([](::tensorflow::shape_inference::InferenceContext* c) {
      ::tensorflow::shape_inference::ShapeHandle blobs;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &blobs));
      int64_t cells, row_bytes, frame_bytes;
      TF_RETURN_IF_ERROR(c->GetAttr("cells", &cells));
      TF_RETURN_IF_ERROR(c->GetAttr("row_bytes", &row_bytes));
      TF_RETURN_IF_ERROR(c->GetAttr("frame_bytes", &frame_bytes));
      ::tensorflow::shape_inference::DimensionHandle windows = c->Dim(blobs, 0);
      ::tensorflow::shape_inference::DimensionHandle all;
      TF_RETURN_IF_ERROR(c->Multiply(c->Dim(blobs, 1), cells, &all));
      c->set_output(0, c->MakeShape({windows, all}));
      c->set_output(1, c->MakeShape({windows, all, row_bytes}));
      c->set_output(2, c->MakeShape({c->UnknownDim(), frame_bytes}));
      c->set_output(3, c->MakeShape({windows}));
      return ::tensorflow::OkStatus();
    })
    .Doc(R"doc(
Decodes `blobs[windows, groups]`, each one zstd frame of a group of `cells`
frame cells (`uint16 cells | uint8 counts[cells] | rows[cells, row_bytes] |
frames`), into `counts[windows, groups * cells]`, `rows[windows, groups *
cells, row_bytes]`, every window's frames one after another in
`frames[total, frame_bytes]`, and `offsets[windows]`, the first frame of each
window. A blob that does not decode, or whose header does not match what it
holds, is an InvalidArgumentError naming its flat index.
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

// Skippable frames start with 0x184D2A50..0x184D2A5F (little-endian).
bool IsSkippableFrame(const tstring& blob) {
  if (blob.size() < 4) return false;
  const auto* b = reinterpret_cast<const unsigned char*>(blob.data());
  const uint32_t magic = uint32_t{b[0]} | (uint32_t{b[1]} << 8) |
                         (uint32_t{b[2]} << 16) | (uint32_t{b[3]} << 24);
  return (magic & 0xFFFFFFF0u) == 0x184D2A50u;
}

::tensorflow::Status Refused(const char* op, int64_t index, size_t blob_size,
                             const std::string& reason) {
  return ::tensorflow::errors::InvalidArgument(
      op, ": blobs[", index, "] (flat index; ", blob_size, " bytes): ",
      reason);
}

// The content size of `blob`, element `index` of an `op`'s input, after
// every check that needs no decoding (see the top of this file).
::tensorflow::Status ContentSize(const char* op, const tstring& blob,
                                 int64_t index, int64_t max_size,
                                 size_t* size) {
  const size_t blob_size = blob.size();
  if (blob_size == 0) {
    return Refused(op, index, blob_size,
                   "empty string, not a zstd frame (empty data encodes to a "
                   "frame of 9 bytes or more)");
  }
  if (IsSkippableFrame(blob)) {
    return Refused(op, index, blob_size,
                   "a skippable zstd frame, which holds no data");
  }
  const unsigned long long content_size =  // NOLINT(runtime/int)
      ZSTD_getFrameContentSize(blob.data(), blob_size);
  if (content_size == ZSTD_CONTENTSIZE_ERROR) {
    return Refused(op, index, blob_size,
                   "not a zstd frame (bad magic number or truncated header)");
  }
  if (content_size == ZSTD_CONTENTSIZE_UNKNOWN) {
    return Refused(op, index, blob_size,
                   "the zstd frame does not record its content size "
                   "(streamed without a pledged size?); only frames with a "
                   "recorded content size are accepted");
  }
  if (content_size > static_cast<uint64_t>(max_size)) {
    return Refused(op, index, blob_size,
                   ::tensorflow::strings::StrCat(
                       "declared content size ", content_size,
                       " bytes exceeds max_size ", max_size));
  }
  const size_t frame_size = ZSTD_findFrameCompressedSize(blob.data(),
                                                          blob_size);
  if (ZSTD_isError(frame_size)) {
    return Refused(op, index, blob_size,
                   ::tensorflow::strings::StrCat(
                       "damaged zstd frame: ", ZSTD_getErrorName(frame_size)));
  }
  if (frame_size != blob_size) {
    return Refused(op, index, blob_size,
                   ::tensorflow::strings::StrCat(
                       blob_size - frame_size, " bytes after the zstd frame "
                       "(of ", frame_size, " bytes); exactly one frame is "
                       "accepted"));
  }
  // Every block of a frame takes at least 3 bytes and holds at most
  // ZSTD_BLOCKSIZE_MAX (128 KiB): a larger declared size is a forged header,
  // refused before allocating (whatever max_size allows).
  const uint64_t most_possible =
      (static_cast<uint64_t>(blob_size) / 3 + 1) * kBlockSizeMax;
  if (content_size > most_possible) {
    return Refused(op, index, blob_size,
                   ::tensorflow::strings::StrCat(
                       "declared content size ", content_size,
                       " bytes is more than a frame this size can hold "
                       "(forged header)"));
  }
  *size = static_cast<size_t>(content_size);
  return ::tensorflow::OkStatus();
}

// Decodes `blob` (whose `ContentSize` is `size`) into `destination`.
::tensorflow::Status DecodeInto(const char* op, ZSTD_DCtx* dctx,
                                const tstring& blob, int64_t index,
                                char* destination, size_t size) {
  char scratch = 0;  // A valid destination for an empty frame.
  const size_t written = ZSTD_decompressDCtx(
      dctx, size == 0 ? &scratch : destination, size, blob.data(),
      blob.size());
  if (ZSTD_isError(written)) {
    return Refused(op, index, blob.size(),
                   ::tensorflow::strings::StrCat(
                       "damaged zstd frame: ", ZSTD_getErrorName(written)));
  }
  if (written != size) {
    return Refused(op, index, blob.size(),
                   ::tensorflow::strings::StrCat(
                       "decoded ", written, " bytes, the frame declares ",
                       size));
  }
  return ::tensorflow::OkStatus();
}

::tensorflow::Status MakeDCtx(std::unique_ptr<ZSTD_DCtx, DCtxDeleter>* dctx) {
  dctx->reset(ZSTD_createDCtx());
  if (*dctx == nullptr) {
    return ::tensorflow::errors::ResourceExhausted(
        "ZSTD_createDCtx failed (out of memory)");
  }
  return ::tensorflow::OkStatus();
}

class ZstdDecodeOp : public OpKernel {
 public:
  explicit ZstdDecodeOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("max_size", &max_size_));
    OP_REQUIRES(context, max_size_ >= 0,
                ::tensorflow::errors::InvalidArgument(
                    "max_size must be >= 0, got ", max_size_));
  }

  void Compute(OpKernelContext* context) override {
    static constexpr char kOp[] = "SmartReplayZstdDecode";
    const Tensor& input = context->input(0);
    Tensor* output = nullptr;
    OP_REQUIRES_OK(context,
                   context->allocate_output(0, input.shape(), &output));
    const auto blobs = input.flat<tstring>();
    auto data = output->flat<tstring>();
    const int64_t n = blobs.size();
    if (n == 0) return;
    std::unique_ptr<ZSTD_DCtx, DCtxDeleter> dctx;
    OP_REQUIRES_OK(context, MakeDCtx(&dctx));
    for (int64_t i = 0; i < n; ++i) {
      size_t size = 0;
      OP_REQUIRES_OK(context, ContentSize(kOp, blobs(i), i, max_size_, &size));
      tstring& out = data(i);
      out.resize_uninitialized(size);
      const ::tensorflow::Status status =
          DecodeInto(kOp, dctx.get(), blobs(i), i, out.mdata(), size);
      if (!status.ok()) out.clear();
      OP_REQUIRES_OK(context, status);
    }
  }

 private:
  int64_t max_size_ = kDefaultMaxSize;
};

// Decodes groups of frame cells (smart_replay/layouts/frame_cells.py) and
// splits them in one pass: each blob is one zstd frame of
// `uint16 cells | uint8 counts[cells] | rows[cells, row_bytes] | frames`.
class ZstdDecodeCellsOp : public OpKernel {
 public:
  explicit ZstdDecodeCellsOp(OpKernelConstruction* context)
      : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("cells", &cells_));
    OP_REQUIRES_OK(context, context->GetAttr("row_bytes", &row_bytes_));
    OP_REQUIRES_OK(context, context->GetAttr("frame_bytes", &frame_bytes_));
    OP_REQUIRES_OK(context, context->GetAttr("max_size", &max_size_));
  }

  void Compute(OpKernelContext* context) override {
    static constexpr char kOp[] = "SmartReplayZstdDecodeCells";
    const Tensor& input = context->input(0);
    OP_REQUIRES(context, input.dims() == 2,
                ::tensorflow::errors::InvalidArgument(
                    kOp, ": blobs must be [windows, groups], got shape ",
                    input.shape().DebugString()));
    const int64_t windows = input.dim_size(0);
    const int64_t groups = input.dim_size(1);
    const int64_t cells = groups * cells_;
    const auto blobs = input.flat<tstring>();
    const int64_t n = blobs.size();
    const size_t head = 2 + static_cast<size_t>(cells_) * (1 + row_bytes_);

    // First pass: every blob's size, so the frames are allocated once.
    std::vector<size_t> sizes(n);
    int64_t total = 0;  // Frames.
    for (int64_t i = 0; i < n; ++i) {
      OP_REQUIRES_OK(context,
                     ContentSize(kOp, blobs(i), i, max_size_, &sizes[i]));
      OP_REQUIRES(context,
                  sizes[i] >= head && (sizes[i] - head) % frame_bytes_ == 0,
                  Refused(kOp, i, blobs(i).size(),
                          ::tensorflow::strings::StrCat(
                              "decodes to ", sizes[i], " bytes, not a group "
                              "of ", cells_, " cells (", head, " bytes of "
                              "header and rows, then frames of ",
                              frame_bytes_, " bytes)")));
      total += static_cast<int64_t>((sizes[i] - head) / frame_bytes_);
    }
    Tensor* counts = nullptr;
    Tensor* rows = nullptr;
    Tensor* frames = nullptr;
    Tensor* offsets = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(
        0, ::tensorflow::TensorShape({windows, cells}), &counts));
    OP_REQUIRES_OK(context, context->allocate_output(
        1, ::tensorflow::TensorShape({windows, cells, row_bytes_}), &rows));
    OP_REQUIRES_OK(context, context->allocate_output(
        2, ::tensorflow::TensorShape({total, frame_bytes_}), &frames));
    OP_REQUIRES_OK(context, context->allocate_output(
        3, ::tensorflow::TensorShape({windows}), &offsets));
    if (n == 0) {
      auto first = offsets->flat<int32_t>();
      for (int64_t w = 0; w < windows; ++w) first(w) = 0;
      return;
    }
    auto count_out = counts->flat<int32_t>();
    auto first = offsets->flat<int32_t>();
    char* row_out = reinterpret_cast<char*>(rows->flat<uint8_t>().data());
    char* frame_out = reinterpret_cast<char*>(frames->flat<uint8_t>().data());
    OP_REQUIRES(context, total <= INT32_MAX,
                ::tensorflow::errors::InvalidArgument(
                    kOp, ": ", total, " frames are more than int32 indexes"));

    std::unique_ptr<ZSTD_DCtx, DCtxDeleter> dctx;
    OP_REQUIRES_OK(context, MakeDCtx(&dctx));
    std::vector<char> raw;
    int64_t done = 0;  // Frames written.
    for (int64_t i = 0; i < n; ++i) {
      if (i % groups == 0) first(i / groups) = static_cast<int32_t>(done);
      if (raw.size() < sizes[i]) raw.resize(sizes[i]);
      OP_REQUIRES_OK(context, DecodeInto(kOp, dctx.get(), blobs(i), i,
                                         raw.data(), sizes[i]));
      const auto* bytes = reinterpret_cast<const unsigned char*>(raw.data());
      const int64_t stated = int64_t{bytes[0]} | (int64_t{bytes[1]} << 8);
      const int64_t held =
          static_cast<int64_t>((sizes[i] - head) / frame_bytes_);
      int64_t counted = 0;
      for (int64_t c = 0; c < cells_; ++c) {
        counted += bytes[2 + c];
        count_out(i * cells_ + c) = bytes[2 + c];
      }
      OP_REQUIRES(context, stated == cells_ && counted == held,
                  Refused(kOp, i, blobs(i).size(),
                          ::tensorflow::strings::StrCat(
                              "its header states ", stated, " cells and ",
                              counted, " frames; expected ", cells_,
                              " cells and the ", held, " frames it holds")));
      std::memcpy(row_out + i * cells_ * row_bytes_, raw.data() + 2 + cells_,
                  static_cast<size_t>(cells_ * row_bytes_));
      std::memcpy(frame_out + done * frame_bytes_, raw.data() + head,
                  static_cast<size_t>(held * frame_bytes_));
      done += held;
    }
  }

 private:
  int64_t cells_ = 1;
  int64_t row_bytes_ = 0;
  int64_t frame_bytes_ = 1;
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
    OP_REQUIRES_OK(context, Check(MakeOurFrames(cctx.get(), level_),
                                  "setting the level and frame flags"));

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
REGISTER_KERNEL_BUILDER(Name("SmartReplayZstdDecodeCells").Device(DEVICE_CPU),
                        ZstdDecodeCellsOp);
REGISTER_KERNEL_BUILDER(Name("SmartReplayZstdEncode").Device(DEVICE_CPU),
                        ZstdEncodeOp);

}  // namespace smart_replay

// For the write path, without TensorFlow's eager dispatch (about 60 us a
// call): compresses `size` bytes at `source` into `destination` (of
// `capacity` bytes) as one frame with its content size and a checksum, like
// SmartReplayZstdEncode. Returns the frame's size, or -1 on an error
// (`capacity` below ZSTD_compressBound(size), or a level out of range).
extern "C" int64_t smart_replay_zstd_compress(const void* source, size_t size,
                                              void* destination,
                                              size_t capacity, int level) {
  if (level < ZSTD_minCLevel() || level > ZSTD_maxCLevel()) return -1;
  // One context per calling thread, kept: making one costs more than
  // compressing a frame.
  thread_local std::unique_ptr<ZSTD_CCtx, smart_replay::CCtxDeleter> cctx(
      ZSTD_createCCtx());
  if (cctx == nullptr) return -1;
  size_t result = ZSTD_CCtx_reset(cctx.get(),
                                  ZSTD_reset_session_and_parameters);
  if (!ZSTD_isError(result)) {
    result = smart_replay::MakeOurFrames(cctx.get(), level);
  }
  if (!ZSTD_isError(result)) {
    result = ZSTD_compress2(cctx.get(), destination, capacity, source, size);
  }
  return ZSTD_isError(result) ? -1 : static_cast<int64_t>(result);
}

// ZSTD_compressBound(size): the capacity `smart_replay_zstd_compress` needs.
extern "C" size_t smart_replay_zstd_compress_bound(size_t size) {
  return ZSTD_compressBound(size);
}
