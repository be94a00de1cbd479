#include "checkpoint/safetensors.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "util/error.h"

namespace beamline {
namespace {

using nlohmann::json;

constexpr std::size_t kHeaderLengthBytes = 8;

uint64_t read_le64(const std::byte* bytes) {
  uint64_t value = 0;
  for (int i = 7; i >= 0; --i) value = (value << 8) | static_cast<uint64_t>(bytes[i]);
  return value;
}

struct ParsedTensor {
  TensorView view;
  uint64_t begin, end;  // relative to the data section
};

// A non-negative integer JSON value, or nullopt.
std::optional<uint64_t> as_size(const json& value) {
  if (value.is_number_unsigned()) return value.get<uint64_t>();
  if (value.is_number_integer() && value.get<int64_t>() >= 0) return static_cast<uint64_t>(value.get<int64_t>());
  return std::nullopt;
}

ParsedTensor parse_entry(const std::string& file, const std::string& name, const json& entry,
                         uint64_t data_size) {
  const auto bad = [&](std::string_view what) -> ParsedTensor {
    fail("{}: tensor \"{}\": {}", file, name, what);
  };
  if (!entry.is_object()) return bad(fmt::format("header entry must be an object, found {}", entry.type_name()));

  const auto dtype_it = entry.find("dtype");
  if (dtype_it == entry.end() || !dtype_it->is_string()) return bad("header entry has no string \"dtype\"");
  const auto dtype = dtype_from_name(dtype_it->get<std::string>());
  if (!dtype) return bad(fmt::format("unknown dtype \"{}\"", dtype_it->get<std::string>()));

  const auto shape_it = entry.find("shape");
  if (shape_it == entry.end() || !shape_it->is_array()) return bad("header entry has no \"shape\" list");
  std::vector<int64_t> shape;
  uint64_t numel = 1;
  for (const json& dim : *shape_it) {
    const auto size = as_size(dim);
    if (!size || *size > static_cast<uint64_t>(INT64_MAX))
      return bad(fmt::format("shape {} has an entry that is not a non-negative integer", shape_it->dump()));
    if (__builtin_mul_overflow(numel, *size, &numel)) return bad(fmt::format("shape {} overflows", shape_it->dump()));
    shape.push_back(static_cast<int64_t>(*size));
  }
  uint64_t expected_bytes = 0;
  if (__builtin_mul_overflow(numel, static_cast<uint64_t>(dtype_size(*dtype)), &expected_bytes))
    return bad(fmt::format("shape {} overflows", shape_it->dump()));

  const auto offsets_it = entry.find("data_offsets");
  if (offsets_it == entry.end() || !offsets_it->is_array() || offsets_it->size() != 2 ||
      !as_size((*offsets_it)[0]) || !as_size((*offsets_it)[1]))
    return bad("header entry has no \"data_offsets\" [begin, end] of non-negative integers");
  const uint64_t begin = *as_size((*offsets_it)[0]), end = *as_size((*offsets_it)[1]);
  if (end < begin) return bad(fmt::format("data_offsets [{}, {}] end before they begin", begin, end));
  if (end - begin != expected_bytes)
    return bad(fmt::format("shape {} of {} needs {} bytes but data_offsets [{}, {}] hold {}", shape_string(shape),
                           dtype_name(*dtype), expected_bytes, begin, end, end - begin));
  if (end > data_size)
    return bad(fmt::format("data_offsets [{}, {}] reach past the end of the data section ({} bytes): "
                           "the file is truncated or the header is wrong", begin, end, data_size));

  ParsedTensor parsed;
  parsed.view.name = name;
  parsed.view.dtype = *dtype;
  parsed.view.shape = std::move(shape);
  parsed.view.nbytes = static_cast<std::size_t>(expected_bytes);
  parsed.begin = begin;
  parsed.end = end;
  return parsed;
}

// Validates the whole header of one mapped file and returns its tensors with data pointers into the map.
std::vector<TensorView> parse_file(const MappedFile& file) {
  const std::string path = file.path().string();
  if (file.size() < kHeaderLengthBytes)
    fail("{}: truncated: {} bytes, too short for the 8-byte header length", path, file.size());
  const uint64_t header_length = read_le64(file.data());
  const uint64_t available = file.size() - kHeaderLengthBytes;
  if (header_length > available)
    fail("{}: header length {} is larger than the {} bytes after it (truncated file or corrupt header)", path,
         header_length, available);
  const char* header_begin = reinterpret_cast<const char*>(file.data() + kHeaderLengthBytes);
  json header;
  try {
    header = json::parse(header_begin, header_begin + header_length);
  } catch (const json::exception& error) {  // parse_error, or out_of_range for a number past a double's range
    fail("{}: header is not valid JSON: {}", path, error.what());
  }
  if (!header.is_object()) fail("{}: header must be a JSON object, found {}", path, header.type_name());

  const uint64_t data_offset = kHeaderLengthBytes + header_length;
  const uint64_t data_size = file.size() - data_offset;
  std::vector<ParsedTensor> parsed;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") continue;
    parsed.push_back(parse_entry(path, name, entry, data_size));
  }

