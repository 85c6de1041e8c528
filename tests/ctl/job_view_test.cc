// The `list` table and the `status` block (ctl/job_view.h).
#include "ctl/job_view.h"

#include <stdlib.h>
#include <time.h>

#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace trainerd::ctl {
namespace {

constexpr int64_t kSubmitted = 1714572187000;  // 2024-05-01 14:03:07 UTC

// Runs with TZ=UTC and fixed user names, so the output is the same everywhere.
class JobViewTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tz = getenv("TZ");
    had_tz_ = tz != nullptr;
    if (had_tz_) saved_tz_ = tz;
    setenv("TZ", "UTC", 1);
    tzset();
    options_.now_unix_ms = kSubmitted + 3 * 60'000 + 5'000;  // 3m 05s later
    options_.user_name = [](uint32_t uid) { return uid == 1000 ? std::string("ana") : std::to_string(uid); };
  }
  void TearDown() override {
    if (had_tz_) {
      setenv("TZ", saved_tz_.c_str(), 1);
    } else {
      unsetenv("TZ");
    }
    tzset();
  }

  static proto::Job Running() {
    proto::Job job;
    job.set_id(7);
    job.set_name("llama-lora");
    job.set_owner_uid(1000);
    job.set_state(proto::JOB_STATE_RUNNING);
    job.set_priority(0);
    job.set_submitted_unix_ms(kSubmitted);
    job.set_started_unix_ms(kSubmitted + 60'000);
    job.set_attempt(1);
    job.set_device("cuda:0");
    job.set_output_dir("/var/lib/trainerd/jobs/7/output");
    proto::Progress* p = job.mutable_progress();
    p->set_step(450);
    p->set_total_steps(1000);
    p->set_epoch(1.35);
    p->set_loss(1.23456);
    p->set_learning_rate(2e-4);
    p->set_tokens_per_second(12345.4);
    p->set_peak_memory_bytes(static_cast<int64_t>(12.3 * (int64_t{1} << 30)));
    p->set_elapsed_seconds(3720);
    p->set_eta_seconds(4500);
    p->set_eval_loss(1.3);
    return job;
  }

  static proto::Job Queued() {
    proto::Job job;
    job.set_id(12);
    job.set_name("x");
    job.set_owner_uid(4242);
    job.set_state(proto::JOB_STATE_QUEUED);
    job.set_priority(-5);
    job.set_submitted_unix_ms(kSubmitted + 120'000);
    return job;
  }

  ViewOptions options_;
  bool had_tz_ = false;
  std::string saved_tz_;
};

TEST_F(JobViewTest, TableOffATerminalHasLocalTimesAndNoColour) {
  options_.terminal = false;
  EXPECT_EQ(RenderJobTable({Running(), Queued()}, options_),
            "ID  NAME        STATE    OWNER  PRIORITY  PROGRESS      SUBMITTED            DEVICE\n"
            " 7  llama-lora  running  ana           0  450/1000 45%  2024-05-01 14:03:07  cuda:0\n"
            "12  x           queued   4242         -5  -             2024-05-01 14:05:07  -\n");
}

TEST_F(JobViewTest, TableOnATerminalHasRelativeTimes) {
  options_.terminal = true;
  const std::string table = RenderJobTable({Running(), Queued()}, options_);
  EXPECT_NE(table.find("3m ago"), std::string::npos) << table;
  EXPECT_NE(table.find("1m ago"), std::string::npos) << table;
  EXPECT_EQ(table.find('\x1b'), std::string::npos) << "colour only when asked";
}

TEST_F(JobViewTest, TableColoursStatesWhenAsked) {
  options_.terminal = true;
  options_.colour = true;
  const std::string table = RenderJobTable({Running()}, options_);
  EXPECT_NE(table.find("\x1b[36mrunning\x1b[0m"), std::string::npos) << table;
}

TEST_F(JobViewTest, StatusOfARunningJob) {
  const std::string text = RenderJobStatus(Running(), options_);
  EXPECT_EQ(text.substr(0, text.find('\n')), "job 7 (llama-lora): running");
  const std::vector<std::string> expected_lines = {
      "  owner:            ana (uid 1000)\n",
      "  priority:         0\n",
      "  device:           cuda:0\n",
      "  attempt:          1\n",
      "  progress:         [#########-----------] 45%  step 450/1000  epoch 1.35\n",
      "  loss:             1.2346\n",
      "  eval loss:        1.3000\n",
      "  learning rate:    2.00e-04\n",
      "  tokens/s:         12,345\n",
      "  peak GPU memory:  12.3 GiB\n",
      "  elapsed:          1h 02m\n",
      "  ETA:              1h 15m\n",
      "  submitted:        2024-05-01 14:03:07 (3m ago)\n",
      "  started:          2024-05-01 14:04:07 (2m ago)\n",
      "  output dir:       /var/lib/trainerd/jobs/7/output\n",
  };
  size_t at = 0;
  for (const std::string& line : expected_lines) {
    const size_t found = text.find(line, at);
    EXPECT_NE(found, std::string::npos) << "missing or out of order: " << line << "in:\n" << text;
    if (found != std::string::npos) at = found + line.size();
  }
  EXPECT_EQ(text.find("finished:"), std::string::npos) << text;
  EXPECT_EQ(text.find("worker:"), std::string::npos) << text;
}

TEST_F(JobViewTest, StatusOfAFailedJobSaysWhyAndHowTheWorkerEnded) {
  proto::Job job = Running();
  job.set_state(proto::JOB_STATE_FAILED);
  job.set_finished_unix_ms(kSubmitted + 180'000);
  job.set_reason("CUDA out of memory");
  job.mutable_result()->set_signal(9);
  std::string text = RenderJobStatus(job, options_);
  EXPECT_NE(text.find("job 7 (llama-lora): failed\n"), std::string::npos) << text;
  EXPECT_NE(text.find("reason:           CUDA out of memory\n"), std::string::npos) << text;
  EXPECT_NE(text.find("worker:           killed by SIGKILL (signal 9)\n"), std::string::npos) << text;
  EXPECT_NE(text.find("finished:         2024-05-01 14:06:07 (5s ago)\n"), std::string::npos) << text;
  EXPECT_EQ(text.find("ETA:"), std::string::npos) << "no ETA once the job is not running:\n" << text;

  job.mutable_result()->set_signal(0);
  job.mutable_result()->set_exit_code(1);
  text = RenderJobStatus(job, options_);
  EXPECT_NE(text.find("worker:           exit code 1\n"), std::string::npos) << text;
}

TEST_F(JobViewTest, ValuesOfSeveralLinesContinueInTheValueColumn) {
  proto::Job job = Queued();
  job.set_state(proto::JOB_STATE_FAILED);
  job.set_reason("the worker exited with status 1; its last lines:\n  error: out of memory\n");
  EXPECT_EQ(RenderJobStatus(job, options_),
            "job 12 (x): failed\n"
            "  owner:      uid 4242\n"
            "  priority:   -5\n"
            "  submitted:  2024-05-01 14:05:07 (1m ago)\n"
            "  reason:     the worker exited with status 1; its last lines:\n"
            "                error: out of memory\n");
}

TEST_F(JobViewTest, StatusOfAQueuedJobShowsOnlyWhatItHas) {
  EXPECT_EQ(RenderJobStatus(Queued(), options_),
            "job 12 (x): queued\n"
            "  owner:      uid 4242\n"
            "  priority:   -5\n"
            "  submitted:  2024-05-01 14:05:07 (1m ago)\n");
}

TEST_F(JobViewTest, StatusOfASucceededJobShowsItsOutputs) {
  proto::Job job = Running();
  job.set_state(proto::JOB_STATE_SUCCEEDED);
  job.mutable_result()->set_output_path("/var/lib/trainerd/jobs/7/output/adapter");
  job.mutable_spec()->set_source("/home/ana/llama.yaml");
  const std::string text = RenderJobStatus(job, options_);
  EXPECT_NE(text.find("  output:           /var/lib/trainerd/jobs/7/output/adapter\n"), std::string::npos) << text;
  EXPECT_NE(text.find("  spec:             /home/ana/llama.yaml\n"), std::string::npos) << text;
}

}  // namespace
}  // namespace trainerd::ctl
