#include "parallel/parallel_groups.h"

#include "util/error.h"
#ifdef BEAMLINE_HAVE_NCCL
#include "parallel/nccl/nccl_communicator.h"
#endif

namespace beamline {
namespace {

std::unique_ptr<Communicator> on_device(std::unique_ptr<Communicator> host, Backend& backend, double timeout_seconds) {
  if (backend.device() == Device::Cpu) return host;
#ifdef BEAMLINE_HAVE_NCCL
  return make_nccl_communicator(std::move(host), backend, timeout_seconds);
#else
  (void)timeout_seconds;
  fail("the {} backend needs NCCL for more than one rank, and this build has none", backend.name());
#endif
}

}  // namespace

std::unique_ptr<ParallelGroups> make_parallel_groups(MpiWorld& world, const ParallelConfig& config, Backend& backend) {
  config.validate();
  require(world.size() == config.world_size(),
          "mpirun started {} ranks, but --data-parallel-size {} x --pipeline-parallel-size {} x "
          "--tensor-parallel-size {} needs {}",
          world.size(), config.data, config.pipeline, config.tensor, config.world_size());
  auto groups = std::make_unique<ParallelGroups>();
  groups->config = config;
  groups->world_rank = world.rank();
  const RankCoordinates at = rank_coordinates(config, world.rank());
  groups->at = at;
  const double timeout = world.timeout_seconds();
  groups->world = world.split("world", 0, world.rank());
  groups->tensor = on_device(world.split("tensor-parallel", at.data * config.pipeline + at.pipeline, at.tensor), backend,
                             timeout);
  groups->pipeline =
      on_device(world.split("pipeline", at.data * config.tensor + at.tensor, at.pipeline), backend, timeout);
  groups->data = on_device(world.split("data-parallel", at.pipeline * config.tensor + at.tensor, at.data), backend,
                           timeout);
  if (config.expert)
    groups->expert = on_device(world.split("expert-parallel", at.pipeline, groups->expert_rank()), backend, timeout);
  if (config.tensor > 1) groups->fused_norm = std::make_unique<FusedAllReduceNorm>(*groups->tensor, backend);
  return groups;
}

}  // namespace beamline
