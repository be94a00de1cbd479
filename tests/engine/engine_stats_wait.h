#pragma once
// Engine::stats() returns snapshots the engine thread takes (one per interval while busy, and when idle), so a test
// that has its outputs may still read an older snapshot: wait until one shows what the test needs.
#include <chrono>
#include <thread>

#include "engine/engine.h"

namespace beamline {

// Waits until a snapshot shows `done` (or gives up after 10 s) and returns the last one read.
template <typename Predicate>
EngineStats wait_for_stats(const Engine& engine, Predicate done) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  EngineStats stats = engine.stats();
  while (!done(stats) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    stats = engine.stats();
  }
  return stats;
}

}  // namespace beamline
