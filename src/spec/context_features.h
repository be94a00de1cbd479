#pragma once
// Where each sequence's context features live (the block drafter's keys and values over the target's hidden
// states, /work DRAFTER_SEMANTICS §2-4): host bookkeeping of a per-sequence ring beside the target's KV.
//
// Why a ring and not paged blocks: every draft layer is sliding-window, so a draft at anchor P reads only positions
// P - W_d + 1 .. P - 1 of the context and its own B block positions. A ring of R >= W_d + B - 1 positions per
// sequence (position t in entry t mod R) holds all of them, needs no block allocator, and never competes with the
// target for KV blocks. The ring is a PagedKvPool whose "blocks" are sequences (one block of R positions each, one
// layer slot per draft layer), so the backends' write_kv and paged_attention read and write it unchanged: a table
// [slot, slot] and positions shifted by a multiple of R (RingWindow) make the pool's position -> (block, offset)
// rule land on t mod R.
//
// The ring holds what was committed: features of positions whose tokens are verified (never a rejected draft's), in a
// contiguous run [begin, end). A sequence drafts at anchor P only when end == P and the run reaches back to
// P - W_d + 1 (or 0): after a prefix-cache hit or a lost slot it waits until the target has computed enough positions
// itself. Drafts are only proposals, so what the ring misses costs acceptance, never correctness.
#include <cstdint>
#include <optional>
#include <unordered_map>
#include <vector>

namespace beamline {

// Positions as the pool sees them for one sequence: absolute position t is ring position t - shift, with shift a
// multiple of R chosen so that every position in use lies in [0, 2R) (block table [slot, slot]).
struct RingWindow {
  int32_t slot = 0;
  int64_t shift = 0;
};

class ContextFeatureRing {
 public:
  // `window` is the drafter's sliding window W_d, `block_size` its B; `max_sequences` ring slots (the least recently
  // used sequence loses its slot when a new one needs one).
  ContextFeatureRing(int32_t window, int32_t block_size, int32_t max_sequences);

  int32_t ring_size() const { return ring_size_; }  // R: a power of two >= W_d + B - 1 (the fast attention paths)
  int32_t max_sequences() const { return max_sequences_; }

  // Target rows at positions [begin, end) of `sequence` are about to be written (only the last R of them are: the
  // rest would be overwritten in the same write): their first position and the ring window to write them with.
  // Takes a slot for a new sequence.
  struct Write {
    int64_t first = 0;
    RingWindow ring;
  };
  Write begin_write(int64_t sequence, int64_t begin, int64_t end);

  // The ring window for a draft at anchor `anchor`, or nullopt when the committed run does not cover the context the
  // draft reads. The block's own B positions are written over ring entries that the window has left: the run is cut
  // to what they leave intact.
  std::optional<RingWindow> begin_draft(int64_t sequence, int64_t anchor);

  // The committed run ends at `end` at the latest: what was written from `end` on (a step's draft rows, committed
  // before they were verified) is not context. Those ring entries are written over before any draft reads them: a
  // draft at anchor `end` writes its block there, and the next commit its rows.
  void truncate(int64_t sequence, int64_t end);

  void forget(int64_t sequence);

 private:
  struct Entry {
    int32_t slot = 0;
    int64_t begin = 0, end = 0;  // the committed run
    uint64_t last_use = 0;
  };
  Entry& entry_for(int64_t sequence);
  RingWindow window_ending_at(const Entry& entry, int64_t end) const;

  int32_t window_, block_size_, ring_size_, max_sequences_;
  std::unordered_map<int64_t, Entry> entries_;
  std::vector<int32_t> free_slots_;
  uint64_t clock_ = 0;
};

}  // namespace beamline
