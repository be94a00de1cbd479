#include "util/npy.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <charconv>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>

#include "util/error.h"

namespace beamline {
namespace {
constexpr char kMagic[] = "\x93NUMPY";
constexpr std::size_t kMagicSize = 6;
}  // namespace

void write_npy(const std::filesystem::path& path, std::span<const float> values, const std::vector<int64_t>& shape) {
  int64_t count = 1;
  for (int64_t d : shape) count *= d;
  require(count == static_cast<int64_t>(values.size()), "{}: {} values for shape [{}]", path.string(), values.size(),
          fmt::join(shape, ", "));
  std::string shape_text = fmt::format("({}{})", fmt::join(shape, ", "), shape.size() == 1 ? "," : "");
  std::string header = fmt::format("{{'descr': '<f4', 'fortran_order': False, 'shape': {}, }}", shape_text);
  // Magic, version, a 2-byte length, then the header padded with spaces to a multiple of 64, ending in '\n'.
  const std::size_t unpadded = kMagicSize + 2 + 2 + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header.push_back('\n');
  std::ofstream out(path, std::ios::binary);
  require(out.good(), "{}: cannot open for writing: {}", path.string(), std::strerror(errno));
  const auto length = static_cast<uint16_t>(header.size());
  const char version[2] = {1, 0};
  const char length_bytes[2] = {static_cast<char>(length & 0xff), static_cast<char>(length >> 8)};
  out.write(kMagic, kMagicSize);
  out.write(version, 2);
  out.write(length_bytes, 2);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  out.write(reinterpret_cast<const char*>(values.data()), static_cast<std::streamsize>(values.size_bytes()));
  out.close();
  require(out.good(), "{}: write failed: {}", path.string(), std::strerror(errno));
}

NpyArray read_npy(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  require(in.good(), "{}: cannot open: {}", path.string(), std::strerror(errno));
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  require(bytes.size() >= 10 && bytes.compare(0, kMagicSize, kMagic, kMagicSize) == 0, "{}: not a .npy file",
          path.string());
  const int major = bytes[6];
  std::size_t header_length, header_begin;
  if (major == 1) {
    header_length = static_cast<uint8_t>(bytes[8]) | static_cast<std::size_t>(static_cast<uint8_t>(bytes[9])) << 8;
    header_begin = 10;
  } else {
    require(bytes.size() >= 12, "{}: truncated .npy header", path.string());
    header_length = 0;
    for (int i = 0; i < 4; ++i) header_length |= static_cast<std::size_t>(static_cast<uint8_t>(bytes[8 + i])) << (8 * i);
    header_begin = 12;
  }
  require(bytes.size() >= header_begin + header_length, "{}: truncated .npy header", path.string());
  const std::string header = bytes.substr(header_begin, header_length);
  require(header.find("'fortran_order': False") != std::string::npos, "{}: only C-order arrays are supported",
          path.string());
  std::size_t element;
  if (header.find("'descr': '<f8'") != std::string::npos) element = 8;
  else if (header.find("'descr': '<f4'") != std::string::npos) element = 4;
  else fail("{}: only little-endian float32/float64 arrays are supported (header {})", path.string(), header);

  NpyArray array;
  const std::size_t open = header.find("'shape': (");
  require(open != std::string::npos, "{}: no shape in the header", path.string());
  const std::size_t close = header.find(')', open);
  require(close != std::string::npos, "{}: malformed shape in the header", path.string());
  std::string dims = header.substr(open + 10, close - open - 10);
  int64_t count = 1;
  for (std::size_t at = 0; at < dims.size();) {
    const std::size_t comma = dims.find(',', at);
    const std::string dim = dims.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    const std::size_t digits = dim.find_first_not_of(' ');
    if (digits != std::string::npos) {
      int64_t value = -1;
      const auto [end, error] = std::from_chars(dim.data() + digits, dim.data() + dim.size(), value);
      require(error == std::errc() && value >= 0 && dim.find_first_not_of(' ', end - dim.data()) == std::string::npos,
              "{}: malformed shape entry \"{}\" in the header", path.string(), dim);
      array.shape.push_back(value);
      count *= value;
    }
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  const std::size_t data_begin = header_begin + header_length;
  require(bytes.size() - data_begin == static_cast<std::size_t>(count) * element,
          "{}: {} data bytes for shape [{}] of {}-byte elements", path.string(), bytes.size() - data_begin,
          fmt::join(array.shape, ", "), element);
  array.values.resize(static_cast<std::size_t>(count));
  for (std::size_t i = 0; i < array.values.size(); ++i) {
    if (element == 8) {
      std::memcpy(&array.values[i], bytes.data() + data_begin + i * 8, 8);
    } else {
      float value;
      std::memcpy(&value, bytes.data() + data_begin + i * 4, 4);
      array.values[i] = value;
    }
  }
  return array;
}

}  // namespace beamline
