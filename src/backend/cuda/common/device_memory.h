#pragma once
// Device memory of the CUDA backend (internal to backend/cuda):
//  - CachingAllocator: activations, scratch and the KV pool. Freed blocks go back to a size-keyed cache and are
//    reused in stream order (all work is on one stream), so a steady decode loop makes no cudaMalloc. What recorded
//    graphs allocate comes from one graph pool instead (begin_recording).
//  - WeightArena: weights, bump-allocated from a few large chunks, never freed one by one.
//  - PinnedStaging: host-to-device copies through page-locked buffers (weights streamed from the mmap'd
//    checkpoint, and the small per-step uploads of the batch description).
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <span>
#include <vector>

namespace beamline::cuda {

// Throws beamline::Error naming the call and CUDA's message.
void check(cudaError_t status, const char* what);
#define BEAMLINE_CUDA_CHECK(expr) ::beamline::cuda::check((expr), #expr)

struct AllocatorStats {
  int64_t device_allocations = 0;  // cudaMalloc calls so far
  std::size_t reserved_bytes = 0;  // held from the device (in use + cached)
  std::size_t cached_bytes = 0;    // free for reuse
  std::size_t graph_pool_bytes = 0;  // of those reserved, the graph pool's
};

class CachingAllocator {
 public:
  CachingAllocator() : state_(std::make_shared<State>()) {}
  // A block of at least `bytes`, 256-byte aligned; the shared_ptr gives it back to the cache.
  std::shared_ptr<void> allocate(std::size_t bytes);
  AllocatorStats stats() const;
  void release_cached();  // cudaFree of every cached block (after a device synchronisation)

  // Between these, allocations come from the graph pool, shared by every recorded graph (PyTorch's and vLLM's
  // design): one step runs at a time and each step's tensors are consumed before the next one runs, in stream
  // order, so a recording may use every block of the pool, and a block freed during it serves again later in it.
  // Pool blocks never return to the cache, whose later (eager) allocations could outlive a replay.
  void begin_recording();
  void end_recording();

 private:
  struct State {
    mutable std::mutex mutex;
    std::multimap<std::size_t, void*> free_blocks;  // size -> block
    bool recording = false;
    std::vector<std::pair<std::size_t, void*>> graph_blocks;  // the graph pool
    std::multimap<std::size_t, void*> graph_free;              // while recording: pool blocks not in use
    std::set<void*> graph_handed_out;                          // while recording: pool blocks in use
    AllocatorStats stats;
    ~State();
  };
  void* device_malloc(std::size_t size);
  std::shared_ptr<State> state_;
};

class WeightArena {
 public:
  // `bytes` of device memory that lives as long as any returned pointer's owner (the chunk).
  std::shared_ptr<std::byte> allocate(std::size_t bytes);
  // Makes the next chunk hold exactly these tensors (as allocate would round them), so a whole model is one
  // cudaMalloc. Only before the first allocation; later calls change nothing.
  void reserve(std::span<const std::size_t> tensor_bytes);
  std::size_t bytes_used() const { return used_total_; }
  int64_t chunks() const { return static_cast<int64_t>(chunks_allocated_); }

 private:
  std::shared_ptr<std::byte> chunk_;
  std::size_t chunk_size_ = 0, chunk_used_ = 0, used_total_ = 0, chunks_allocated_ = 0, reserved_ = 0;
};

class PinnedStaging {
 public:
  explicit PinnedStaging(cudaStream_t stream) : stream_(stream) {}
  ~PinnedStaging();
  PinnedStaging(const PinnedStaging&) = delete;
  PinnedStaging& operator=(const PinnedStaging&) = delete;

  // Enqueues a copy of `bytes` host bytes to `device`; the host buffer may be reused as soon as this returns.
  void copy_to_device(void* device, const void* host, std::size_t bytes);

 private:
  static constexpr std::size_t kSlotBytes = 32u << 20;
  static constexpr int kSlots = 4;
  void next_slot();

  cudaStream_t stream_;
  std::byte* buffer_ = nullptr;  // kSlots slots of kSlotBytes
  cudaEvent_t done_[kSlots] = {};
  int slot_ = 0;
  std::size_t offset_ = 0;
};

// Page-locked host buffers for device-to-host copies the host waits for later (Backend::download_later): one
// buffer per pending copy, from a size-keyed free list, so a steady loop makes no cudaMallocHost.
class PinnedReadbackPool {
 public:
  PinnedReadbackPool() = default;
  ~PinnedReadbackPool();
  PinnedReadbackPool(const PinnedReadbackPool&) = delete;
  PinnedReadbackPool& operator=(const PinnedReadbackPool&) = delete;

  // At least `bytes` (rounded up to a power of two); give it back with release(buffer, bytes).
  void* acquire(std::size_t bytes);
  void release(void* buffer, std::size_t bytes);

 private:
  static std::size_t rounded(std::size_t bytes);
  std::mutex mutex_;
  std::multimap<std::size_t, void*> free_;
  std::vector<void*> all_;
};

}  // namespace beamline::cuda
