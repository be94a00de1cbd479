#pragma once
// Read-only safetensors checkpoints over mmap: one file, or shards listed by model.safetensors.index.json.
// Every header is validated in full when opened (lengths, dtypes, shapes against byte sizes, offsets inside
// the file, no overlaps or holes, element alignment), so a view handed out never reads outside its file.
#include <cstddef>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tensor/tensor_view.h"
#include "util/mapped_file.h"

namespace beamline {

class SafetensorsArchive {
 public:
  // `path` is a checkpoint directory (its model.safetensors.index.json if present, else its
  // model.safetensors), a single .safetensors file, or an index .json file. Throws beamline::Error naming
  // the file and tensor for any malformed or missing input.
  static std::shared_ptr<const SafetensorsArchive> open(const std::filesystem::path& path);

  const TensorView* find(std::string_view name) const;                  // nullptr when absent
  const TensorView& at(std::string_view name) const;                    // throws naming the tensor
  const std::filesystem::path& file_of(std::string_view name) const;    // the file holding a present tensor
  std::vector<std::string> tensor_names() const;                        // sorted
  std::size_t tensor_count() const { return tensors_.size(); }
  const std::filesystem::path& source() const { return source_; }       // what open() was given
  std::vector<std::filesystem::path> files() const;                     // the mapped .safetensors files

  SafetensorsArchive(const SafetensorsArchive&) = delete;
  SafetensorsArchive& operator=(const SafetensorsArchive&) = delete;

 private:
  struct Entry {
    TensorView view;
    std::size_t file_index;
  };
  SafetensorsArchive() = default;
  void open_index(const std::filesystem::path& index_path);
  std::size_t map_file(const std::filesystem::path& path);

  std::filesystem::path source_;
  std::vector<MappedFile> files_;
  std::map<std::string, Entry, std::less<>> tensors_;
};

// The name of shard `index` (0-based) of `count` in the Hugging Face layout: model-00001-of-00003.safetensors.
std::string safetensors_shard_name(std::size_t index, std::size_t count);

inline constexpr std::string_view kSafetensorsFile = "model.safetensors";
inline constexpr std::string_view kSafetensorsIndexFile = "model.safetensors.index.json";

}  // namespace beamline
