// json_fields: the one reader of untrusted JSON. Every failure names the document and the field's path.
#include <gtest/gtest.h>

#include <functional>

#include <nlohmann/json.hpp>

#include "util/error.h"
#include "util/json_fields.h"

namespace beamline {
namespace {

namespace jf = json_fields;
using nlohmann::json;

std::string failure(const std::function<void()>& read) {
  try {
    read();
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

TEST(JsonFields, LocationsNameTheDocumentAndThePath) {
  EXPECT_EQ(jf::Location("config.json", "").key("quantization_config").key("quant_method").describe(),
            "config.json: key \"quantization_config.quant_method\"");
  EXPECT_EQ(jf::Location("messages").index(2).key("content").describe(), "messages[2].content");
  EXPECT_EQ(jf::Location("config.json", "").describe(), "config.json");
}

TEST(JsonFields, WrongTypesSayWhatWasFound) {
  const json object = {{"a", "x"}, {"b", 2.5}, {"c", {1, "two"}}};
  EXPECT_EQ(failure([&] { jf::optional_integer(object, "a", {"req"}); }), "req.a: must be an integer, found string \"x\"");
  EXPECT_EQ(failure([&] { jf::optional_integer(object, "b", {}, jf::IntegralFloats::Accepted); }),
            "b: must be an integer, found number 2.5");
  EXPECT_EQ(failure([&] { jf::integer_array(object.at("c"), jf::Location("config.json", "c")); }),
            "config.json: key \"c[1]\": must be an integer, found string \"two\"");
  EXPECT_EQ(failure([&] { jf::required_string(object, "missing", {}); }), "missing: required key is missing");
  EXPECT_EQ(failure([&] { jf::expect_object(json::array(), {"tools"}); }), "tools: must be a JSON object, found array");
}

TEST(JsonFields, IntegralFloatsOnlyWhereAccepted) {
  const json object = {{"n", 2.0}, {"big", 18446744073709551615ull}, {"null", nullptr}};
  EXPECT_EQ(jf::optional_integer(object, "n", {}, jf::IntegralFloats::Accepted), 2);
  EXPECT_NE(failure([&] { jf::optional_integer(object, "n", {}); }), "");
  EXPECT_NE(failure([&] { jf::optional_integer(object, "big", {}); }).find("out of range"), std::string::npos);
  EXPECT_FALSE(jf::optional_integer(object, "null", {}).has_value());
}

}  // namespace
}  // namespace beamline
