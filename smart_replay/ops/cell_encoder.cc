// The frame cell of one step, made in one call for the write path:
//
//   smart_replay_encode_cell(...)  (extern "C", through ctypes)
//
// A per-window writer of a frame-stacked layout appends one cell a step
// (smart_replay/layouts/frame_cells.py): the group of one cell of
// smart_replay/layouts/frame_blobs.py,
//
//   uint16 1 (little-endian) | uint8 k | row[row_bytes] | k frames
//
// compressed as one zstd frame (`smart_replay_zstd_compress`), where the k
// frames are the newest one if the step's stack continues the previous
// step's (its oldest depth - 1 frames are that step's newest ones), else the
// whole stack. Made in Python, the comparison, the group's bytes and the
// compression were four calls and three copies a step (about 20 us of an
// Atari step's ~150); here they are one call.
//
// The caller keeps one `previous` buffer per stream: the call compares the
// step's frames with it, then copies them into it. Nothing else is kept
// between calls but a per-thread scratch buffer.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

extern "C" int64_t smart_replay_zstd_compress(const void* source, size_t size,
                                              void* destination,
                                              size_t capacity, int level);

// Encodes one step's frame cell.
//
// Args:
//   frames: the step's stack cut into its frames, oldest first
//     (`depth * frame_bytes` bytes; `smart_replay_split_stacks` cuts a
//     depth-last stack).
//   previous: the previous step's frames (same size): compared with
//     `frames` if `has_previous`, then overwritten with them.
//   has_previous: whether `previous` holds the stream's previous step (0 at
//     the start of a stream: the cell holds the whole stack).
//   depth: frames per stack, 1..255.
//   frame_bytes: bytes per frame.
//   row: the step's packed row of the other fields (`row_bytes` bytes).
//   level: the zstd level.
//   destination, capacity: where the zstd frame goes; capacity at least
//     ZSTD_compressBound(3 + row_bytes + depth * frame_bytes).
//
// Returns:
//   The size of the zstd frame, or -1 on a bad argument (depth outside
//   1..255, a negative size), a level outside zstd's range, a capacity too
//   small or no memory.
extern "C" int64_t smart_replay_encode_cell(
    const void* frames, void* previous, int has_previous, int64_t depth,
    int64_t frame_bytes, const void* row, int64_t row_bytes, int level,
    void* destination, size_t capacity) {
  if (depth < 1 || depth > 255 || frame_bytes < 0 || row_bytes < 0) return -1;
  const auto* stack = static_cast<const uint8_t*>(frames);
  auto* kept = static_cast<uint8_t*>(previous);
  const size_t stack_bytes = static_cast<size_t>(depth * frame_bytes);
  const size_t tail_bytes = stack_bytes - static_cast<size_t>(frame_bytes);
  const bool continues =
      has_previous && std::memcmp(stack, kept + frame_bytes, tail_bytes) == 0;
  const size_t new_bytes = continues ? static_cast<size_t>(frame_bytes)
                                     : stack_bytes;
  const size_t raw_bytes = 3 + static_cast<size_t>(row_bytes) + new_bytes;
  thread_local std::vector<uint8_t> raw;
  if (raw.size() < raw_bytes) raw.resize(raw_bytes);
  raw[0] = 1;  // One cell, uint16 little-endian.
  raw[1] = 0;
  raw[2] = static_cast<uint8_t>(continues ? 1 : depth);
  std::memcpy(raw.data() + 3, row, static_cast<size_t>(row_bytes));
  std::memcpy(raw.data() + 3 + row_bytes, stack + (stack_bytes - new_bytes),
              new_bytes);
  std::memcpy(kept, stack, stack_bytes);
  return smart_replay_zstd_compress(raw.data(), raw_bytes, destination,
                                    capacity, level);
}
