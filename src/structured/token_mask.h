#pragma once
// Token masks over a real vocabulary. The vocabulary's byte strings are laid out as a trie in preorder; at
// compile time every automaton state that reads bytes classifies every token against that state alone (the
// stack below it unknown): accepted (read entirely inside the state's rule and what it calls), rejected, or
// uncertain (it reads past the rule's end with a byte that can follow the rule). Accepted sets are
// precomputed; at run time a mask is the union of the accepted sets of the configuration's stack tops plus
// the uncertain tokens walked through the real stacks (XGrammar's adaptive token-mask cache, in our terms).
#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "structured/pushdown.h"
#include "tokenizer/tokenizer.h"

namespace beamline {

class Vocabulary {
 public:
  // Special tokens never match grammar bytes; only the listed stop tokens are allowed, once the output may end.
  static std::shared_ptr<const Vocabulary> from_tokenizer(const Tokenizer& tokenizer);
  static std::shared_ptr<const Vocabulary> from_tokens(std::vector<std::string> token_bytes,
                                                       std::vector<TokenId> special_ids);

  int32_t size() const { return static_cast<int32_t>(token_bytes_.size()); }
  std::string_view bytes(TokenId id) const { return token_bytes_[id]; }
  bool is_special(TokenId id) const { return special_[id] != 0; }
  int32_t mask_words() const { return (size() + 31) / 32; }

  // The trie over non-special tokens, nodes in preorder (node 0 is the first child of the empty root).
  int32_t num_nodes() const { return static_cast<int32_t>(node_byte_.size()); }
  uint8_t node_byte(int32_t n) const { return node_byte_[n]; }
  int32_t node_depth(int32_t n) const { return node_depth_[n]; }     // 1 for a child of the root
  int32_t subtree_end(int32_t n) const { return subtree_end_[n]; }   // first node after n's subtree
  // Tokens in byte order: node n's own tokens are sorted[first_token(n) .. first_token(n) + own_tokens(n)),
  // its whole subtree's are sorted[first_token(n) .. first_token(subtree_end(n))).
  int32_t first_token(int32_t n) const { return first_token_[n]; }
  int32_t own_tokens(int32_t n) const { return own_tokens_[n]; }
  TokenId sorted(int32_t index) const { return sorted_[index]; }
  int32_t num_sorted() const { return static_cast<int32_t>(sorted_.size()); }
  // The bytes read anywhere below node n (not n's own), for nodes with at least kSummarizedDescendants
  // descendants; nullptr for smaller subtrees, which are as cheap to walk as to check.
  const ByteSet* bytes_below(int32_t n) const {
    return below_index_[n] < 0 ? nullptr : &bytes_below_[below_index_[n]];
  }
  static constexpr int32_t kSummarizedDescendants = 8;
  // The most bytes any token below node n reads after n's own (0 when n's longest token ends at n).
  int32_t bytes_after(int32_t n) const { return longest_below_[n] - node_depth_[n]; }
  // utf8_prefix_step over node n's bytes from a token's start, and whether every descendant stays well-formed
  // from there (then the subtree's tokens are whole characters after n, the last one possibly cut short).
  uint8_t utf8_state(int32_t n) const { return utf8_state_[n]; }
  bool utf8_valid_below(int32_t n) const { return utf8_valid_below_[n] != 0; }
  // The token whose bytes are exactly `byte` (-1: none); the first by id when several are.
  TokenId single_byte_token(uint8_t byte) const { return single_byte_token_[byte]; }
  // Bit t is set for every token in the trie (neither special nor empty): the start of a mask that excludes few.
  const std::vector<uint32_t>& trie_tokens_mask() const { return trie_tokens_mask_; }

 private:
  void build_trie();
  void summarize_subtrees();

  std::vector<std::string> token_bytes_;
  std::vector<uint8_t> special_;
  std::vector<TokenId> sorted_;
  std::vector<uint8_t> node_byte_;
  std::vector<int32_t> node_depth_, subtree_end_, first_token_, own_tokens_;
  std::vector<int32_t> below_index_;
  std::vector<int32_t> longest_below_;  // per node: the length of the longest token in its subtree
  std::vector<uint8_t> utf8_state_, utf8_valid_below_;
  std::vector<ByteSet> bytes_below_;
  std::vector<uint32_t> trie_tokens_mask_;
  std::array<TokenId, 256> single_byte_token_;
};

// A grammar ready to match: the pushdown tables and, with a vocabulary, the per-state token classification.
class CompiledGrammar {
 public:
  // `stop_tokens` end the output once the grammar is complete (e.g. eos, <|return|>).
  static std::shared_ptr<const CompiledGrammar> compile(const Grammar& grammar,
                                                        std::shared_ptr<const Vocabulary> vocabulary,
                                                        std::vector<TokenId> stop_tokens);

  const PushdownTables& tables() const { return tables_; }
  const Vocabulary* vocabulary() const { return vocabulary_.get(); }
  const std::vector<TokenId>& stop_tokens() const { return stop_tokens_; }

