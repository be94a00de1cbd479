// beamline serve: the OpenAI-compatible HTTP server (src/server) over the serving engine.
#include <signal.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <atomic>
#include <charconv>
#include <chrono>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "checkpoint/model_source.h"
#include "commands.h"
#include "engine/engine.h"
#include "engine/engine_client.h"
#include "engine/engine_config.h"
#include "engine/generation_config.h"
#include "harmony/harmony_template.h"
#include "model_options.h"
#include "parallel/mpi_world.h"
#include "parallel_options.h"
#include "runner/beam_model_runner.h"
#include "runner/data_parallel_runner.h"
#include "server/http_server.h"
#include "server/serving_context.h"
#include "structured/grammar_cache.h"
#include "util/error.h"
#include "util/open_file_limit.h"

namespace beamline::cli {
namespace {

namespace fs = std::filesystem;

// Where `beamline serve` looks when --model is not given: the project's own trained model, and beside it its block
// drafter, used for speculative decoding unless --speculative-config says otherwise.
constexpr const char* kDefaultModelDir = "models/beam-nano";
constexpr const char* kDefaultDrafterDir = "beam-nano-drafter";
constexpr int32_t kDefaultDraftTokens = 7;

struct ServeOptions {
  std::string model;
  std::string load_format = "auto", hf_overrides, quantization;
  std::string served_model_name;
  std::string device = "auto";
  std::string api_key;
  std::string max_request_body = "32M";
  server::HttpOptions http;
  EngineConfig engine;
  ParallelConfig parallel;
  bool harmony_constraint = true;
};

// Compiled structured-output grammars kept (LRU): each distinct schema, tool set or format is one entry.
constexpr std::size_t kGrammarCacheEntries = 256;

// --model, else models/beam-nano under the working directory or under any folder above the binary
// (the binary lives in a build folder of the source tree).
fs::path resolve_model_dir(const std::string& given) {
  const auto has_config = [](const fs::path& dir) { return fs::is_regular_file(dir / "config.json"); };
  if (!given.empty()) {
    require(fs::is_directory(given), "--model {}: no such directory", given);
    require(has_config(given), "--model {}: no config.json there (not a checkpoint directory)", given);
    return given;
  }
  std::vector<fs::path> tried{fs::current_path() / kDefaultModelDir};
  std::error_code error;
  const fs::path exe = fs::read_symlink("/proc/self/exe", error);
  if (!error) {
    for (fs::path dir = exe.parent_path(); !dir.empty() && dir != dir.root_path(); dir = dir.parent_path()) {
      tried.push_back(dir / kDefaultModelDir);
    }
  }
  for (const fs::path& candidate : tried) {
    if (has_config(candidate)) return candidate;
  }
  fail("no --model given, and the default model {} was not found (looked in {} and the folders above the binary). "
       "It is the project's trained model and may not exist yet; serve a random model instead: "
       "`beamline make-model --preset tiny --out /tmp/tiny && beamline serve --model /tmp/tiny`",
       kDefaultModelDir, tried.front().string());
}

// SIGINT / SIGTERM are blocked in every thread and taken by one waiting thread: the first asks for a
// graceful shutdown (no new requests, in-flight ones finish), a second aborts what is still running.
class ShutdownSignals {
 public:
  ShutdownSignals() {
    sigemptyset(&signals_);
    sigaddset(&signals_, SIGINT);
    sigaddset(&signals_, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &signals_, nullptr);
    // A client that closes its connection must not kill the server with SIGPIPE on the next write.
    ::signal(SIGPIPE, SIG_IGN);
  }

  // Waits for signals on a thread of its own until stop().
  void watch(server::ApiServer& api, EngineClient& engine) {
    watcher_ = std::thread([this, &api, &engine] {
      const timespec poll{0, 200'000'000};
      while (!stopping_) {
        const int signal = sigtimedwait(&signals_, nullptr, &poll);
        if (signal < 0) continue;
        if (!api.refusing_new_requests()) {
          spdlog::info("{}: finishing the requests in flight, then exiting (signal again to abort them)",
                       strsignal(signal));
          api.refuse_new_requests();
          drainer_ = std::thread([&api, &engine] {
            engine.shutdown(ShutdownMode::Drain);
            api.wait_until_idle(std::chrono::seconds(10));
            api.stop();
          });
        } else {
          spdlog::info("{} again: aborting the requests in flight", strsignal(signal));
          api.abort_in_flight();
        }
      }
    });
  }

  void stop() {
    stopping_ = true;
    if (watcher_.joinable()) watcher_.join();
    if (drainer_.joinable()) drainer_.join();
  }

  ~ShutdownSignals() { stop(); }

