#pragma once
// Writes safetensors checkpoints in bounded memory: headers are computed from shapes first, then each
// tensor's bytes are produced chunk by chunk (on the thread pool) and streamed to disk. Used by
// `beamline make-model` and by tests, which also write hand-made (even malformed) tensor lists with it.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "checkpoint/drafter_checkpoint.h"
#include "model/config.h"
#include "tensor/dtype.h"

namespace beamline {

// One tensor to write. `fill(byte_offset, out)` writes bytes [byte_offset, byte_offset + out.size()) of the
// tensor into `out`; it is called for disjoint ranges from several threads at once, with offsets that are
// multiples of the element size.
struct TensorSource {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  std::function<void(std::size_t byte_offset, std::span<std::byte> out)> fill;

  std::size_t nbytes() const;  // product of shape * dtype_size
};

// A tensor whose bytes are given (their count must match the shape).
TensorSource tensor_from_bytes(std::string name, DType dtype, std::vector<int64_t> shape, std::vector<std::byte> bytes);
// A tensor from float values, stored as `dtype` (F32, BF16 or F16).
TensorSource tensor_from_floats(std::string name, DType dtype, std::vector<int64_t> shape, const std::vector<float>& values);

inline constexpr uint64_t kDefaultMaxShardBytes = uint64_t{4} << 30;

// One .safetensors file holding `tensors` (names must be unique). Data is laid out widest element type
// first so every tensor is aligned to its element size.
void write_safetensors(const std::filesystem::path& file, const std::vector<TensorSource>& tensors);

// `tensors` into `dir` as model.safetensors when they total at most max_shard_bytes, else as
// model-0000N-of-0000M.safetensors shards (filled in order up to max_shard_bytes each) plus
// model.safetensors.index.json. Returns the files written.
std::vector<std::filesystem::path> write_safetensors_checkpoint(const std::filesystem::path& dir,
                                                                const std::vector<TensorSource>& tensors,
                                                                uint64_t max_shard_bytes = kDefaultMaxShardBytes);

// The tensors of docs/model-format.md §3 for `config`, with seeded random contents (same seed, same
// bytes, whatever the thread count): embeddings ~ N(0,1), norms ~ 1 + N(0, 0.1²), projections ~ N(0, 1/in),
// router (always F32) ~ N(0, 1/hidden), router bias (F32) ~ N(0, 0.05²). `dtype` (F32, BF16, F16) is the
// storage type of everything but the router.
std::vector<TensorSource> random_checkpoint_tensors(const ModelConfig& config, uint64_t seed, DType dtype);

// Everything of a model directory but the weights: config.json, generation_config.json, harmony.json and the
// tokenizer.json (when the vocabulary has room for one) — what `serve --load-format dummy` reads.
void write_model_files(const ModelConfig& config, const std::filesystem::path& dir);

// A complete checkpoint directory: config.json, the weights (random_checkpoint_tensors), generation_config.json,
// harmony.json, and a byte-level BPE tokenizer.json when the vocabulary has room for one.
void write_random_checkpoint(const ModelConfig& config, const std::filesystem::path& dir, uint64_t seed = 0,
                             DType dtype = DType::BF16, uint64_t max_shard_bytes = kDefaultMaxShardBytes);

// A drafter directory (docs/model-format.md §6): config.json and seeded random weights drawn as make-model's are
// (random_init by role), stored as `dtype`.
void write_random_drafter(const DrafterConfig& config, const std::filesystem::path& dir, uint64_t seed = 0,
                          DType dtype = DType::BF16);

// Writes `text` to `path`, failing with the path and errno text.
void write_text_file(const std::filesystem::path& path, std::string_view text);

}  // namespace beamline
