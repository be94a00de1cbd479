#pragma once
// NumPy .npy files (format version 1.0, little-endian, C order): float32 out, float32/float64 in.
#include <cstdint>
#include <filesystem>
#include <span>
#include <vector>

namespace beamline {

void write_npy(const std::filesystem::path& path, std::span<const float> values, const std::vector<int64_t>& shape);

struct NpyArray {
  std::vector<int64_t> shape;
  std::vector<double> values;
};

// Reads '<f4' or '<f8' arrays; anything else (or a truncated file) is an Error naming the file.
NpyArray read_npy(const std::filesystem::path& path);

}  // namespace beamline
