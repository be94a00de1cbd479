#include "loadgen/openai_stream_client.h"

#include <fmt/format.h>
#include <httplib.h>

#include "loadgen/sse_reader.h"
#include "util/error.h"

namespace beamline::loadgen {

namespace {

using Clock = std::chrono::steady_clock;

// A benchmark request may wait long in a loaded server's queue: reads time out only after this.
constexpr std::chrono::seconds kReadTimeout{6 * 3600};

double seconds_between(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

httplib::Headers auth_headers(const std::optional<std::string>& api_key) {
  httplib::Headers headers;
  if (api_key) headers.emplace("Authorization", "Bearer " + *api_key);
  return headers;
}

struct ChunkText {
  std::string all;      // completions' choices[].text; chat's delta reasoning and content
  std::string content;  // chat's delta content alone
};

std::string string_member(const nlohmann::json& object, const char* key) {
  const auto field = object.find(key);
  return field != object.end() && field->is_string() ? field->get<std::string>() : std::string();
}

ChunkText chunk_text(const nlohmann::json& chunk, ApiKind kind) {
  ChunkText text;
  const auto choices = chunk.find("choices");
  if (choices == chunk.end() || !choices->is_array()) return text;
  for (const nlohmann::json& choice : *choices) {
    if (!choice.is_object()) continue;
    if (kind == ApiKind::Completions) {
      text.all += string_member(choice, "text");
      continue;
    }
    const auto delta = choice.find("delta");
    if (delta == choice.end() || !delta->is_object()) continue;
    // vLLM sends the reasoning as reasoning_content (older) or reasoning; beamline sends both, so one is read.
    std::string reasoning = string_member(*delta, "reasoning_content");
    if (reasoning.empty()) reasoning = string_member(*delta, "reasoning");
    const std::string content = string_member(*delta, "content");
    text.all += reasoning + content;
    text.content += content;
  }
  return text;
}

// Reads the chunks of one stream into `result`; false (with result.error set) on an error chunk.
class StreamTimer {
 public:
  StreamTimer(RequestResult& result, ApiKind kind, Clock::time_point sent) : result_(result), kind_(kind), sent_(sent) {}

  bool on_event(const SseEvent& event) {
    if (event.data == "[DONE]") return true;
    nlohmann::json chunk = nlohmann::json::parse(event.data, nullptr, /*allow_exceptions=*/false);
    if (chunk.is_discarded()) {
      result_.error = "a stream event is not JSON: " + event.data.substr(0, 200);
      return false;
    }
    if (auto error = chunk.find("error"); error != chunk.end() && !error->is_null()) {
      result_.error = "error event: " + error->dump();
      return false;
    }
    const Clock::time_point now = Clock::now();
    const ChunkText chunk_texts = chunk_text(chunk, kind_);
    const std::string& text = chunk_texts.all;
    result_.content_text += chunk_texts.content;
    if (!text.empty()) {
      if (!got_text_) {
        result_.ttft = seconds_between(sent_, now);
      } else {
        result_.itl.push_back(seconds_between(last_text_, now));
      }
      got_text_ = true;
      last_text_ = now;
      ++text_chunks_;
      result_.generated_text += text;
    }
    if (auto usage = chunk.find("usage"); usage != chunk.end() && usage->is_object()) {
      usage_prompt_ = usage->value("prompt_tokens", int64_t{-1});
      usage_completion_ = usage->value("completion_tokens", int64_t{-1});
    }
    return true;
  }

  // After the stream ended: counts from usage where the server sent it.
  void finish(int64_t dataset_prompt_len) {
    result_.prompt_len = usage_prompt_ >= 0 ? usage_prompt_ : dataset_prompt_len;
    result_.output_tokens = usage_completion_ >= 0 ? usage_completion_ : text_chunks_;
  }

  bool got_text() const { return got_text_; }

 private:
  RequestResult& result_;
  ApiKind kind_;
  Clock::time_point sent_;
  Clock::time_point last_text_;
  bool got_text_ = false;
  int64_t text_chunks_ = 0;
  int64_t usage_prompt_ = -1;
  int64_t usage_completion_ = -1;
};

}  // namespace

SplitUrl split_url(const std::string& url) {
  const std::size_t scheme = url.find("://");
  require(scheme != std::string::npos, "--base-url '{}': expected scheme://host[:port][/path]", url);
  const std::size_t path = url.find('/', scheme + 3);
  if (path == std::string::npos) return {url, ""};
  std::string prefix = url.substr(path);
  while (!prefix.empty() && prefix.back() == '/') prefix.pop_back();
  return {url.substr(0, path), prefix};
}

nlohmann::json request_payload(ApiKind kind, const std::string& model, const BenchRequest& request, bool ignore_eos,
                               const nlohmann::json& sampling) {
  nlohmann::json payload = {{"model", model}, {"temperature", 0.0}, {"stream", true},
                            {"stream_options", {{"include_usage", true}}}};
  if (kind == ApiKind::Completions) {
    payload["prompt"] = request.prompt;
    payload["max_tokens"] = request.output_len;
  } else {
    payload["messages"] = nlohmann::json::array({{{"role", "user"}, {"content", request.prompt}}});
    payload["max_completion_tokens"] = request.output_len;
  }
  if (ignore_eos) payload["ignore_eos"] = true;
  for (const auto& [key, value] : sampling.items()) payload[key] = value;
  return payload;
}

RequestResult send_streaming(const ServerEndpoint& endpoint, const nlohmann::json& payload, int64_t dataset_prompt_len,
                             Clock::time_point benchmark_start) {
  RequestResult result;
  httplib::Client client(endpoint.base_url);
  if (!client.is_valid()) {
    result.error = fmt::format("cannot use '{}' (only http:// is supported by this build)", endpoint.base_url);
    return result;
  }
  client.set_read_timeout(kReadTimeout);
  client.set_keep_alive(false);

  httplib::Request request;
  request.method = "POST";
  request.path = endpoint.path;
  request.headers = auth_headers(endpoint.api_key);
  request.body = payload.dump();
  request.set_header("Content-Type", "application/json");

  const Clock::time_point sent = Clock::now();
  result.start_time = seconds_between(benchmark_start, sent);
  StreamTimer timer(result, endpoint.kind, sent);
  SseReader reader;
  std::string error_body;
  int status = 0;
  bool stream_failed = false;
  request.response_handler = [&](const httplib::Response& response) {
    status = response.status;
    return true;
  };
  request.content_receiver = [&](const char* data, std::size_t size, uint64_t, uint64_t) {
    if (status != 200) {
      error_body.append(data, std::min<std::size_t>(size, 4096 - std::min<std::size_t>(error_body.size(), 4096)));
      return true;
    }
    for (const SseEvent& event : reader.push(std::string_view(data, size))) {
      if (!timer.on_event(event)) {
        stream_failed = true;
        return false;
      }
    }
    return true;
  };
  httplib::Response response;
  httplib::Error error = httplib::Error::Success;
  const bool sent_ok = client.send(request, response, error);
  result.latency = seconds_between(sent, Clock::now());
  if (stream_failed) return result;
  if (!sent_ok) {
    result.error = fmt::format("{} {}: {}", endpoint.base_url, endpoint.path, httplib::to_string(error));
    return result;
  }
  if (status != 200) {
    result.error = fmt::format("HTTP {}: {}", status, error_body);
    return result;
  }
  if (!timer.got_text()) {
    result.error = "the stream ended without any text";
    return result;
  }
  timer.finish(dataset_prompt_len);
  result.success = true;
  return result;
}

std::string first_served_model(const std::string& base_url, const std::optional<std::string>& api_key) {
  const SplitUrl url = split_url(base_url);
  httplib::Client client(url.base_url);
  require(client.is_valid(), "cannot use '{}' (only http:// is supported by this build)", url.base_url);
  const httplib::Result response = client.Get(url.path + "/v1/models", auth_headers(api_key));
  require(static_cast<bool>(response), "GET {}{}/v1/models: {}", url.base_url, url.path,
          httplib::to_string(response.error()));
  require(response->status == 200, "GET {}{}/v1/models: HTTP {}: {}", url.base_url, url.path, response->status,
          response->body);
  const nlohmann::json models = nlohmann::json::parse(response->body, nullptr, false);
  require(models.is_object() && models.contains("data") && models["data"].is_array() && !models["data"].empty() &&
              models["data"][0].contains("id"),
          "GET {}/v1/models: no model in the answer ({}); pass --model", base_url, response->body.substr(0, 200));
  return models["data"][0]["id"].get<std::string>();
}

}  // namespace beamline::loadgen
