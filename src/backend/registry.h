#pragma once
// Backends by device name ("cpu", "cuda", or "auto": CUDA where a device is present, else the CPU), kept apart from the op set (backend.h) so that the interface includes
// no implementation. The CPU backend is always there; others register a factory (the CUDA library does so from a
// static initialiser when it is linked in), with their peer memory's where they have one. An unknown or unavailable
// device is an Error that says how to get it.
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "backend/backend.h"

namespace beamline {

class PeerAllReduce;  // backend/peer_all_reduce.h

using BackendFactory = std::function<std::unique_ptr<Backend>()>;
// New peer memory for the fused tensor-parallel all-reduce on a backend of this kind (backend/peer_all_reduce.h).
using PeerAllReduceFactory = std::function<std::unique_ptr<PeerAllReduce>(Backend& backend)>;
// `peers`: how the backend makes peer memory, where it has any (make_peer_all_reduce).
void register_backend(std::string name, BackendFactory factory, PeerAllReduceFactory peers = nullptr);
std::unique_ptr<Backend> create_backend(std::string_view device);

}  // namespace beamline
