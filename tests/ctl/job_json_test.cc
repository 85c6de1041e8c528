// The JSON of `list --json` and `status --json` (ctl/job_json.h): the field
// names and values docs/trainctl.md documents, for a Job with every field set.
#include "ctl/job_json.h"

#include <cmath>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace trainerd::ctl {
namespace {

using nlohmann::ordered_json;

proto::Job FullJob() {
  proto::Job job;
  job.set_id(7);
  job.set_name("llama-lora");
  job.set_owner_uid(1000);
  job.set_state(proto::JOB_STATE_RUNNING);
  job.set_priority(-3);
  job.set_submitted_unix_ms(1714572187000);
  job.set_started_unix_ms(1714572190000);
  job.set_finished_unix_ms(1714575790000);
  job.set_attempt(2);
  proto::Progress* p = job.mutable_progress();
  p->set_step(450);
  p->set_total_steps(1000);
  p->set_epoch(1.5);
  p->set_loss(1.25);
  p->set_learning_rate(2e-4);
  p->set_grad_norm(0.75);
  p->set_tokens_per_second(12345.5);
  p->set_mfu(0.41);
  p->set_peak_memory_bytes(int64_t{12} << 30);
  p->set_elapsed_seconds(3600.5);
  p->set_eta_seconds(4400);
  p->set_eval_loss(1.375);
  proto::JobResult* r = job.mutable_result();
  r->set_exit_code(1);
  r->set_signal(9);
  r->set_output_path("/out/adapter");
  r->set_eval_loss(1.5);
  job.set_reason("worker killed");
  job.set_output_dir("/out");
  job.set_device("cuda:0");
  job.mutable_spec()->set_yaml("model: {}\n");
  job.mutable_spec()->set_source("job.yaml");
  job.mutable_spec()->set_base_dir("/home/ana");
  return job;
}

std::vector<std::string> Keys(const ordered_json& object) {
  std::vector<std::string> keys;
  for (auto it = object.begin(); it != object.end(); ++it) keys.push_back(it.key());
  return keys;
}

TEST(JobJsonTest, EveryJobFieldUnderItsDocumentedNameAndOrder) {
  ordered_json j = JobToJson(FullJob(), "ana", /*with_spec=*/false);
  EXPECT_EQ(Keys(j), (std::vector<std::string>{"id", "name", "owner_uid", "owner", "state", "priority",
                                               "submitted_unix_ms", "started_unix_ms", "finished_unix_ms",
                                               "attempt", "device", "output_dir", "reason", "progress",
                                               "result"}));
  EXPECT_EQ(j["id"], 7);
  EXPECT_EQ(j["name"], "llama-lora");
  EXPECT_EQ(j["owner_uid"], 1000);
  EXPECT_EQ(j["owner"], "ana");
  EXPECT_EQ(j["state"], "running");
  EXPECT_EQ(j["priority"], -3);
  EXPECT_EQ(j["submitted_unix_ms"], 1714572187000);
  EXPECT_EQ(j["started_unix_ms"], 1714572190000);
  EXPECT_EQ(j["finished_unix_ms"], 1714575790000);
  EXPECT_EQ(j["attempt"], 2);
  EXPECT_EQ(j["device"], "cuda:0");
  EXPECT_EQ(j["output_dir"], "/out");
  EXPECT_EQ(j["reason"], "worker killed");
}

TEST(JobJsonTest, ProgressFields) {
  ordered_json p = JobToJson(FullJob(), "ana", false)["progress"];
  EXPECT_EQ(Keys(p), (std::vector<std::string>{"step", "total_steps", "epoch", "loss", "learning_rate",
                                               "grad_norm", "tokens_per_second", "mfu", "peak_memory_bytes",
                                               "elapsed_seconds", "eta_seconds", "eval_loss"}));
  EXPECT_EQ(p["step"], 450);
  EXPECT_EQ(p["total_steps"], 1000);
  EXPECT_EQ(p["epoch"], 1.5);
  EXPECT_EQ(p["loss"], 1.25);
  EXPECT_EQ(p["learning_rate"], 2e-4);
  EXPECT_EQ(p["grad_norm"], 0.75);
  EXPECT_EQ(p["tokens_per_second"], 12345.5);
  EXPECT_EQ(p["mfu"], 0.41);
  EXPECT_EQ(p["peak_memory_bytes"], int64_t{12} << 30);
  EXPECT_EQ(p["elapsed_seconds"], 3600.5);
  EXPECT_EQ(p["eta_seconds"], 4400.0);
  EXPECT_EQ(p["eval_loss"], 1.375);
}

TEST(JobJsonTest, ResultFields) {
  ordered_json r = JobToJson(FullJob(), "ana", false)["result"];
  EXPECT_EQ(Keys(r), (std::vector<std::string>{"exit_code", "signal", "output_path", "eval_loss"}));
  EXPECT_EQ(r["exit_code"], 1);
  EXPECT_EQ(r["signal"], 9);
  EXPECT_EQ(r["output_path"], "/out/adapter");
  EXPECT_EQ(r["eval_loss"], 1.5);
}

TEST(JobJsonTest, SpecOnlyWhenAsked) {
  ordered_json with = JobToJson(FullJob(), "ana", /*with_spec=*/true);
  ASSERT_TRUE(with.contains("spec"));
  EXPECT_EQ(Keys(with["spec"]), (std::vector<std::string>{"source", "base_dir", "yaml"}));
  EXPECT_EQ(with["spec"]["source"], "job.yaml");
  EXPECT_EQ(with["spec"]["base_dir"], "/home/ana");
  EXPECT_EQ(with["spec"]["yaml"], "model: {}\n");
  EXPECT_EQ(Keys(with).back(), "spec");
  EXPECT_FALSE(JobToJson(FullJob(), "ana", /*with_spec=*/false).contains("spec"));
}

TEST(JobJsonTest, AnEmptyJobHasEveryKeyWithZeroValues) {
  ordered_json j = JobToJson(proto::Job(), "0", /*with_spec=*/true);
  EXPECT_EQ(j["id"], 0);
  EXPECT_EQ(j["name"], "");
  EXPECT_EQ(j["state"], "unspecified");
  EXPECT_EQ(j["device"], "");
  EXPECT_EQ(j["progress"]["step"], 0);
  EXPECT_EQ(j["progress"]["loss"], 0.0);
  EXPECT_EQ(j["result"]["output_path"], "");
  EXPECT_EQ(j["spec"]["yaml"], "");
}

TEST(JobJsonTest, StateNamesAreLowerCase) {
  const std::vector<std::pair<proto::JobState, std::string>> cases = {
      {proto::JOB_STATE_QUEUED, "queued"},       {proto::JOB_STATE_RUNNING, "running"},
      {proto::JOB_STATE_SUCCEEDED, "succeeded"}, {proto::JOB_STATE_FAILED, "failed"},
      {proto::JOB_STATE_CANCELLED, "cancelled"}, {proto::JOB_STATE_INTERRUPTED, "interrupted"}};
  for (const auto& [state, name] : cases) {
    proto::Job job;
    job.set_state(state);
    EXPECT_EQ(JobToJson(job, "", false)["state"], name);
  }
}

TEST(JobJsonTest, NonFiniteNumbersBecomeNull) {
  proto::Job job;
  job.mutable_progress()->set_loss(std::nan(""));
  job.mutable_progress()->set_eta_seconds(INFINITY);
  ordered_json j = JobToJson(job, "", false);
  EXPECT_TRUE(j["progress"]["loss"].is_null());
  EXPECT_TRUE(j["progress"]["eta_seconds"].is_null());
  // And the text is still valid JSON.
  EXPECT_NO_THROW(ordered_json::parse(DumpJson(j)));
}

TEST(JobJsonTest, DumpIsIndentedEndsInANewlineAndSurvivesBadUtf8) {
  proto::Job job;
  job.set_name("caf\xc3\xa9");
  job.set_output_dir("/bad/\xff/path");
  const std::string text = DumpJson(JobToJson(job, "ana", false));
  EXPECT_EQ(text.rfind("{\n  \"id\": 0,\n", 0), 0u) << text;
  EXPECT_EQ(text.back(), '\n');
  ordered_json back = ordered_json::parse(text);
  EXPECT_EQ(back["name"], "caf\xc3\xa9");
  EXPECT_EQ(back["output_dir"], "/bad/\xef\xbf\xbd/path");  // U+FFFD
}

}  // namespace
}  // namespace trainerd::ctl