  struct StateTokens {
    std::vector<uint32_t> accepted_mask;  // a full bitmask when many tokens are accepted, else empty
    std::vector<TokenId> accepted_ids;    // the accepted tokens when few are
    std::vector<int32_t> uncertain;       // indices into the vocabulary's byte order
    // A state of a counted rule, classified with its count untracked (kUncounted): the accepted tokens (each read
    // inside the frame) by their need, the counts they read plus the fewest from where they stop to the rule's
    // end. With count c under bound max a token is allowed when its need is at most max - c.
    std::vector<TokenId> by_need;        // ascending need
    std::vector<int32_t> need_begin;     // by_need[need_begin[k]..] need k or more; the last entry is by_need.size()
    int32_t max_need() const { return static_cast<int32_t>(need_begin.size()) - 2; }
    // Accepted tokens (indices into the vocabulary's byte order) that may also leave the frame: `Ja` in email's label
    // reads J in the counted repetition and may read a after it. Over the budget inside the frame, such a token is
    // still allowed when a path that leaves the frame after k counts fits: k within the budget, the frame's count at
    // its minimum, and the bytes after it read by the rule the frame returns to. Each token is kept by its least such
    // k, found at compile time by reading the rest of the token from every state the rule returns to (the stack below
    // unknown): `sure` where the rest stays alive inside the returning rule from all of them (allowed without a walk),
    // `walk` where it may depend on the stack below (walked through the real configuration); a rest that dies in every
    // returning rule is no path. Byte order within a (need, k); LeavingTokens::group(n) are the tokens of need n.
    struct LeavingTokens {
      std::vector<int32_t> index;  // by need, then k
      std::vector<int32_t> k;      // beside index
      std::vector<int32_t> begin;  // need n: [begin[n], begin[n + 1]); empty when no token leaves
      // The tokens of need `need` that may leave after at most `budget` counts.
      std::span<const int32_t> within(int32_t need, int32_t budget) const;
    };
    LeavingTokens sure, walk;
  };
  const StateTokens& state_tokens(int32_t state) const { return *state_tokens_[state]; }
  size_t uncertain_total() const;
  // The accepted tokens of `state` whose need is at most `budget` (any when budget >= max_need()) into `mask`.
  void add_accepted(int32_t state, int32_t budget, std::span<uint32_t> mask, std::vector<uint32_t>& scratch) const;

 private:
  void classify_tokens();
  void store_accepted(const std::vector<std::pair<int32_t, int32_t>>& ranges, StateTokens& out) const;
  void store_needs(int32_t state, const std::vector<std::pair<int32_t, int32_t>>& ranges,
                   const std::vector<int32_t>& returns, ConfigurationSpace& space, StateTokens& out) const;

  PushdownTables tables_;
  std::shared_ptr<const Vocabulary> vocabulary_;
  std::vector<TokenId> stop_tokens_;
  // Per state; states of counted rules with the same automaton (string fields that differ only in their bounds)
  // share one classification.
  std::vector<std::shared_ptr<const StateTokens>> state_tokens_;
};

// One output's matcher: feed it tokens (or bytes), ask for the next token's mask, roll back rejected drafts.
class GrammarMatcher {
 public:
  explicit GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar);

  // False (and no change) when the token is not allowed; a stop token is allowed once can_end().
  bool accept_token(TokenId token);
  bool accept_bytes(std::string_view bytes);  // one step of history, like a token
  // Bit t of `mask` (32-bit words, vocabulary().mask_words() of them) is set when token t is allowed now.
  void fill_next_token_mask(std::span<uint32_t> mask);
  void rollback(int32_t steps);  // undo the last `steps` accepted tokens (speculative decoding)
  // The bytes the grammar forces from here (each position has exactly one allowed byte), possibly empty.
  std::string jump_forward_bytes();
  // Jump-forward: at most `max_tokens` tokens for the forced bytes, as a draft to verify (the engine's rule, in
  // docs/structured-outputs.md): the canonical tokenization of the forced text (`tokenizer.encode`; a grammar byte that
  // stands for a special token, such as Harmony's, is that token), without its last text token, which could merge
  // with the free text after it; cut before the first token the grammar does not take. Leaves the matcher as it is.
  std::vector<TokenId> jump_forward_tokens(const Tokenizer& tokenizer, size_t max_tokens);

  bool can_end() const { return space_.at(history_.back()).can_end; }
  bool terminated() const { return terminated_.back() != 0; }
  // Nothing more can follow: a stop token was accepted, or the grammar has ended and has no stop tokens to wait for
  // (e.g. Harmony's, whose ending tokens are part of the grammar).
  bool completed() const {
    return terminated() || (can_end() && space_.at(history_.back()).nodes.empty() && grammar_->stop_tokens().empty());
  }
  int32_t steps() const { return static_cast<int32_t>(history_.size()) - 1; }
  // Does `bytes` match the whole grammar from the start (no tokens involved)?
  static bool matches(const CompiledGrammar& grammar, std::string_view bytes);

 private:
  void walk_uncertain(std::span<const int32_t> uncertain, int32_t config, std::span<uint32_t> mask);

  std::shared_ptr<const CompiledGrammar> grammar_;
  ConfigurationSpace space_;
  std::vector<int32_t> history_;
  std::vector<uint8_t> terminated_;
  std::vector<int32_t> walk_stack_;
  std::vector<uint32_t> scratch_;
  std::vector<std::pair<int32_t, int32_t>> tops_;  // (state, budget) of the configuration's stack tops
};

}  // namespace beamline
