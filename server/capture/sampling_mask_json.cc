#include "server/capture/sampling_mask_json.h"

#include <limits>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace rollpack {
namespace {

absl::Status ReadOffsets(JsonValue& value, absl::string_view what, std::vector<int64_t>& out) {
  simdjson::ondemand::array array;
  if (value.get_array().get(array)) return NotA(what, value, "an array of offsets");
  size_t i = 0;
  for (auto element : array) {
    JsonValue item;
    if (auto error = std::move(element).get(item)) {
      return JsonError(absl::StrCat(what, "[", i, "]"), error);
    }
    int64_t offset = 0;
    if (item.get_int64().get(offset)) {
      return NotA(absl::StrCat(what, "[", i, "]"), item, "an integer");
    }
    out.push_back(offset);
    ++i;
  }
  return absl::OkStatus();
}

// vLLM's SamplingMask(token_ids, offsets), the form its first release gave.
absl::Status ReadCsr(simdjson::ondemand::object& object, absl::string_view what,
                     SamplingMaskLists& out) {
  std::optional<std::vector<int32_t>> ids;
  std::vector<int64_t> offsets;
  bool saw_offsets = false;
  for (auto field : object) {
    std::string_view key;
    if (auto error = field.unescaped_key().get(key)) return JsonError(what, error);
    JsonValue value;
    if (auto error = field.value().get(value)) return JsonError(what, error);
    if (key == "token_ids") {
      ASSIGN_OR_RETURN(ids, ReadTokenIds(value, absl::StrCat(what, ".token_ids")));
    } else if (key == "offsets") {
      RETURN_IF_ERROR(ReadOffsets(value, absl::StrCat(what, ".offsets"), offsets));
      saw_offsets = true;
    }
  }
  if (!ids.has_value() || !saw_offsets) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " is an object without \"token_ids\" and \"offsets\""));
  }
  if (offsets.empty() || offsets.front() != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ".offsets must start at 0, starts at ",
        offsets.empty() ? std::string("nothing (empty)") : absl::StrCat(offsets.front())));
  }
  for (size_t j = 1; j < offsets.size(); ++j) {
    if (offsets[j] < offsets[j - 1]) {
      return absl::InvalidArgumentError(absl::StrCat(what, ".offsets[", j, "] is ", offsets[j],
                                                     ", below offsets[", j - 1, "] = ",
                                                     offsets[j - 1]));
    }
  }
  if (offsets.back() != static_cast<int64_t>(ids->size())) {
    return absl::InvalidArgumentError(absl::StrCat(what, ".offsets ends at ", offsets.back(),
                                                   ", token_ids holds ", ids->size()));
  }
  out.ids = std::move(*ids);
  out.offsets = std::move(offsets);
  return absl::OkStatus();
}

}  // namespace

void AppendSamplingMask(const SamplingMaskLists& from, SamplingMaskLists& to) {
  if (!from.present()) return;
  if (to.offsets.empty()) to.offsets.push_back(0);
  const int64_t base = static_cast<int64_t>(to.ids.size());
  to.ids.insert(to.ids.end(), from.ids.begin(), from.ids.end());
  for (size_t j = 1; j < from.offsets.size(); ++j) to.offsets.push_back(base + from.offsets[j]);
}

absl::Status ReadSamplingMask(JsonValue& value, absl::string_view what, SamplingMaskLists& out) {
  out = SamplingMaskLists();
  ASSIGN_OR_RETURN(simdjson::ondemand::json_type type, TypeOf(value, what));
  if (type == simdjson::ondemand::json_type::null) return absl::OkStatus();
  if (type == simdjson::ondemand::json_type::object) {
    simdjson::ondemand::object object;
    if (auto error = value.get_object().get(object)) return JsonError(what, error);
    return ReadCsr(object, what, out);
  }
  simdjson::ondemand::array lists;
  if (value.get_array().get(lists)) {
    return NotA(what, value, "an array of token id lists, an object or null");
  }
  out.offsets.push_back(0);
  size_t j = 0;
  for (auto element : lists) {
    JsonValue list;
    if (auto error = std::move(element).get(list)) {
      return JsonError(absl::StrCat(what, "[", j, "]"), error);
    }
    simdjson::ondemand::array ids;
    if (list.get_array().get(ids)) {
      return NotA(absl::StrCat(what, "[", j, "]"), list, "an array of token ids");
    }
    size_t k = 0;
    for (auto id_element : ids) {
      JsonValue item;
      if (auto error = std::move(id_element).get(item)) {
        return JsonError(absl::StrCat(what, "[", j, "][", k, "]"), error);
      }
      int64_t id = 0;
      if (item.get_int64().get(id) || id < 0 || id > std::numeric_limits<int32_t>::max()) {
        return NotA(absl::StrCat(what, "[", j, "][", k, "]"), item, "a token id");
      }
      out.ids.push_back(static_cast<int32_t>(id));
      ++k;
    }
    out.offsets.push_back(static_cast<int64_t>(out.ids.size()));
    ++j;
  }
  return absl::OkStatus();
}

}  // namespace rollpack
