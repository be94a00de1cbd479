#include "loadgen/multi_turn_session.h"

namespace beamline::loadgen {

WorkItem multi_turn_session(ServerEndpoint endpoint, std::string model, BenchSession session, bool ignore_eos,
                            nlohmann::json sampling) {
  return [endpoint = std::move(endpoint), model = std::move(model), session = std::move(session), ignore_eos,
          sampling = std::move(sampling)](std::chrono::steady_clock::time_point start) {
    std::vector<RequestResult> results;
    nlohmann::json messages = nlohmann::json::array();
    std::string transcript;
    for (const std::string& user : session.user_turns) {
      BenchRequest request;
      request.output_len = session.output_len;
      nlohmann::json payload;
      if (endpoint.kind == ApiKind::ChatCompletions) {
        messages.push_back({{"role", "user"}, {"content", user}});
        request.prompt = "";
        payload = request_payload(endpoint.kind, model, request, ignore_eos, sampling);
        payload["messages"] = messages;
      } else {
        transcript += "User: " + user + "\nAssistant:";
        request.prompt = transcript;
        payload = request_payload(endpoint.kind, model, request, ignore_eos, sampling);
      }
      RequestResult result = send_streaming(endpoint, payload, 0, start);
      const bool failed = !result.success;
      if (endpoint.kind == ApiKind::ChatCompletions) {
        messages.push_back({{"role", "assistant"}, {"content", result.content_text}});
      } else {
        transcript += result.generated_text + "\n";
      }
      results.push_back(std::move(result));
      if (failed) break;
    }
    return results;
  };
}

}  // namespace beamline::loadgen
