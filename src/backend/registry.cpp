#include "backend/registry.h"

#include <spdlog/spdlog.h>

#include <map>
#include <mutex>

#include "backend/cpu/cpu_backend.h"
#include "backend/peer_all_reduce.h"
#include "util/error.h"

namespace beamline {
namespace {

std::mutex registry_mutex;

struct Registered {
  BackendFactory backend;
  PeerAllReduceFactory peers;  // empty: no peer memory
};

std::map<std::string, Registered, std::less<>>& registry() {
  static std::map<std::string, Registered, std::less<>> factories;
  return factories;
}

}  // namespace

void register_backend(std::string name, BackendFactory factory, PeerAllReduceFactory peers) {
  std::lock_guard lock(registry_mutex);
  registry()[std::move(name)] = {std::move(factory), std::move(peers)};
}

std::unique_ptr<PeerAllReduce> make_peer_all_reduce(Backend& backend) {
  PeerAllReduceFactory peers;
  {
    std::lock_guard lock(registry_mutex);
    if (auto found = registry().find(backend.name()); found != registry().end()) peers = found->second.peers;
  }
  return peers ? peers(backend) : nullptr;
}

std::unique_ptr<Backend> create_backend(std::string_view device) {
  if (device == "auto") {
    // As vLLM does: the GPU when there is one, and the choice logged, since it decides everything about speed.
    try {
      std::unique_ptr<Backend> backend = create_backend("cuda");
      spdlog::info("--device auto: using cuda");
      return backend;
    } catch (const Error& error) {
      spdlog::info("--device auto: using cpu ({})", error.what());
      return make_cpu_backend();
    }
  }
  if (device == "cpu") return make_cpu_backend();
  {
    std::lock_guard lock(registry_mutex);
    if (auto found = registry().find(device); found != registry().end()) return found->second.backend();
  }
  if (device == "cuda")
    fail("device 'cuda' is not available: this beamline was built without CUDA (configure with -DBEAMLINE_CUDA=ON)");
  fail("unknown device '{}' (expected auto, cpu or cuda)", device);
}

}  // namespace beamline
