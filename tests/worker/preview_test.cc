// trainerd-worker preview: rendering of trained vs masked tokens and the
// statistics line, on real job specs and data files.
#include <filesystem>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "common/job_spec.h"
#include "worker/preview.h"

namespace trainerd::worker {
namespace {

TEST(RenderExample, MasksPromptAndFirstTokenInBrackets) {
  engine::TokenExample ex{{5, 6, 7, 8}, {-100, -100, 7, 8}, {}};
  EXPECT_EQ(RenderExample(ex, nullptr, PreviewStyle{}), "[[5 6]] 7 8");
}

TEST(RenderExample, FirstTokenOfEveryPackedExampleIsMasked) {
  engine::TokenExample ex{{1, 2, 3, 4}, {1, 2, 3, 4}, {0, 1, 0, 1}};
  EXPECT_EQ(RenderExample(ex, nullptr, PreviewStyle{}), "[[1]] 2 [[3]] 4");
}

TEST(RenderExample, ColourInsteadOfBracketsOnATerminal) {
  engine::TokenExample ex{{5, 6}, {5, 6}, {}};
  const std::string s = RenderExample(ex, nullptr, PreviewStyle{true});
  EXPECT_EQ(s.find("[["), std::string::npos);
  EXPECT_NE(s.find("\033[32m6"), std::string::npos) << s;
}

TEST(RunPreview, ShowsExamplesAndStatistics) {
  const std::string dir = (std::filesystem::temp_directory_path() / "trainerd-preview-test").string();
  std::filesystem::create_directories(dir);
  {
    std::ofstream data(dir + "/data.jsonl");
    data << "{\"input_ids\": [1, 2, 3], \"labels\": [-100, -100, 3]}\n"
         << "{\"input_ids\": [4], \"labels\": [4]}\n"
         << "{\"input_ids\": [5, 6, 7, 8, 9, 10]}\n";
  }
  auto spec = ParseJobSpecText("model: {path: " + std::string(TRAINERD_FIXTURES) +
                                   "/llama/model}\ndata: {train: data.jsonl, max_seq_len: 4}\noutput: {dir: out}\n",
                               dir + "/job.yaml", dir);
  ASSERT_TRUE(spec.ok()) << spec.status().message();
  std::ostringstream out;
  Status s = RunPreview(*spec, 5, PreviewStyle{}, out);
  ASSERT_TRUE(s.ok()) << s.message();
  const std::string text = out.str();
  EXPECT_NE(text.find("[[1 2]] 3"), std::string::npos) << text;
  EXPECT_NE(text.find("[[5]] 6 7 8"), std::string::npos) << text;
  EXPECT_NE(text.find("3 lines, 2 examples kept, 1 truncated to data.max_seq_len 4, 1 dropped"), std::string::npos)
      << text;
  EXPECT_NE(text.find("7 tokens, 4 trained"), std::string::npos) << text;
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace trainerd::worker
