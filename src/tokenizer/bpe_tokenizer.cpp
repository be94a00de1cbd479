#include "tokenizer/bpe_tokenizer.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <string_view>
#include <unordered_map>

#include "util/error.h"

namespace beamline::text {

std::string escape_bytes(std::string_view bytes) {
  std::string out;
  for (const char c : bytes) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte >= 0x20 && byte < 0x7F && byte != '\\') {
      out += c;
    } else {
      out += fmt::format("\\x{:02x}", byte);
    }
  }
  return out;
}

namespace {

uint64_t hash_bytes(const unsigned char* p, std::size_t n) {
  uint64_t h = 0x9E3779B97F4A7C15ULL ^ (n * 0xC2B2AE3D27D4EB4FULL);
  for (; n >= 8; p += 8, n -= 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    h = (h ^ word) * 0xFF51AFD7ED558CCDULL;
    h ^= h >> 32;
  }
  if (n > 0) {
    uint64_t word = 0;
    std::memcpy(&word, p, n);
    h = (h ^ word) * 0xC4CEB9FE1A85EC53ULL;
  }
  h ^= h >> 33;
  h *= 0xFF51AFD7ED558CCDULL;
  h ^= h >> 33;
  return h;
}

std::size_t table_capacity(std::size_t entries) { return std::bit_ceil(std::max<std::size_t>(16, entries * 2)); }

// Token bytes -> id, open addressing over ids whose bytes live in the tokenizer's arena.
class TokenLookup {
 public:
  struct Span {
    uint32_t offset;
    uint32_t length;
  };

  // Returns the two ids of a token that appears twice, if one does.
  std::optional<std::pair<TokenId, TokenId>> build(const std::string& arena, const std::vector<Span>& spans,
                                                   const std::vector<TokenId>& ids) {
    arena_ = &arena;
    spans_ = &spans;
    slots_.assign(table_capacity(ids.size()), Slot{0, -1});
    mask_ = slots_.size() - 1;
    for (const TokenId id : ids) {
      const Span span = spans[static_cast<std::size_t>(id)];
      const auto* bytes = reinterpret_cast<const unsigned char*>(arena.data()) + span.offset;
      const uint64_t hash = hash_bytes(bytes, span.length);
      std::size_t index = hash & mask_;
      while (slots_[index].id >= 0) {
        if (equal(slots_[index].id, bytes, span.length)) return std::pair{slots_[index].id, id};
        index = (index + 1) & mask_;
      }
      slots_[index] = Slot{static_cast<uint32_t>(hash >> 32), id};
    }
    return std::nullopt;
  }

  TokenId find(const unsigned char* bytes, std::size_t length) const {
    const uint64_t hash = hash_bytes(bytes, length);
    const auto tag = static_cast<uint32_t>(hash >> 32);
    for (std::size_t index = hash & mask_;; index = (index + 1) & mask_) {
      const Slot slot = slots_[index];
      if (slot.id < 0) return -1;
      if (slot.tag == tag && equal(slot.id, bytes, length)) return slot.id;
    }
  }

 private:
  struct Slot {
    uint32_t tag;
    TokenId id;
  };
  bool equal(TokenId id, const unsigned char* bytes, std::size_t length) const {
    const Span span = (*spans_)[static_cast<std::size_t>(id)];
    return span.length == length && std::memcmp(arena_->data() + span.offset, bytes, length) == 0;
  }
  const std::string* arena_ = nullptr;
  const std::vector<Span>* spans_ = nullptr;
  std::vector<Slot> slots_;
  std::size_t mask_ = 0;
};

// (left token, right token) -> (rank, merged token).
class MergeTable {
 public:
  struct Merge {
    uint32_t rank;
    TokenId result;
  };

  void reserve(std::size_t entries) {
    slots_.assign(table_capacity(entries), Slot{kEmpty, {}});
    mask_ = slots_.size() - 1;
  }

  // Keeps the first (lowest-rank) merge of a pair.
  void insert(TokenId left, TokenId right, Merge merge) {
    const uint64_t key = pack(left, right);
    std::size_t index = slot_of(key);
    while (slots_[index].key != kEmpty) {
      if (slots_[index].key == key) return;
      index = (index + 1) & mask_;
    }
    slots_[index] = Slot{key, merge};
  }

