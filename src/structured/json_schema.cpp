#include "structured/json_schema.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <optional>
#include <memory>
#include <set>
#include <tuple>

#include "structured/regex.h"

namespace beamline {

namespace {

using Json = nlohmann::ordered_json;

// Canonical text of a value: sorted keys, no whitespace, integral numbers without a fraction.
std::string canonical_text(const Json& value) {
  if (value.is_number_float()) {
    double d = value.get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9007199254740992.0)
      return std::to_string(static_cast<int64_t>(d));
  }
  if (value.is_object()) {
    std::vector<std::pair<std::string, const Json*>> members;
    for (auto it = value.begin(); it != value.end(); ++it) members.emplace_back(it.key(), &it.value());
    std::sort(members.begin(), members.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    std::string out = "{";
    for (size_t i = 0; i < members.size(); ++i) {
      if (i) out += ',';
      out += Json(members[i].first).dump() + ":" + canonical_text(*members[i].second);
    }
    return out + "}";
  }
  if (value.is_array()) {
    std::string out = "[";
    for (size_t i = 0; i < value.size(); ++i) out += (i ? "," : "") + canonical_text(value[i]);
    return out + "]";
  }
  return value.dump();
}

// A number as sign + integer digits (no leading zeros, "0" for zero) + fraction digits (no trailing zeros).
struct Decimal {
  bool negative = false;
  std::string integer = "0";
  std::string fraction;
  bool is_zero() const { return integer == "0" && fraction.empty(); }
};

Decimal to_decimal(const Json& value, const std::string& keyword) {
  if (!value.is_number()) refuse(keyword, "its value is not a number");
  std::string text = canonical_text(value);
  Decimal d;
  if (!text.empty() && text[0] == '-') { d.negative = true; text.erase(0, 1); }
  int exponent = 0;
  if (size_t e = text.find_first_of("eE"); e != std::string::npos) {
    exponent = std::stoi(text.substr(e + 1));
    text.resize(e);
  }
  std::string digits = text;
  int point = static_cast<int>(digits.size());
  if (size_t dot = digits.find('.'); dot != std::string::npos) {
    point = static_cast<int>(dot);
    digits.erase(dot, 1);
  }
  point += exponent;
  if (std::abs(point) > 400) refuse(keyword, "the number " + value.dump() + " is out of range");
  while (point < 0) { digits.insert(digits.begin(), '0'); ++point; }
  while (static_cast<int>(digits.size()) < point) digits += '0';
  d.integer = digits.substr(0, point);
  d.fraction = digits.substr(point);
  d.integer.erase(0, std::min(d.integer.find_first_not_of('0'), d.integer.size()));
  if (d.integer.empty()) d.integer = "0";
  while (!d.fraction.empty() && d.fraction.back() == '0') d.fraction.pop_back();
  if (d.is_zero()) d.negative = false;
  return d;
}

// Regular expressions (UTF-8, full match) over unsigned decimals `(0|[1-9]\d*)(\.\d+)?` compared with a bound.
std::string digit_range(char lo, char hi) { return lo > hi ? "" : std::string("[") + lo + "-" + hi + "]"; }
std::string any_fraction() { return "(\\.\\d+)?"; }

std::string integers_above(const std::string& I) {  // canonical integers > I
  std::vector<std::string> alts = {"[1-9]\\d{" + std::to_string(I.size()) + ",}"};
  for (size_t i = 0; i < I.size(); ++i) {
    std::string r = digit_range(static_cast<char>(I[i] + 1), '9');
    if (!r.empty()) alts.push_back(I.substr(0, i) + r + "\\d{" + std::to_string(I.size() - i - 1) + "}");
  }
  std::string out;
  for (const auto& a : alts) out += (out.empty() ? "" : "|") + a;
  return "(" + out + ")";
}

std::string integers_below(const std::string& I) {  // canonical integers < I; "" when none
  if (I == "0") return "";
  std::vector<std::string> alts = {"0"};
  if (I.size() >= 2) alts.push_back("[1-9]\\d{0," + std::to_string(I.size() - 2) + "}");
  for (size_t i = 0; i < I.size(); ++i) {
    std::string r = digit_range(i == 0 ? '1' : '0', static_cast<char>(I[i] - 1));
    if (!r.empty()) alts.push_back(I.substr(0, i) + r + "\\d{" + std::to_string(I.size() - i - 1) + "}");
  }
  std::string out;
  for (const auto& a : alts) out += (out.empty() ? "" : "|") + a;
  return "(" + out + ")";
}

// Fractions (the part after the integer digits, possibly absent) compared with `.F`.
std::string fractions_above(const std::string& F, bool or_equal) {
  std::vector<std::string> alts;
  for (size_t i = 0; i < F.size(); ++i) {
    std::string r = digit_range(static_cast<char>(F[i] + 1), '9');
    if (!r.empty()) alts.push_back("\\." + F.substr(0, i) + r + "\\d*");
  }
  alts.push_back(or_equal ? (F.empty() ? "(\\.\\d+)?" : "\\." + F + "\\d*") : "\\." + F + "\\d*[1-9]\\d*");
  std::string out;
  for (const auto& a : alts) out += (out.empty() ? "" : "|") + a;
  return "(" + out + ")";
}

std::string fractions_below(const std::string& F, bool or_equal) {
  std::vector<std::string> alts = {""};
  for (size_t i = 0; i < F.size(); ++i) {
    std::string r = digit_range('0', static_cast<char>(F[i] - 1));
    if (!r.empty()) alts.push_back("\\." + F.substr(0, i) + r + "\\d*");
    if (i >= 1) alts.push_back("\\." + F.substr(0, i));
  }
  if (or_equal) alts.push_back(F.empty() ? "\\.0+" : "\\." + F + "0*");
  if (F.empty() && !or_equal) return "";  // nothing with this integer part is below an integer bound
  std::string out;
  for (const auto& a : alts) out += (out.empty() ? "" : "|") + a;
  return "(" + out + ")";
}

// Magnitudes (unsigned decimals) above / below the bound's magnitude; "" for none.
std::string magnitudes_above(const Decimal& d, bool or_equal) {
  return "(" + integers_above(d.integer) + any_fraction() + "|" + d.integer + fractions_above(d.fraction, or_equal) + ")";
}
std::string magnitudes_below(const Decimal& d, bool or_equal) {
  std::vector<std::string> alts;
  std::string lower = integers_below(d.integer);
  if (!lower.empty()) alts.push_back(lower + any_fraction());
  std::string frac = fractions_below(d.fraction, or_equal);
  if (!frac.empty() || (or_equal && d.fraction.empty())) alts.push_back(d.integer + frac);
  if (alts.empty()) return "";
  std::string out;
  for (const auto& a : alts) out += (out.empty() ? "" : "|") + a;
  return "(" + out + ")";
}

const std::string kAnyMagnitude = "(0|[1-9]\\d*)(\\.\\d+)?";

// Signed decimals x with x >= bound (or >, <=, <), as a regular expression.
std::string decimals_compared(const Decimal& bound, bool above, bool or_equal) {
  std::vector<std::string> alts;
  auto add = [&](const std::string& sign, const std::string& magnitudes) {
    if (!magnitudes.empty()) alts.push_back(sign + magnitudes);
  };
  Decimal zero;
  if (above) {
    if (!bound.negative) {
      add("", magnitudes_above(bound, or_equal));
    } else {
      add("", kAnyMagnitude);
      add("-", magnitudes_below(bound, or_equal));
    }
  } else {
    if (!bound.negative) {
      add("-", magnitudes_above(zero, false));
      add("", magnitudes_below(bound, or_equal));
    } else {
      add("-", magnitudes_above(bound, or_equal));
    }
  }
  std::string out;
  for (const auto& a : alts) out += (out.empty() ? "" : "|") + a;
  return out.empty() ? "[^\\s\\S]" : out;
}

// Decimals (no exponent) that are multiples of m = A / 10^k: track (digits so far mod A, fraction digits).
Automaton multiples_of(const Decimal& m, const std::string& keyword) {
  if (m.negative || m.is_zero()) refuse(keyword, "the divisor must be positive");
  std::string all = m.integer + m.fraction;
  all.erase(0, std::min(all.find_first_not_of('0'), all.size()));
  if (all.size() > 6) refuse(keyword, "the divisor's digits " + all + " make too large an automaton");
  int64_t A = std::stoll(all);
  int k = static_cast<int>(m.fraction.size());
  if (A * (k + 2) > 200000) refuse(keyword, "the divisor needs too large an automaton");
  auto pow10_mod = [&](int e) { int64_t p = 1; for (int i = 0; i < e; ++i) p = p * 10 % A; return p; };
  Automaton a;
  std::map<std::tuple<int, int64_t, int>, int32_t> index;  // (kind, residue, fraction digits)
  enum { kStart, kSign, kZero, kInteger, kDot, kFraction };
  std::vector<std::tuple<int, int64_t, int>> keys;
  auto state = [&](int kind, int64_t r, int c) {
    auto [it, inserted] = index.emplace(std::tuple{kind, r, c}, a.num_states);
    if (inserted) {
      a.add_state();
      keys.emplace_back(kind, r, c);
      bool accept = (kind == kZero || kind == kInteger || kind == kFraction) && r * pow10_mod(k - c) % A == 0;
      a.accepting.back() = accept;
    }
    return it->second;
  };
  state(kStart, 0, 0);
  for (int32_t s = 0; s < a.num_states; ++s) {
    auto [kind, r, c] = keys[s];
    auto edge = [&](char byte, int32_t to) { a.next[static_cast<size_t>(s) * 256 + static_cast<uint8_t>(byte)] = to; };
    if (kind == kStart) edge('-', state(kSign, 0, 0));
    if (kind == kStart || kind == kSign) {
      edge('0', state(kZero, 0, 0));
      for (char d = '1'; d <= '9'; ++d) edge(d, state(kInteger, (d - '0') % A, 0));
    }
    if (kind == kInteger)
      for (char d = '0'; d <= '9'; ++d) edge(d, state(kInteger, (r * 10 + (d - '0')) % A, 0));
    if (kind == kZero || kind == kInteger) edge('.', state(kDot, r, 0));
    if (kind == kDot || kind == kFraction) {
      for (char d = '0'; d <= '9'; ++d) {
        if (c < k) edge(d, state(kFraction, (r * 10 + (d - '0')) % A, c + 1));
        else if (d == '0') edge(d, state(kFraction, r, c));  // past the divisor's digits only zeros keep it a multiple
      }
    }
  }
  return minimize(a);
}

struct SchemaRef {
  const Json* node;
  std::string base;  // resolution scope (absolute URI without fragment)
};
using Conjunction = std::vector<SchemaRef>;

// The values a conjunction of schemas allows, split by JSON type: scalars exactly as one automaton over the
// value's bytes; objects and arrays as alternatives, each the conjunction of schemas whose keywords shape it.
struct Language {
  Automaton scalars;
  std::vector<Conjunction> objects;
  std::vector<Conjunction> arrays;
  std::optional<std::set<std::string>> composite_literals;  // objects / arrays only among these (enum, const)
  std::set<std::string> literal_extra;  // objects / arrays allowed beside the shapes (anyOf of an enum and a shape)
  // minLength / maxLength of the strings among the scalars, kept beside the automaton: a counter enforces them
  // (Grammar::counted) where unrolling them would cost a state per character.
  int64_t min_length = 0, max_length = -1;
  bool length_bounded() const { return min_length > 0 || max_length >= 0; }
  // pattern / format contents (canonical JSON string content) the strings must match, kept as expressions until
  // something needs them in the automaton: alone, a rule body holds them, and their long repetitions are counted.
  std::vector<ExprId> string_contents;
  bool same_string_rules(const Language& other) const {
    return min_length == other.min_length && max_length == other.max_length && string_contents == other.string_contents;
  }
};

const std::set<std::string> kObjectKeywords = {"properties", "required", "additionalProperties",
                                               "minProperties", "maxProperties", "patternProperties",
                                               "dependencies", "dependentRequired", "dependentSchemas",
                                               "propertyNames", "unevaluatedProperties"};
const std::set<std::string> kArrayKeywords = {"items", "prefixItems", "additionalItems", "minItems", "maxItems",
                                              "uniqueItems", "contains", "minContains", "maxContains",
                                              "unevaluatedItems"};
const std::set<std::string> kIgnoredKeywords = {"$schema", "id", "$id", "title", "description", "default",
                                                "examples", "definitions", "$defs", "$comment", "readOnly",
                                                "writeOnly", "deprecated", "contentMediaType", "contentEncoding",
                                                "$anchor"};

bool shapes(const Conjunction& conj, const std::set<std::string>& keywords) {
  for (const SchemaRef& ref : conj)
    if (ref.node->is_object())
      for (auto it = ref.node->begin(); it != ref.node->end(); ++it)
        if (keywords.contains(it.key()) && !(it.key() == "uniqueItems" && it.value() == false)) return true;
  return false;
}

class SchemaCompiler {
 public:
  SchemaCompiler(const JsonSchemaOptions& options) : options_(options) {
    numbers_ = g_.to_automaton(regex_expr(kNumber));
    integers_ = g_.to_automaton(regex_expr("-?(0|[1-9]\\d*)"));
    strings_ = g_.to_automaton(string_expr(g_.star(json_char())));
    scalar_all_ = g_.to_automaton(g_.choice({g_.literal("null"), g_.literal("true"), g_.literal("false"),
                                             g_.automaton(numbers_), g_.automaton(strings_)}));
    non_strings_ = intersect(scalar_all_, complement(strings_));
  }

