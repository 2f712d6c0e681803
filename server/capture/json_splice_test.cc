#include "server/capture/json_splice.h"

#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/capture/capture_test_support.h"
#include "server/capture/response_splice.h"

namespace rollpack {
namespace {

using ::testing::HasSubstr;

// What to do with the keys of every object, at any depth.
struct Plan {
  std::set<std::string> remove;
  std::set<std::string> null;
  std::string append_to_root;  // members appended to the root object
};

absl::Status WalkObject(simdjson::ondemand::document& doc, absl::string_view text,
                        simdjson::ondemand::object& object, const Plan& plan, bool root,
                        std::vector<JsonEdit>& edits);

absl::Status WalkValue(simdjson::ondemand::document& doc, absl::string_view text, JsonValue& value,
                       const Plan& plan, std::vector<JsonEdit>& edits) {
  simdjson::ondemand::json_type type;
  if (value.type().get(type)) return absl::InvalidArgumentError("type");
  if (type == simdjson::ondemand::json_type::object) {
    simdjson::ondemand::object object;
    if (value.get_object().get(object)) return absl::InvalidArgumentError("object");
    return WalkObject(doc, text, object, plan, false, edits);
  }
  if (type == simdjson::ondemand::json_type::array) {
    simdjson::ondemand::array array;
    if (value.get_array().get(array)) return absl::InvalidArgumentError("array");
    for (auto element : array) {
      JsonValue item;
      if (std::move(element).get(item)) return absl::InvalidArgumentError("element");
      if (absl::Status s = WalkValue(doc, text, item, plan, edits); !s.ok()) return s;
    }
  }
  return absl::OkStatus();
}

absl::Status WalkObject(simdjson::ondemand::document& doc, absl::string_view text,
                        simdjson::ondemand::object& object, const Plan& plan, bool root,
                        std::vector<JsonEdit>& edits) {
  return VisitFields(
      doc, text, object, "object", edits,
      [&](absl::string_view key, JsonValue& value, ObjectFields& fields) -> absl::Status {
        if (plan.remove.count(std::string(key))) fields.Remove();
        if (plan.null.count(std::string(key))) fields.Replace("null");
        return WalkValue(doc, text, value, plan, edits);
      },
      [&](ObjectFields& fields) {
        if (root && !plan.append_to_root.empty()) fields.Append(plan.append_to_root);
      });
}

// `json` with `plan` applied through ObjectFields, or the error.
std::string Edit(absl::string_view json, const Plan& plan) {
  simdjson::padded_string padded(json.data(), json.size());
  simdjson::ondemand::parser parser;
  simdjson::ondemand::document doc;
  if (parser.iterate(padded).get(doc)) return "parse error";
  simdjson::ondemand::object root;
  if (doc.get_object().get(root)) return "not an object";
  std::vector<JsonEdit> edits;
  const absl::string_view text(padded.data(), padded.size());
  if (absl::Status s = WalkObject(doc, text, root, plan, true, edits); !s.ok()) {
    return std::string(s.message());
  }
  return ApplyJsonEdits(json, std::move(edits));
}

bool IsJson(absl::string_view json) {
  simdjson::dom::parser parser;
  simdjson::dom::element element;
  return !parser.parse(std::string(json)).get(element);
}

TEST(ObjectFieldsTest, RemovingAnyFieldsKeepsTheOthersAndValidJson) {
  const std::string json = R"({"a":1,"b":[2,3],"c":{"d":4},"e":"x"})";
  EXPECT_EQ(Edit(json, {{"a"}, {}, ""}), R"({"b":[2,3],"c":{"d":4},"e":"x"})");
  EXPECT_EQ(Edit(json, {{"b"}, {}, ""}), R"({"a":1,"c":{"d":4},"e":"x"})");
  EXPECT_EQ(Edit(json, {{"e"}, {}, ""}), R"({"a":1,"b":[2,3],"c":{"d":4}})");
  EXPECT_EQ(Edit(json, {{"a", "b"}, {}, ""}), R"({"c":{"d":4},"e":"x"})");
  EXPECT_EQ(Edit(json, {{"c", "e"}, {}, ""}), R"({"a":1,"b":[2,3]})");
  EXPECT_EQ(Edit(json, {{"a", "e"}, {}, ""}), R"({"b":[2,3],"c":{"d":4}})");
  EXPECT_EQ(Edit(json, {{"a", "c"}, {}, ""}), R"({"b":[2,3],"e":"x"})");
  EXPECT_EQ(Edit(json, {{"a", "b", "c", "e"}, {}, ""}), R"({})");
  EXPECT_EQ(Edit(json, {{"d"}, {}, ""}), R"({"a":1,"b":[2,3],"c":{},"e":"x"})");
  // A key removed inside an object that is removed whole.
  EXPECT_EQ(Edit(json, {{"c", "d"}, {}, ""}), R"({"a":1,"b":[2,3],"e":"x"})");
  // Every subset of four fields.
  const std::vector<std::string> keys = {"a", "b", "c", "e"};
  for (int mask = 0; mask < 16; ++mask) {
    Plan plan;
    for (int k = 0; k < 4; ++k) {
      if (mask & (1 << k)) plan.remove.insert(keys[k]);
    }
    const std::string out = Edit(json, plan);
    EXPECT_TRUE(IsJson(out)) << mask << ": " << out;
    for (int k = 0; k < 4; ++k) {
      EXPECT_EQ(out.find(absl::StrCat("\"", keys[k], "\"")) == std::string::npos,
                static_cast<bool>(mask & (1 << k)))
          << mask << ": " << out;
    }
  }
}

TEST(ObjectFieldsTest, WhitespaceAroundKeptFieldsStays) {
  const std::string json = "{\n  \"a\": 1,\n  \"b\" :  [2, 3] ,\n  \"c\": null\n}\n";
  // The space b had before its comma stays (before a's comma now).
  EXPECT_EQ(Edit(json, {{"b"}, {}, ""}), "{\n  \"a\": 1 ,\n  \"c\": null\n}\n");
  EXPECT_EQ(Edit(json, {{"c"}, {}, ""}), "{\n  \"a\": 1,\n  \"b\" :  [2, 3]\n}\n");
  EXPECT_EQ(Edit(json, {{"a"}, {}, ""}), "{\n  \"b\" :  [2, 3] ,\n  \"c\": null\n}\n");
  EXPECT_EQ(Edit(json, {{"a", "b", "c"}, {}, ""}), "{\n  \n}\n");
  EXPECT_EQ(Edit(json, {{}, {"b"}, ""}), "{\n  \"a\": 1,\n  \"b\" :  null ,\n  \"c\": null\n}\n");
}

TEST(ObjectFieldsTest, ReplacesValuesAndAppendsFields) {
  EXPECT_EQ(Edit(R"({"a":[1,2],"b":{"x":1}})", {{}, {"a", "b"}, ""}), R"({"a":null,"b":null})");
  EXPECT_EQ(Edit(R"({"a\"q":[1]})", {{}, {"a\"q"}, ""}), R"({"a\"q":null})")
      << "an escaped quote in the key";
  EXPECT_EQ(Edit(R"({"a":1})", {{}, {}, R"("n":true)"}), R"({"a":1,"n":true})");
  EXPECT_EQ(Edit("{ \"a\": 1 \n}", {{}, {}, R"("n":true)"}), "{ \"a\": 1,\"n\":true \n}");
  EXPECT_EQ(Edit("{}", {{}, {}, R"("n":true)"}), R"({"n":true})");
  EXPECT_EQ(Edit("{ }", {{}, {}, R"("n":true)"}), R"({"n":true })");
  EXPECT_EQ(Edit(R"({"a":1,"b":2})", {{"b"}, {}, R"("n":0)"}), R"({"a":1,"n":0})");
  EXPECT_EQ(Edit(R"({"a":1,"b":2})", {{"a", "b"}, {}, R"("n":0)"}), R"({"n":0})");
}

