#pragma once
// A multi-turn session as one benchmark work item: turn k sends the user turns before it with the server's
// answers to them, then user turn k. Chat sends messages (the answers as assistant messages, their content
// only, as clients keep history); completions send the conversation as "User: ...\nAssistant: ..." text.
#include <nlohmann/json.hpp>

#include <string>

#include "loadgen/datasets.h"
#include "loadgen/openai_stream_client.h"
#include "loadgen/serve_benchmark.h"

namespace beamline::loadgen {

// A failed turn ends its session (the turns after it would resend a conversation the server never answered).
WorkItem multi_turn_session(ServerEndpoint endpoint, std::string model, BenchSession session, bool ignore_eos,
                            nlohmann::json sampling);

}  // namespace beamline::loadgen