 private:
  sigset_t signals_;
  std::atomic<bool> stopping_{false};
  std::thread watcher_;
  std::thread drainer_;
};

void serve_ranks(ServeOptions& options, MpiWorld* world);

// Set from the engine thread when a distributed step fails: the server then stops, and the job ends naming the cause.
class DistributedFailure {
 public:
  void watch(BeamModelRunner& runner, server::ApiServer*& api) {
    runner.on_distributed_failure([this, &api](const std::string& cause) {
      std::lock_guard lock(mutex_);
      if (!cause_.empty()) return;
      cause_ = cause;
      // Not on the engine thread, which api.stop() may wait for.
      stopper_ = std::thread([server = api] {
        if (server == nullptr) return;
        // Requests in flight get their error (every later step fails at once), then the server closes.
        server->refuse_new_requests();
        server->wait_until_idle(std::chrono::seconds(5));
        server->abort_in_flight();
        server->stop();
      });
    });
  }
  std::string cause() {
    std::lock_guard lock(mutex_);
    return cause_;
  }
  ~DistributedFailure() {
    if (stopper_.joinable()) stopper_.join();
  }

 private:
  std::mutex mutex_;
  std::string cause_;
  std::thread stopper_;
};

// A rank other than 0 of a distributed server: its shard of the model, running the steps rank 0 broadcasts.
void follow(const ServeOptions& options, const fs::path& model_dir, MpiWorld& world) {
  // Ctrl-C or SIGTERM reach every rank (mpirun forwards them): the server on rank 0 drains and then stops the others.
  ::signal(SIGINT, SIG_IGN);
  ::signal(SIGTERM, SIG_IGN);
  ModelSource source{model_dir.string(), options.load_format, options.hf_overrides};
  source.quantization = options.quantization;
  source.parallel = options.parallel;
  source.world_rank = world.rank();
  BeamModelRunner runner(source.load(), options.device, options.engine, world, options.parallel);
  spdlog::info("rank {} of {} ready (pid {})", world.rank(), world.size(), getpid());
  runner.follow();
  spdlog::info("rank {} stopped", world.rank());
}

void serve(ServeOptions& options) {
  options.parallel.validate();
  relaunch_under_mpirun_unless_launched(options.parallel);
  std::unique_ptr<MpiWorld> world;
  if (launched_by_mpi()) {
    world = std::make_unique<MpiWorld>(options.parallel.timeout_seconds);
    prefix_logs_with_rank(world->rank());
  }
  if (world == nullptr) return serve_ranks(options, nullptr);
  try {
    serve_ranks(options, world.get());
  } catch (const std::exception& error) {
    world->fail(error.what());
  }
}

// The default model with no --speculative-config: dflash with its drafter, when that directory is there (and the other
// flags allow speculation: raw logprobs, one process).
void use_default_drafter(const fs::path& model_dir, EngineConfig& engine) {
  SpeculativeConfig& speculative = engine.speculative;
  const fs::path drafter = model_dir.parent_path() / kDefaultDrafterDir;
  if (speculative.given || engine.logprobs_mode != LogprobsMode::RawLogprobs ||
      !fs::is_regular_file(drafter / "config.json"))
    return;
  speculative.method = SpeculativeMethod::DFlash;
  speculative.model = drafter.string();
  speculative.num_speculative_tokens = kDefaultDraftTokens;
  spdlog::info("speculative decoding with the default drafter {} (K = {}; --speculative-config none turns it off)",
               drafter.string(), kDefaultDraftTokens);
}

void serve_ranks(ServeOptions& options, MpiWorld* world) {
  const fs::path model_dir = resolve_model_dir(options.model);
  if (options.model.empty() && world == nullptr) use_default_drafter(model_dir, options.engine);
  if (world != nullptr && world->rank() != 0) return follow(options, model_dir, *world);
  options.engine.validate();
  options.http.max_request_body_bytes =
      static_cast<std::size_t>(parse_byte_size(options.max_request_body, "--max-request-body-bytes"));
  require(options.http.max_request_body_bytes > 0, "--max-request-body-bytes must be positive");
  if (!options.api_key.empty()) options.http.api_key = options.api_key;
  options.http.weight_sync_timeout_seconds = options.parallel.timeout_seconds;

  ShutdownSignals signals;  // before any thread starts, so every thread inherits the blocked mask

  spdlog::info("loading {} on {}", model_dir.string(), options.device);
  ModelSource source{model_dir.string(), options.load_format, options.hf_overrides};
  source.quantization = options.quantization;
  if (world != nullptr) {
    source.parallel = options.parallel;
    source.world_rank = world->rank();
  }
  auto runner = world == nullptr
                    ? std::make_unique<BeamModelRunner>(source.load(), options.device, options.engine)
                    : std::make_unique<BeamModelRunner>(source.load(), options.device, options.engine, *world,
                                                        options.parallel);
  DistributedFailure failure;
  server::ApiServer* running_api = nullptr;
  failure.watch(*runner, running_api);
  const GenerationConfig generation = GenerationConfig::load(model_dir, runner->model_config());
  std::shared_ptr<const Tokenizer> tokenizer = Tokenizer::from_tokenizer_json(model_dir / "tokenizer.json");
  harmony::HarmonyTemplate harmony_template = harmony::HarmonyTemplate::for_model(model_dir);
  std::vector<TokenId> harmony_stop_ids = harmony_template.stop_token_ids(*tokenizer);
  // One engine per data-parallel replica (each its own scheduler and KV cache), behind one client that balances them.
  std::vector<std::unique_ptr<ModelRunner>> runners;
  if (runner->data_parallel_size() > 1)
    runners = data_parallel_runners(std::shared_ptr<BeamModelRunner>(std::move(runner)));
  else
    runners.push_back(std::move(runner));
  std::vector<std::unique_ptr<Engine>> engines;
  for (std::unique_ptr<ModelRunner>& replica : runners)
    engines.push_back(std::make_unique<Engine>(options.engine, std::move(replica), tokenizer, generation.eos_token_ids));
  EngineClient engine(std::move(engines), parse_data_parallel_routing(options.parallel.data_parallel_routing));
  for (const EngineConfig::LoraModulePath& module : options.engine.lora_modules) {
    engine.load_lora_adapter(module.name, module.path);
    spdlog::info("LoRA adapter '{}' loaded from {}", module.name, module.path);
  }

  const std::string name = options.served_model_name.empty() ? model_dir.filename().string() : options.served_model_name;
  GrammarCache grammars(*tokenizer, kGrammarCacheEntries);
  server::ServingContext context{engine,         *tokenizer, std::move(harmony_template), std::move(harmony_stop_ids),
                                 generation,     name,       server::unix_seconds_now(),  &grammars,
                                 options.harmony_constraint};
  raise_open_file_limit(kWantedOpenFiles);
  server::ApiServer api(context, options.http);
  running_api = &api;
  const int port = api.bind();
  spdlog::info("serving '{}' (max_model_len {}{}) at http://{}:{}/v1", name, engine.config().max_model_len,
               engine.num_engines() > 1
                   ? fmt::format(", {} data-parallel engines, {} routing", engine.num_engines(),
                                 engine.routing() == DataParallelRouting::PrefixAware ? "prefix-aware" : "least-loaded")
                   : "",
               options.http.host, port);
  signals.watch(api, engine);
  api.serve();
  running_api = nullptr;
  signals.stop();
  engine.shutdown(ShutdownMode::Abort);
  if (const std::string cause = failure.cause(); !cause.empty()) fail("the distributed model failed: {}", cause);
  spdlog::info("server stopped");
}

const CommandRegistration registration([](CLI::App& app) {
  auto* command = app.add_subcommand("serve", "Serve a model over an OpenAI-compatible HTTP API "
                                              "(/v1/chat/completions, /v1/completions, /v1/models, /tokenize, "
                                              "/detokenize, /version, /health, /metrics)");
  auto options = std::make_shared<ServeOptions>();
  command->add_option("--model", options->model,
                      std::string("checkpoint directory (default: ") + kDefaultModelDir + ")");
  command
      ->add_option("--load-format", options->load_format,
                   "auto: the checkpoint's safetensors; dummy: random weights drawn on the device from the model "
                   "directory's config.json (its tokenizer and templates are still used)")
      ->capture_default_str();
  command->add_option("--hf-overrides", options->hf_overrides,
                      "JSON object merged into the config with --load-format dummy, e.g. '{\"num_hidden_layers\": 8}'");
  add_quantization_option(*command, options->quantization);
  command->add_option("--host", options->http.host, "address to listen on")->capture_default_str();
  command->add_option("--port", options->http.port, "port to listen on (0: any free port, printed at start)")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
  command->add_option("--served-model-name", options->served_model_name,
                      "model name clients send and see (default: the model directory's name)");
  command->add_option("--api-key", options->api_key, "require 'Authorization: Bearer KEY' on every /v1 request");
  command->add_option("--device", options->device, "backend to run the model on")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->capture_default_str();
  command->add_option("--max-request-body-bytes", options->max_request_body,
                      "largest request body accepted (bytes; K/M/G suffixes); larger ones get 413")
      ->capture_default_str();
  command
      ->add_option("--http-threads", options->http.http_threads,
                   "event-loop threads serving HTTP (each holds any number of connections, idle or streaming)")
      ->check([](const std::string& value) {
        std::size_t threads = 0;
        const auto [end, error] = std::from_chars(value.data(), value.data() + value.size(), threads);
        if (error != std::errc() || end != value.data() + value.size()) return "--http-threads " + value + ": not a count";
        return server::check_http_threads(threads);
      })
      ->capture_default_str();
  command
      ->add_option_function<std::string>(
          "--weight-update-dir", [options](const std::string& dir) { options->http.weight_update_dir = dir; },
          "allow /update_weights_from_disk to load safetensors directories at or below DIR (off without it)");
  command->add_flag("--harmony-constraint,!--no-harmony-constraint", options->harmony_constraint,
                    "hold every chat turn to the Harmony template (channels, recipients among the request's tools, "
                    "arguments to their schemas; default on). Requests with response_format, structured_outputs or "
                    "tool_choice required / named are constrained either way");
  add_engine_options(*command, options->engine);
  add_parallel_options(*command, options->parallel);
  command->callback([options] { serve(*options); });
});

}  // namespace
}  // namespace beamline::cli