  Grammar compile(std::string_view text) {
    Json root = parse(text, "schema");
    documents_.push_back(std::make_unique<Json>(std::move(root)));
    std::string base;
    const Json& doc = *documents_.back();
    if (doc.is_object() && doc.contains("id") && doc["id"].is_string()) base = strip_fragment(doc["id"]);
    if (doc.is_object() && doc.contains("$id") && doc["$id"].is_string()) base = strip_fragment(doc["$id"]);
    register_document(base, doc);
    RuleId root_rule = rule_for({SchemaRef{&doc, base}});
    g_.set_root(root_rule);
    return std::move(g_);
  }

  Grammar any_value(bool object_only) {
    static const Json kObjectSchema = Json{{"type", "object"}};
    static const Json kAnySchema = Json::object();
    g_.set_root(rule_for({SchemaRef{object_only ? &kObjectSchema : &kAnySchema, ""}}));
    return std::move(g_);
  }

 private:
  static inline const std::string kNumber = "-?(0|[1-9]\\d*)(\\.\\d+)?([eE][+-]?\\d+)?";

  static Json parse(std::string_view text, const std::string& what) {
    try {
      return Json::parse(text);
    } catch (const nlohmann::json::exception& e) {
      refuse(what, std::string("not valid JSON: ") + e.what());
    }
  }