  const Merge* find(TokenId left, TokenId right) const {
    const uint64_t key = pack(left, right);
    for (std::size_t index = slot_of(key);; index = (index + 1) & mask_) {
      const Slot& slot = slots_[index];
      if (slot.key == key) return &slot.merge;
      if (slot.key == kEmpty) return nullptr;
    }
  }

 private:
  static constexpr uint64_t kEmpty = std::numeric_limits<uint64_t>::max();
  struct Slot {
    uint64_t key;
    Merge merge;
  };
  static uint64_t pack(TokenId left, TokenId right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
  }
  std::size_t slot_of(uint64_t key) const { return ((key * 0x9E3779B97F4A7C15ULL) >> 20) & mask_; }

  std::vector<Slot> slots_;
  std::size_t mask_ = 0;
};

class BpeTokenizer final : public Tokenizer {
 public:
  explicit BpeTokenizer(BpeDefinition definition)
      : source_(std::move(definition.source)),
        whole_piece_lookup_(definition.whole_piece_lookup),
        merge_by_token_rank_(definition.merge_rule == BpeDefinition::MergeRule::kTokenRanks),
        add_prefix_space_(definition.add_prefix_space),
        pre_tokenizer_(std::move(definition.pre_tokenizer)) {
    require(pre_tokenizer_ != nullptr, "{}: no pre-tokenizer", source_);
    store_vocabulary(definition.vocab);
    store_added_tokens(definition.added_tokens);
    if (!merge_by_token_rank_) store_merges(definition.merges);
  }

  std::vector<TokenId> encode(std::string_view text, bool allow_special) const override {
    std::vector<TokenId> ids;
    ids.reserve(text.size() / 4 + 4);
    const bool scan = allow_special ? !added_.empty() : has_non_special_added_;
    if (!scan) {
      encode_ordinary(text, ids);
      return ids;
    }
    std::size_t segment_start = 0;
    for (std::size_t i = 0; i < text.size();) {
      const auto byte = static_cast<unsigned char>(text[i]);
      const AddedEntry* found = nullptr;
      for (uint32_t k = first_byte_begin_[byte]; k < first_byte_begin_[byte + 1]; ++k) {
        const AddedEntry& entry = added_[k];
        if ((allow_special || !entry.special) && text.substr(i, entry.text.size()) == entry.text) {
          found = &entry;
          break;
        }
      }
      if (found == nullptr) {
        ++i;
        continue;
      }
      encode_ordinary(text.substr(segment_start, i - segment_start), ids);
      ids.push_back(found->id);
      i += found->text.size();
      segment_start = i;
    }
    encode_ordinary(text.substr(segment_start), ids);
    return ids;
  }

  std::string_view token_bytes(TokenId id) const override {
    if (id < 0 || static_cast<std::size_t>(id) >= spans_.size() || spans_[static_cast<std::size_t>(id)].length == kHole) {
      fail("unknown token id {} (the tokenizer from {} has ids 0..{})", id, source_, spans_.size() - 1);
    }
    const Span span = spans_[static_cast<std::size_t>(id)];
    return std::string_view(arena_).substr(span.offset, span.length);
  }

  std::string decode_bytes(const std::vector<TokenId>& ids) const override {
    std::string out;
    for (const TokenId id : ids) out += token_bytes(id);
    return out;
  }

  std::optional<TokenId> token_to_id(std::string_view token) const override {
    if (const auto it = added_by_text_.find(std::string(token)); it != added_by_text_.end()) return it->second;
    const TokenId id = lookup_.find(reinterpret_cast<const unsigned char*>(token.data()), token.size());
    if (id < 0) return std::nullopt;
    return id;
  }

  bool is_special(TokenId id) const override {
    return id >= 0 && static_cast<std::size_t>(id) < special_.size() && special_[static_cast<std::size_t>(id)];
  }

  std::size_t vocab_size() const override { return spans_.size(); }

 private:
  using Span = TokenLookup::Span;
  static constexpr uint32_t kHole = std::numeric_limits<uint32_t>::max();
  // Ids index tables sized by the largest id, so one absurd id in a file would allocate gigabytes (found by
  // tests/fuzz/fuzz_tokenizer_json): ids stay below 2^24, sixteen times the largest vocabularies in use.
  static constexpr TokenId kMaxTokenIds = TokenId{1} << 24;

