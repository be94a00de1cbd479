#pragma once
// --data-parallel-size on rank 0: one ModelRunner per data-parallel replica, for one engine each (its own scheduler and
// KV block manager, as vLLM's data-parallel engine cores), over the one distributed BeamModelRunner that steps them
// together (BeamModelRunner::launch_replica). The runners share it; the last one to go stops the other ranks. New
// weights given to any of them reach every replica at once: EngineClient::run_on_model gives them to one runner, with
// every engine between steps.
#include <memory>
#include <vector>

#include "engine/model_runner.h"
#include "runner/beam_model_runner.h"

namespace beamline {

// runner->data_parallel_size() (above 1) runners, replica 0 first.
std::vector<std::unique_ptr<ModelRunner>> data_parallel_runners(const std::shared_ptr<BeamModelRunner>& runner);

}  // namespace beamline
