#include "mpi_check.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <vector>

#include "util/error.h"

namespace beamline {

int32_t flag_int(const std::string& flag, const std::string& value) {
  int32_t number = 0;
  const auto [end, error] = std::from_chars(value.data(), value.data() + value.size(), number);
  require(error == std::errc() && end == value.data() + value.size(), "{} {}: expected a whole number", flag, value);
  return number;
}

ParallelConfig parse_check_args(int argc, char** argv, double timeout_seconds, const OtherFlag& other) {
  ParallelConfig config;
  config.timeout_seconds = timeout_seconds;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const std::function<std::string()> value = [&] {
      require(i + 1 < argc, "{} needs a value", arg);
      return std::string(argv[++i]);
    };
    if (arg == "--tp") config.tensor = flag_int(arg, value());
    else if (arg == "--pp") config.pipeline = flag_int(arg, value());
    else if (arg == "--dp") config.data = flag_int(arg, value());
    else if (arg == "--ep") config.expert = true;
    else require(other && other(arg, value), "unknown argument {}", arg);
  }
  return config;
}

std::filesystem::path shared_scratch_path(Communicator& group, const std::string& prefix) {
  const std::string path =
      (std::filesystem::temp_directory_path() / (prefix + "-" + std::to_string(getpid()))).string();
  std::vector<std::byte> bytes(path.size());
  std::memcpy(bytes.data(), path.data(), path.size());
  group.broadcast_bytes(bytes, 0);
  return std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

bool LogitsDifference::within(double tolerance) const {
  return std::isfinite(relative()) && relative() <= tolerance;
}

LogitsDifference logits_difference(std::span<const float> actual, std::span<const float> expected,
                                   const std::string& who) {
  require(actual.size() == expected.size(), "{}: {} logits, expected {}", who, actual.size(), expected.size());
  LogitsDifference difference;
  bool nan = false;  // std::max would drop it
  for (std::size_t i = 0; i < actual.size(); ++i) {
    const double gap = std::abs(double{actual[i]} - double{expected[i]});
    nan = nan || std::isnan(gap);
    difference.worst = std::max(difference.worst, gap);
    difference.scale = std::max(difference.scale, std::abs(double{expected[i]}));
  }
  if (nan) difference.worst = std::nan("");
  return difference;
}

int run_check(int (*check)(int, char**), int argc, char** argv) {
  try {
    return check(argc, argv);
  } catch (const std::exception& error) {
    spdlog::error("{}", error.what());
    return 1;
  }
}

}  // namespace beamline
