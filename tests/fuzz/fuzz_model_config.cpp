// Fuzzes config.json parsing (model/config): JSON text in, ModelConfig::from_json. A config it accepts must survive
// its own round trip (to_json, then from_json again, gives the same JSON), and the derived values the model uses
// (kv_group_size divides by num_key_value_heads) must be computable.
#include <cstdlib>

#include "fuzz_support.h"
#include "model/config.h"
#include "util/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  const nlohmann::json json = nlohmann::json::parse(beamline::fuzz::as_text(data, size), nullptr,
                                                    /*allow_exceptions=*/false);
  if (json.is_discarded()) return 0;  // not JSON: nlohmann's parser, not beamline's, would answer
  beamline::ModelConfig config;
  try {
    config = beamline::ModelConfig::from_json(json);
  } catch (const beamline::Error&) {
    return 0;
  }
  beamline::fuzz::sink = static_cast<uint64_t>(config.kv_group_size());
  const nlohmann::json written = config.to_json();
  if (beamline::ModelConfig::from_json(written).to_json() != written) std::abort();
  return 0;
}
