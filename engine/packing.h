// Packing: several short examples in one training sequence, so that a
// micro-batch carries fewer padding tokens. Torch-free.
#pragma once

#include <cstdint>

#include "engine/token_dataset.h"

namespace trainerd::engine {

// Packs the examples, in order, into sequences of at most max_seq_len tokens:
// each sequence takes the next examples while they fit (an example never
// splits). A packed sequence's position_ids restart at 0 at every example,
// which is what keeps attention and rotary positions inside each example
// (LlamaModel), and the first label of every example is -100, as it is never
// a target of an example on its own. So the loss over a packed sequence is
// the sum of its examples' losses. Counts (lines, truncated, dropped) carry over.
TokenDataset PackExamples(const TokenDataset& data, int64_t max_seq_len);

}  // namespace trainerd::engine
