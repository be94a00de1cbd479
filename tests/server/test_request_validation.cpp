// Request validation and error mapping of the OpenAI endpoints: every bad field is a 4xx naming the field,
// every good one reaches the engine's SamplingParams unchanged.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <random>
#include <stdexcept>

#include "engine/request.h"
#include "server/api_error.h"
#include "server/openai_sampling.h"
#include "server/request_fields.h"
#include "server/request_limits.h"

namespace beamline::server {
namespace {

constexpr int32_t kMaxLogprobs = 20;

// Runs `body` and returns the ApiError it throws (fails the test when it throws none).
template <typename Body>
ApiError error_of(Body&& body) {
  try {
    body();
  } catch (...) {
    return to_api_error(std::current_exception());
  }
  ADD_FAILURE() << "no error thrown";
  return internal_error("no error");
}

ApiError sampling_error(const std::string& json, Endpoint endpoint = Endpoint::ChatCompletions) {
  return error_of([&] { read_sampling_params(Json::parse(json), endpoint, kMaxLogprobs, GenerationConfig{}); });
}

void expect_bad_field(const std::string& json, const std::string& param, Endpoint endpoint = Endpoint::ChatCompletions) {
  const ApiError error = sampling_error(json, endpoint);
  EXPECT_EQ(error.status(), 400) << json;
  EXPECT_EQ(error.type(), "invalid_request_error") << json;
  EXPECT_EQ(error.param().value_or("<none>"), param) << json << ": " << error.what();
}

TEST(ApiError, JsonHasTheFourOpenAiFields) {
  const Json body = invalid_request("temperature", "temperature: expected a number").to_json();
  ASSERT_TRUE(body.contains("error"));
  const Json& error = body["error"];
  EXPECT_EQ(error["message"], "temperature: expected a number");
  EXPECT_EQ(error["type"], "invalid_request_error");
  EXPECT_EQ(error["param"], "temperature");
  EXPECT_TRUE(error["code"].is_null());
  const Json missing = model_not_found("gpt-9").to_json()["error"];
  EXPECT_EQ(missing["code"], "model_not_found");
  EXPECT_EQ(missing["param"], "model");
  EXPECT_TRUE(unauthorized().to_json()["error"]["param"].is_null());
  EXPECT_EQ(unauthorized().status(), 401);
  EXPECT_EQ(payload_too_large(10).status(), 413);
}

TEST(ApiError, ExceptionsMapToStatusAndField) {
  const ApiError engine = error_of([] { throw InvalidRequest("max_tokens", "max_tokens 9 plus the prompt ..."); });
  EXPECT_EQ(engine.status(), 400);
  EXPECT_EQ(engine.param(), "max_tokens");

  const ApiError text = error_of([] { throw Error("messages[2].tool_calls[0].function.name: expected a string"); });
  EXPECT_EQ(text.status(), 400);
  EXPECT_EQ(text.param(), "messages[2].tool_calls[0].function.name");

  const ApiError sentence = error_of([] { throw Error("the prompt is empty: at least one token is needed"); });
  EXPECT_EQ(sentence.status(), 400);
  EXPECT_FALSE(sentence.param().has_value());

  const ApiError bug = error_of([] { throw std::logic_error("index out of range"); });
  EXPECT_EQ(bug.status(), 500);
  EXPECT_EQ(bug.type(), "internal_server_error");

  const ApiError api = error_of([] { throw model_not_found("x"); });
  EXPECT_EQ(api.status(), 404);
}

TEST(RequestBody, InvalidJsonAndNonObjectsAre400) {
  for (const char* body : {"", "{", "{\"model\": }", "[1, 2]", "\"text\"", "42", "{\"a\": 1} trailing",
                           // A number past a double's range is nlohmann's out_of_range, not a parse_error: it escaped
                           // parse_body (found by tests/fuzz/fuzz_openai_chat_request).
                           "{\"temperature\": 1E999}", "{\"n\": -7777777777777777777777E7777777777777777777777}"}) {
    const ApiError error = error_of([&] { parse_body(body); });
    EXPECT_EQ(error.status(), 400) << body;
    EXPECT_EQ(error.type(), "invalid_request_error");
  }
  EXPECT_EQ(parse_body("{\"model\": \"m\"}")["model"], "m");
}

TEST(Sampling, WrongTypesNameTheField) {
  expect_bad_field(R"({"temperature": "hot"})", "temperature");
  expect_bad_field(R"({"top_p": [1]})", "top_p");
  expect_bad_field(R"({"top_k": 2.5})", "top_k");
  expect_bad_field(R"({"min_p": true})", "min_p");
  expect_bad_field(R"({"presence_penalty": {}})", "presence_penalty");
  expect_bad_field(R"({"frequency_penalty": "0"})", "frequency_penalty");
  expect_bad_field(R"({"repetition_penalty": "1"})", "repetition_penalty");
  expect_bad_field(R"({"seed": "7"})", "seed");
  expect_bad_field(R"({"n": "2"})", "n");
  expect_bad_field(R"({"max_tokens": "10"})", "max_tokens");
  expect_bad_field(R"({"max_completion_tokens": 1.5})", "max_completion_tokens");
  expect_bad_field(R"({"stop": 5})", "stop");
  expect_bad_field(R"({"stop": ["a", 5]})", "stop");
  expect_bad_field(R"({"stop_token_ids": [1, "2"]})", "stop_token_ids");
  expect_bad_field(R"({"ignore_eos": "yes"})", "ignore_eos");
  expect_bad_field(R"({"logprobs": 1})", "logprobs");
  expect_bad_field(R"({"logprobs": true, "top_logprobs": "3"})", "top_logprobs");
  expect_bad_field(R"({"logit_bias": [1]})", "logit_bias");
  expect_bad_field(R"({"logit_bias": {"abc": 1}})", "logit_bias");
  expect_bad_field(R"({"logit_bias": {"-3": 1}})", "logit_bias");
  expect_bad_field(R"({"logit_bias": {"5": "big"}})", "logit_bias");
  expect_bad_field(R"({"logprobs": true})", "logprobs", Endpoint::Completions);
}

TEST(Sampling, OutOfRangeCountsAre400) {
  expect_bad_field(R"({"n": 0})", "n");
  expect_bad_field(R"({"n": 129})", "n");
  expect_bad_field(R"({"n": -1})", "n");
  expect_bad_field(R"({"max_tokens": 0})", "max_tokens");
  expect_bad_field(R"({"max_tokens": -5})", "max_tokens");
  expect_bad_field(R"({"max_tokens": 1e12})", "max_tokens");
  expect_bad_field(R"({"max_tokens": 99999999999999999999})", "max_tokens");
  expect_bad_field(R"({"logprobs": true, "top_logprobs": 21})", "top_logprobs");
  expect_bad_field(R"({"logprobs": true, "top_logprobs": -1})", "top_logprobs");
  expect_bad_field(R"({"top_logprobs": 3})", "top_logprobs");
  expect_bad_field(R"({"logprobs": 21})", "logprobs", Endpoint::Completions);
  expect_bad_field(R"({"logit_bias": {"5": 101}})", "logit_bias");
  expect_bad_field(R"({"top_k": -2})", "top_k");
  expect_bad_field(R"({"min_tokens": -1})", "min_tokens");
}

// Each limit of request_limits.h: one past it is a 400 naming the field and the limit, the limit itself passes.
TEST(RequestLimits, EachLimitIs400NamingTheFieldOnlyPastIt) {
  const auto repeated = [](std::size_t count, const Json& item) { return Json(std::vector<Json>(count, item)); };
  const auto bias = [](std::size_t count) {
    Json entries = Json::object();
    for (std::size_t i = 0; i < count; ++i) entries[std::to_string(i)] = 1;
    return entries;
  };
  for (const auto& [body, param] : std::vector<std::pair<Json, std::string>>{
           {{{"stop", repeated(kMaxStopStrings + 1, "s")}}, "stop"},
           {{{"stop", Json::array({std::string(kMaxStopStringBytes + 1, 'x')})}}, "stop"},
           {{{"stop_token_ids", repeated(kMaxStopTokenIds + 1, 1)}}, "stop_token_ids"},
           {{{"logit_bias", bias(kMaxLogitBiasEntries + 1)}}, "logit_bias"}}) {
    const ApiError error = sampling_error(body.dump());
    EXPECT_EQ(error.status(), 400);
    EXPECT_EQ(error.param().value_or("<none>"), param);
    EXPECT_NE(std::string(error.what()).find("limit"), std::string::npos) << error.what();
  }
  const Json at_limits_body = {{"stop", repeated(kMaxStopStrings, "s")},
                               {"stop_token_ids", repeated(kMaxStopTokenIds, 1)},
                               {"logit_bias", bias(kMaxLogitBiasEntries)}};
  const SamplingParams at_limits =
      read_sampling_params(at_limits_body, Endpoint::ChatCompletions, kMaxLogprobs, GenerationConfig{});
  EXPECT_EQ(at_limits.stop.size(), kMaxStopStrings);
  EXPECT_EQ(at_limits.stop_token_ids.size(), kMaxStopTokenIds);
  EXPECT_EQ(at_limits.logit_bias.size(), kMaxLogitBiasEntries);
}

TEST(RequestLimits, DeepJsonIsRefusedWhileParsing) {
  // {"a": [[...]]}: the object is one level, each bracket one more.
  const auto nested = [](std::size_t depth) {
    return fmt::format("{{\"a\": {}{}}}", std::string(depth - 1, '['), std::string(depth - 1, ']'));
  };
  EXPECT_NO_THROW(parse_body(nested(kMaxJsonDepth)));
  const ApiError error = error_of([&] { parse_body(nested(kMaxJsonDepth + 1)); });
  EXPECT_EQ(error.status(), 400);
  EXPECT_NE(std::string(error.what()).find("deeper than"), std::string::npos) << error.what();
  // Far deeper than any stack would survive if parsing or freeing recursed.
  EXPECT_EQ(error_of([&] { parse_body(std::string(1'000'000, '[')); }).status(), 400);
}

TEST(Sampling, RandomValidRequestsReachTheEngineUnchanged) {
  std::mt19937 rng(1234);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  for (int trial = 0; trial < 200; ++trial) {
    const int n = 1 + static_cast<int>(rng() % 8);
    const double temperature = 2.0 * unit(rng);
    const double top_p = 0.05 + 0.95 * unit(rng);
    const int top_k = static_cast<int>(rng() % 50) - 1;
    const double penalty = 4.0 * unit(rng) - 2.0;
    const int max_tokens = 1 + static_cast<int>(rng() % 5000);
    const int top_logprobs = static_cast<int>(rng() % (kMaxLogprobs + 1));
    const int64_t seed = static_cast<int64_t>(rng()) - (int64_t{1} << 31);
    const int bias_token = static_cast<int>(rng() % 1000);
    const double bias = 200.0 * unit(rng) - 100.0;
    const bool use_completion_tokens = rng() % 2 == 0;
    Json body = {{"n", n},
                 {"temperature", temperature},
                 {"top_p", top_p},
                 {"top_k", top_k},
                 {"presence_penalty", penalty},
                 {"frequency_penalty", -penalty},
                 {"seed", seed},
                 {"logprobs", true},
                 {"top_logprobs", top_logprobs},
                 {"logit_bias", {{std::to_string(bias_token), bias}}},
                 {"stop", trial % 3 == 0 ? Json("END") : Json::array({"a", "bc"})},
                 {"ignore_eos", trial % 2 == 1}};
    if (use_completion_tokens) {
      body["max_completion_tokens"] = max_tokens;
      body["max_tokens"] = max_tokens + 7;  // the newer field wins
    } else {
      body["max_tokens"] = max_tokens;
    }
    const SamplingParams params = read_sampling_params(body, Endpoint::ChatCompletions, kMaxLogprobs, {});
    EXPECT_EQ(params.n, n);
    EXPECT_FLOAT_EQ(params.temperature, static_cast<float>(temperature));
    EXPECT_FLOAT_EQ(params.top_p, static_cast<float>(top_p));
    EXPECT_EQ(params.top_k, top_k);
    EXPECT_FLOAT_EQ(params.presence_penalty, static_cast<float>(penalty));
    EXPECT_FLOAT_EQ(params.frequency_penalty, static_cast<float>(-penalty));
    EXPECT_EQ(params.seed, static_cast<uint64_t>(seed));
    EXPECT_EQ(params.max_tokens, max_tokens);
    EXPECT_EQ(params.logprobs, top_logprobs);
    ASSERT_EQ(params.logit_bias.size(), 1u);
    EXPECT_EQ(params.logit_bias[0].first, bias_token);
    EXPECT_FLOAT_EQ(params.logit_bias[0].second, static_cast<float>(bias));
    EXPECT_EQ(params.stop.size(), trial % 3 == 0 ? 1u : 2u);
    EXPECT_EQ(params.ignore_eos, trial % 2 == 1);
    EXPECT_NO_THROW(validate_sampling_params(params, 1000, kMaxLogprobs));
  }
}

TEST(Sampling, NullFieldsMeanNotSet) {
  const SamplingParams params = read_sampling_params(
      Json::parse(R"({"temperature": null, "max_tokens": null, "stop": null, "logprobs": null, "n": null})"),
      Endpoint::ChatCompletions, kMaxLogprobs, {});
  const SamplingParams defaults;
  EXPECT_EQ(params.temperature, defaults.temperature);
  EXPECT_FALSE(params.max_tokens.has_value());
  EXPECT_TRUE(params.stop.empty());
  EXPECT_FALSE(params.logprobs.has_value());
  EXPECT_EQ(params.n, 1);
}

TEST(Sampling, GenerationConfigFillsWhatTheRequestLeavesOut) {
  GenerationConfig defaults;
  defaults.temperature = 0.6f;
  defaults.top_p = 0.9f;
  defaults.top_k = 40;
  defaults.max_new_tokens = 100;
  const SamplingParams left_out = read_sampling_params(Json::object(), Endpoint::Completions, kMaxLogprobs, defaults);
  EXPECT_FLOAT_EQ(left_out.temperature, 0.6f);
  EXPECT_FLOAT_EQ(left_out.top_p, 0.9f);
  EXPECT_EQ(left_out.top_k, 40);
  const SamplingParams given = read_sampling_params(Json::parse(R"({"temperature": 0, "top_k": 5})"),
                                                    Endpoint::Completions, kMaxLogprobs, defaults);
  EXPECT_FLOAT_EQ(given.temperature, 0.0f);
  EXPECT_EQ(given.top_k, 5);

  SamplingParams params = left_out;
  apply_default_max_tokens(params, 50, 120, defaults);  // only 70 positions left
  EXPECT_EQ(params.max_tokens, 70);
  params.max_tokens.reset();
  apply_default_max_tokens(params, 10, 1000, defaults);
  EXPECT_EQ(params.max_tokens, 100);
  params.max_tokens = 3;  // the request's own value stays
  apply_default_max_tokens(params, 10, 1000, defaults);
  EXPECT_EQ(params.max_tokens, 3);
}

TEST(RequestFields, StreamOptionsNeedStream) {
  EXPECT_EQ(error_of([] { read_stream_options(Json::parse(R"({"stream_options": {"include_usage": true}})")); })
                .param(),
            "stream_options");
  EXPECT_EQ(error_of([] { read_stream_options(Json::parse(R"({"stream": "yes"})")); }).param(), "stream");
  EXPECT_EQ(error_of([] {
              read_stream_options(Json::parse(R"({"stream": true, "stream_options": {"include_usage": 1}})"));
            }).param(),
            "stream_options.include_usage");
  const StreamOptions options = read_stream_options(Json::parse(R"({"stream": true, "stream_options": {"include_usage": true}})"));
  EXPECT_TRUE(options.stream);
  EXPECT_TRUE(options.include_usage);
}

TEST(RequestFields, ModelMustBeTheServedOne) {
  EXPECT_NO_THROW(check_model(Json::parse(R"({"model": "beam"})"), "beam"));
  EXPECT_NO_THROW(check_model(Json::object(), "beam"));
  const ApiError error = error_of([] { check_model(Json::parse(R"({"model": "other"})"), "beam"); });
  EXPECT_EQ(error.status(), 404);
  EXPECT_EQ(error.code(), "model_not_found");
  EXPECT_EQ(error_of([] { check_model(Json::parse(R"({"model": 3})"), "beam"); }).status(), 400);
}

TEST(RequestFields, UnsupportedFieldsThatChangeTheAnswerAre400) {
  const auto param_of = [](const std::string& json, Endpoint endpoint) {
    return error_of([&] { reject_unsupported_fields(Json::parse(json), endpoint); }).param().value_or("");
  };
  EXPECT_EQ(param_of(R"({"prompt_logprobs": 1})", Endpoint::ChatCompletions), "prompt_logprobs");
  EXPECT_EQ(param_of(R"({"functions": []})", Endpoint::ChatCompletions), "functions");
  EXPECT_EQ(param_of(R"({"guided_json": {}})", Endpoint::Completions), "guided_json");
  EXPECT_EQ(param_of(R"({"suffix": "end"})", Endpoint::Completions), "suffix");
  EXPECT_EQ(param_of(R"({"best_of": 3, "n": 1})", Endpoint::Completions), "best_of");
  EXPECT_NO_THROW(reject_unsupported_fields(
      Json::parse(R"({"response_format": {"type": "text"}, "user": "u", "best_of": 2, "n": 2})"),
      Endpoint::ChatCompletions));
  // Structured outputs are read (and their keywords refused) by server/structured_outputs, not refused here.
  EXPECT_NO_THROW(reject_unsupported_fields(
      Json::parse(R"({"response_format": {"type": "json_schema"}, "structured_outputs": {"regex": "a"}})"),
      Endpoint::Completions));
}

TEST(RequestFields, IntegersAcceptIntegralFloatsOnly) {
  EXPECT_EQ(optional_integer(Json::parse(R"({"k": 4.0})"), "k"), 4);
  EXPECT_EQ(optional_integer(Json::parse(R"({"k": -3})"), "k"), -3);
  EXPECT_EQ(error_of([] { optional_integer(Json::parse(R"({"k": 4.5})"), "k"); }).param(), "k");
  EXPECT_EQ(error_of([] { optional_integer(Json::parse(R"({"k": 1e300})"), "k"); }).param(), "k");
  EXPECT_EQ(error_of([] { optional_integer(Json::parse(R"({"k": 18446744073709551615})"), "k"); }).param(), "k");
}

TEST(ApiError, FieldOfMessage) {
  EXPECT_EQ(field_of_message("tools[0].function.name: bad"), "tools[0].function.name");
  EXPECT_EQ(field_of_message("reasoning_effort: 'x' is not"), "reasoning_effort");
  EXPECT_FALSE(field_of_message("no field here").has_value());
  EXPECT_FALSE(field_of_message("the prompt has 9 tokens: too many").has_value());
  EXPECT_FALSE(field_of_message(": starts with a colon").has_value());
}

}  // namespace
}  // namespace beamline::server
