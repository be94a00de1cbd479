#pragma once
// A whole file mapped read-only into memory (checkpoint shards are read through this, never copied).
#include <cstddef>
#include <filesystem>
#include <span>

namespace beamline {

class MappedFile {
 public:
  // Throws beamline::Error naming the path and the system's reason (errno text) when the file cannot be
  // opened, sized or mapped. An empty file maps to an empty span.
  explicit MappedFile(const std::filesystem::path& path);
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::byte* data() const { return data_; }
  std::size_t size() const { return size_; }
  std::span<const std::byte> bytes() const { return {data_, size_}; }
  const std::filesystem::path& path() const { return path_; }

 private:
  void unmap() noexcept;

  std::filesystem::path path_;
  const std::byte* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace beamline
