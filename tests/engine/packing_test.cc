// Packing: a packed batch computes exactly the losses of its examples
// unpacked (issue bound: 1e-5 relative, fp32 CPU).
#include "engine/batch.h"
#include "engine/model_config.h"
#include "engine/packing.h"
#include "engine/tensor_io.h"
#include "tests/engine/test_support.h"

namespace trainerd::testing {
namespace {

std::unique_ptr<engine::LlamaModel> Model(const std::string& name) {
  auto config = engine::LoadModelConfig(Fixture(name + "/model"));
  EXPECT_TRUE(config.ok());
  auto weights = engine::LoadModelWeights(Fixture(name + "/model"), TorchTestDtype(), TorchTestDevice());
  EXPECT_TRUE(weights.ok());
  auto model = engine::LlamaModel::FromWeights(*config, std::move(*weights), name);
  EXPECT_TRUE(model.ok());
  return std::move(*model);
}

TEST(PackExamples, FillsSequencesInOrderAndRestartsPositions) {
  engine::TokenDataset data;
  data.examples = {{{1, 2, 3}, {1, 2, 3}, {}}, {{4, 5}, {-100, 5}, {}}, {{6, 7, 8, 9}, {6, 7, 8, 9}, {}}};
  data.lines = 3;
  engine::TokenDataset packed = engine::PackExamples(data, 6);
  ASSERT_EQ(packed.examples.size(), 2u);
  EXPECT_EQ(packed.examples[0].input_ids, (std::vector<int64_t>{1, 2, 3, 4, 5}));
  EXPECT_EQ(packed.examples[0].labels, (std::vector<int64_t>{-100, 2, 3, -100, 5}));
  EXPECT_EQ(packed.examples[0].position_ids, (std::vector<int64_t>{0, 1, 2, 0, 1}));
  EXPECT_EQ(packed.examples[1].position_ids, (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(packed.examples[0].target_tokens(), data.examples[0].target_tokens() + data.examples[1].target_tokens());
  EXPECT_EQ(packed.lines, 3);
}

class PackingLossTest : public ::testing::TestWithParam<std::string> {};

TEST_P(PackingLossTest, PackedLossEqualsUnpackedLosses) {
  auto model = Model(GetParam());
  auto data = engine::LoadTokenDataset(Fixture("llama/lora_train/train.jsonl"), model->config().vocab_size, 64);
  ASSERT_TRUE(data.ok()) << data.status().message();
  torch::NoGradGuard no_grad;
  double unpacked = 0;
  int64_t unpacked_targets = 0;
  for (const auto& ex : data->examples) {
    engine::Batch b = engine::MakeBatch({&ex}, model->device());
    unpacked += engine::CausalLmLossSum(*model, b).item<double>();
    unpacked_targets += b.target_tokens;
  }
  engine::TokenDataset packed = engine::PackExamples(*data, 48);
  ASSERT_LT(packed.examples.size(), data->examples.size());  // something was packed
  std::vector<const engine::TokenExample*> rows;
  for (const auto& ex : packed.examples) rows.push_back(&ex);
  engine::Batch b = engine::MakeBatch(rows, model->device());  // padded too: rows differ in length
  ASSERT_TRUE(b.position_ids.defined());
  const double packed_loss = engine::CausalLmLossSum(*model, b).item<double>();
  EXPECT_EQ(b.target_tokens, unpacked_targets);
  EXPECT_LE(Report(GetParam() + " packed vs unpacked loss rel err", std::abs(packed_loss - unpacked) / unpacked),
            TestDtype() == "bfloat16" ? 1e-2 : 1e-5);
}

TEST(PackedRun, TrainsAndReportsThePacking) {
  TempDir tmp;
  RecordingReporter r;
  auto result = engine::RunJob(
      SpecFromYaml("model: {path: " + Fixture("llama/model") + ", dtype: float32}\nadapter: {r: 2}\n"
                   "data: {train: " + Fixture("llama/lora_train/train.jsonl") + ", eval: " + Fixture("llama/eval.jsonl") +
                   ", packing: true, max_seq_len: 48}\ntraining: {max_steps: 3, micro_batch_size: 2}\n"
                   "output: {dir: " + (tmp / "out") + "}\ndevice: cpu\n",
                   tmp.path()),
      {}, r);
  ASSERT_TRUE(result.ok()) << result.status().message();
  ASSERT_FALSE(r.messages.empty());
  EXPECT_NE(r.messages[0].find("packed into"), std::string::npos) << r.messages[0];
  EXPECT_LT(r.info.train_examples, 10);  // 10 examples became fewer sequences
  // Eval over packed sequences still counts every target token of data.eval once.
  ASSERT_FALSE(r.evals.empty());
  EXPECT_EQ(r.evals.back().eval_tokens, 27);
}

INSTANTIATE_TEST_SUITE_P(Families, PackingLossTest, ::testing::Values("llama", "mistral", "qwen2"));

}  // namespace
}  // namespace trainerd::testing
