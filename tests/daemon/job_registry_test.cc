// JobRegistry over a real JobStore file: the in-memory copy matches the store,
// selection and queue order match JobStore's, progress is written through at
// most every kProgressWriteInterval and always before a state change, and the
// state listener hears every change.
#include "daemon/job_registry.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/temp_dir.h"

namespace trainerd::daemon {
namespace {

JobRecord NewJob(const std::string& name, int32_t priority = 0) {
  JobRecord job;
  job.name = name;
  job.owner_uid = 1000;
  job.priority = priority;
  job.submitted_unix_ms = 1;
  job.spec_yaml = "model: {path: /m}\n";
  job.spec_source = "/s/" + name + ".yaml";
  job.spec_base_dir = "/s";
  job.spec_json = "{}";
  return job;
}

class JobRegistryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto store = JobStore::Open(dir_ / "queue.db");
    ASSERT_TRUE(store.ok()) << store.status().message();
    store_ = std::make_unique<JobStore>(std::move(store).value());
    auto registry = JobRegistry::Load(*store_);
    ASSERT_TRUE(registry.ok()) << registry.status().message();
    registry_ = std::move(registry).value();
    registry_->SetStateListener([this](const JobRecord& job) { heard_.push_back({job.id, job.state}); });
  }

  JobRecord Stored(int64_t id) { return store_->Get(id)->value(); }

  testing::TempDir dir_;
  std::unique_ptr<JobStore> store_;
  std::unique_ptr<JobRegistry> registry_;
  std::vector<std::pair<int64_t, JobState>> heard_;
};

TEST_F(JobRegistryTest, MemoryMatchesTheStoreWithoutTheSpecText) {
  const int64_t id = registry_->Add(NewJob("a")).value();
  const JobRecord* held = registry_->Find(id);
  ASSERT_NE(held, nullptr);
  JobRecord stored = Stored(id);
  EXPECT_EQ(held->spec_yaml, "");
  EXPECT_EQ(held->spec_json, "");
  stored.spec_yaml.clear();
  stored.spec_json.clear();
  EXPECT_TRUE(*held == stored);
  EXPECT_EQ(registry_->ReadFull(id).value().spec_yaml, "model: {path: /m}\n");
  EXPECT_EQ(registry_->Find(99), nullptr);
  EXPECT_FALSE(registry_->ReadFull(99).ok());
}

TEST_F(JobRegistryTest, LoadReadsEveryJobAndSelectAndNextQueuedAgreeWithTheStore) {
  const int64_t a = store_->Add(NewJob("a")).value();
  const int64_t b = store_->Add(NewJob("b", /*priority=*/5)).value();
  const int64_t c = store_->Add(NewJob("c")).value();
  ASSERT_TRUE(store_->Cancel(c, "no", 2).ok());
  auto loaded = JobRegistry::Load(*store_);
  ASSERT_TRUE(loaded.ok());
  JobRegistry& r = **loaded;
  EXPECT_EQ(r.size(), 3u);
  EXPECT_EQ(r.NextQueued()->id, b);  // priority first
  EXPECT_EQ(r.NextQueued()->id, store_->NextQueued().value()->id);
  std::vector<int64_t> active, all, cancelled;
  for (const JobRecord* j : r.Select(false, {})) active.push_back(j->id);
  for (const JobRecord* j : r.Select(true, {})) all.push_back(j->id);
  for (const JobRecord* j : r.Select(false, {JobState::kCancelled})) cancelled.push_back(j->id);
  EXPECT_EQ(active, (std::vector<int64_t>{a, b}));
  EXPECT_EQ(all, (std::vector<int64_t>{a, b, c}));
  EXPECT_EQ(cancelled, (std::vector<int64_t>{c}));
  EXPECT_EQ(r.Count(JobState::kQueued), 2u);
}

TEST_F(JobRegistryTest, ProgressIsWrittenThroughAtMostEveryIntervalAndBeforeTheEnd) {
  const int64_t id = registry_->Add(NewJob("a")).value();
  ASSERT_TRUE(registry_->MarkRunning(id, "cpu", 10).ok());
  JobProgress p;
  p.step = 1;
  p.total_steps = 100;
  ASSERT_TRUE(registry_->UpdateProgress(id, p).ok());
  p.step = 2;
  ASSERT_TRUE(registry_->UpdateProgress(id, p).ok());
  EXPECT_EQ(registry_->Find(id)->progress.step, 2);  // memory: at once
  EXPECT_LT(Stored(id).progress.step, 2);             // the store: within the interval, not yet
  ASSERT_TRUE(registry_->Finish(id, JobState::kSucceeded, JobResult{}, "", 20).ok());
  EXPECT_EQ(Stored(id).progress.step, 2);  // written before the job ended
  EXPECT_EQ(Stored(id).state, JobState::kSucceeded);
  // An ended job takes no more progress.
  EXPECT_FALSE(registry_->UpdateProgress(id, p).ok());
}

TEST_F(JobRegistryTest, StateListenerHearsEveryStateChange) {
  const int64_t a = registry_->Add(NewJob("a")).value();
  const int64_t b = registry_->Add(NewJob("b")).value();
  ASSERT_TRUE(registry_->SetPaths(a, "/o", "/l").ok());  // not a state change
  ASSERT_TRUE(registry_->MarkRunning(a, "cpu", 3).ok());
  ASSERT_TRUE(registry_->Finish(a, JobState::kFailed, JobResult{1, 0, "", 0}, "x", 4).ok());
  ASSERT_TRUE(registry_->Cancel(b, "y", 5).ok());
  const std::vector<std::pair<int64_t, JobState>> expected = {{a, JobState::kQueued},
                                                              {b, JobState::kQueued},
                                                              {a, JobState::kRunning},
                                                              {a, JobState::kFailed},
                                                              {b, JobState::kCancelled}};
  EXPECT_EQ(heard_, expected);
  // A refused change leaves memory and store alone and tells nobody.
  EXPECT_FALSE(registry_->MarkRunning(b, "cpu", 6).ok());
  EXPECT_EQ(registry_->Find(b)->state, JobState::kCancelled);
  EXPECT_EQ(heard_.size(), expected.size());
}

}  // namespace
}  // namespace trainerd::daemon
