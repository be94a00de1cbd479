#pragma once
// Harmony renderer: a conversation becomes a sequence of pieces, each either a special token (by its
// string, e.g. "<|start|>") or ordinary text. Pieces turn into the prompt text or into token ids; text
// pieces are encoded one by one with special tokens NOT allowed, so "<|end|>" typed by a user stays text.
#include <string>
#include <vector>

#include "harmony/harmony_message.h"
#include "tokenizer/tokenizer.h"

namespace beamline::harmony {

struct Piece {
  bool special = false;
  std::string text;  // the special token's string, or the text

  bool operator==(const Piece&) const = default;
};
using Pieces = std::vector<Piece>;

struct RenderOptions {
  // When the conversation's last assistant message is on the final channel, leave out every reasoning
  // message that comes before the first final message (Harmony's rule; see HARMONY.md).
  bool auto_drop_analysis = true;
  std::string reasoning_channel = "analysis";
  std::string final_channel = "final";
  // A developer message defining a non-empty namespace of this name adds the line "Calls to these tools
  // must go to the <tool_channel> channel: '<namespace>'." to the system message.
  std::string tool_namespace = "functions";
  std::string tool_channel = "commentary";
};

// The messages only; the last one keeps its terminator.
Pieces render_conversation(const Conversation& conversation, const RenderOptions& options = {});
// The messages, then "<|start|>{next_role}" for the model to continue.
Pieces render_for_completion(const Conversation& conversation, Role next_role, const RenderOptions& options = {});
// One message on its own (no conversation context: the system message gets no tool-channel line).
Pieces render_message(const Message& message, const RenderOptions& options = {});

// Special tokens written literally, as in Harmony's text form.
std::string pieces_to_text(const Pieces& pieces);
// Special tokens are looked up by string in the tokenizer (an error names a missing one).
std::vector<TokenId> pieces_to_ids(const Pieces& pieces, const Tokenizer& tokenizer);

}  // namespace beamline::harmony
