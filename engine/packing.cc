#include "engine/packing.h"

namespace trainerd::engine {

TokenDataset PackExamples(const TokenDataset& data, int64_t max_seq_len) {
  TokenDataset packed;
  packed.lines = data.lines;
  packed.truncated = data.truncated;
  packed.dropped = data.dropped;
  TokenExample row;
  auto flush = [&] {
    if (!row.input_ids.empty()) packed.examples.push_back(std::move(row));
    row = TokenExample{};
  };
  for (const TokenExample& ex : data.examples) {
    const size_t n = ex.input_ids.size();
    if (row.input_ids.size() + n > static_cast<size_t>(max_seq_len)) flush();
    for (size_t i = 0; i < n; ++i) {
      row.input_ids.push_back(ex.input_ids[i]);
      row.labels.push_back(i == 0 ? kIgnoreIndex : ex.labels[i]);
      row.position_ids.push_back(static_cast<int64_t>(i));
    }
  }
  flush();
  return packed;
}

}  // namespace trainerd::engine
