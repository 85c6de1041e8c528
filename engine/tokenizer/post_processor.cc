#include "engine/tokenizer/post_processor.h"

#include <string>

#include "engine/tokenizer/component_json.h"

namespace trainerd::engine::tokenizer {
namespace {

using nlohmann::json;

class NoOpPostProcessor : public PostProcessor {
 public:
  void Process(std::vector<int32_t>*, bool) const override {}
};

class SequencePostProcessor : public PostProcessor {
 public:
  explicit SequencePostProcessor(std::vector<std::unique_ptr<PostProcessor>> steps) : steps_(std::move(steps)) {}
  void Process(std::vector<int32_t>* ids, bool add_special_tokens) const override {
    for (const auto& step : steps_) step->Process(ids, add_special_tokens);
  }

 private:
  std::vector<std::unique_ptr<PostProcessor>> steps_;
};

// The single-sequence template: a list of pieces, each either the sequence
// or the ids of a special token.
class TemplatePostProcessor : public PostProcessor {
 public:
  struct Piece {
    bool is_sequence;
    std::vector<int32_t> special_ids;
  };
  explicit TemplatePostProcessor(std::vector<Piece> pieces) : pieces_(std::move(pieces)) {}
  void Process(std::vector<int32_t>* ids, bool add_special_tokens) const override {
    if (!add_special_tokens) return;
    std::vector<int32_t> out;
    out.reserve(ids->size() + 4);
    for (const Piece& piece : pieces_) {
      if (piece.is_sequence) {
        out.insert(out.end(), ids->begin(), ids->end());
      } else {
        out.insert(out.end(), piece.special_ids.begin(), piece.special_ids.end());
      }
    }
    ids->swap(out);
  }

 private:
  std::vector<Piece> pieces_;
};

StatusOr<std::unique_ptr<PostProcessor>> ParseTemplate(const json& config, const std::string& where) {
  auto single = config.find("single");
  if (single == config.end() || !single->is_array())
    return Status::Error(where + ": \"single\" must be an array of template pieces");
  auto specials = config.find("special_tokens");
  std::vector<TemplatePostProcessor::Piece> pieces;
  for (const auto& item : *single) {
    if (!item.is_object() || item.size() != 1)
      return Status::Error(where + ": a piece of \"single\" must be {\"Sequence\": ...} or {\"SpecialToken\": ...}");
    if (auto seq = item.find("Sequence"); seq != item.end()) {
      std::string id;
      TRAINERD_RETURN_IF_ERROR(ReadString(*seq, "id", where + " Sequence", true, &id));
      if (id != "A")
        return Status::Error(where + ": the single template uses sequence \"" + id + "\"; only \"A\" exists");
      pieces.push_back({true, {}});
    } else if (auto special = item.find("SpecialToken"); special != item.end()) {
      std::string id;
      TRAINERD_RETURN_IF_ERROR(ReadString(*special, "id", where + " SpecialToken", true, &id));
      if (specials == config.end() || !specials->is_object() || !specials->contains(id))
        return Status::Error(where + ": special token \"" + id + "\" is not in \"special_tokens\"");
      const json& entry = (*specials)[id];
      auto ids = entry.find("ids");
      if (ids == entry.end() || !ids->is_array())
        return Status::Error(where + ": special_tokens \"" + id + "\" has no \"ids\" array");
      TemplatePostProcessor::Piece piece{false, {}};
      for (const auto& value : *ids) {
        if (!value.is_number_integer() || value.get<int64_t>() < 0 || value.get<int64_t>() > INT32_MAX)
          return Status::Error(where + ": special_tokens \"" + id + "\" ids must be non-negative integers");
        piece.special_ids.push_back(static_cast<int32_t>(value.get<int64_t>()));
      }
      pieces.push_back(std::move(piece));
    } else {
      return Status::Error(where + ": a piece of \"single\" must be {\"Sequence\": ...} or {\"SpecialToken\": ...}");
    }
  }
  return std::unique_ptr<PostProcessor>(new TemplatePostProcessor(std::move(pieces)));
}

}  // namespace

StatusOr<std::unique_ptr<PostProcessor>> ParsePostProcessor(const json& config) {
  if (config.is_null()) return std::unique_ptr<PostProcessor>();
  std::string type;
  TRAINERD_RETURN_IF_ERROR(ReadType(config, "post_processor", &type));
  const std::string where = "post_processor " + type;
  if (type == "TemplateProcessing") return ParseTemplate(config, where);
  if (type == "ByteLevel") return std::unique_ptr<PostProcessor>(new NoOpPostProcessor());
  if (type == "Sequence") {
    auto it = config.find("processors");
    if (it == config.end() || !it->is_array()) return Status::Error(where + ": \"processors\" must be an array");
    std::vector<std::unique_ptr<PostProcessor>> steps;
    for (const auto& step_config : *it) {
      TRAINERD_ASSIGN_OR_RETURN(auto step, ParsePostProcessor(step_config));
      if (step) steps.push_back(std::move(step));
    }
    return std::unique_ptr<PostProcessor>(new SequencePostProcessor(std::move(steps)));
  }
  return UnsupportedType("post_processor", type);
}

}  // namespace trainerd::engine::tokenizer
