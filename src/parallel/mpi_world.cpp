#include "parallel/mpi_world.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <thread>
#include <vector>

#include <fmt/ranges.h>

#include "parallel/mpi_communicator.h"
#include "util/error.h"

namespace beamline {
namespace {

int32_t env_int(const char* name, int32_t fallback) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? std::atoi(value) : fallback;
}

}  // namespace

bool launched_by_mpi() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMIX_RANK") != nullptr;
}

MpiWorld::MpiWorld(double timeout_seconds) : timeout_seconds_(timeout_seconds) {
  int provided = 0;
  require(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided) == MPI_SUCCESS, "MPI_Init_thread failed");
  if (provided < MPI_THREAD_SERIALIZED) {
    MPI_Finalize();
    beamline::fail("this MPI library offers thread level {}; beamline needs MPI_THREAD_SERIALIZED", provided);
  }
  // Errors come back as codes (and from the deadline loops as beamline::Error) rather than aborting inside MPI.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  rank_ = rank;
  size_ = size;
  local_rank_ = env_int("OMPI_COMM_WORLD_LOCAL_RANK", env_int("MPI_LOCALRANKID", 0));
}

MpiWorld::~MpiWorld() { MPI_Finalize(); }

void MpiWorld::use_local_gpu() const {
  std::vector<std::string> visible;
  if (const char* list = std::getenv("CUDA_VISIBLE_DEVICES"); list != nullptr && *list != '\0') {
    std::string entry;
    for (const char* c = list;; ++c) {
      if (*c == ',' || *c == '\0') {
        visible.push_back(entry);
        entry.clear();
        if (*c == '\0') break;
      } else {
        entry += *c;
      }
    }
    require(local_rank_ < static_cast<int32_t>(visible.size()),
            "rank {}: local rank {} has no GPU among CUDA_VISIBLE_DEVICES={}", rank_, local_rank_, list);
  }
  const std::string device = visible.empty() ? std::to_string(local_rank_) : visible[static_cast<std::size_t>(local_rank_)];
  setenv("CUDA_VISIBLE_DEVICES", device.c_str(), 1);
}

std::unique_ptr<Communicator> MpiWorld::split(const std::string& name, int32_t color, int32_t key) {
  MPI_Comm comm = MPI_COMM_NULL;
  require(MPI_Comm_split(MPI_COMM_WORLD, color, key, &comm) == MPI_SUCCESS, "rank {}: MPI_Comm_split of the {} group failed",
          rank_, name);
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  int size = 0;
  MPI_Comm_size(comm, &size);
  std::vector<int32_t> members(static_cast<std::size_t>(size));
  MPI_Request request = MPI_REQUEST_NULL;
  MPI_Iallgather(&rank_, 1, MPI_INT32_T, members.data(), 1, MPI_INT32_T, comm, &request);
  wait_for(request, timeout_seconds_, fmt::format("rank {}: making the {} group", rank_, name));
  const std::string full_name = fmt::format("{} group (world ranks {})", name, fmt::join(members, ", "));
  return make_mpi_communicator(comm, full_name, timeout_seconds_);
}

void MpiWorld::fail(const std::string& message) {
  spdlog::error("{}", message);
  if (rank_ != 0) {
    MPI_Request request = MPI_REQUEST_NULL;
    MPI_Isend(message.data(), static_cast<int>(message.size()), MPI_CHAR, 0, kFailureTag, MPI_COMM_WORLD, &request);
    // Rank 0 picks the report up from its next wait and ends the job itself; give it that long (a minute at most: it
    // may be busy loading, and this rank's own log already says why).
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::duration<double>(std::min(timeout_seconds_, 60.0));
    int done = 0;
    while (std::chrono::steady_clock::now() < deadline) {
      MPI_Test(&request, &done, MPI_STATUS_IGNORE);
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::_Exit(1);
}

}  // namespace beamline
