// Shared pieces of the engine tests: temporary folders, specs from YAML
// text, a Reporter that records, the device/dtype under test and tolerances.
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "common/job_spec.h"
#include "engine/durable_files.h"
#include "engine/engine.h"
#include "tests/temp_dir.h"

namespace trainerd::testing {

namespace fs = std::filesystem;

inline std::string Fixture(const std::string& rel) { return std::string(TRAINERD_FIXTURES) + "/" + rel; }


// The device and dtype the suite runs on: TRAINERD_TEST_DEVICE (cpu | cuda)
// and TRAINERD_TEST_DTYPE (float32 | bfloat16); cpu/float32 by default.
inline std::string TestDevice() {
  const char* d = std::getenv("TRAINERD_TEST_DEVICE");
  return d ? d : "cpu";
}
inline std::string TestDtype() {
  const char* d = std::getenv("TRAINERD_TEST_DTYPE");
  return d ? d : "float32";
}
inline torch::Device TorchTestDevice() {
  return TestDevice() == "cpu" ? torch::Device(torch::kCPU) : torch::Device(TestDevice());
}
inline torch::ScalarType TorchTestDtype() {
  return TestDtype() == "bfloat16" ? torch::kBFloat16 : torch::kFloat32;
}

// Relative tolerances: exact-ish on the CPU in float32, looser on the GPU
// (other kernels) and in bfloat16 (8 bits of mantissa).
struct Tolerances {
  double logits, loss, train_loss;
};
inline Tolerances TestTolerances() {
  if (TestDtype() == "bfloat16") return {3e-2, 1e-2, 1e-2};
  if (TestDevice() != "cpu") return {1e-4, 1e-4, 1e-4};
  return {1e-5, 1e-5, 1e-4};
}

// max |a - b| / max |b|, both taken to float64 on the CPU.
inline double RelativeError(const torch::Tensor& a, const torch::Tensor& b) {
  torch::Tensor x = a.detach().to(torch::kCPU, torch::kFloat64), y = b.detach().to(torch::kCPU, torch::kFloat64);
  return (x - y).abs().max().item<double>() / y.abs().max().item<double>();
}

// Prints a measured figure so that a run's log shows how close parity is.
inline double Report(const std::string& what, double value) {
  std::printf("[  figure  ] %s = %.3g\n", what.c_str(), value);
  return value;
}

inline void WriteText(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
}

inline JobSpec SpecFromYaml(const std::string& yaml, const std::string& dir) {
  auto spec = ParseJobSpecText(yaml, dir + "/job.yaml", dir);
  EXPECT_TRUE(spec.ok()) << spec.status().message();
  return spec.ok() ? *spec : JobSpec{};
}

// Records every event; optionally raises a stop flag after a given step.
class RecordingReporter : public engine::Reporter {
 public:
  void OnStart(const engine::RunInfo& i) override { info = i; }
  void OnProgress(const engine::ProgressEvent& e) override {
    progress.push_back(e);
    if (stop_after_step > 0 && e.step == stop_after_step) stop.store(true);
  }
  void OnEval(const engine::EvalEvent& e) override { evals.push_back(e); }
  void OnCheckpoint(const engine::CheckpointEvent& e) override { checkpoints.push_back(e); }
  void OnMessage(const std::string& m) override { messages.push_back(m); }

  engine::RunInfo info;
  std::vector<engine::ProgressEvent> progress;
  std::vector<engine::EvalEvent> evals;
  std::vector<engine::CheckpointEvent> checkpoints;
  std::vector<std::string> messages;
  int64_t stop_after_step = 0;
  std::atomic<bool> stop{false};
};

}  // namespace trainerd::testing
