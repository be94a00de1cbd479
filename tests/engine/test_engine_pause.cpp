// Engine::pause / resume (vLLM's /pause modes) and run_between_steps, on the deterministic fake model.
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <memory>
#include <thread>

#include "engine/engine.h"
#include "engine/engine_core.h"
#include "fake_model_runner.h"

namespace beamline {
namespace {

using namespace std::chrono_literals;

std::unique_ptr<Engine> make_engine() {
  auto runner = std::make_unique<testing::FakeModelRunner>(testing::fake_layout(4, 400, 1, 2), 12, 64, 512);
  runner->step_delay = 1ms;
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

TEST(EnginePause, ShutdownEndsAPause) {
  auto engine = make_engine();
  engine->pause(PauseMode::Keep);
  auto held = engine->add_request(request("a", 5));
  engine->shutdown(ShutdownMode::Drain);
  EXPECT_EQ(collect_output(*held).samples.at(0).finish_reason, FinishReason::Length);
}

}  // namespace
}  // namespace beamline
