#include "checkpoint/checkpoint_writer.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>

#include "checkpoint/random_init.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/synthetic_tokenizer.h"
#include "model/checkpoint_layout.h"
#include "util/counter_random.h"
#include "util/error.h"
#include "util/thread_pool.h"

namespace beamline {
namespace {

using nlohmann::json;

constexpr std::size_t kWriteChunkBytes = std::size_t{64} << 20;  // bounds the writer's memory
constexpr std::size_t kFillTaskBytes = std::size_t{1} << 20;     // granularity of parallel generation

class OutputFile {
 public:
  explicit OutputFile(std::filesystem::path path) : path_(std::move(path)), file_(std::fopen(path_.c_str(), "wb")) {
    if (file_ == nullptr) fail("{}: cannot create: {}", path_.string(), std::strerror(errno));
  }
  ~OutputFile() {
    if (file_ != nullptr) std::fclose(file_);
  }
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;

  void write(const void* data, std::size_t size) {
    if (size != 0 && std::fwrite(data, 1, size, file_) != size)
      fail("{}: write failed: {}", path_.string(), std::strerror(errno));
  }
  void close() {
    const int result = std::fclose(std::exchange(file_, nullptr));
    if (result != 0) fail("{}: write failed on close: {}", path_.string(), std::strerror(errno));
  }

 private:
  std::filesystem::path path_;
  std::FILE* file_;
};

void require_float_dtype(DType dtype, std::string_view what) {
  require(dtype == DType::F32 || dtype == DType::BF16 || dtype == DType::F16,
          "{}: dtype {} is not a float storage type (F32, BF16, F16)", what, dtype_name(dtype));
}

TensorSource random_tensor(std::string name, DType dtype, std::vector<int64_t> shape, uint64_t seed, float mean,
                           float stddev) {
  const uint64_t key = stream_key(seed, name);
  const std::size_t element_size = dtype_size(dtype);
  auto fill = [=](std::size_t byte_offset, std::span<std::byte> out) {
    const std::size_t first = byte_offset / element_size, count = out.size() / element_size;
    for (std::size_t i = 0; i < count; ++i)
      store_float(dtype, normal_value(key, first + i, mean, stddev), out.data() + i * element_size);
  };
  return TensorSource{std::move(name), dtype, std::move(shape), std::move(fill)};
}

std::size_t checked_nbytes(const TensorSource& tensor) {
  uint64_t bytes = dtype_size(tensor.dtype);
  for (int64_t dim : tensor.shape) {
    require(dim >= 0, "tensor \"{}\": negative dimension in shape {}", tensor.name, shape_string(tensor.shape));
    require(!__builtin_mul_overflow(bytes, static_cast<uint64_t>(dim), &bytes), "tensor \"{}\": shape {} overflows",
            tensor.name, shape_string(tensor.shape));
  }
  return static_cast<std::size_t>(bytes);
}

void stream_tensor(const TensorSource& tensor, std::vector<std::byte>& buffer, OutputFile& out) {
  const std::size_t total = tensor.nbytes();
  for (std::size_t offset = 0; offset < total; offset += buffer.size()) {
    const std::size_t chunk = std::min(buffer.size(), total - offset);
    const std::size_t tasks = (chunk + kFillTaskBytes - 1) / kFillTaskBytes;
    ThreadPool::global().parallel_for(tasks, [&](std::size_t begin, std::size_t end) {
      for (std::size_t task = begin; task < end; ++task) {
        const std::size_t from = task * kFillTaskBytes, to = std::min(chunk, from + kFillTaskBytes);
        tensor.fill(offset + from, std::span<std::byte>(buffer.data() + from, to - from));
      }
    });
    out.write(buffer.data(), chunk);
  }
}

nlohmann::json harmony_template_json() {
  return {{"channels", {"analysis", "commentary", "final"}},
          {"reasoning_channel", "analysis"},
          {"final_channel", "final"},
          {"tool_channel", "commentary"},
          {"tool_namespace", "functions"},
          {"stop_tokens", {"<|return|>", "<|call|>"}},
          {"model_identity", "You are Beam, a large language model trained by Reflection AI."},
          {"knowledge_cutoff", "2026-06"},
          {"default_reasoning_effort", "medium"}};
}

nlohmann::json generation_config_json(const ModelConfig& config) {
  json out = json::object();
  out["bos_token_id"] = config.bos_token_id ? json(*config.bos_token_id) : json(nullptr);
  out["eos_token_id"] = config.eos_token_ids;
  out["pad_token_id"] = config.pad_token_id ? json(*config.pad_token_id) : json(nullptr);
  return out;
}

// A directory holding weights from an earlier write would otherwise mix old shards (or a stale index)
// with the new ones.
void remove_previous_weights(const std::filesystem::path& dir) {
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(dir, error)) {
    const std::string name = entry.path().filename().string();
    const bool is_shard = name.starts_with("model-") && name.ends_with(".safetensors") && name.find("-of-") != std::string::npos;
    if (name == kSafetensorsFile || name == kSafetensorsIndexFile || is_shard) std::filesystem::remove(entry.path(), error);
  }
}

}  // namespace

