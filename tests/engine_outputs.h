#pragma once
// Submits requests to an engine together (so they share its batches) and collects each one's first sample.
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "engine/engine.h"

namespace beamline::testing {

inline std::map<std::string, std::vector<TokenId>> token_ids_together(Engine& engine,
                                                                      const std::vector<GenerationRequest>& requests) {
  std::vector<std::shared_ptr<OutputStream>> streams;
  for (const auto& request : requests) streams.push_back(engine.add_request(request));
  std::map<std::string, std::vector<TokenId>> out;
  for (std::size_t i = 0; i < requests.size(); ++i) {
    const RequestOutput output = collect_output(*streams[i]);
    EXPECT_FALSE(output.error) << *output.error;
    out[requests[i].request_id] = output.samples.at(0).token_ids;
  }
  return out;
}

}  // namespace beamline::testing
