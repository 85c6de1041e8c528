// output.dir/metrics.jsonl: one JSON object per line, appended and flushed as
// events arrive so that a crash loses at most the line being written.
//   {"step", "loss", "lr", "grad_norm", "tokens", "tokens_per_s", "epoch", "elapsed_s"}
//   {"step", "eval_loss", "eval_tokens"}
#pragma once

#include <cstdio>
#include <string>

#include "common/status.h"
#include "engine/engine.h"

namespace trainerd::worker {

class MetricsLog {
 public:
  ~MetricsLog();
  // Opens output_dir/metrics.jsonl. A fresh run (resumed_from_step == 0)
  // starts it empty; a resumed run keeps the lines up to that step and drops
  // later ones, which the resumed run writes again.
  Status Open(const std::string& output_dir, int64_t resumed_from_step);
  void Append(const engine::ProgressEvent& e);
  void Append(const engine::EvalEvent& e);

 private:
  void WriteLine(const std::string& line);
  std::FILE* file_ = nullptr;
};

}  // namespace trainerd::worker