std::size_t TensorSource::nbytes() const { return checked_nbytes(*this); }

TensorSource tensor_from_bytes(std::string name, DType dtype, std::vector<int64_t> shape, std::vector<std::byte> bytes) {
  auto shared = std::make_shared<const std::vector<std::byte>>(std::move(bytes));
  TensorSource tensor{std::move(name), dtype, std::move(shape),
                      [shared](std::size_t byte_offset, std::span<std::byte> out) {
                        std::memcpy(out.data(), shared->data() + byte_offset, out.size());
                      }};
  require(tensor.nbytes() == shared->size(), "tensor \"{}\": shape {} of {} needs {} bytes, {} given", tensor.name,
          shape_string(tensor.shape), dtype_name(dtype), tensor.nbytes(), shared->size());
  return tensor;
}

TensorSource tensor_from_floats(std::string name, DType dtype, std::vector<int64_t> shape, const std::vector<float>& values) {
  require_float_dtype(dtype, name);
  std::vector<std::byte> bytes(values.size() * dtype_size(dtype));
  for (std::size_t i = 0; i < values.size(); ++i) store_float(dtype, values[i], bytes.data() + i * dtype_size(dtype));
  return tensor_from_bytes(std::move(name), dtype, std::move(shape), std::move(bytes));
}

void write_text_file(const std::filesystem::path& path, std::string_view text) {
  OutputFile out(path);
  out.write(text.data(), text.size());
  out.close();
}

void write_safetensors(const std::filesystem::path& file, const std::vector<TensorSource>& tensors) {
  std::set<std::string_view> names;
  for (const TensorSource& tensor : tensors)
    require(names.insert(tensor.name).second, "{}: tensor \"{}\" is listed twice", file.string(), tensor.name);

  std::vector<const TensorSource*> order;
  for (const TensorSource& tensor : tensors) order.push_back(&tensor);
  std::stable_sort(order.begin(), order.end(), [](const TensorSource* a, const TensorSource* b) {
    return dtype_size(a->dtype) > dtype_size(b->dtype);
  });

  json header = json::object();
  header["__metadata__"] = {{"format", "pt"}};
  std::size_t offset = 0;
  for (const TensorSource* tensor : order) {
    const std::size_t end = offset + tensor->nbytes();
    header[tensor->name] = {{"dtype", dtype_name(tensor->dtype)}, {"shape", tensor->shape}, {"data_offsets", {offset, end}}};
    offset = end;
  }
  std::string header_text = header.dump();
  header_text.append((8 - header_text.size() % 8) % 8, ' ');  // data starts 8-byte aligned

  OutputFile out(file);
  std::byte length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<std::byte>((header_text.size() >> (8 * i)) & 0xff);
  out.write(length, sizeof length);
  out.write(header_text.data(), header_text.size());
  std::size_t largest = 0;
  for (const TensorSource& tensor : tensors) largest = std::max(largest, tensor.nbytes());
  std::vector<std::byte> buffer(std::min(largest, kWriteChunkBytes));
  for (const TensorSource* tensor : order) stream_tensor(*tensor, buffer, out);
  out.close();
}

