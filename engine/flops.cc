#include "engine/flops.h"

#include <vector>

namespace trainerd::engine {

double DenseMatmulParams(const ModelConfig& c) {
  const double h = static_cast<double>(c.hidden_size), inter = static_cast<double>(c.intermediate_size);
  const double q = static_cast<double>(c.num_attention_heads * c.head_dim);
  const double kv = static_cast<double>(c.num_key_value_heads * c.head_dim);
  const double per_layer = h * q + 2 * h * kv + q * h + 3 * h * inter;
  return static_cast<double>(c.num_hidden_layers) * per_layer + static_cast<double>(c.vocab_size) * h;
}

double TrainingStepFlops(const ModelConfig& c, bool full_finetune, double tokens, double sum_squared_lengths) {
  const double q = static_cast<double>(c.num_attention_heads * c.head_dim);
  const double attention = 4.0 * static_cast<double>(c.num_hidden_layers) * q * sum_squared_lengths;
  return (full_finetune ? 6.0 : 4.0) * DenseMatmulParams(c) * tokens + attention;
}

double PeakBf16Flops(const std::string& name) {
  // Dense (no sparsity) bf16 with float32 accumulation, NVIDIA datasheets.
  // First match wins: more specific names first.
  struct Entry {
    const char* needle;
    double tflops;
  };
  static const std::vector<Entry> kTable = {
      {"GH200", 989.4}, {"H200", 989.4},    {"H100 NVL", 835.0}, {"H100 PCIe", 756.0}, {"H100", 989.4},
      {"H800", 989.4},  {"H20", 148.0},     {"B200", 2250.0},    {"B100", 1750.0},     {"A100", 312.0},
      {"A800", 312.0},  {"L40S", 362.05},   {"L40", 181.05},     {"L4", 121.0},        {"A10G", 70.0},
      {"A10", 125.0},   {"RTX 6000 Ada", 364.2},
  };
  for (const Entry& e : kTable) {
    if (name.find(e.needle) != std::string::npos) return e.tflops * 1e12;
  }
  return 0;
}

}  // namespace trainerd::engine
