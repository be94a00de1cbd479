#include "backend/cuda/common/device_memory.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <bit>
#include <cstring>

#include "util/error.h"

namespace beamline::cuda {
namespace {

constexpr std::size_t kAlignment = 256;
constexpr std::size_t kSmallLimit = 1u << 20;
constexpr std::size_t kLargeGranule = 2u << 20;
constexpr std::size_t kFirstWeightChunk = 256u << 20;
constexpr std::size_t kMaxWeightChunk = 8ull << 30;

std::size_t round_up(std::size_t value, std::size_t granule) { return (value + granule - 1) / granule * granule; }

}  // namespace

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess)
    fail("cuda backend: {} failed: {} ({})", what, cudaGetErrorName(status), cudaGetErrorString(status));
}

CachingAllocator::State::~State() {
  for (auto& [size, block] : free_blocks) cudaFree(block);
  for (auto& [size, block] : graph_blocks) cudaFree(block);
}

void* CachingAllocator::device_malloc(std::size_t size) {
  void* block = nullptr;
  cudaError_t status = cudaMalloc(&block, size);
  if (status == cudaErrorMemoryAllocation && !state_->recording) {
    // cudaDeviceSynchronize (in release_cached) is not allowed while a stream is being recorded.
    (void)cudaGetLastError();
    release_cached();
    status = cudaMalloc(&block, size);
  }
  if (status != cudaSuccess)
    fail("cuda backend: cannot allocate {} bytes of device memory: {} ({} bytes reserved)", size,
         cudaGetErrorString(status), stats().reserved_bytes);
  std::lock_guard lock(state_->mutex);
  ++state_->stats.device_allocations;
  state_->stats.reserved_bytes += size;
  return block;
}

std::shared_ptr<void> CachingAllocator::allocate(std::size_t bytes) {
  const std::size_t size = bytes <= kSmallLimit ? round_up(std::max<std::size_t>(bytes, 1), kAlignment)
                                                : round_up(bytes, kLargeGranule);
  void* block = nullptr;
  std::size_t block_size = size;
  bool for_graph = false;
  {
    std::lock_guard lock(state_->mutex);
    for_graph = state_->recording;
    auto& free_blocks = for_graph ? state_->graph_free : state_->free_blocks;
    // Best fit among cached blocks up to twice the size, so odd sizes do not each pin a block of their own.
    auto found = free_blocks.lower_bound(size);
    if (found != free_blocks.end() && found->first <= 2 * size) {
      block_size = found->first;
      block = found->second;
      free_blocks.erase(found);
      if (!for_graph) state_->stats.cached_bytes -= block_size;
    }
  }
  if (block == nullptr) {
    block = device_malloc(size);
    if (for_graph) {
      std::lock_guard lock(state_->mutex);
      state_->graph_blocks.emplace_back(size, block);
      state_->stats.graph_pool_bytes += size;
    }
  }
  std::weak_ptr<State> owner = state_;
  if (for_graph) {
    std::lock_guard lock(state_->mutex);
    state_->graph_handed_out.insert(block);
    return std::shared_ptr<void>(block, [owner, block_size](void* pointer) {
      // Later in the same recording the block serves again; afterwards it stays in the pool for every recording.
      if (auto state = owner.lock()) {
        std::lock_guard lock(state->mutex);
        if (state->recording && state->graph_handed_out.erase(pointer) > 0)
          state->graph_free.emplace(block_size, pointer);
      }
    });
  }
  return std::shared_ptr<void>(block, [owner, block_size](void* pointer) {
    if (auto state = owner.lock()) {
      std::lock_guard lock(state->mutex);
      state->free_blocks.emplace(block_size, pointer);
      state->stats.cached_bytes += block_size;
    } else {
      cudaFree(pointer);
    }
  });
}

void CachingAllocator::begin_recording() {
  std::lock_guard lock(state_->mutex);
  state_->recording = true;
  state_->graph_free.clear();
  for (const auto& [size, block] : state_->graph_blocks) state_->graph_free.emplace(size, block);
  state_->graph_handed_out.clear();
}

void CachingAllocator::end_recording() {
  std::lock_guard lock(state_->mutex);
  state_->recording = false;
  state_->graph_free.clear();
  state_->graph_handed_out.clear();
}

AllocatorStats CachingAllocator::stats() const {
  std::lock_guard lock(state_->mutex);
  return state_->stats;
}

void CachingAllocator::release_cached() {
  BEAMLINE_CUDA_CHECK(cudaDeviceSynchronize());
  std::lock_guard lock(state_->mutex);
  for (auto& [size, block] : state_->free_blocks) {
    BEAMLINE_CUDA_CHECK(cudaFree(block));
    state_->stats.reserved_bytes -= size;
  }
  state_->free_blocks.clear();
  state_->stats.cached_bytes = 0;
}

