#include "worker/metrics_log.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "engine/durable_files.h"

namespace trainerd::worker {
namespace fs = std::filesystem;

MetricsLog::~MetricsLog() {
  if (file_) std::fclose(file_);
}

Status MetricsLog::Open(const std::string& output_dir, int64_t resumed_from_step) {
  std::error_code ec;
  fs::create_directories(output_dir, ec);
  if (ec) return Status::Error("creating output.dir " + output_dir + ": " + ec.message());
  const std::string path = (fs::path(output_dir) / "metrics.jsonl").string();
  if (resumed_from_step > 0 && fs::exists(path)) {
    std::ifstream in(path);
    std::string kept, line;
    while (std::getline(in, line)) {
      auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (j.is_object() && j.value("step", int64_t{0}) <= resumed_from_step) kept += line + "\n";
    }
    TRAINERD_RETURN_IF_ERROR(engine::WriteFileAtomically(path, kept));
    file_ = std::fopen(path.c_str(), "a");
  } else {
    file_ = std::fopen(path.c_str(), "w");
  }
  if (!file_) return Status::Error("opening " + path + " for writing");
  return Status::Ok();
}

void MetricsLog::WriteLine(const std::string& line) {
  if (!file_) return;
  std::fputs(line.c_str(), file_);
  std::fputc('\n', file_);
  std::fflush(file_);
}

void MetricsLog::Append(const engine::ProgressEvent& e) {
  WriteLine(nlohmann::json{{"step", e.step}, {"loss", e.loss}, {"lr", e.lr}, {"grad_norm", e.grad_norm},
                           {"tokens", e.tokens}, {"tokens_per_s", e.tokens_per_s}, {"mfu", e.mfu}, {"epoch", e.epoch},
                           {"elapsed_s", e.elapsed_s}, {"peak_memory_bytes", e.peak_memory_bytes}}
                .dump());
}

void MetricsLog::Append(const engine::EvalEvent& e) {
  WriteLine(nlohmann::json{{"step", e.step}, {"eval_loss", e.eval_loss}, {"eval_tokens", e.eval_tokens}}.dump());
}

}  // namespace trainerd::worker
