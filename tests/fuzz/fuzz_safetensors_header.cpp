// Fuzzes the safetensors reader (checkpoint/safetensors): the input is a whole .safetensors file (8-byte header
// length, JSON header, data). Every view it hands out is read to its last byte, so a header that passed validation
// but points outside the mapping is an ASan report.
#include "checkpoint/safetensors.h"
#include "fuzz_support.h"
#include "util/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  const auto path = beamline::fuzz::write_input_file(data, size, "model.safetensors");
  try {
    const auto archive = beamline::SafetensorsArchive::open(path);
    uint64_t checksum = 0;
    for (const std::string& name : archive->tensor_names()) {
      const beamline::TensorView& view = archive->at(name);
      const std::byte* bytes = view.data;
      for (std::size_t i = 0; i < view.nbytes; ++i) checksum += static_cast<uint64_t>(bytes[i]);
    }
    beamline::fuzz::sink = checksum;
  } catch (const beamline::Error&) {
  }
  return 0;
}