TEST(JsonEditsTest, NestedEditsAreDroppedAndInsertionsKeepTheirPlace) {
  const std::string text = "0123456789";
  EXPECT_EQ(ApplyJsonEdits(text, {{2, 8, "x"}, {3, 4, "y"}, {5, 5, "z"}}), "01x89");
  EXPECT_EQ(ApplyJsonEdits(text, {{4, 6, ""}, {4, 4, "a"}, {6, 6, "b"}}), "0123ab6789");
  EXPECT_EQ(ApplyJsonEdits(text, {{9, 10, "!"}, {0, 1, ""}}), "12345678!");
  EXPECT_EQ(ApplyJsonEdits(text, {}), text);
}

TEST(ResponseSpliceTest, CutsRoutingStringsAndMapsEditsBackToTheBody) {
  const std::string routing_a(5000, 'A');
  const std::string routing_b = "QUJD";
  const Padded body(
      absl::StrCat(R"({"choices":[{"text":"say \"routed_experts\": \"zz\"","routed_experts" : ")",
                   routing_a, R"("},{"routed_experts":")", routing_b,
                   R"(","x":1}],"note":"routed_experts","routed_experts":null})"));
  ResponseSplice splice;
  ASSERT_TRUE(splice.Parse(body.view).ok());
  EXPECT_EQ(splice.cuts(), 2u) << "the escaped key in text and the key's null are not cut";
  EXPECT_LT(splice.text().size(), 200u);

  // Remove both routing keys and the trailing null one; read the strings.
  std::vector<absl::string_view> routings;
  simdjson::ondemand::object root;
  ASSERT_FALSE(splice.doc().get_object().get(root));
  absl::Status status = VisitFields(
      splice.doc(), splice.text(), root, "root", splice.edits(),
      [&](absl::string_view key, JsonValue& value, ObjectFields& fields) -> absl::Status {
        if (key == "routed_experts") fields.Remove();
        if (key != "choices") return absl::OkStatus();
        simdjson::ondemand::array choices;
        if (value.get_array().get(choices)) return absl::InvalidArgumentError("choices");
        for (auto element : choices) {
          simdjson::ondemand::object choice;
          if (element.get_object().get(choice)) return absl::InvalidArgumentError("choice");
          absl::Status s =
              VisitFields(splice.doc(), splice.text(), choice, "choice", splice.edits(),
                          [&](absl::string_view k, JsonValue& v, ObjectFields& f) -> absl::Status {
                            if (k == "routed_experts") {
                              routings.push_back(splice.StringInBody(AbslView(v.raw_json_token())));
                              f.Remove();
                            }
                            if (k == "text") {
                              // An uncut string maps back too.
                              EXPECT_EQ(splice.StringInBody(AbslView(v.raw_json_token())),
                                        R"(say \"routed_experts\": \"zz\")");
                            }
                            return absl::OkStatus();
                          });
          if (!s.ok()) return s;
        }
        return absl::OkStatus();
      });
  ASSERT_TRUE(status.ok()) << status;
  ASSERT_EQ(routings.size(), 2u);
  EXPECT_EQ(routings[0], routing_a);
  EXPECT_EQ(routings[1], routing_b);
  EXPECT_TRUE(routings[0].data() > body.view.data() &&
              routings[0].data() < body.view.data() + body.view.size())
      << "a view of the body, not a copy";
  int64_t stripped = -1;
  EXPECT_EQ(splice.ClientBody(&stripped),
            R"({"choices":[{"text":"say \"routed_experts\": \"zz\""},{"x":1}],)"
            R"("note":"routed_experts"})");
  EXPECT_EQ(stripped, static_cast<int64_t>(routing_a.size() + routing_b.size()));
}