  ExprId regex_expr(const std::string& pattern) {
    return regex_to_expr(g_, pattern, RegexEncoding::kUtf8, false, "pattern");
  }
  ExprId json_char() { return code_points(g_, {{0, 0x10FFFF}}, RegexEncoding::kJsonString); }
  ExprId string_expr(ExprId content) { return g_.sequence({g_.literal("\""), content, g_.literal("\"")}); }
  Automaton with_other_scalars(const Automaton& constraint, const Automaton& of_type) {
    // A keyword of one type leaves the other types alone: constraint ∪ (scalars minus that type).
    Automaton others = intersect(scalar_all_, complement(of_type));
    return g_.to_automaton(g_.choice({g_.automaton(constraint), g_.automaton(others)}));
  }

  static constexpr int64_t kMaxLength = 100000;
  static constexpr int64_t kMaxUnrolledLength = 4096;

  static bool has_strings(const Automaton& scalars) { return scalars.num_states > 0 && scalars.step(0, '"') >= 0; }

  // Intersects the pending pattern / format contents into the scalar automaton (their repetitions unrolled).
  void apply_contents(Language& language) {
    for (ExprId content : language.string_contents)
      restrict_scalars(language, with_other_scalars(intersect(strings_, g_.to_automaton(string_expr(content))), strings_));
    language.string_contents.clear();
  }

  // Every string rule of the language in its automaton: for the combinators that need the exact set of strings (oneOf,
  // not, anyOf of different rules).
  void settle_strings(Language& language) {
    apply_contents(language);
    unroll_lengths(language);
  }

  // Applies the length bounds to the scalar automaton itself, one state per character: for the combinators that need
  // the exact set of strings and contents a counter cannot measure.
  void unroll_lengths(Language& language) {
    if (!language.length_bounded()) return;
    const bool max_too_large = language.max_length > kMaxUnrolledLength;
    if (max_too_large || language.min_length > kMaxUnrolledLength)
      refuse(max_too_large ? "maxLength" : "minLength",
             "lengths over " + std::to_string(kMaxUnrolledLength) + " characters are enforced only on a plain string schema");
    const auto min = static_cast<int32_t>(language.min_length);
    const auto max = static_cast<int32_t>(language.max_length);
    const ExprId rest = max < 0 ? g_.star(json_char()) : max < min ? g_.nothing() : g_.repeat(json_char(), 0, max - min);
    const ExprId content = g_.sequence({g_.repeat(json_char(), min, min), rest});
    language.min_length = 0;
    language.max_length = -1;
    restrict_scalars(language, with_other_scalars(g_.to_automaton(string_expr(content)), strings_));
  }

  // The content between the quotes of a string automaton (`"` content `"`): the states after the opening quote,
  // accepting where the closing quote would complete the value.
  static Automaton string_content(const Automaton& strings) {
    Automaton content;
    const int32_t first = strings.step(0, '"');
    std::vector<int32_t> remap(strings.num_states, -1), order = {first};
    remap[first] = content.add_state();
    for (size_t i = 0; i < order.size(); ++i) {
      const int32_t s = order[i];
      for (int b = 0; b < 256; ++b) {
        const int32_t t = strings.step(s, static_cast<uint8_t>(b));
        if (t < 0) continue;
        if (b == '"' && strings.accepting[t]) {  // unescaped: the closing quote (an escaped one is `\"`)
          content.accepting[remap[s]] = 1;
          continue;
        }
        if (remap[t] < 0) { remap[t] = content.add_state(); order.push_back(t); }
        content.next[static_cast<size_t>(remap[s]) * 256 + b] = remap[t];
      }
    }
    return minimize(content);
  }

  // The scalars of a language as a rule body: length-bounded strings as their content under a counter (one rule
  // whatever the bound) when the counter enforces the bounds exactly, else unrolled into the automaton.
  ExprId scalar_expr(Language& language) {
    if (!has_strings(language.scalars)) return g_.automaton(language.scalars);
    if (!language.length_bounded() && language.string_contents.size() == 1 &&
        intersect(strings_, complement(intersect(language.scalars, strings_))).num_states == 0) {
      // Any string the pattern / format allows: the content as it is, so its long repetitions are counted.
      return g_.choice({g_.automaton(intersect(language.scalars, non_strings_)), string_expr(language.string_contents[0])});
    }
    apply_contents(language);
    if (!language.length_bounded()) return g_.automaton(language.scalars);
    const Automaton content = string_content(intersect(language.scalars, strings_));
    const auto starts = json_character_starts(content);
    const auto min = static_cast<int32_t>(language.min_length), max = static_cast<int32_t>(language.max_length);
    if (!starts || !counter_is_exact(content, *starts, min, max, max >= 0 ? "maxLength" : "minLength")) {
      unroll_lengths(language);
      return g_.automaton(language.scalars);
    }
    const ExprId strings = string_expr(g_.counted(g_.automaton(content), CountUnit::kJsonCharacter, min, max));
    return g_.choice({g_.automaton(intersect(language.scalars, non_strings_)), strings});
  }

  // ---- $ref resolution -------------------------------------------------------------------------------
  static std::string strip_fragment(const std::string& uri) { return uri.substr(0, uri.find('#')); }

  static std::string resolve_uri(const std::string& base, const std::string& ref) {
    if (ref.find("://") != std::string::npos || ref.rfind("urn:", 0) == 0) return ref;
    if (!ref.empty() && ref[0] == '#') return strip_fragment(base) + ref;
    std::string dir = strip_fragment(base);
    size_t slash = dir.rfind('/');
    dir = slash == std::string::npos ? "" : dir.substr(0, slash + 1);
    return dir + ref;
  }

