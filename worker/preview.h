// `trainerd-worker preview JOB.yaml [-n N]`: the first N training examples as
// the job will train them, trained and masked tokens told apart, and the
// statistics of the whole training set. Torch-free.
#pragma once

#include <cstdint>
#include <ostream>

#include "common/job_spec.h"
#include "common/status.h"
#include "engine/token_dataset.h"
#include "engine/tokenizer/tokenizer.h"

namespace trainerd::worker {

struct PreviewStyle {
  // ANSI colours (masked dim, trained green) on a terminal; otherwise masked
  // runs are written inside [[ ]].
  bool color = false;
};

// One example as text: runs of consecutive trained or masked tokens decoded
// together (so multi-byte characters split across tokens stay whole). Without
// a tokenizer the ids are written instead. A token is trained when its label is
// not -100 and it is not the first of its sequence (nothing predicts it).
std::string RenderExample(const engine::TokenExample& example, const engine::tokenizer::Tokenizer* tokenizer,
                          const PreviewStyle& style);

// Loads the job's training data (data.format, truncation, packing as in a run)
// and writes the first `n` examples and the statistics to `out`.
Status RunPreview(const JobSpec& spec, int64_t n, const PreviewStyle& style, std::ostream& out);

}  // namespace trainerd::worker
