// OutputStream's on_ready callback, what lets the HTTP event loop write a request's output without a thread waiting
// on it: called after every push (with whether the final event came), at once for events already waiting, and
// dropped after the final event so what it holds is released.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "engine/request_output.h"

namespace beamline {
namespace {

RequestOutput event(const std::string& text, bool finished) {
  SampleOutput sample;
  sample.text = text;
  RequestOutput output;
  output.samples.push_back(std::move(sample));
  output.finished = finished;
  return output;
}

TEST(OutputStream, OnReadyIsCalledForEveryPushAndDroppedAfterTheLast) {
  OutputStream stream("r");
  std::vector<bool> calls;
  auto held = std::make_shared<int>(0);
  stream.on_ready([&calls, held](bool finished) { calls.push_back(finished); });
  EXPECT_TRUE(calls.empty());  // nothing waits yet
  stream.push(event("a", false));
  stream.push(event("b", false));
  EXPECT_EQ(held.use_count(), 2);
  stream.push(event("c", true));
  EXPECT_EQ(calls, (std::vector<bool>{false, false, true}));
  EXPECT_EQ(held.use_count(), 1);  // the callback is gone with what it captured
  const std::optional<RequestOutput> merged = stream.next(std::chrono::milliseconds(0));
  ASSERT_TRUE(merged.has_value());
  EXPECT_EQ(merged->samples.at(0).text, "abc");
  EXPECT_TRUE(merged->finished);
  EXPECT_TRUE(stream.done());
}

TEST(OutputStream, OnReadyRegisteredLateIsCalledAtOnceForWhatWaits) {
  OutputStream waiting("r");
  waiting.push(event("a", false));
  std::vector<bool> calls;
  waiting.on_ready([&calls](bool finished) { calls.push_back(finished); });
  EXPECT_EQ(calls, (std::vector<bool>{false}));
  waiting.push(event("b", true));
  EXPECT_EQ(calls, (std::vector<bool>{false, true}));

  OutputStream ended("r");
  ended.push(event("a", true));
  calls.clear();
  ended.on_ready([&calls](bool finished) { calls.push_back(finished); });
  EXPECT_EQ(calls, (std::vector<bool>{true}));
}

TEST(OutputStream, NextWithoutWaitingTakesWhatArrivedFromAnotherThread) {
  OutputStream stream("r");
  EXPECT_FALSE(stream.next(std::chrono::milliseconds(0)).has_value());
  std::thread engine([&stream] {
    for (int i = 0; i < 100; ++i) stream.push(event("x", i == 99));
  });
  std::string text;
  while (!stream.done()) {
    if (std::optional<RequestOutput> output = stream.next(std::chrono::milliseconds(0))) {
      text += output->samples.at(0).text;
    }
  }
  engine.join();
  EXPECT_EQ(text, std::string(100, 'x'));
}

}  // namespace
}  // namespace beamline
