#include "server/http_server.h"

#include <fmt/format.h>
#include <httplib.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>

#include <chrono>
#include <functional>

#include "server/auth.h"
#include "server/connection_threads.h"
#include "server/lora_endpoints.h"
#include "server/openai_chat.h"
#include "server/openai_completions.h"
#include "server/openai_responses.h"
#include "server/peer_connection.h"
#include "server/request_fields.h"
#include "server/sglang_generate.h"
#include "server/sse.h"
#include "server/tokenize_endpoints.h"

namespace beamline::server {

// httplib's listen backlog is compiled into the Debian library (5 connections): a burst of hundreds of
// clients would see refused or retried connections. The socket is reachable from a subclass, so the
// backlog is raised after binding.
class ListeningServer : public httplib::Server {
 public:
  void widen_backlog(int backlog) {
    if (::listen(svr_sock_, backlog) != 0) spdlog::warn("could not raise the listen backlog to {}", backlog);
  }
};

namespace {

constexpr int kListenBacklog = 4096;
// How long a stream waits for engine output before checking on its client.
constexpr std::chrono::milliseconds kStreamPoll{200};
// A stream with nothing to say writes an SSE comment this often, so a gone client is noticed (and its
// request aborted) even while the request waits in the queue; a non-streamed request asks the kernel
// whether its client is still connected as often.
constexpr std::chrono::seconds kHeartbeatInterval{1};

constexpr const char* kJson = "application/json";

}  // namespace

void write_error(httplib::Response& response, const ApiError& error) {
  response.status = error.status();
  response.set_content(dump_json(error.to_json()), kJson);
}

ApiServer::ApiServer(ServingContext& context, HttpOptions options)
    : context_(context),
      options_(std::move(options)),
      http_(std::make_unique<ListeningServer>()),
      control_(context, options_.weight_update_dir, options_.weight_sync_timeout_seconds) {
  const std::size_t threads = options_.http_threads;
  http_->new_task_queue = [threads] { return new ConnectionThreads(threads); };
  http_->set_payload_max_length(options_.max_request_body_bytes);
  http_->set_keep_alive_max_count(1000);
  http_->set_tcp_nodelay(true);

  http_->set_pre_routing_handler([this](const httplib::Request& request, httplib::Response& response) {
    if (options_.api_key && path_needs_api_key(request.path) &&
        !bearer_token_matches(request.get_header_value("Authorization"), *options_.api_key)) {
      write_error(response, unauthorized());
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  // Errors httplib answers itself (unknown route, oversize body) get the OpenAI error shape too.
  http_->set_error_handler([this](const httplib::Request& request, httplib::Response& response) {
    if (!response.body.empty() || response.has_header("Content-Type")) return;
    if (response.status == 413) {
      write_error(response, payload_too_large(options_.max_request_body_bytes));
    } else if (response.status == 404) {
      write_error(response, not_found(request.path));
    } else {
      const int status = response.status;
      write_error(response, ApiError(status, "invalid_request_error", "HTTP error " + std::to_string(status)));
    }
  });
  http_->set_exception_handler([](const httplib::Request&, httplib::Response& response, std::exception_ptr error) {
    write_error(response, to_api_error(error));
  });
  http_->set_logger([this](const httplib::Request&, const httplib::Response& response) {
    counters_.count_response(response.status);
  });

  http_->Get("/health", [this](const httplib::Request&, httplib::Response& response) {
    if (refusing_) {
      write_error(response, server_shutting_down());
    } else {
      response.status = 200;
    }
  });
  http_->Get("/metrics", [this](const httplib::Request&, httplib::Response& response) { metrics(response); });
  http_->Get("/v1/models", [this](const httplib::Request& request, httplib::Response& response) {
    guarded(request, response, [&] { models(response); });
  });
  http_->Post("/v1/chat/completions", [this](const httplib::Request& request, httplib::Response& response) {
    guarded(request, response, [&] { chat_completions(request, response); });
  });
  http_->Post("/v1/completions", [this](const httplib::Request& request, httplib::Response& response) {
    guarded(request, response, [&] { completions(request, response); });
  });
  http_->Post("/v1/responses", [this](const httplib::Request& request, httplib::Response& response) {
    guarded(request, response, [&] { responses(request, response); });
  });
  http_->Post("/generate", [this](const httplib::Request& request, httplib::Response& response) {
    guarded(request, response, [&] { generate(request, response); });
  });
  http_->Post("/tokenize", [this](const httplib::Request& request, httplib::Response& response) {
    guarded(request, response,
            [&] { response.set_content(dump_json(tokenize_response(parse_body(request.body), context_)), kJson); });
  });
  http_->Post("/detokenize", [this](const httplib::Request& request, httplib::Response& response) {
    guarded(request, response,
            [&] { response.set_content(dump_json(detokenize_response(parse_body(request.body), context_)), kJson); });
  });
  http_->Post("/v1/load_lora_adapter", [this](const httplib::Request& request, httplib::Response& response) {
    guarded(request, response,
            [&] { response.set_content(load_lora_adapter(parse_body(request.body), context_), "text/plain"); });
  });
  http_->Post("/v1/unload_lora_adapter", [this](const httplib::Request& request, httplib::Response& response) {
    guarded(request, response,
            [&] { response.set_content(unload_lora_adapter(parse_body(request.body), context_), "text/plain"); });
  });
  http_->Get("/version", [this](const httplib::Request& request, httplib::Response& response) {
    guarded(request, response,
            [&] { response.set_content(dump_json(Json{{"version", beamline_version()}}), kJson); });
  });
  add_control_routes();
}

void ApiServer::add_control_routes() {
  const auto control_request = [](const httplib::Request& request) {
    ControlRequest control;
    for (const auto& [key, value] : request.params) control.query[key] = value;
    if (!request.body.empty()) control.body = parse_body(request.body);
    return control;
  };
  const auto post = [&](const std::string& path, std::function<Json(const ControlRequest&)> handler) {
    http_->Post(path, [this, control_request, handler](const httplib::Request& request, httplib::Response& response) {
      guarded(request, response, [&] { response.set_content(dump_json(handler(control_request(request))), kJson); });
    });
  };
  const auto get = [&](const std::string& path, std::function<Json()> handler) {
    http_->Get(path, [this, handler](const httplib::Request& request, httplib::Response& response) {
      guarded(request, response, [&] { response.set_content(dump_json(handler()), kJson); });
    });
  };
  post("/pause", [this](const ControlRequest& request) { return control_.pause(request); });
  post("/resume", [this](const ControlRequest&) { return control_.resume(); });
  get("/is_paused", [this] { return control_.is_paused(); });
  post("/sleep", [this](const ControlRequest& request) { return control_.sleep(request); });
  post("/wake_up", [this](const ControlRequest& request) { return control_.wake_up(request); });
  get("/is_sleeping", [this] { return control_.is_sleeping(); });
  post("/reset_prefix_cache", [this](const ControlRequest&) { return control_.reset_prefix_cache(); });
  post("/flush_cache", [this](const ControlRequest&) { return control_.reset_prefix_cache(); });  // SGLang's name
  get("/flush_cache", [this] { return control_.reset_prefix_cache(); });
  post("/update_weights_from_disk",
       [this](const ControlRequest& request) { return control_.update_weights_from_disk(request); });
  post("/init_weights_update_group",
       [this](const ControlRequest& request) { return control_.init_weights_update_group(request); });
  post("/update_weights_from_distributed",
       [this](const ControlRequest& request) { return control_.update_weights_from_distributed(request); });
  post("/destroy_weights_update_group",
       [this](const ControlRequest& request) { return control_.destroy_weights_update_group(request); });
}

ApiServer::~ApiServer() = default;

int ApiServer::bind() {
  int port = options_.port;
  if (port == 0) {
    port = http_->bind_to_any_port(options_.host);
    require(port > 0, "cannot listen on {} (any port)", options_.host);
  } else {
    require(http_->bind_to_port(options_.host, port), "cannot listen on {}:{} (in use, or not an address of this host)",
            options_.host, port);
  }
  http_->widen_backlog(kListenBacklog);
  options_.port = port;
  return port;
}

void ApiServer::serve() { http_->listen_after_bind(); }

void ApiServer::refuse_new_requests() { refusing_ = true; }

void ApiServer::abort_in_flight() {
  std::vector<std::string> ids;
  {
    std::lock_guard lock(in_flight_mutex_);
    ids.assign(in_flight_.begin(), in_flight_.end());
  }
  for (const std::string& id : ids) context_.engine.abort(id);
}

void ApiServer::stop() { http_->stop(); }

template <typename Body>
void ApiServer::guarded(const httplib::Request&, httplib::Response& response, Body&& body) {
  try {
    if (refusing_) throw server_shutting_down();
    body();
  } catch (...) {
    write_error(response, to_api_error(std::current_exception()));
  }
}

std::shared_ptr<OutputStream> ApiServer::submit(GenerationRequest request) {
  const std::string id = request.request_id;
  {
    std::lock_guard lock(in_flight_mutex_);
    in_flight_.insert(id);
  }
  try {
    return context_.engine.add_request(std::move(request));
  } catch (const InvalidRequest&) {
    release(id);
    throw;
  } catch (const Error& error) {
    release(id);
    // The engine refuses new work only once it is shutting down.
    spdlog::debug("engine refused request {}: {}", id, error.what());
    throw server_shutting_down();
  }
}

void ApiServer::release(const std::string& request_id) {
  {
    std::lock_guard lock(in_flight_mutex_);
    in_flight_.erase(request_id);
  }
  in_flight_changed_.notify_all();
}

void ApiServer::wait_until_idle(std::chrono::milliseconds timeout) {
  std::unique_lock lock(in_flight_mutex_);
  in_flight_changed_.wait_for(lock, timeout, [&] { return in_flight_.empty(); });
}

std::vector<RequestOutput> ApiServer::wait_for(const httplib::Request& request,
                                               const std::vector<std::shared_ptr<OutputStream>>& streams) {
  const TcpConnection connection{request.local_addr, request.local_port, request.remote_addr, request.remote_port};
  std::chrono::steady_clock::time_point last_check = std::chrono::steady_clock::now();
  bool aborted = false;
  std::vector<RequestOutput> outputs(streams.size());
  for (std::size_t i = 0; i < streams.size(); ++i) {
    OutputStream& stream = *streams[i];
    bool first = true;
    while (!stream.done()) {
      if (std::optional<RequestOutput> event = stream.next(kStreamPoll)) {
        if (first) {
          outputs[i] = std::move(*event);
          first = false;
        } else {
          merge_output(outputs[i], std::move(*event));
        }
      }
      const std::chrono::steady_clock::time_point now = std::chrono::steady_clock::now();
      if (aborted || now - last_check < kHeartbeatInterval) continue;
      last_check = now;
      if (tcp_peer_state(connection) == PeerState::Gone) {
        // Nobody will read the answer: free the KV blocks now, as for a stream whose client left.
        spdlog::info("client of {} went away before its answer: aborting it", stream.request_id());
        for (std::size_t j = i; j < streams.size(); ++j) context_.engine.abort(streams[j]->request_id());
        aborted = true;
      }
    }
    release(stream.request_id());
  }
  for (const RequestOutput& output : outputs) {
    if (output.error) throw internal_error("generation failed: " + *output.error);
  }
  return outputs;
}

void ApiServer::respond_stream(httplib::Response& response, std::shared_ptr<OutputStream> stream,
                               std::unique_ptr<SseResponder> responder) {
  struct StreamState {
    std::shared_ptr<OutputStream> stream;
    std::unique_ptr<SseResponder> responder;
    bool begun = false;
    bool finished = false;
    std::chrono::steady_clock::time_point last_write = std::chrono::steady_clock::now();
  };
  auto state = std::make_shared<StreamState>();
  state->stream = std::move(stream);
  state->responder = std::move(responder);
  ++counters_.active_streams;

  response.set_header("Cache-Control", "no-cache");
  response.set_header("X-Accel-Buffering", "no");
  response.set_chunked_content_provider(
      "text/event-stream",
      [state](std::size_t, httplib::DataSink& sink) {
        const auto write = [&](const std::string& text) {
          if (text.empty()) return true;  // an empty write would end httplib's chunked loop
          state->last_write = std::chrono::steady_clock::now();
          return sink.write(text.data(), text.size());
        };
        if (!state->begun) {
          state->begun = true;
          if (!write(state->responder->begin())) return false;
        }
        std::optional<RequestOutput> output = state->stream->next(kStreamPoll);
        if (!output) {
          if (std::chrono::steady_clock::now() - state->last_write < kHeartbeatInterval) return true;
          return write(kSseHeartbeat);
        }
        if (!write(state->responder->on_output(*output))) return false;
        if (output->finished) {
          state->finished = true;
          sink.done();
        }
        return true;
      },
      [this, state](bool) {
        // Runs when the response is done with, whether or not the client read it all: a client that went
        // away mid-stream leaves an unfinished request, which is aborted so its KV blocks are freed.
        if (!state->finished) {
          spdlog::info("client of {} went away mid-stream: aborting it", state->stream->request_id());
          context_.engine.abort(state->stream->request_id());
        }
        release(state->stream->request_id());
        --counters_.active_streams;
      });
}

void ApiServer::chat_completions(const httplib::Request& request, httplib::Response& response) {
  const Json body = parse_body(request.body);
  ChatPlan plan = plan_chat_completion(body, context_);
  const std::string id = new_response_id("chatcmpl");
  plan.request.request_id = id;
  std::shared_ptr<OutputStream> stream;
  try {
    stream = submit(plan.request);
  } catch (const InvalidRequest& invalid) {
    // A chat request has no `prompt`: what the engine calls the prompt comes from `messages`.
    throw invalid_request(invalid.param() == "prompt" ? "messages" : invalid.param(), invalid.what());
  }
  if (plan.stream.stream) {
    respond_stream(response, std::move(stream), chat_completion_stream(id, context_, std::move(plan)));
    return;
  }
  const RequestOutput output = std::move(wait_for(request, {stream}).front());
  response.set_content(dump_json(chat_completion_response(id, context_, plan, output)), kJson);
}

void ApiServer::responses(const httplib::Request& request, httplib::Response& response) {
  const Json body = parse_body(request.body);
  ResponsesPlan plan = plan_response(body, context_);
  const std::string id = new_item_id("resp");
  plan.chat.request.request_id = id;
  std::shared_ptr<OutputStream> stream;
  try {
    stream = submit(plan.chat.request);
  } catch (const InvalidRequest& invalid) {
    // The engine's `prompt` is the request's `input`; its max_tokens is max_output_tokens.
    const std::string param = invalid.param() == "prompt" ? "input"
                              : invalid.param() == "max_tokens" ? "max_output_tokens"
                                                                : invalid.param();
    throw invalid_request(param, invalid.what());
  }
  if (plan.chat.stream.stream) {
    respond_stream(response, std::move(stream), response_stream(id, context_, std::move(plan)));
    return;
  }
  const RequestOutput output = std::move(wait_for(request, {stream}).front());
  response.set_content(dump_json(response_object(id, context_, plan, output)), kJson);
}

void ApiServer::completions(const httplib::Request& request, httplib::Response& response) {
  const Json body = parse_body(request.body);
  std::vector<CompletionPlan> plans = plan_completions(body, context_);
  const std::string id = new_response_id("cmpl");
  std::vector<GenerationRequest*> requests;
  for (std::size_t p = 0; p < plans.size(); ++p) {
    plans[p].request.request_id = plans.size() == 1 ? id : fmt::format("{}-{}", id, p);
    requests.push_back(&plans[p].request);
  }
  std::vector<std::shared_ptr<OutputStream>> streams = submit_batch(requests);
  if (plans.front().stream.stream) {
    respond_stream(response, std::move(streams.front()), completion_stream(id, context_, std::move(plans.front())));
    return;
  }
  const std::vector<RequestOutput> outputs = wait_for(request, streams);
  response.set_content(dump_json(completion_response(id, context_, plans, outputs)), kJson);
}

std::vector<std::shared_ptr<OutputStream>> ApiServer::submit_batch(const std::vector<GenerationRequest*>& requests) {
  std::vector<std::shared_ptr<OutputStream>> streams;
  for (std::size_t p = 0; p < requests.size(); ++p) {
    try {
      streams.push_back(submit(*requests[p]));
    } catch (const InvalidRequest& invalid) {
      // All or none: those already queued are taken back.
      for (const std::shared_ptr<OutputStream>& queued : streams) {
        context_.engine.abort(queued->request_id());
        collect_output(*queued);
        release(queued->request_id());
      }
      if (requests.size() == 1) throw;
      throw invalid_request(invalid.param(), fmt::format("prompt {} of the batch: {}", p, invalid.what()));
    }
  }
  return streams;
}

void ApiServer::generate(const httplib::Request& request, httplib::Response& response) {
  const Json body = parse_body(request.body);
  GeneratePlan plan = plan_generate(body, context_);
  const std::string id = new_response_id("gen");
  std::vector<GenerationRequest*> requests;
  for (std::size_t p = 0; p < plan.requests.size(); ++p) {
    plan.requests[p].request_id = plan.requests.size() == 1 ? id : fmt::format("{}-{}", id, p);
    requests.push_back(&plan.requests[p]);
  }
  const std::vector<RequestOutput> outputs = wait_for(request, submit_batch(requests));
  response.set_content(dump_json(generate_response(context_, plan, outputs)), kJson);
}

void ApiServer::models(httplib::Response& response) const {
  const Json model = {{"id", context_.model_name},
                      {"object", "model"},
                      {"created", context_.created},
                      {"owned_by", "beamline"},
                      {"root", context_.model_name},
                      {"parent", nullptr},
                      {"max_model_len", context_.engine.config().max_model_len}};
  Json data = Json::array({model});
  for (Json& card : lora_model_cards(context_)) data.push_back(std::move(card));
  response.set_content(dump_json(Json{{"object", "list"}, {"data", std::move(data)}}), kJson);
}

void ApiServer::metrics(httplib::Response& response) const {
  response.set_content(render_metrics(context_.engine.stats(), counters_.responses_by_status(),
                                      counters_.active_streams.load(), context_.model_name),
                       "text/plain; version=0.0.4; charset=utf-8");
}

}  // namespace beamline::server
