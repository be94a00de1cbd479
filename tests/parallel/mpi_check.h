#pragma once
// What the MPI check programs of tests/parallel share: their command line (the layout flags and each program's own),
// a scratch folder every rank sees, the logits comparison, and main's error handling.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <span>
#include <string>

#include "parallel/communicator.h"
#include "parallel/parallel_config.h"

namespace beamline {

// Reads argv: `--tp N`, `--pp N`, `--dp N` and `--ep` into the layout (whose timeout_seconds is `timeout_seconds`);
// any other flag goes to `other(flag, value)`, where value() reads the flag's value (an Error when there is none).
// `other` returns false for a flag it does not know, which is then an Error naming it.
using OtherFlag = std::function<bool(const std::string& flag, const std::function<std::string()>& value)>;
ParallelConfig parse_check_args(int argc, char** argv, double timeout_seconds, const OtherFlag& other);
int32_t flag_int(const std::string& flag, const std::string& value);  // an Error naming the flag if not a number

// A folder path that rank 0 of `group` picks under the temporary folder (`prefix` and its process id), the same on
// every rank; nothing is created.
std::filesystem::path shared_scratch_path(Communicator& group, const std::string& prefix);

// max |actual - expected| and max |expected| over two logit vectors of one size (an Error naming `who` otherwise).
struct LogitsDifference {
  double worst = 0, scale = 0;
  double relative() const { return worst / scale; }
  bool within(double tolerance) const;  // finite and relative() <= tolerance
};
LogitsDifference logits_difference(std::span<const float> actual, std::span<const float> expected,
                                   const std::string& who);

// main's body: check(argc, argv), or 1 after logging the exception it throws.
int run_check(int (*check)(int, char**), int argc, char** argv);

}  // namespace beamline