  void register_document(const std::string& base, const Json& node) {
    ids_[base] = &node;
    register_ids(base, node);
  }

  void register_ids(const std::string& base, const Json& node) {
    if (node.is_object()) {
      std::string scope = base;
      for (const char* key : {"id", "$id"})
        if (node.contains(key) && node[key].is_string()) {
          scope = resolve_uri(base, node[key].get<std::string>());
          ids_[scope] = &node;
          scope = strip_fragment(scope);
        }
      scopes_[&node] = scope;
      for (auto it = node.begin(); it != node.end(); ++it)
        if (it.key() != "enum" && it.key() != "const") register_ids(scope, it.value());
    } else if (node.is_array()) {
      for (const Json& item : node) register_ids(base, item);
    }
  }

  SchemaRef resolve_ref(const SchemaRef& from, const std::string& ref) {
    std::string uri = resolve_uri(from.base, ref);
    std::string document = strip_fragment(uri);
    std::string fragment = uri.size() > document.size() ? uri.substr(document.size() + 1) : "";
    if (auto it = ids_.find(uri); it != ids_.end() && !fragment.empty() && fragment[0] != '/')
      return SchemaRef{it->second, scope_of(it->second, document)};
    auto doc = ids_.find(document);
    if (doc == ids_.end()) {
      auto known = options_.documents.find(document);
      if (known == options_.documents.end()) refuse("$ref", "'" + ref + "' names a document that is not known here");
      documents_.push_back(std::make_unique<Json>(parse(known->second, "$ref")));
      register_document(document, *documents_.back());
      doc = ids_.find(document);
    }
    const Json* node = doc->second;
    if (!fragment.empty()) {
      if (fragment[0] != '/') refuse("$ref", "'" + ref + "' names an anchor that is not defined");
      size_t at = 1;
      while (at <= fragment.size()) {
        size_t end = fragment.find('/', at);
        if (end == std::string::npos) end = fragment.size();
        std::string token = unescape_pointer(fragment.substr(at, end - at));
        if (node->is_object() && node->contains(token)) node = &(*node)[token];
        else if (node->is_array() && !token.empty() && token.size() <= 9 && std::all_of(token.begin(), token.end(), ::isdigit) &&
                 std::stoul(token) < node->size())
          node = &(*node)[std::stoul(token)];
        else refuse("$ref", "'" + ref + "' points at nothing");
        at = end + 1;
      }
    }
    return SchemaRef{node, scope_of(node, document)};
  }

  std::string scope_of(const Json* node, const std::string& fallback) {
    auto it = scopes_.find(node);
    return it == scopes_.end() ? fallback : it->second;
  }

  static std::string unescape_pointer(std::string token) {
    std::string out;
    for (size_t i = 0; i < token.size(); ++i) {
      if (token[i] == '%' && i + 2 < token.size() && isxdigit(static_cast<unsigned char>(token[i + 1])) &&
          isxdigit(static_cast<unsigned char>(token[i + 2]))) {
        out += static_cast<char>(std::stoi(token.substr(i + 1, 2), nullptr, 16));
        i += 2;
      } else {
        out += token[i];
      }
    }
    std::string result;
    for (size_t i = 0; i < out.size(); ++i) {
      if (out[i] == '~' && i + 1 < out.size()) {
        result += out[i + 1] == '1' ? '/' : '~';
        ++i;
      } else {
        result += out[i];
      }
    }
    return result;
  }

  // ---- lowering a conjunction into a Language -----------------------------------------------------------
  Conjunction expand(const Conjunction& conj, int depth = 0) {
    if (depth > 64) refuse("$ref", "references form a cycle that never reaches a value");
    Conjunction out;
    for (SchemaRef ref : conj) {
      ref.base = scope_of(ref.node, ref.base);  // a subschema with its own id starts a new resolution scope
      if (ref.node->is_object() && ref.node->contains("$ref")) {
        const Json& target = (*ref.node)["$ref"];
        if (!target.is_string()) refuse("$ref", "its value is not a string");
        Conjunction inner = expand({resolve_ref(ref, target.get<std::string>())}, depth + 1);
        out.insert(out.end(), inner.begin(), inner.end());
        // Keywords beside $ref apply too (draft 2019 and later; stricter than draft 4, which ignores them).
        if (ref.node->size() > 1) {
          Conjunction siblings = expand({SchemaRef{without_keyword(ref.node, "$ref"), ref.base}}, depth + 1);
          out.insert(out.end(), siblings.begin(), siblings.end());
        }
        continue;
      }
      if (ref.node->is_object() && ref.node->contains("allOf")) {
        const Json& all = (*ref.node)["allOf"];
        if (!all.is_array() || all.empty()) refuse("allOf", "its value is not a non-empty array");
        out.push_back(ref);
        Conjunction parts;
        for (const Json& part : all) parts.push_back(SchemaRef{&part, ref.base});
        Conjunction inner = expand(parts, depth + 1);
        out.insert(out.end(), inner.begin(), inner.end());
        continue;
      }
      out.push_back(ref);
    }
    return out;
  }

  Language lower(const Conjunction& input, int depth = 0) {
    if (depth > 32) refuse("anyOf", "combinators nest too deeply");
    Conjunction conj = expand(input);
    // Distribute the first anyOf / oneOf / not over the rest of the conjunction.
    for (size_t i = 0; i < conj.size(); ++i) {
      const Json& node = *conj[i].node;
      if (!node.is_object()) continue;
      for (const char* combinator : {"anyOf", "oneOf", "not"}) {
        if (!node.contains(combinator)) continue;
        Conjunction rest = conj;
        rest[i] = SchemaRef{without_keyword(&node, combinator), conj[i].base};
        if (std::string(combinator) == "not") {
          Language base = lower(rest, depth + 1);
          Language excluded = lower({SchemaRef{&node["not"], conj[i].base}}, depth + 1);
          return subtract(std::move(base), excluded);
        }
        const Json& branches = node[combinator];
        if (!branches.is_array() || branches.empty()) refuse(combinator, "its value is not a non-empty array");
        std::vector<Language> options;
        for (const Json& branch : branches) {
          Conjunction with_branch = rest;
          with_branch.push_back(SchemaRef{&branch, conj[i].base});
          options.push_back(lower(with_branch, depth + 1));
        }
        return std::string(combinator) == "anyOf" ? unite(std::move(options)) : exactly_one(std::move(options));
      }
    }
    return lower_plain(conj);
  }