  void check_id(TokenId id, std::string_view what, std::string_view bytes) const {
    require(id >= 0, "{}: {} \"{}\" has a negative id {}", source_, what, escape_bytes(bytes), id);
    require(id < kMaxTokenIds, "{}: {} \"{}\" has id {}, past the largest supported id {}", source_, what,
            escape_bytes(bytes), id, kMaxTokenIds - 1);
  }

  struct AddedEntry {
    std::string text;
    TokenId id;
    bool special;
  };

  struct Part {
    TokenId token;
    uint32_t previous;
    uint32_t next;
  };
  struct Candidate {
    uint64_t order;  // rank, then position: the lowest rank merges first, the leftmost among equals
    TokenId left_token;
    TokenId right_token;
    TokenId result;
  };
  // A small per-thread cache of pair lookups in front of the large tables: text reuses few pairs (CJK
  // characters are three-byte pairs merged again and again), and a hit stays in the L1/L2 cache.
  struct PairCacheEntry {
    uint64_t pair;
    MergeTable::Merge merge;  // result -1: the pair does not merge
  };
  static constexpr std::size_t kPairCacheSize = 32768;
  static constexpr uint64_t kNoPair = std::numeric_limits<uint64_t>::max();
  struct MergeScratch {
    std::vector<Part> parts;
    std::vector<Candidate> heap;
    std::vector<PairCacheEntry> cache;
    uint64_t cache_owner = 0;
  };

  // The merge of two adjacent parts that span [left, end) of the piece.
  MergeTable::Merge find_merge(std::vector<PairCacheEntry>& cache, const unsigned char* piece, uint32_t left,
                               TokenId left_token, TokenId right_token, uint32_t end) const {
    const uint64_t pair = (static_cast<uint64_t>(static_cast<uint32_t>(left_token)) << 32) |
                          static_cast<uint32_t>(right_token);
    PairCacheEntry& entry = cache[((pair * 0x9E3779B97F4A7C15ULL) >> 32) & (kPairCacheSize - 1)];
    if (entry.pair == pair) return entry.merge;
    MergeTable::Merge merge{0, -1};
    if (merge_by_token_rank_) {
      const TokenId joined = lookup_.find(piece + left, end - left);
      if (joined >= 0) merge = {static_cast<uint32_t>(joined), joined};
    } else if (const MergeTable::Merge* found = merges_.find(left_token, right_token)) {
      merge = *found;
    }
    entry = PairCacheEntry{pair, merge};
    return merge;
  }

  void place(TokenId id, std::string_view bytes, std::string_view what) {
    check_id(id, what, bytes);
    const auto index = static_cast<std::size_t>(id);
    if (index >= spans_.size()) spans_.resize(index + 1, Span{0, kHole});
    require(spans_[index].length == kHole, "{}: id {} is used twice (again by {} \"{}\")", source_, id, what,
            escape_bytes(bytes));
    require(arena_.size() + bytes.size() < kHole, "{}: the vocabulary is larger than 4 GiB", source_);
    spans_[index] = Span{static_cast<uint32_t>(arena_.size()), static_cast<uint32_t>(bytes.size())};
    arena_ += bytes;
  }

  void store_vocabulary(const std::vector<std::pair<std::string, TokenId>>& vocab) {
    std::size_t total = 0;
    for (const auto& entry : vocab) total += entry.first.size();
    arena_.reserve(total);
    std::vector<TokenId> ids;
    ids.reserve(vocab.size());
    for (const auto& [bytes, id] : vocab) {
      require(!bytes.empty(), "{}: vocabulary token {} is empty", source_, id);
      place(id, bytes, "vocabulary token");
      ids.push_back(id);
    }
    if (const auto duplicate = lookup_.build(arena_, spans_, ids)) {
      fail("{}: token \"{}\" appears twice, with ids {} and {}", source_, escape_bytes(token_bytes(duplicate->first)),
           duplicate->first, duplicate->second);
    }
    for (std::size_t byte = 0; byte < 256; ++byte) {
      const auto c = static_cast<unsigned char>(byte);
      byte_token_[byte] = lookup_.find(&c, 1);
      require(byte_token_[byte] >= 0, "{}: the vocabulary has no token for the single byte 0x{:02x}", source_, byte);
    }
    // The arena may grow below (added tokens); the lookup keeps pointers to arena_ and spans_ themselves.
  }