std::vector<std::filesystem::path> write_safetensors_checkpoint(const std::filesystem::path& dir,
                                                                const std::vector<TensorSource>& tensors,
                                                                uint64_t max_shard_bytes) {
  remove_previous_weights(dir);
  std::vector<std::vector<TensorSource>> shards(1);
  uint64_t shard_bytes = 0, total_bytes = 0;
  for (const TensorSource& tensor : tensors) {
    const uint64_t bytes = tensor.nbytes();
    if (!shards.back().empty() && shard_bytes + bytes > max_shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().push_back(tensor);
    shard_bytes += bytes;
    total_bytes += bytes;
  }
  if (shards.size() == 1) {
    write_safetensors(dir / kSafetensorsFile, tensors);
    return {dir / kSafetensorsFile};
  }
  std::vector<std::filesystem::path> files;
  json weight_map = json::object();
  for (std::size_t i = 0; i < shards.size(); ++i) {
    const std::string name = safetensors_shard_name(i, shards.size());
    for (const TensorSource& tensor : shards[i]) weight_map[tensor.name] = name;
    write_safetensors(dir / name, shards[i]);
    files.push_back(dir / name);
  }
  const json index = {{"metadata", {{"total_size", total_bytes}}}, {"weight_map", std::move(weight_map)}};
  write_text_file(dir / kSafetensorsIndexFile, index.dump(2) + "\n");
  files.push_back(dir / kSafetensorsIndexFile);
  return files;
}

std::vector<TensorSource> random_checkpoint_tensors(const ModelConfig& config, uint64_t seed, DType dtype) {
  std::vector<TensorSource> tensors;
  for (ExpectedTensor& expected : expected_tensors(config)) {
    const RandomInit init = random_init(expected, dtype);
    tensors.push_back(random_tensor(std::move(expected.name), init.dtype, std::move(expected.shape), seed, init.mean,
                                    init.stddev));
  }
  return tensors;
}

void write_model_files(const ModelConfig& config, const std::filesystem::path& dir) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) fail("{}: cannot create directory: {}", dir.string(), error.message());
  write_text_file(dir / "config.json", config.to_json().dump(2) + "\n");
  write_text_file(dir / "generation_config.json", generation_config_json(config).dump(2) + "\n");
  write_text_file(dir / "harmony.json", harmony_template_json().dump(2) + "\n");
  if (config.vocab_size >= kMinSyntheticTokenizerVocab)
    write_text_file(dir / "tokenizer.json", synthetic_tokenizer_json(config.vocab_size) + "\n");
}

void write_random_checkpoint(const ModelConfig& config, const std::filesystem::path& dir, uint64_t seed, DType dtype,
                             uint64_t max_shard_bytes) {
  write_model_files(config, dir);
  write_safetensors_checkpoint(dir, random_checkpoint_tensors(config, seed, dtype), max_shard_bytes);
}

void write_random_drafter(const DrafterConfig& config, const std::filesystem::path& dir, uint64_t seed, DType dtype) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) fail("{}: cannot create directory: {}", dir.string(), error.message());
  write_text_file(dir / "config.json", config.to_json().dump(2) + "\n");
  std::vector<TensorSource> tensors;
  for (ExpectedTensor& expected : expected_drafter_tensors(config)) {
    const RandomInit init = random_init(expected, dtype);
    tensors.push_back(random_tensor(std::move(expected.name), init.dtype, std::move(expected.shape), seed, init.mean,
                                    init.stddev));
  }
  write_safetensors(dir / "model.safetensors", tensors);
}

}  // namespace beamline
