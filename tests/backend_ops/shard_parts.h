#pragma once
// One tensor-parallel rank's parts of quantized weights (docs/parallel.md, Quantized weights), for the fp8, mxfp8 and
// nvfp4 groups: Beam-1.0's TP8 cuts (rank 1's part) and small ones, among them parts inside one fp8 block; each group
// keeps the cases its scheme can hold (quant/slice.h).
#include <cstdint>
#include <vector>

#include "quant/slice.h"

namespace beamline::backend_ops {

struct ShardPartCase {
  int64_t out, in;  // the whole weight
  SliceAxis axis;
  int64_t begin, count;
  const char* what;

  int64_t part_out() const { return axis == SliceAxis::Rows ? count : out; }
  int64_t part_in() const { return axis == SliceAxis::Rows ? in : count; }
};

inline std::vector<ShardPartCase> shard_part_cases(QuantScheme scheme, bool small_only) {
  const std::vector<ShardPartCase> all{
      {6144, 5120, SliceAxis::Rows, 768, 768, "TP8 q_proj rows"},
      {5120, 6144, SliceAxis::Columns, 768, 768, "TP8 o_proj columns"},
      {1024, 5120, SliceAxis::Rows, 128, 128, "TP8 k_proj rows"},
      {2560, 5120, SliceAxis::Rows, 320, 320, "TP8 expert gate_proj rows"},
      {5120, 2560, SliceAxis::Columns, 320, 320, "TP8 expert down_proj columns"},
      {128, 64, SliceAxis::Rows, 16, 16, "rows inside a block"},
      {64, 128, SliceAxis::Columns, 32, 32, "columns inside a block"},
      {200, 336, SliceAxis::Columns, 256, 80, "columns to the short edge block"},
      {40, 128, SliceAxis::Columns, 32, 64, "whole groups of columns"}};
  std::vector<ShardPartCase> cases;
  for (const ShardPartCase& c : all) {
    const bool beam_sized = c.out >= 1024 || c.in >= 1024;
    if ((small_only && beam_sized) ||
        !quantized_slice_problem(scheme, c.out, c.in, c.axis, c.begin, c.count).empty())
      continue;
    cases.push_back(c);
  }
  return cases;
}

}  // namespace beamline::backend_ops
