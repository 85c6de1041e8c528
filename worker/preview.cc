#include "worker/preview.h"

#include <filesystem>

#include "engine/model_config.h"
#include "engine/packing.h"
#include "engine/text_dataset.h"

namespace trainerd::worker {
namespace fs = std::filesystem;

namespace {
constexpr char kDim[] = "\033[2m";
constexpr char kGreen[] = "\033[32m";
constexpr char kReset[] = "\033[0m";

bool Trained(const engine::TokenExample& ex, size_t i) {
  const bool starts = i == 0 || (!ex.position_ids.empty() && ex.position_ids[i] == 0);
  return !starts && ex.labels[i] != engine::kIgnoreIndex;
}

std::string Text(const std::vector<int32_t>& ids, const engine::tokenizer::Tokenizer* tokenizer) {
  if (tokenizer) return tokenizer->Decode(ids);
  std::string s;
  for (int32_t id : ids) s += (s.empty() ? "" : " ") + std::to_string(id);
  return s;
}
}  // namespace

std::string RenderExample(const engine::TokenExample& ex, const engine::tokenizer::Tokenizer* tokenizer,
                          const PreviewStyle& style) {
  std::string out;
  size_t i = 0;
  while (i < ex.input_ids.size()) {
    const bool trained = Trained(ex, i);
    std::vector<int32_t> run;
    for (; i < ex.input_ids.size() && Trained(ex, i) == trained; ++i) run.push_back(static_cast<int32_t>(ex.input_ids[i]));
    std::string text = Text(run, tokenizer);
    if (!tokenizer && !out.empty()) out += " ";
    if (style.color) {
      out += (trained ? kGreen : kDim) + text + kReset;
    } else {
      out += trained ? text : "[[" + text + "]]";
    }
  }
  return out;
}

Status RunPreview(const JobSpec& spec, int64_t n, const PreviewStyle& style, std::ostream& out) {
  TRAINERD_ASSIGN_OR_RETURN(engine::ModelConfig config, engine::LoadModelConfig(spec.model.path));
  const std::string& data_path = spec.task == "eval" ? spec.data.eval : spec.data.train;
  engine::DatasetLoader loader(engine::DataOptionsFor(spec, config.vocab_size),
                               [&out](const std::string& note) { out << note << "\n"; });
  TRAINERD_ASSIGN_OR_RETURN(engine::TokenDataset data, loader.Load(data_path));
  const size_t examples = data.examples.size();
  if (spec.data.packing) data = engine::PackExamples(data, spec.data.max_seq_len);

  std::unique_ptr<engine::tokenizer::Tokenizer> tokenizer;
  if (fs::exists(fs::path(spec.model.path) / "tokenizer.json")) {
    TRAINERD_ASSIGN_OR_RETURN(tokenizer, engine::tokenizer::Tokenizer::FromFile(spec.model.path));
  }
  const engine::TokenDataset::TokenCounts counts = data.CountTokens();
  const std::string unit = spec.data.packing ? "sequence" : "example";
  for (int64_t k = 0; k < n && k < static_cast<int64_t>(data.examples.size()); ++k) {
    const auto& ex = data.examples[k];
    out << "── " << unit << " " << k + 1 << ": " << ex.input_ids.size() << " tokens, " << ex.target_tokens()
        << " trained ──\n"
        << RenderExample(ex, tokenizer.get(), style) << "\n\n";
  }
  if (!style.color) out << "(text inside [[ ]] is not trained)\n";
  out << data_path << ": " << data.lines << " lines, " << examples << " examples kept, " << data.truncated
      << " truncated to data.max_seq_len " << spec.data.max_seq_len << ", " << data.dropped
      << " dropped with nothing to train; " << counts.tokens << " tokens, " << counts.trained << " trained";
  if (spec.data.packing) out << "; packed into " << data.examples.size() << " sequences";
  out << "\n";
  return Status::Ok();
}

}  // namespace trainerd::worker