  // The node without one keyword, made once per (node, keyword) so rule memo keys stay stable.
  const Json* without_keyword(const Json* node, const char* key) {
    auto [it, inserted] = stripped_.emplace(std::pair{node, std::string(key)}, nullptr);
    if (inserted) it->second = own(without(*node, key));
    return it->second;
  }
  const Json* own(Json value) {
    documents_.push_back(std::make_unique<Json>(std::move(value)));
    return documents_.back().get();
  }
  static Json without(const Json& node, const char* key) {
    Json copy = node;
    copy.erase(key);
    return copy;
  }

  // The options' string rules (length bounds, pattern / format contents) stay beside the automaton when every option
  // holding strings has the same ones; otherwise those options' rules go into their automata. Copies what stays to
  // `out`.
  void common_string_rules(std::vector<Language>& options, Language& out) {
    std::vector<Language*> with_strings;
    for (Language& o : options)
      if (has_strings(o.scalars)) with_strings.push_back(&o);
    if (with_strings.empty()) return;
    const bool same = std::all_of(with_strings.begin(), with_strings.end(),
                                  [&](const Language* o) { return o->same_string_rules(*with_strings[0]); });
    if (!same) {
      for (Language* o : with_strings) settle_strings(*o);
      return;
    }
    out.min_length = with_strings[0]->min_length;
    out.max_length = with_strings[0]->max_length;
    out.string_contents = with_strings[0]->string_contents;
  }

  Language unite(std::vector<Language> options) {
    Language out;
    common_string_rules(options, out);
    std::vector<ExprId> scalar_parts;
    bool any_literal_restriction = false, any_free = false;
    std::set<std::string> literals;
    for (Language& o : options) {
      scalar_parts.push_back(g_.automaton(o.scalars));
      if (o.composite_literals) {
        any_literal_restriction = true;
        literals.insert(o.composite_literals->begin(), o.composite_literals->end());
      } else {
        any_free = true;
      }
      out.objects.insert(out.objects.end(), o.objects.begin(), o.objects.end());
      out.arrays.insert(out.arrays.end(), o.arrays.begin(), o.arrays.end());
    }
    out.scalars = g_.to_automaton(g_.choice(scalar_parts));
    if (any_literal_restriction) {
      if (any_free && (!out.objects.empty() || !out.arrays.empty()))
        out.literal_extra = literals;  // literals beside shapes
      else
        out.composite_literals = literals;
    }
    return out;
  }

  // oneOf: scalars matched by exactly one branch; composite values only where at most one branch allows
  // objects (arrays), or every branch that does allows all of them (then no object satisfies exactly one).
  Language exactly_one(std::vector<Language> options) {
    Language out;
    // Subtracting one option's strings from another's needs them exact; one option with strings keeps its counter.
    const auto holds_strings = [&](const Language& o) { return has_strings(o.scalars); };
    if (std::count_if(options.begin(), options.end(), holds_strings) > 1)
      for (Language& o : options) settle_strings(o);
    common_string_rules(options, out);
    std::vector<ExprId> scalar_parts;
    for (size_t i = 0; i < options.size(); ++i) {
      Automaton only = options[i].scalars;
      for (size_t j = 0; j < options.size() && only.num_states > 0; ++j)
        if (j != i) only = intersect(only, complement(options[j].scalars));
      scalar_parts.push_back(g_.automaton(only));
    }
    out.scalars = g_.to_automaton(g_.choice(scalar_parts));
    auto pick = [&](auto member, const std::set<std::string>& keywords, const char* what) {
      std::vector<size_t> with;
      for (size_t i = 0; i < options.size(); ++i)
        if (!(options[i].*member).empty()) with.push_back(i);
      if (with.size() == 1) { out.*member = options[with[0]].*member; return; }
      if (with.empty()) return;
      bool all_free = std::all_of(with.begin(), with.end(), [&](size_t i) {
        const auto& alts = options[i].*member;
        return alts.size() == 1 && !shapes(alts[0], keywords) && !options[i].composite_literals;
      });
      if (!all_free) refuse("oneOf", std::string("two branches allow ") + what + " that may overlap");
    };
    pick(&Language::objects, kObjectKeywords, "objects");
    pick(&Language::arrays, kArrayKeywords, "arrays");
    for (const Language& o : options)
      if ((o.composite_literals && !o.composite_literals->empty()) || !o.literal_extra.empty())
        refuse("oneOf", "a branch has enum or const objects or arrays");
    return out;
  }

  Language subtract(Language base, Language excluded) {
    settle_strings(excluded);  // its complement needs its exact strings; the base's string rules still apply after
    base.scalars = intersect(base.scalars, complement(excluded.scalars));
    auto apply = [&](std::vector<Conjunction>& mine, const std::vector<Conjunction>& theirs,
                     const std::set<std::string>& keywords) {
      if (theirs.empty()) return;
      bool free = std::any_of(theirs.begin(), theirs.end(), [&](const Conjunction& c) { return !shapes(c, keywords); });
      if (!free || excluded.composite_literals || !excluded.literal_extra.empty())
        refuse("not", "it excludes objects or arrays by their contents");
      mine.clear();
    };
    apply(base.objects, excluded.objects, kObjectKeywords);
    apply(base.arrays, excluded.arrays, kArrayKeywords);
    if (excluded.composite_literals) refuse("not", "it excludes objects or arrays by enum or const");
    return base;
  }

  Language lower_plain(const Conjunction& conj) {
    Language out;
    out.scalars = scalar_all_;
    bool objects = true, arrays = true;
    for (const SchemaRef& ref : conj) {
      const Json& s = *ref.node;
      if (s.is_boolean()) {
        if (!s.get<bool>()) { out.scalars = Automaton{}; objects = arrays = false; }
        continue;
      }
      if (!s.is_object()) refuse("schema", "a schema must be an object or a boolean, not " + s.dump());
      for (auto it = s.begin(); it != s.end(); ++it) apply_keyword(out, objects, arrays, ref, it.key(), it.value());
    }
    if (objects) out.objects.push_back(filter(conj, kObjectKeywords));
    if (arrays) out.arrays.push_back(filter(conj, kArrayKeywords));
    if (out.composite_literals) {
      bool shaped = (objects && shapes(conj, kObjectKeywords)) || (arrays && shapes(conj, kArrayKeywords));
      if (shaped) refuse("enum", "enum or const objects / arrays together with object or array keywords");
      std::set<std::string> kept;
      for (const std::string& text : *out.composite_literals)
        if ((text[0] == '{' && objects) || (text[0] == '[' && arrays)) kept.insert(text);
      out.composite_literals = kept;
      out.objects.clear();
      out.arrays.clear();
    }
    return out;
  }

  static Conjunction filter(const Conjunction& conj, const std::set<std::string>& keywords) {
    Conjunction out;
    for (const SchemaRef& ref : conj)
      if (shapes({ref}, keywords)) out.push_back(ref);
    return out;
  }

  void restrict_scalars(Language& out, const Automaton& allowed) { out.scalars = intersect(out.scalars, allowed); }