  void store_added_tokens(const std::vector<AddedToken>& added) {
    std::vector<bool> placed_by_added;
    for (const AddedToken& token : added) {
      require(!token.text.empty(), "{}: added token {} has empty content", source_, token.id);
      check_id(token.id, "added token", token.text);
      const auto index = static_cast<std::size_t>(token.id);
      if (placed_by_added.size() <= index) placed_by_added.resize(index + 1, false);
      const bool placed = index < spans_.size() && spans_[index].length != kHole;
      // A second name for an id that an added token already has is an alias for encoding (o200k_harmony
      // has both <|endofprompt|> and <|reserved_200018|>); decoding gives the first name.
      if (placed && !placed_by_added[index]) {
        require(token_bytes(token.id) == token.text,
                "{}: added token \"{}\" has id {}, which the vocabulary gives to \"{}\"", source_,
                escape_bytes(token.text), token.id, escape_bytes(token_bytes(token.id)));
      } else if (!placed) {
        place(token.id, token.text, "added token");
        placed_by_added[index] = true;
      }
      const auto [it, inserted] = added_by_text_.try_emplace(token.text, token.id);
      require(inserted || it->second == token.id, "{}: added token \"{}\" has two ids, {} and {}", source_,
              escape_bytes(token.text), it->second, token.id);
      if (!inserted) continue;
      if (token.special) {
        if (special_.size() <= index) special_.resize(index + 1, false);
        special_[index] = true;
      } else {
        has_non_special_added_ = true;
      }
      added_.push_back(AddedEntry{token.text, token.id, token.special});
    }
    // Candidates grouped by first byte, longest first, so the longest special at a position wins.
    std::stable_sort(added_.begin(), added_.end(), [](const AddedEntry& a, const AddedEntry& b) {
      const auto first_a = static_cast<unsigned char>(a.text[0]), first_b = static_cast<unsigned char>(b.text[0]);
      return first_a != first_b ? first_a < first_b : a.text.size() > b.text.size();
    });
    first_byte_begin_.fill(0);
    for (const AddedEntry& entry : added_) ++first_byte_begin_[static_cast<unsigned char>(entry.text[0]) + 1];
    for (std::size_t byte = 0; byte < 256; ++byte) first_byte_begin_[byte + 1] += first_byte_begin_[byte];
  }

  void store_merges(const std::vector<std::pair<std::string, std::string>>& merges) {
    merges_.reserve(merges.size());
    for (std::size_t rank = 0; rank < merges.size(); ++rank) {
      const auto& [left, right] = merges[rank];
      const TokenId left_id = find_token(left), right_id = find_token(right);
      const std::string joined = left + right;
      const TokenId result = find_token(joined);
      require(left_id >= 0, "{}: merges[{}]: \"{}\" is not in the vocabulary", source_, rank, escape_bytes(left));
      require(right_id >= 0, "{}: merges[{}]: \"{}\" is not in the vocabulary", source_, rank, escape_bytes(right));
      require(result >= 0, "{}: merges[{}]: the merged token \"{}\" is not in the vocabulary", source_, rank,
              escape_bytes(joined));
      merges_.insert(left_id, right_id, {static_cast<uint32_t>(rank), result});
    }
  }

  TokenId find_token(std::string_view bytes) const {
    return lookup_.find(reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size());
  }

  void encode_ordinary(std::string_view text, std::vector<TokenId>& ids) const {
    if (text.empty()) return;
    if (add_prefix_space_ && text.front() != ' ') {
      std::string prefixed;
      prefixed.reserve(text.size() + 1);
      prefixed += ' ';
      prefixed += text;
      encode_pieces(prefixed, ids);
      return;
    }
    encode_pieces(text, ids);
  }