TEST(ResponseSpliceTest, ABodyWithoutRoutingIsParsedInPlace) {
  const Padded body(R"({"a":[1,2,3]})");
  ResponseSplice splice;
  ASSERT_TRUE(splice.Parse(body.view).ok());
  EXPECT_EQ(splice.cuts(), 0u);
  EXPECT_EQ(splice.text().data(), body.view.data());
  int64_t stripped = -1;
  EXPECT_EQ(splice.ClientBody(&stripped), body.view);
  EXPECT_EQ(stripped, 0);
}

TEST(ResponseSpliceTest, AnUnterminatedRoutingStringIsLeftToTheParser) {
  const Padded body(R"({"routed_experts":"AAAA)");
  ResponseSplice splice;
  absl::Status status = splice.Parse(body.view);
  if (status.ok()) {
    simdjson::ondemand::object root;
    EXPECT_TRUE(splice.doc().get_object().get(root) != simdjson::SUCCESS ||
                VisitFields(
                    splice.doc(), splice.text(), root, "root", splice.edits(),
                    [](absl::string_view, JsonValue&, ObjectFields&) {
                      return absl::OkStatus();
                    }).code() == absl::StatusCode::kInvalidArgument);
  }
  EXPECT_EQ(splice.cuts(), 0u);
}

TEST(ResponseSpliceTest, TwoSplicesOnOneThreadEachParse) {
  const Padded a(R"({"routed_experts":"QQ==","k":1})");
  const Padded b(R"({"routed_experts":"Qg==","k":2})");
  ResponseSplice first;
  ResponseSplice second;
  ASSERT_TRUE(first.Parse(a.view).ok());
  ASSERT_TRUE(second.Parse(b.view).ok());
  EXPECT_EQ(first.text(), R"({"routed_experts":"","k":1})");
  EXPECT_EQ(second.text(), R"({"routed_experts":"","k":2})");
}

TEST(ObjectFieldsTest, FinishRefusesTextThatIsNotTheObject) {
  EXPECT_THAT(Edit(R"([1,2])", {}), HasSubstr("not an object"));
}

}  // namespace
}  // namespace rollpack