  // The data section is covered exactly once, in offset order (the format allows no holes or overlaps).
  std::sort(parsed.begin(), parsed.end(), [](const ParsedTensor& a, const ParsedTensor& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t covered = 0;
  const ParsedTensor* previous = nullptr;
  for (const ParsedTensor& tensor : parsed) {
    if (tensor.begin < covered)
      fail("{}: tensor \"{}\": data_offsets [{}, {}] overlap those of tensor \"{}\" [{}, {}]", path, tensor.view.name,
           tensor.begin, tensor.end, previous->view.name, previous->begin, previous->end);
    if (tensor.begin > covered)
      fail("{}: tensor \"{}\": data_offsets [{}, {}] leave bytes [{}, {}) of the data section unused", path,
           tensor.view.name, tensor.begin, tensor.end, covered, tensor.begin);
    covered = tensor.end;
    previous = &tensor;
  }
  if (covered != data_size)
    fail("{}: the tensors cover {} bytes of data but the file holds {} after the header", path, covered, data_size);

  std::vector<TensorView> views;
  views.reserve(parsed.size());
  for (ParsedTensor& tensor : parsed) {
    const uint64_t file_offset = data_offset + tensor.begin;
    const std::size_t alignment = dtype_size(tensor.view.dtype);
    if (file_offset % alignment != 0)
      fail("{}: tensor \"{}\": data at file offset {} is not aligned to its {}-byte {} elements", path,
           tensor.view.name, file_offset, alignment, dtype_name(tensor.view.dtype));
    tensor.view.data = file.data() + file_offset;
    views.push_back(std::move(tensor.view));
  }
  return views;
}

json read_json_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("{}: cannot open: {}", path.string(), std::strerror(errno));
  try {
    return json::parse(in);
  } catch (const json::exception& error) {
    fail("{}: invalid JSON: {}", path.string(), error.what());
  }
}

}  // namespace

std::string safetensors_shard_name(std::size_t index, std::size_t count) {
  return fmt::format("model-{:05}-of-{:05}.safetensors", index + 1, count);
}

std::shared_ptr<const SafetensorsArchive> SafetensorsArchive::open(const std::filesystem::path& path) {
  std::shared_ptr<SafetensorsArchive> archive(new SafetensorsArchive());
  archive->source_ = path;
  std::error_code error;
  if (std::filesystem::is_directory(path, error)) {
    const auto index = path / kSafetensorsIndexFile;
    const auto single = path / kSafetensorsFile;
    if (std::filesystem::exists(index, error)) {
      archive->open_index(index);
    } else if (std::filesystem::exists(single, error)) {
      archive->map_file(single);
    } else {
      fail("{}: checkpoint directory has neither {} nor {}", path.string(), kSafetensorsFile, kSafetensorsIndexFile);
    }
  } else if (path.extension() == ".json") {
    archive->open_index(path);
  } else {
    archive->map_file(path);
  }
  return archive;
}

std::size_t SafetensorsArchive::map_file(const std::filesystem::path& path) {
  const std::size_t file_index = files_.size();
  files_.emplace_back(path);
  for (TensorView& view : parse_file(files_.back())) {
    std::string name = view.name;
    tensors_.emplace(std::move(name), Entry{std::move(view), file_index});
  }
  return file_index;
}

void SafetensorsArchive::open_index(const std::filesystem::path& index_path) {
  const std::string index_name = index_path.string();
  const json index = read_json_file(index_path);
  if (!index.is_object()) fail("{}: must be a JSON object, found {}", index_name, index.type_name());
  const auto map_it = index.find("weight_map");
  if (map_it == index.end() || !map_it->is_object()) fail("{}: key \"weight_map\": missing or not an object", index_name);
  if (map_it->empty()) fail("{}: key \"weight_map\" lists no tensors", index_name);

  std::map<std::string, std::vector<std::string>> tensors_by_shard;
  for (const auto& [tensor, shard] : map_it->items()) {
    if (!shard.is_string())
      fail("{}: weight_map entry for tensor \"{}\" must be a file name string, found {}", index_name, tensor,
           shard.type_name());
    const std::string shard_name = shard.get<std::string>();
    if (shard_name.empty() || shard_name == "." || shard_name == ".." || shard_name.find('/') != std::string::npos)
      fail("{}: weight_map entry for tensor \"{}\": \"{}\" is not a file name in the checkpoint directory", index_name,
           tensor, shard_name);
    tensors_by_shard[shard_name].push_back(tensor);
  }

  std::map<std::string, Entry, std::less<>> shard_tensors;
  for (const auto& [shard_name, wanted] : tensors_by_shard) {
    const auto shard_path = index_path.parent_path() / shard_name;
    const std::size_t first_new = files_.size();
    try {
      files_.emplace_back(shard_path);
    } catch (const Error& error) {
      fail("{}: tensor \"{}\" is mapped to shard {}, which cannot be read: {}", index_name, wanted.front(),
           shard_name, error.what());
    }
    std::vector<TensorView> views = parse_file(files_.back());
    std::map<std::string, TensorView, std::less<>> by_name;
    for (TensorView& view : views) {
      std::string name = view.name;
      by_name.emplace(std::move(name), std::move(view));
    }
    for (const std::string& tensor : wanted) {
      auto it = by_name.find(tensor);
      if (it == by_name.end())
        fail("{}: tensor \"{}\" is mapped to {}, but that file has no such tensor", index_name, tensor,
             shard_path.string());
      tensors_.emplace(tensor, Entry{std::move(it->second), first_new});
      by_name.erase(it);
    }
    for (const auto& [stray, view] : by_name)
      spdlog::warn("{}: tensor \"{}\" is not listed in {}; ignored", shard_path.string(), stray, index_name);
  }
}

const TensorView* SafetensorsArchive::find(std::string_view name) const {
  const auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second.view;
}

const TensorView& SafetensorsArchive::at(std::string_view name) const {
  const TensorView* view = find(name);
  if (view == nullptr) fail("{}: no tensor \"{}\"", source_.string(), name);
  return *view;
}

const std::filesystem::path& SafetensorsArchive::file_of(std::string_view name) const {
  const auto it = tensors_.find(name);
  if (it == tensors_.end()) fail("{}: no tensor \"{}\"", source_.string(), name);
  return files_[it->second.file_index].path();
}

std::vector<std::string> SafetensorsArchive::tensor_names() const {
  std::vector<std::string> names;
  names.reserve(tensors_.size());
  for (const auto& [name, entry] : tensors_) names.push_back(name);
  return names;
}

std::vector<std::filesystem::path> SafetensorsArchive::files() const {
  std::vector<std::filesystem::path> paths;
  for (const MappedFile& file : files_) paths.push_back(file.path());
  return paths;
}

}  // namespace beamline
