// JSON schema → TypeScript-like tool signatures for the shapes the official vectors do not cover
// (nested objects, arrays of objects and unions, anyOf, const, integers, maps, multi-line descriptions).
// The vector-covered shapes (enums, defaults, nullable, oneOf, titles, examples) are checked by
// test_harmony_vectors against upstream's expected text.
#include <gtest/gtest.h>

#include "harmony/harmony_tools.h"

namespace beamline::harmony {
namespace {

std::string signature(const char* schema) { return render_tool_signature(Json::parse(schema)); }

TEST(HarmonyTools, NoParameters) {
  EXPECT_EQ(render_tool_signature(std::nullopt), "() => any");
  EXPECT_EQ(signature(R"({"type": "object"})"), "() => any");
  EXPECT_EQ(signature(R"({"type": "object", "properties": {}})"), "() => any");
}

TEST(HarmonyTools, NestedObjectsIndentAndKeepPropertyOrder) {
  EXPECT_EQ(signature(R"({"type": "object", "properties": {
      "zeta": {"type": "integer"},
      "address": {"type": "object", "description": "Where.", "properties": {
          "street": {"type": "string"}, "geo": {"type": "object", "properties": {"lat": {"type": "number"}},
          "required": ["lat"]}}, "required": ["street"]}},
      "required": ["address"]})"),
            "(_: {\n"
            "zeta?: number,\n"
            "// Where.\n"
            "address: {\n"
            "  street: string,\n"
            "  geo?: {\n"
            "    lat: number,\n"
            "  },\n"
            "},\n"
            "}) => any");
}

TEST(HarmonyTools, ArraysUnionsAndLiterals) {
  EXPECT_EQ(signature(R"({"type": "object", "properties": {
      "tags": {"type": "array", "items": {"type": "string"}},
      "any_list": {"type": "array"},
      "mixed": {"type": "array", "items": {"anyOf": [{"type": "string"}, {"type": "integer"}]}},
      "points": {"type": "array", "items": {"type": "object", "properties": {"x": {"type": "number"}}}},
      "mode": {"const": "fast"},
      "level": {"type": "integer", "enum": [1, 2, 3]},
      "maybe": {"type": ["string", "null"]},
      "labels": {"type": "object", "additionalProperties": {"type": "string"}},
      "blob": {}}})"),
            "(_: {\n"
            "tags?: string[],\n"
            "any_list?: any[],\n"
            "mixed?: (string | number)[],\n"
            "points?: {\n"
            "  x?: number,\n"
            "}[],\n"
            "mode?: \"fast\",\n"
            "level?: 1 | 2 | 3,\n"
            "maybe?: string | null,\n"
            "labels?: Record<string, string>,\n"
            "blob?: any,\n"
            "}) => any");
}

TEST(HarmonyTools, AnyOfPropertyAndMultiLineDescriptions) {
  EXPECT_EQ(signature(R"({"type": "object", "description": "Line one.\nLine two.", "properties": {
      "q": {"description": "First.\n\nSecond.", "anyOf": [{"type": "string", "description": "text\nquery"},
            {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]}], "nullable": true}},
      "required": ["q"]})"),
            "(_: // Line one.\n"
            "// Line two.\n"
            "{\n"
            "// First.\n"
            "//\n"
            "// Second.\n"
            "q:\n"
            " | string // text query\n"
            " | {\n"
            "     id: number,\n"
            "   }\n"
            " | null\n"
            ",\n"
            "}) => any");
}

TEST(HarmonyTools, NamespaceWithoutDescriptionsOrTools) {
  ToolNamespace empty{"notes", std::nullopt, {}};
  EXPECT_EQ(render_tool_namespace(empty), "## notes\n\n");
  ToolNamespace plain{"functions", std::nullopt, {ToolDescription{"ping", "", std::nullopt}}};
  EXPECT_EQ(render_tool_namespace(plain), "## functions\n\nnamespace functions {\n\ntype ping = () => any;\n\n} // namespace functions");
}

}  // namespace
}  // namespace beamline::harmony