void WeightArena::reserve(std::span<const std::size_t> tensor_bytes) {
  if (chunk_) return;
  std::size_t total = 0;
  for (std::size_t bytes : tensor_bytes) total += round_up(std::max<std::size_t>(bytes, 1), kAlignment);
  reserved_ = total;
}

std::shared_ptr<std::byte> WeightArena::allocate(std::size_t bytes) {
  const std::size_t size = round_up(std::max<std::size_t>(bytes, 1), kAlignment);
  if (!chunk_ || chunk_used_ + size > chunk_size_) {
    // Chunks grow with what is loaded already, so a model takes a handful of allocations, not one per tensor.
    chunk_size_ = std::max(size, reserved_ > 0 ? reserved_ : std::clamp(used_total_, kFirstWeightChunk, kMaxWeightChunk));
    reserved_ = 0;
    void* memory = nullptr;
    const cudaError_t status = cudaMalloc(&memory, chunk_size_);
    if (status != cudaSuccess)
      fail("cuda backend: cannot allocate {} bytes for weights ({} bytes loaded so far): {}", chunk_size_, used_total_,
           cudaGetErrorString(status));
    chunk_.reset(static_cast<std::byte*>(memory), [](std::byte* pointer) { cudaFree(pointer); });
    chunk_used_ = 0;
    ++chunks_allocated_;
  }
  std::shared_ptr<std::byte> result(chunk_, chunk_.get() + chunk_used_);
  chunk_used_ += size;
  used_total_ += size;
  return result;
}

std::size_t PinnedReadbackPool::rounded(std::size_t bytes) { return std::bit_ceil(std::max<std::size_t>(bytes, 256)); }

void* PinnedReadbackPool::acquire(std::size_t bytes) {
  const std::size_t size = rounded(bytes);
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    const auto found = free_.find(size);
    if (found != free_.end()) {
      void* buffer = found->second;
      free_.erase(found);
      return buffer;
    }
  }
  void* buffer = nullptr;
  BEAMLINE_CUDA_CHECK(cudaMallocHost(&buffer, size));
  const std::lock_guard<std::mutex> lock(mutex_);
  all_.push_back(buffer);
  return buffer;
}

void PinnedReadbackPool::release(void* buffer, std::size_t bytes) {
  const std::lock_guard<std::mutex> lock(mutex_);
  free_.emplace(rounded(bytes), buffer);
}

PinnedReadbackPool::~PinnedReadbackPool() {
  for (void* buffer : all_) cudaFreeHost(buffer);
}

PinnedStaging::~PinnedStaging() {
  if (buffer_ != nullptr) {
    cudaStreamSynchronize(stream_);
    cudaFreeHost(buffer_);
  }
  for (cudaEvent_t event : done_)
    if (event != nullptr) cudaEventDestroy(event);
}

void PinnedStaging::next_slot() {
  BEAMLINE_CUDA_CHECK(cudaEventRecord(done_[slot_], stream_));
  slot_ = (slot_ + 1) % kSlots;
  // The copies out of the slot we enter were enqueued before its event: wait for them before overwriting it.
  BEAMLINE_CUDA_CHECK(cudaEventSynchronize(done_[slot_]));
  offset_ = 0;
}

void PinnedStaging::copy_to_device(void* device, const void* host, std::size_t bytes) {
  if (buffer_ == nullptr) {
    void* memory = nullptr;
    BEAMLINE_CUDA_CHECK(cudaMallocHost(&memory, kSlotBytes * kSlots));
    buffer_ = static_cast<std::byte*>(memory);
    for (cudaEvent_t& event : done_) BEAMLINE_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  }
  const auto* source = static_cast<const std::byte*>(host);
  auto* destination = static_cast<std::byte*>(device);
  while (bytes > 0) {
    if (offset_ == kSlotBytes) next_slot();
    const std::size_t piece = std::min(bytes, kSlotBytes - offset_);
    std::byte* staging = buffer_ + static_cast<std::size_t>(slot_) * kSlotBytes + offset_;
    std::memcpy(staging, source, piece);
    BEAMLINE_CUDA_CHECK(cudaMemcpyAsync(destination, staging, piece, cudaMemcpyHostToDevice, stream_));
    offset_ = std::min(kSlotBytes, offset_ + round_up(piece, kAlignment));
    source += piece;
    destination += piece;
    bytes -= piece;
  }
}

}  // namespace beamline::cuda
