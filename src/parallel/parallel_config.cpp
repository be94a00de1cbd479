#include "parallel/parallel_config.h"

#include "util/error.h"

namespace beamline {

void ParallelConfig::validate() const {
  require(tensor >= 1, "--tensor-parallel-size must be at least 1, not {}", tensor);
  require(pipeline >= 1, "--pipeline-parallel-size must be at least 1, not {}", pipeline);
  require(data >= 1, "--data-parallel-size must be at least 1, not {}", data);
  require(pipeline_micro_batches >= 0, "pipeline micro-batches must be at least 0 (one per stage), not {}",
          pipeline_micro_batches);
  require(timeout_seconds > 0, "--distributed-timeout-seconds must be positive, not {}", timeout_seconds);
}

RankCoordinates rank_coordinates(const ParallelConfig& config, int32_t world_rank) {
  require(world_rank >= 0 && world_rank < config.world_size(), "rank {} is outside a world of {} ranks", world_rank,
          config.world_size());
  RankCoordinates coordinates;
  coordinates.tensor = world_rank % config.tensor;
  coordinates.pipeline = (world_rank / config.tensor) % config.pipeline;
  coordinates.data = world_rank / (config.tensor * config.pipeline);
  return coordinates;
}

}  // namespace beamline
