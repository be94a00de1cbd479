#pragma once
// One rank's part of a quantized weight (docs/parallel.md, "Quantized weights"): rows or columns of the logical
// [out, in] matrix, stored in the scheme's own layout for the part's own shape (quant_layout(scheme, rows, columns)),
// so that every backend reads a part exactly as it reads a whole weight. The part's codes are the whole weight's
// codes of its elements and each of its scales is the scale of the whole weight's block or group that its elements
// came from; dequantization is elementwise, so dequantize(part) == part of dequantize(whole), bit for bit.
//
// What a part can hold, per scheme (B the scale block or group along the cut axis):
//  fp8    (B = 128 along both axes; blocks may be cut short at the bottom and right edges): a part whose first row
//         (column) starts a block, or that lies inside one block (each rank keeps a copy of that block's scale).
//  mxfp8  rows: any (scales are per row); columns: begin and count multiples of 32 (a part's row needs whole groups).
//  nvfp4  rows: any (weight_scale_2 is per tensor: each part keeps it); columns: begin and count multiples of 16,
//         which also keeps the packed nibbles whole bytes.
// Anything else would need a scale the layout cannot store and is refused (quantized_slice_problem).
#include <cstdint>
#include <string>

#include "quant/quantize.h"

namespace beamline {

enum class SliceAxis : uint8_t { Rows, Columns };

// Empty when [begin, begin + count) along `axis` of an [out, in] weight in `scheme` is a part the scheme's layout
// can hold (above), else why not, naming the block or group size and the bounds.
std::string quantized_slice_problem(QuantScheme scheme, int64_t out_features, int64_t in_features, SliceAxis axis,
                                    int64_t begin, int64_t count);

// Rows [begin, begin + count): a view into the whole weight's bytes (codes and scales are contiguous per row band).
// Error (quantized_slice_problem) when the part cannot be held.
QuantizedWeightView quantized_rows(const QuantizedWeightView& weight, int64_t begin, int64_t count);

// Columns [begin, begin + count): copied, row by row. Error (quantized_slice_problem) when the part cannot be held.
QuantizedWeight quantized_columns(const QuantizedWeightView& weight, int64_t begin, int64_t count);

}  // namespace beamline
