// Engine::pause / resume (vLLM's /pause modes), run_between_steps and EngineClient::run_on_model, on the deterministic
// fake model.
#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <thread>

#include "engine/engine.h"
#include "engine/engine_client.h"
#include "engine/engine_core.h"
#include "fake_model_runner.h"

namespace beamline {
namespace {

using namespace std::chrono_literals;

// `runner`, when given, is set to the engine's fake runner.
std::unique_ptr<Engine> make_engine(testing::FakeModelRunner** runner_out = nullptr) {
  auto runner = std::make_unique<testing::FakeModelRunner>(testing::fake_layout(4, 400, 1, 2), 12, 64, 512);
  runner->step_delay = 1ms;
  if (runner_out != nullptr) *runner_out = runner.get();
  EngineConfig config;
  config.max_num_seqs = 6;
  config.max_num_batched_tokens = 24;
  config.max_model_len = 160;
  return std::make_unique<Engine>(config, std::move(runner), nullptr, std::vector<TokenId>{0});
}

GenerationRequest request(const std::string& id, int32_t max_tokens) {
  GenerationRequest r;
  r.request_id = id;
  r.detokenize = false;
  r.prompt = {5, 9, 13, 2, 7};
  r.sampling.temperature = 0.8f;
  r.sampling.seed = 42;
  r.sampling.max_tokens = max_tokens;
  r.sampling.ignore_eos = true;
  return r;
}

// What the stream has delivered within `wait` (merged); nothing at all when it stayed silent.
std::optional<RequestOutput> drain(OutputStream& stream, std::chrono::milliseconds wait) {
  std::optional<RequestOutput> merged;
  const auto deadline = std::chrono::steady_clock::now() + wait;
  while (std::chrono::steady_clock::now() < deadline) {
    std::optional<RequestOutput> event = stream.next(10ms);
    if (!event) continue;
    if (merged) {
      merge_output(*merged, std::move(*event));
    } else {
      merged = std::move(event);
    }
  }
  return merged;
}

std::vector<TokenId> reference_tokens(const std::string& id, int32_t max_tokens) {
  auto engine = make_engine();
  return collect_output(*engine->add_request(request(id, max_tokens))).samples.at(0).token_ids;
}

TEST(EnginePause, KeepFreezesRequestsAndResumeContinuesThemUnchanged) {
  const std::vector<TokenId> expected = reference_tokens("a", 120);
  auto engine = make_engine();
  auto stream = engine->add_request(request("a", 120));
  std::optional<RequestOutput> seen = stream->next();
  ASSERT_TRUE(seen);
  engine->pause(PauseMode::Keep);
  EXPECT_TRUE(engine->paused());
  if (auto before = drain(*stream, 50ms)) merge_output(*seen, std::move(*before));  // the step in flight at the pause
  auto held = engine->add_request(request("b", 10));
  EXPECT_FALSE(drain(*stream, 100ms).has_value());  // frozen
  EXPECT_FALSE(drain(*held, 1ms).has_value());      // held, not scheduled
  ASSERT_LT(seen->samples.at(0).token_ids.size(), 120u);
  engine->resume();
  EXPECT_FALSE(engine->paused());
  merge_output(*seen, collect_output(*stream));
  EXPECT_EQ(seen->samples.at(0).token_ids, expected);
  EXPECT_EQ(collect_output(*held).samples.at(0).token_ids, reference_tokens("b", 10));
}

TEST(EnginePause, AbortEndsTheRequestsInFlight) {
  auto engine = make_engine();
  auto stream = engine->add_request(request("a", 150));
  ASSERT_TRUE(stream->next());
  engine->pause(PauseMode::Abort);
  const RequestOutput rest = collect_output(*stream);
  EXPECT_TRUE(rest.finished);
  EXPECT_EQ(rest.samples.at(0).finish_reason, FinishReason::Abort);
  // Its id is free again, and a request added now waits for resume().
  auto again = engine->add_request(request("a", 5));
  EXPECT_FALSE(drain(*again, 50ms).has_value());
  engine->resume();
  EXPECT_EQ(collect_output(*again).samples.at(0).finish_reason, FinishReason::Length);
}

TEST(EnginePause, WaitReturnsWhenTheRequestsInFlightHaveFinished) {
  auto engine = make_engine();
  auto stream = engine->add_request(request("a", 60));
  ASSERT_TRUE(stream->next());
  std::shared_ptr<OutputStream> late;
  std::thread pauser([&] { engine->pause(PauseMode::Wait); });
  std::this_thread::sleep_for(5ms);
  late = engine->add_request(request("late", 5));  // arrives while draining: held
  pauser.join();
  const RequestOutput rest = collect_output(*stream);
  EXPECT_EQ(rest.samples.at(0).finish_reason, FinishReason::Length);
  EXPECT_FALSE(drain(*late, 50ms).has_value());
  engine->resume();
  EXPECT_TRUE(collect_output(*late).finished);
}

TEST(EnginePause, AHeldRequestCanBeAborted) {
  auto engine = make_engine();
  engine->pause(PauseMode::Keep);
  auto held = engine->add_request(request("h", 5));
  engine->abort("h");
  const RequestOutput output = collect_output(*held);
  EXPECT_EQ(output.samples.at(0).finish_reason, FinishReason::Abort);
  engine->resume();
  EXPECT_TRUE(collect_output(*engine->add_request(request("after", 3))).finished);
}

TEST(EnginePause, RunBetweenStepsRunsOnTheEngineThreadAndRethrows) {
  auto engine = make_engine();
  auto stream = engine->add_request(request("a", 40));
  std::thread::id where;
  engine->run_between_steps([&](EngineCore& core, ModelRunner&) {
    where = std::this_thread::get_id();
    core.reset_prefix_cache();
  });
  EXPECT_NE(where, std::this_thread::get_id());
  EXPECT_THROW(engine->run_between_steps([](EngineCore&, ModelRunner& runner) { runner.load_weights_from_disk("/x"); }),
               Error);  // the fake runner cannot load weights: the error reaches the caller
  EXPECT_EQ(collect_output(*stream).samples.at(0).token_ids, reference_tokens("a", 40));
}

// Two engines as data-parallel replicas: a model change runs once, on engine 0's runner, while neither engine steps;
// then the per-engine part on both. A task that throws reaches the caller, without the per-engine part, and both
// engines serve on.
TEST(EnginePause, RunOnModelRunsOnceWhileEveryEngineIsBetweenSteps) {
  std::array<testing::FakeModelRunner*, 2> runners{};
  std::vector<std::unique_ptr<Engine>> engines;
  for (testing::FakeModelRunner*& runner : runners) engines.push_back(make_engine(&runner));
  EngineClient client(std::move(engines));
  std::vector<std::shared_ptr<OutputStream>> streams;
  for (const char* id : {"a", "b", "c", "d"}) streams.push_back(client.add_request(request(id, 60)));
  std::this_thread::sleep_for(20ms);  // both engines are stepping
  int tasks = 0;
  bool quiet = false;
  std::atomic<int> afters = 0;
  client.run_on_model(
      [&](ModelRunner& runner) {
        ++tasks;
        EXPECT_EQ(&runner, runners[0]);
        const std::array<int64_t, 2> before{runners[0]->forward_calls, runners[1]->forward_calls};
        std::this_thread::sleep_for(30ms);  // some 30 steps, were an engine stepping
        quiet = before == std::array<int64_t, 2>{runners[0]->forward_calls, runners[1]->forward_calls};
      },
      [&](EngineCore& core) {
        core.reset_prefix_cache();
        ++afters;
      });
  EXPECT_EQ(tasks, 1);
  EXPECT_TRUE(quiet) << "an engine stepped while the model changed";
  EXPECT_EQ(afters.load(), 2);
  EXPECT_THROW(client.run_on_model([](ModelRunner& runner) { runner.load_weights_from_disk("/x"); },
                                   [&](EngineCore&) { ++afters; }),
               Error);
  EXPECT_EQ(afters.load(), 2);
  for (std::size_t i = 0; i < streams.size(); ++i) {
    const std::string id(1, static_cast<char>('a' + i));
    EXPECT_EQ(collect_output(*streams[i]).samples.at(0).token_ids, reference_tokens(id, 60)) << id;
  }
}

TEST(EnginePause, ShutdownEndsAPause) {
  auto engine = make_engine();
  engine->pause(PauseMode::Keep);
  auto held = engine->add_request(request("a", 5));
  engine->shutdown(ShutdownMode::Drain);
  EXPECT_EQ(collect_output(*held).samples.at(0).finish_reason, FinishReason::Length);
}

}  // namespace
}  // namespace beamline