  void apply_keyword(Language& out, bool& objects, bool& arrays, const SchemaRef& ref, const std::string& key,
                     const Json& value) {
    const Json& s = *ref.node;
    if (kIgnoredKeywords.contains(key) || kObjectKeywords.contains(key) || kArrayKeywords.contains(key)) {
      check_composite_keyword(key, value, s);
      return;
    }
    if (key == "type") {
      std::vector<std::string> types;
      if (value.is_string()) types.push_back(value.get<std::string>());
      else if (value.is_array()) for (const Json& t : value) types.push_back(t.is_string() ? t.get<std::string>() : "?");
      std::vector<ExprId> parts;
      bool has_object = false, has_array = false;
      for (const std::string& t : types) {
        if (t == "null") parts.push_back(g_.literal("null"));
        else if (t == "boolean") parts.push_back(g_.choice({g_.literal("true"), g_.literal("false")}));
        else if (t == "number") parts.push_back(g_.automaton(numbers_));
        else if (t == "integer") parts.push_back(g_.automaton(integers_));
        else if (t == "string") parts.push_back(g_.automaton(strings_));
        else if (t == "object") has_object = true;
        else if (t == "array") has_array = true;
        else refuse("type", "unknown type " + Json(t).dump());
      }
      restrict_scalars(out, g_.to_automaton(g_.choice(parts)));
      objects = objects && has_object;
      arrays = arrays && has_array;
    } else if (key == "enum" || key == "const") {
      std::vector<Json> values;
      if (key == "const") values.push_back(value);
      else if (value.is_array()) values.assign(value.begin(), value.end());
      else refuse("enum", "its value is not an array");
      std::vector<ExprId> scalar_parts;
      std::set<std::string> composite;
      for (const Json& v : values) {
        std::string text = canonical_text(v);
        if (v.is_object() || v.is_array()) composite.insert(text);
        else scalar_parts.push_back(g_.literal(text));
      }
      restrict_scalars(out, g_.to_automaton(g_.choice(scalar_parts)));
      if (out.composite_literals) {
        std::set<std::string> both;
        for (const auto& t : composite) if (out.composite_literals->contains(t)) both.insert(t);
        out.composite_literals = both;
      } else {
        out.composite_literals = composite;
      }
    } else if (key == "minimum" || key == "maximum" || key == "exclusiveMinimum" || key == "exclusiveMaximum") {
      if (value.is_boolean()) {
        std::string bound = key == "exclusiveMinimum" ? "minimum" : "maximum";
        if (!s.contains(bound)) refuse(key, "it needs '" + bound + "' beside it");
        return;  // applied with the bound
      }
      bool above = key == "minimum" || key == "exclusiveMinimum";
      bool strict = key.rfind("exclusive", 0) == 0;
      if (!strict) {
        const char* flag = above ? "exclusiveMinimum" : "exclusiveMaximum";
        if (s.contains(flag) && s[flag].is_boolean()) strict = s[flag].get<bool>();
      }
      std::string pattern = decimals_compared(to_decimal(value, key), above, !strict);
      Automaton bounded = intersect(numbers_, g_.to_automaton(regex_expr(pattern)));
      restrict_scalars(out, with_other_scalars(bounded, numbers_));
    } else if (key == "multipleOf") {
      Automaton multiples = intersect(numbers_, multiples_of(to_decimal(value, key), key));
      restrict_scalars(out, with_other_scalars(multiples, numbers_));
    } else if (key == "minLength" || key == "maxLength") {
      if (!value.is_number_unsigned() && !(value.is_number_integer() && value.get<int64_t>() >= 0))
        refuse(key, "its value is not a non-negative integer");
      const int64_t n = value.get<int64_t>();
      if (n > kMaxLength) refuse(key, "lengths over " + std::to_string(kMaxLength) + " characters are not enforced");
      if (key == "minLength") out.min_length = std::max(out.min_length, n);
      else out.max_length = out.max_length < 0 ? n : std::min(out.max_length, n);
    } else if (key == "pattern") {
      if (!value.is_string()) refuse(key, "its value is not a string");
      out.string_contents.push_back(regex_to_expr(g_, value.get<std::string>(), RegexEncoding::kJsonString, true, "pattern"));
    } else if (key == "format") {
      if (!value.is_string()) refuse(key, "its value is not a string");
      std::string regex = format_regex(value.get<std::string>());
      out.string_contents.push_back(regex_to_expr(g_, regex, RegexEncoding::kJsonString, false, "format"));
    } else if (key == "$ref" || key == "allOf" || key == "anyOf" || key == "oneOf" || key == "not") {
      // handled by expand() / lower()
    } else if (key == "if" || key == "then" || key == "else" || key == "contentSchema" || key == "$dynamicRef" ||
               key == "$recursiveRef") {
      refuse(key, "this keyword is not supported");
    }
    // Any other key is an annotation unknown to JSON Schema; validators ignore it, and so does the grammar.
  }

  static void check_composite_keyword(const std::string& key, const Json& value, const Json& schema) {
    if (key == "uniqueItems" && value == true) {
      bool short_arrays = schema.contains("maxItems") && schema["maxItems"].is_number() && schema["maxItems"].get<double>() <= 1;
      if (!short_arrays) refuse("uniqueItems", "distinct items cannot be checked by a grammar");
    }
    static const std::set<std::string> refused = {"patternProperties", "dependencies", "dependentRequired",
                                                  "dependentSchemas", "propertyNames", "unevaluatedProperties",
                                                  "contains", "minContains", "maxContains", "unevaluatedItems"};
    if (refused.contains(key)) refuse(key, "this keyword is not supported");
  }

  static std::string format_regex(const std::string& format) {
    // RFC 3339 full-date, calendar-correct: 30-day months, February's 28 days, its 29th only in leap years
    // (a year divisible by 4, and by 400 when it ends in 00).
    const std::string date =
        "(\\d{4}-((0[13578]|1[02])-(0[1-9]|[12]\\d|3[01])|(0[469]|11)-(0[1-9]|[12]\\d|30)|02-(0[1-9]|1\\d|2[0-8]))"
        "|(\\d\\d(0[48]|[2468][048]|[13579][26])|([02468][048]|[13579][26])00)-02-29)";
    const std::string time = "([01]\\d|2[0-3]):[0-5]\\d:([0-5]\\d|60)(\\.\\d+)?([zZ]|[+-]([01]\\d|2[0-3]):[0-5]\\d)";
    const std::string label = "[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?";
    const std::string octet = "(25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)";
    if (format == "date") return date;
    if (format == "time") return time;
    if (format == "date-time") return date + "[tT]" + time;
    if (format == "email") return "[A-Za-z0-9_+-]+(\\.[A-Za-z0-9_+-]+)*@" + label + "(\\." + label + ")+";
    if (format == "ipv4") return octet + "(\\." + octet + "){3}";
    if (format == "uuid") return "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}";
    refuse("format", "the format '" + format + "' is not supported (date, time, date-time, email, ipv4, uuid are)");
  }

