#include "spec/context_features.h"

#include <algorithm>
#include <bit>

#include "util/error.h"

namespace beamline {

ContextFeatureRing::ContextFeatureRing(int32_t window, int32_t block_size, int32_t max_sequences)
    : window_(window),
      block_size_(block_size),
      ring_size_(static_cast<int32_t>(std::bit_ceil(static_cast<uint32_t>(window + block_size - 1)))),
      max_sequences_(max_sequences) {
  require(window >= 1 && block_size >= 2 && max_sequences >= 1,
          "context features: window {}, block size {} and {} sequences must be positive", window, block_size,
          max_sequences);
  for (int32_t slot = max_sequences - 1; slot >= 0; --slot) free_slots_.push_back(slot);
}

ContextFeatureRing::Entry& ContextFeatureRing::entry_for(int64_t sequence) {
  const auto found = entries_.find(sequence);
  if (found != entries_.end()) return found->second;
  if (free_slots_.empty()) {  // the least recently used sequence gives its slot up (it drafts again once refilled)
    const auto oldest = std::min_element(entries_.begin(), entries_.end(), [](const auto& a, const auto& b) {
      return a.second.last_use < b.second.last_use;
    });
    free_slots_.push_back(oldest->second.slot);
    entries_.erase(oldest);
  }
  Entry entry;
  entry.slot = free_slots_.back();
  free_slots_.pop_back();
  return entries_.emplace(sequence, entry).first->second;
}

RingWindow ContextFeatureRing::window_ending_at(const Entry& entry, int64_t end) const {
  // The largest multiple of R that keeps end - R .. end - 1 at or above 0: they then lie in [0, 2R).
  const int64_t shift = std::max<int64_t>(0, end - ring_size_) / ring_size_ * ring_size_;
  return {entry.slot, shift};
}

ContextFeatureRing::Write ContextFeatureRing::begin_write(int64_t sequence, int64_t begin, int64_t end) {
  Entry& entry = entry_for(sequence);
  entry.last_use = ++clock_;
  const int64_t first = std::max(begin, end - ring_size_);
  if (entry.begin <= first && first <= entry.end) {
    // Continues (or rewrites the tail of) the committed run: the run grows, keeping the last R positions.
    entry.end = std::max(entry.end, end);
    entry.begin = std::max(entry.begin, entry.end - ring_size_);
  } else {
    // A gap (a prefix-cache hit, a lost slot) or an older stretch (a recomputed sequence): these rows alone.
    entry.begin = first;
    entry.end = end;
  }
  return {first, window_ending_at(entry, end)};
}

std::optional<RingWindow> ContextFeatureRing::begin_draft(int64_t sequence, int64_t anchor) {
  const auto found = entries_.find(sequence);
  if (found == entries_.end() && anchor > 0) return std::nullopt;
  Entry& entry = found == entries_.end() ? entry_for(sequence) : found->second;  // anchor 0: no context to have
  if (entry.end != anchor || entry.begin > std::max<int64_t>(0, anchor - window_ + 1)) return std::nullopt;
  entry.last_use = ++clock_;
  // The block's K/V go to positions anchor .. anchor + B - 1, over the entries of positions R earlier.
  entry.begin = std::max(entry.begin, anchor + block_size_ - ring_size_);
  return window_ending_at(entry, anchor + block_size_);
}

void ContextFeatureRing::truncate(int64_t sequence, int64_t end) {
  const auto found = entries_.find(sequence);
  if (found == entries_.end()) return;
  Entry& entry = found->second;
  entry.end = std::min(entry.end, end);
  entry.begin = std::min(entry.begin, entry.end);
}

void ContextFeatureRing::forget(int64_t sequence) {
  const auto found = entries_.find(sequence);
  if (found == entries_.end()) return;
  free_slots_.push_back(found->second.slot);
  entries_.erase(found);
}

}  // namespace beamline
