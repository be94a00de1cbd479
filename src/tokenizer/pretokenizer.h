#pragma once
// Pre-tokenization: splitting text into the pieces that byte-pair merging encodes independently.
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace beamline::text {

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Appends the end offset of each piece; the pieces cover all of `text` in order. Malformed UTF-8 is
  // split as if each maximal invalid subpart were U+FFFD (see utf8.h); the pieces keep the raw bytes.
  virtual void split(std::string_view text, std::vector<std::size_t>& ends) const = 0;
};

// tiktoken's o200k split pattern (the `(?i:...)` spelling tiktoken compiles).
extern const std::string_view kO200kPattern;
// js-tiktoken's spelling of it: JavaScript has no inline (?i:), so the contractions are spelled out case by
// case; unlike (?i:'s) it does not match the long s (U+017F, which case-folds to s) after the apostrophe.
extern const std::string_view kO200kPatternSpelledOut;
// GPT-2's pattern: what a Hugging Face ByteLevel pre-tokenizer with use_regex applies.
extern const std::string_view kGpt2Pattern;

// A splitter for a regex from a tokenizer file. The o200k pattern (in the spellings tiktoken and
// js-tiktoken use) gets an exact hand-written splitter; any other pattern runs on PCRE2 (JIT, UTF,
// Unicode properties), where text between matches becomes a piece of its own (Hugging Face's
// "Isolated" behaviour). In both, `\s` means the Unicode White_Space property, as in tiktoken's engine.
// `where` names the pattern's origin for error messages.
std::unique_ptr<PreTokenizer> make_pretokenizer(std::string_view pattern, std::string_view where);

// Always PCRE2 (the reference the hand-written splitter is tested against).
std::unique_ptr<PreTokenizer> make_regex_pretokenizer(std::string_view pattern, std::string_view where);

// Applies each step to every piece of the previous one.
std::unique_ptr<PreTokenizer> make_pretokenizer_sequence(std::vector<std::unique_ptr<PreTokenizer>> steps);

}  // namespace beamline::text