  // ---- emitting rules ---------------------------------------------------------------------------------
  static std::string key_of(const Conjunction& conj) {
    std::vector<const Json*> nodes;
    for (const SchemaRef& ref : conj) nodes.push_back(ref.node);
    std::sort(nodes.begin(), nodes.end());
    nodes.erase(std::unique(nodes.begin(), nodes.end()), nodes.end());
    std::string key;
    for (const Json* n : nodes) key += std::to_string(reinterpret_cast<uintptr_t>(n)) + ",";
    return key;
  }

  static std::string automaton_key(const Automaton& a) {
    std::string key(reinterpret_cast<const char*>(a.next.data()), a.next.size() * sizeof(int32_t));
    key.append(reinterpret_cast<const char*>(a.accepting.data()), a.accepting.size());
    return key;
  }

  RuleId rule_for(const Conjunction& conj) {
    std::string key = key_of(conj);
    if (auto it = rules_.find(key); it != rules_.end()) return it->second;
    Language language = lower(conj);
    bool scalar_only = language.objects.empty() && language.arrays.empty() && !language.composite_literals &&
                       language.literal_extra.empty();
    if (scalar_only) {
      std::string akey = automaton_key(language.scalars) + "/" + std::to_string(language.min_length) + "/" +
                         std::to_string(language.max_length);
      for (ExprId content : language.string_contents) akey += "/" + std::to_string(content);
      if (auto it = scalar_rules_.find(akey); it != scalar_rules_.end()) return rules_[key] = it->second;
      RuleId rule = g_.add_rule("scalar" + std::to_string(g_.num_rules()));
      g_.set_body(rule, scalar_expr(language));
      scalar_rules_[akey] = rule;
      return rules_[key] = rule;
    }
    RuleId rule = g_.add_rule("value" + std::to_string(g_.num_rules()));
    rules_[key] = rule;
    std::vector<ExprId> parts = {scalar_expr(language)};
    for (const Conjunction& c : language.objects) parts.push_back(object_expr(c));
    for (const Conjunction& c : language.arrays) parts.push_back(array_expr(c));
    std::set<std::string> literals = language.literal_extra;
    if (language.composite_literals) literals.insert(language.composite_literals->begin(), language.composite_literals->end());
    for (const std::string& text : literals) parts.push_back(g_.literal(text));
    g_.set_body(rule, g_.choice(parts));
    return rule;
  }

  ExprId comma() { return g_.sequence({g_.literal(","), g_.optional(g_.literal(" "))}); }
  ExprId colon() { return g_.sequence({g_.literal(":"), g_.optional(g_.literal(" "))}); }
  std::string encode_key(const std::string& name) { return Json(name).dump(); }

  ExprId object_expr(const Conjunction& conj) {
    struct Property { std::string name; Conjunction value; bool required = false; };
    std::vector<Property> properties;
    auto find = [&](const std::string& name) -> Property* {
      for (Property& p : properties) if (p.name == name) return &p;
      return nullptr;
    };
    for (const SchemaRef& ref : conj)
      if (ref.node->contains("properties")) {
        const Json& props = (*ref.node)["properties"];
        if (!props.is_object()) refuse("properties", "its value is not an object");
        for (auto it = props.begin(); it != props.end(); ++it)
          if (!find(it.key())) properties.push_back(Property{it.key(), {}, false});
      }
    for (const SchemaRef& ref : conj)
      if (ref.node->contains("required")) {
        const Json& req = (*ref.node)["required"];
        if (!req.is_array()) refuse("required", "its value is not an array");
        for (const Json& name : req) {
          if (!name.is_string()) refuse("required", "a name is not a string");
          if (!find(name.get<std::string>())) properties.push_back(Property{name.get<std::string>(), {}, false});
          find(name.get<std::string>())->required = true;
        }
      }
    // Each property's schema, per member: its own `properties` entry, else that member's additionalProperties.
    Conjunction extra;
    for (const SchemaRef& ref : conj) {
      const Json& s = *ref.node;
      for (Property& p : properties) {
        if (s.contains("properties") && s["properties"].contains(p.name))
          p.value.push_back(SchemaRef{&s["properties"][p.name], ref.base});
        else if (s.contains("additionalProperties"))
          p.value.push_back(SchemaRef{&s["additionalProperties"], ref.base});
      }
      if (s.contains("additionalProperties")) extra.push_back(SchemaRef{&s["additionalProperties"], ref.base});
    }
    if (options_.sorted_keys)
      std::sort(properties.begin(), properties.end(), [](const Property& a, const Property& b) { return a.name < b.name; });
    int64_t min_props = 0, max_props = -1;
    for (const SchemaRef& ref : conj) {
      if (ref.node->contains("minProperties")) min_props = std::max(min_props, count_value(*ref.node, "minProperties"));
      if (ref.node->contains("maxProperties")) {
        int64_t m = count_value(*ref.node, "maxProperties");
        max_props = max_props < 0 ? m : std::min(max_props, m);
      }
    }
    if ((min_props > 0 || max_props >= 0) && !properties.empty())
      refuse(min_props > 0 ? "minProperties" : "maxProperties", "counts are supported only for objects without declared properties");

    bool extras_allowed = !std::any_of(extra.begin(), extra.end(), [](const SchemaRef& r) { return *r.node == false; });
    ExprId extra_pair = g_.nothing();
    if (extras_allowed) {
      std::vector<ExprId> declared;
      for (const Property& p : properties) declared.push_back(g_.literal(encode_key(p.name)));
      Automaton other_keys = intersect(strings_, complement(g_.to_automaton(g_.choice(declared))));
      extra_pair = g_.sequence({g_.automaton(other_keys), colon(), g_.rule_ref(rule_for(extra))});
    }
    if (properties.empty()) {
      if (!extras_allowed) return min_props > 0 ? g_.nothing() : g_.literal("{}");
      int32_t lo = static_cast<int32_t>(std::max<int64_t>(min_props, 1) - 1);
      int32_t hi = max_props < 0 ? -1 : static_cast<int32_t>(max_props - 1);
      ExprId list = max_props == 0 ? g_.nothing()
                                   : g_.sequence({extra_pair, g_.repeat(g_.sequence({comma(), extra_pair}), lo, hi)});
      ExprId body = min_props > 0 ? list : g_.optional(list);
      return g_.sequence({g_.literal("{"), body, g_.literal("}")});
    }
    std::vector<ExprId> items;
    for (const Property& p : properties)
      items.push_back(g_.sequence({g_.literal(encode_key(p.name)), colon(), g_.rule_ref(rule_for(p.value))}));
    ExprId extras = extras_allowed ? g_.star(g_.sequence({comma(), extra_pair})) : g_.empty();
    // tails[k]: properties k.. after something was written: each is `, item` (optional unless required),
    // extra members may follow any of them.
    size_t n = properties.size();
    std::vector<ExprId> tails(n + 1);
    tails[n] = g_.empty();
    for (size_t k = n; k-- > 0;) {
      ExprId step = g_.sequence({comma(), items[k], extras});
      tails[k] = g_.sequence({properties[k].required ? step : g_.optional(step), tails[k + 1]});
    }
    std::vector<ExprId> bodies;
    bool required_seen = false;
    for (size_t j = 0; j < n && !required_seen; ++j) {
      bodies.push_back(g_.sequence({items[j], extras, tails[j + 1]}));
      required_seen = properties[j].required;
    }
    if (extras_allowed) bodies.push_back(g_.sequence({extra_pair, extras, tails[0]}));
    if (!required_seen) bodies.push_back(g_.empty());
    return g_.sequence({g_.literal("{"), g_.choice(bodies), g_.literal("}")});
  }