  void encode_pieces(std::string_view text, std::vector<TokenId>& ids) const {
    thread_local std::vector<std::size_t> ends;
    ends.clear();
    pre_tokenizer_->split(text, ends);
    const auto* bytes = reinterpret_cast<const unsigned char*>(text.data());
    std::size_t start = 0;
    for (const std::size_t end : ends) {
      encode_piece(bytes + start, end - start, ids);
      start = end;
    }
  }

  void encode_piece(const unsigned char* piece, std::size_t length, std::vector<TokenId>& ids) const {
    if (length == 1) {
      ids.push_back(byte_token_[piece[0]]);
      return;
    }
    if (whole_piece_lookup_) {
      const TokenId id = lookup_.find(piece, length);
      if (id >= 0) {
        ids.push_back(id);
        return;
      }
    }
    merge(piece, length, ids);
  }

  // Repeatedly merges the lowest-ranked adjacent pair (the leftmost among equal ranks) until no pair
  // merges. Parts form a linked list indexed by start byte; candidate pairs wait in a min-heap and are
  // dropped when popped if either side has changed since they were pushed.
  void merge(const unsigned char* piece, std::size_t length, std::vector<TokenId>& ids) const {
    thread_local MergeScratch scratch;
    if (scratch.cache_owner != instance_) {
      scratch.cache.assign(kPairCacheSize, PairCacheEntry{kNoPair, {}});
      scratch.cache_owner = instance_;
    }
    auto& parts = scratch.parts;
    auto& heap = scratch.heap;
    const auto n = static_cast<uint32_t>(length);
    parts.resize(n);
    heap.clear();
    const auto later = [](const Candidate& a, const Candidate& b) { return a.order > b.order; };
    const auto consider = [&](uint32_t left) {
      const uint32_t right = parts[left].next;
      const MergeTable::Merge merge =
          find_merge(scratch.cache, piece, left, parts[left].token, parts[right].token, parts[right].next);
      if (merge.result < 0) return;
      heap.push_back(Candidate{(static_cast<uint64_t>(merge.rank) << 32) | left, parts[left].token,
                               parts[right].token, merge.result});
      std::push_heap(heap.begin(), heap.end(), later);
    };
    for (uint32_t i = 0; i < n; ++i) parts[i] = Part{byte_token_[piece[i]], i - 1, i + 1};
    for (uint32_t i = 0; i + 1 < n; ++i) consider(i);
    while (!heap.empty()) {
      std::pop_heap(heap.begin(), heap.end(), later);
      const Candidate candidate = heap.back();
      heap.pop_back();
      const auto left = static_cast<uint32_t>(candidate.order);
      Part& left_part = parts[left];
      if (left_part.token != candidate.left_token || left_part.next >= n) continue;
      const uint32_t right = left_part.next;
      if (parts[right].token != candidate.right_token) continue;
      left_part.token = candidate.result;
      parts[right].token = -1;
      left_part.next = parts[right].next;
      if (left_part.next < n) parts[left_part.next].previous = left;
      if (left != 0) consider(left_part.previous);
      if (left_part.next < n) consider(left);
    }
    for (uint32_t i = 0; i < n; i = parts[i].next) ids.push_back(parts[i].token);
  }

  static inline std::atomic<uint64_t> instances_{0};
  const uint64_t instance_ = ++instances_;  // tells the per-thread pair caches of two tokenizers apart
  std::string source_;
  bool whole_piece_lookup_;
  // tiktoken: two adjacent parts merge when their bytes together are a token, ranked by its id; looked
  // up by those bytes, so no merge table is needed.
  bool merge_by_token_rank_;
  bool add_prefix_space_;
  std::unique_ptr<PreTokenizer> pre_tokenizer_;
  std::string arena_;
  std::vector<Span> spans_;
  TokenLookup lookup_;
  MergeTable merges_;
  std::array<TokenId, 256> byte_token_{};
  std::vector<AddedEntry> added_;
  std::array<uint32_t, 257> first_byte_begin_{};
  std::unordered_map<std::string, TokenId> added_by_text_;
  std::vector<bool> special_;
  bool has_non_special_added_ = false;
};

}  // namespace

std::unique_ptr<Tokenizer> make_bpe_tokenizer(BpeDefinition definition) {
  return std::make_unique<BpeTokenizer>(std::move(definition));
}

}  // namespace beamline::text