  static int64_t count_value(const Json& s, const char* key) {
    const Json& v = s[key];
    if (!v.is_number_integer() || v.get<int64_t>() < 0) refuse(key, "its value is not a non-negative integer");
    if (v.get<int64_t>() > 100000) refuse(key, "the count is too large to enforce");
    return v.get<int64_t>();
  }

  ExprId array_expr(const Conjunction& conj) {
    size_t tuple_length = 0;
    for (const SchemaRef& ref : conj) {
      const Json& s = *ref.node;
      if (s.contains("prefixItems")) tuple_length = std::max(tuple_length, s["prefixItems"].size());
      else if (s.contains("items") && s["items"].is_array()) tuple_length = std::max(tuple_length, s["items"].size());
    }
    int64_t min_items = 0, max_items = -1;
    std::vector<Conjunction> positions(tuple_length);
    Conjunction rest;
    bool rest_allowed = true;
    for (const SchemaRef& ref : conj) {
      const Json& s = *ref.node;
      const Json* tuple = s.contains("prefixItems") ? &s["prefixItems"]
                          : (s.contains("items") && s["items"].is_array()) ? &s["items"] : nullptr;
      const Json* after = s.contains("prefixItems") ? (s.contains("items") ? &s["items"] : nullptr)
                          : tuple ? (s.contains("additionalItems") ? &s["additionalItems"] : nullptr)
                                  : (s.contains("items") ? &s["items"] : nullptr);
      for (size_t i = 0; i < tuple_length; ++i) {
        if (tuple && i < tuple->size()) positions[i].push_back(SchemaRef{&(*tuple)[i], ref.base});
        else if (after) positions[i].push_back(SchemaRef{after, ref.base});
      }
      if (after) {
        if (*after == false) rest_allowed = false;
        rest.push_back(SchemaRef{after, ref.base});
      }
      if (s.contains("minItems")) min_items = std::max(min_items, count_value(s, "minItems"));
      if (s.contains("maxItems")) {
        int64_t m = count_value(s, "maxItems");
        max_items = max_items < 0 ? m : std::min(max_items, m);
      }
    }
    if (!rest_allowed) max_items = max_items < 0 ? static_cast<int64_t>(tuple_length) : std::min<int64_t>(max_items, tuple_length);
    if (max_items >= 0 && min_items > max_items) return g_.nothing();
    if (max_items >= 0 && static_cast<size_t>(max_items) < tuple_length) tuple_length = max_items;
    std::vector<ExprId> values;
    for (size_t i = 0; i < tuple_length; ++i) values.push_back(g_.rule_ref(rule_for(positions[i])));
    ExprId rest_value = rest_allowed ? g_.rule_ref(rule_for(rest)) : g_.nothing();
    // After position i (i items written): more items, optional once i >= minItems.
    int64_t rest_min = std::max<int64_t>(0, min_items - static_cast<int64_t>(tuple_length));
    int64_t rest_max = max_items < 0 ? -1 : max_items - static_cast<int64_t>(tuple_length);
    ExprId after_tuple = g_.repeat(g_.sequence({comma(), rest_value}), static_cast<int32_t>(rest_min), static_cast<int32_t>(rest_max));
    if (rest_max == 0 || !rest_allowed) after_tuple = rest_min > 0 ? g_.nothing() : g_.empty();
    ExprId list;
    if (tuple_length == 0) {
      if (rest_max == 0 || !rest_allowed) list = g_.nothing();
      else list = g_.sequence({rest_value, g_.repeat(g_.sequence({comma(), rest_value}),
                                                     static_cast<int32_t>(std::max<int64_t>(rest_min, 1) - 1),
                                                     rest_max < 0 ? -1 : static_cast<int32_t>(rest_max - 1))});
    } else {
      ExprId tail = after_tuple;
      for (size_t i = tuple_length; i-- > 1;) {
        ExprId step = g_.sequence({comma(), values[i], tail});
        tail = static_cast<int64_t>(i) < min_items ? step : g_.optional(step);
      }
      list = g_.sequence({values[0], tail});
    }
    ExprId body = min_items > 0 ? list : g_.optional(list);
    return g_.sequence({g_.literal("["), body, g_.literal("]")});
  }

  const JsonSchemaOptions& options_;
  Grammar g_;
  Automaton scalar_all_, numbers_, integers_, strings_, non_strings_;
  std::vector<std::unique_ptr<Json>> documents_;
  std::map<std::string, const Json*> ids_;
  std::map<const Json*, std::string> scopes_;
  std::map<std::string, RuleId> rules_;
  std::map<std::string, RuleId> scalar_rules_;
  std::map<std::pair<const Json*, std::string>, const Json*> stripped_;
};

}  // namespace

Grammar json_schema_grammar(std::string_view schema_text, const JsonSchemaOptions& options) {
  SchemaCompiler compiler(options);
  return compiler.compile(schema_text);
}

Grammar any_json_grammar(std::string_view kind) {
  JsonSchemaOptions options;
  SchemaCompiler compiler(options);
  return compiler.any_value(kind == "object");
}

Grammar choice_grammar(const std::vector<std::string>& choices) {
  if (choices.empty()) refuse("choice", "the list is empty");
  Grammar g;
  std::vector<ExprId> parts;
  for (const std::string& c : choices) parts.push_back(g.literal(c));
  RuleId root = g.add_rule("root");
  g.set_body(root, g.choice(parts));
  g.set_root(root);
  return g;
}

Grammar regex_grammar(std::string_view pattern) {
  Grammar g;
  RuleId root = g.add_rule("root");
  g.set_body(root, regex_to_expr(g, pattern, RegexEncoding::kUtf8, false, "regex"));
  g.set_root(root);
  return g;
}

std::string canonical_json(std::string_view json_text) { return canonical_text(Json::parse(json_text)); }

}  // namespace beamline
