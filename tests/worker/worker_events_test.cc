// Drives the real trainerd-worker binary with --events-fd on the tiny Llama
// fixture, on the CPU, and decodes the WorkerEvent frames it writes: what a
// run sends from Started to Finished, what a failure sends, usage errors, and
// a reader that goes away before the end (the job must go on).
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/framing.h"
#include "common/proto_framing.h"
#include "proto/trainerd.pb.h"
#include "tests/temp_dir.h"
#include "tests/worker/worker_process.h"

namespace trainerd::worker {
namespace {

namespace fs = std::filesystem;
using proto::WorkerEvent;

using namespace testing;  // NOLINT: the worker-binary helpers of worker_process.h
using trainerd::testing::TempDir;

size_t Count(const std::string& text, const std::string& part) {
  size_t n = 0;
  for (size_t pos = text.find(part); pos != std::string::npos; pos = text.find(part, pos + 1)) ++n;
  return n;
}

// Reads WorkerEvent frames from `fd` until end of file (or kRunTimeout),
// failing the test on a truncated or unparsable frame. `on_event`, if given,
// sees each event as it arrives and returns false to stop reading early.
std::vector<WorkerEvent> ReadEvents(int fd, const std::function<bool(const WorkerEvent&)>& on_event = nullptr) {
  std::vector<WorkerEvent> events;
  FrameDecoder decoder;
  const auto deadline = std::chrono::steady_clock::now() + kRunTimeout;
  char buf[4096];
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      ADD_FAILURE() << "no end of the event stream within " << kRunTimeout.count() << " s";
      return events;
    }
    pollfd p{fd, POLLIN, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(left.count()));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) continue;
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      ADD_FAILURE() << "read: " << std::strerror(errno);
      return events;
    }
    if (n == 0) {
      Status end = decoder.AtEndOfStream();
      EXPECT_TRUE(end.ok()) << end.message();
      return events;
    }
    decoder.Feed(buf, static_cast<size_t>(n));
    while (true) {
      auto frame = decoder.Next();
      if (!frame.ok()) {
        ADD_FAILURE() << frame.status().message();
        return events;
      }
      if (!frame->has_value()) break;
      WorkerEvent event;
      Status parsed = ParseFrame(**frame, &event);
      if (!parsed.ok()) {
        ADD_FAILURE() << parsed.message();
        return events;
      }
      events.push_back(event);
      if (on_event && !on_event(events.back())) return events;
    }
  }
}

// The first event that is not a log line: the engine's notes on loading
// (data from the cache, examples dropped) are sent as they happen, before Started.
const WorkerEvent* FirstNonLogEvent(const std::vector<WorkerEvent>& events) {
  for (const WorkerEvent& e : events) {
    if (!e.has_log_line()) return &e;
  }
  return nullptr;
}

std::string Describe(const std::vector<WorkerEvent>& events) {
  std::string text;
  for (const WorkerEvent& e : events) text += e.ShortDebugString() + "\n";
  return text;
}

struct Outcome {
  int exit_code;
  int signal;
  std::string out, err;
  std::vector<WorkerEvent> events;
};

class WorkerEventsTest : public testing::WorkerBinaryTest {
 protected:
  // Runs the worker with `args` (which name fd 3) and a pipe or a socketpair
  // as fd 3, reading every event until it exits.
  Outcome RunWithEvents(const std::vector<std::string>& args, bool socket) {
    int fds[2];
    if (socket) {
      EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0) << std::strerror(errno);
    } else {
      EXPECT_EQ(::pipe2(fds, O_CLOEXEC), 0) << std::strerror(errno);
    }
    WorkerProcess p(args, dir_.path(), fds[1]);
    ::close(fds[1]);
    EXPECT_TRUE(p.started()) << "fork failed";
    std::vector<WorkerEvent> events = ReadEvents(fds[0]);
    ::close(fds[0]);
    const int code = p.Wait();
    return {code, p.signal(), p.out(), p.err(), std::move(events)};
  }

  // Runs the worker without an events fd of the test's (fd 3 is closed in it
  // unless `child_fd` is given).
  Outcome RunPlain(const std::vector<std::string>& args, int child_fd = -1) {
    WorkerProcess p(args, dir_.path(), child_fd);
    EXPECT_TRUE(p.started()) << "fork failed";
    const int code = p.Wait();
    return {code, p.signal(), p.out(), p.err(), {}};
  }
};

// ---------------------------------------------------------------------------
// A job that succeeds

TEST_F(WorkerEventsTest, LoraJobSendsStartedProgressCheckpointsEvalAndFinished) {
  const std::string out = PathOf("run");
  const std::string job = WriteJob("job.yaml", LoraJobYaml(out,
                                                           "  max_steps: 6\n"
                                                           "  micro_batch_size: 2\n"
                                                           "  log_every: 1\n"
                                                           "  checkpoint_every: 2\n",
                                                           /*with_eval=*/true));
  Outcome r = RunWithEvents({"run", job, "--events-fd", std::to_string(kEventsFd)}, /*socket=*/true);
  ASSERT_EQ(r.exit_code, 0) << "stdout:\n" << r.out << "\nstderr:\n" << r.err;
  ASSERT_GE(r.events.size(), 2u) << Describe(r.events);

  // Started first (after the notes on loading), with the run's figures.
  ASSERT_NE(FirstNonLogEvent(r.events), nullptr) << Describe(r.events);
  const WorkerEvent& first = *FirstNonLogEvent(r.events);
  ASSERT_TRUE(first.has_started()) << Describe(r.events);
  EXPECT_EQ(first.started().total_steps(), 6);
  EXPECT_EQ(first.started().resumed_from_step(), 0);
  EXPECT_EQ(first.started().device(), "cpu");
  EXPECT_EQ(first.started().dtype(), "float32");
  EXPECT_GT(first.started().train_examples(), 0);
  EXPECT_GT(first.started().train_tokens(), 0);
  EXPECT_GT(first.started().trained_tokens(), 0);
  EXPECT_LE(first.started().trained_tokens(), first.started().train_tokens());

  // Finished last, once, naming the adapter.
  const WorkerEvent& last = r.events.back();
  ASSERT_TRUE(last.has_finished()) << Describe(r.events);
  EXPECT_EQ(last.finished().error(), "");
  EXPECT_FALSE(last.finished().stopped());
  EXPECT_EQ(fs::path(last.finished().output_path()).filename(), "adapter") << last.finished().output_path();
  EXPECT_TRUE(fs::equivalent(last.finished().output_path(), out + "/adapter")) << last.finished().output_path();
  EXPECT_TRUE(fs::is_regular_file(last.finished().output_path() + "/adapter_model.safetensors"));

  std::vector<int64_t> progress_steps, checkpoint_steps;
  int started = 0, finished = 0, evals = 0, log_lines = 0;
  double eval_loss = 0;
  for (const WorkerEvent& e : r.events) {
    switch (e.kind_case()) {
      case WorkerEvent::kStarted:
        ++started;
        break;
      case WorkerEvent::kProgress: {
        const proto::Progress& p = e.progress();
        progress_steps.push_back(p.step());
        EXPECT_EQ(p.total_steps(), 6) << e.ShortDebugString();
        EXPECT_TRUE(std::isfinite(p.loss()) && p.loss() > 0) << e.ShortDebugString();
        EXPECT_GT(p.learning_rate(), 0) << e.ShortDebugString();
        EXPECT_TRUE(std::isfinite(p.grad_norm())) << e.ShortDebugString();
        EXPECT_GT(p.tokens_per_second(), 0) << e.ShortDebugString();
        EXPECT_GT(p.epoch(), 0) << e.ShortDebugString();
        EXPECT_GE(p.elapsed_seconds(), 0) << e.ShortDebugString();
        EXPECT_GE(p.eta_seconds(), 0) << e.ShortDebugString();
        EXPECT_EQ(p.mfu(), 0) << e.ShortDebugString();
        EXPECT_EQ(p.peak_memory_bytes(), 0) << e.ShortDebugString();  // the CPU
        EXPECT_EQ(evals, 0) << "a progress event after the final eval: " << e.ShortDebugString();
        break;
      }
      case WorkerEvent::kCheckpoint:
        checkpoint_steps.push_back(e.checkpoint().step());
        EXPECT_EQ(fs::path(e.checkpoint().path()).filename(), "checkpoint-" + std::to_string(e.checkpoint().step()))
            << e.ShortDebugString();
        break;
      case WorkerEvent::kEval:
        ++evals;
        EXPECT_EQ(e.eval().step(), 6) << e.ShortDebugString();
        EXPECT_GT(e.eval().eval_tokens(), 0) << e.ShortDebugString();
        EXPECT_TRUE(std::isfinite(e.eval().eval_loss()) && e.eval().eval_loss() > 0) << e.ShortDebugString();
        eval_loss = e.eval().eval_loss();
        break;
      case WorkerEvent::kLogLine:
        ++log_lines;
        // The engine's notes, as the console prints them.
        EXPECT_NE(r.err.find(e.log_line() + "\n"), std::string::npos) << e.log_line() << "\nstderr:\n" << r.err;
        break;
      case WorkerEvent::kFinished:
        ++finished;
        break;
      case WorkerEvent::KIND_NOT_SET:
        ADD_FAILURE() << "an event with no kind";
        break;
    }
  }
  EXPECT_EQ(started, 1);
  EXPECT_EQ(finished, 1);
  EXPECT_EQ(progress_steps, (std::vector<int64_t>{1, 2, 3, 4, 5, 6})) << Describe(r.events);
  EXPECT_EQ(checkpoint_steps, (std::vector<int64_t>{2, 4})) << Describe(r.events);  // not at the last step
  EXPECT_EQ(evals, 1) << Describe(r.events);
  EXPECT_GE(log_lines, 1) << Describe(r.events);  // at least the note on loading the data
  EXPECT_EQ(last.finished().eval_loss(), eval_loss);

  // The console output is unchanged by --events-fd.
  EXPECT_NE(r.out.find("step 6/6 | loss"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("done: 6 steps"), std::string::npos) << r.out;
  EXPECT_EQ(r.err.find("warning"), std::string::npos) << r.err;
}

TEST_F(WorkerEventsTest, ProgressCarriesTheLatestEvalLossAndEqualsFormAndPipeWork) {
  const std::string out = PathOf("run");
  const std::string job = WriteJob("job.yaml", LoraJobYaml(out,
                                                           "  max_steps: 4\n"
                                                           "  log_every: 1\n"
                                                           "  eval_every: 2\n"
                                                           "  checkpoint_every: 0\n",
                                                           /*with_eval=*/true));
  Outcome r = RunWithEvents({"run", "--events-fd=3", job}, /*socket=*/false);
  ASSERT_EQ(r.exit_code, 0) << "stdout:\n" << r.out << "\nstderr:\n" << r.err;
  double latest_eval = 0;
  std::vector<int64_t> steps;
  for (const WorkerEvent& e : r.events) {
    if (e.has_eval()) latest_eval = e.eval().eval_loss();
    if (e.has_progress()) {
      steps.push_back(e.progress().step());
      EXPECT_EQ(e.progress().eval_loss(), latest_eval) << Describe(r.events);
    }
  }
  EXPECT_GT(latest_eval, 0) << Describe(r.events);
  EXPECT_EQ(steps, (std::vector<int64_t>{1, 2, 3, 4})) << Describe(r.events);
  ASSERT_FALSE(r.events.empty());
  EXPECT_TRUE(r.events.back().has_finished()) << Describe(r.events);
}

// ---------------------------------------------------------------------------
// Jobs that fail or stop

TEST_F(WorkerEventsTest, BadDataEndsWithFinishedNamingTheProblem) {
  const std::string data = PathOf("bad.jsonl");
  WriteText(data, "{\"input_ids\": [1, 2, 3]}\n{\"input_ids\": [1, 256]}\n");
  const std::string out = PathOf("run");
  const std::string job = WriteJob("job.yaml", "model:\n  path: " + kModel + "\n"
                                               "adapter:\n  r: 4\n"
                                               "data:\n  train: " + data + "\n"
                                               "training:\n  max_steps: 2\n"
                                               "output:\n  dir: " + out + "\n"
                                               "device: cpu\n");
  Outcome r = RunWithEvents({"run", job, "--events-fd", "3"}, /*socket=*/false);
  EXPECT_EQ(r.exit_code, kExitFailed) << r.err;
  ASSERT_FALSE(r.events.empty());
  const WorkerEvent& last = r.events.back();
  ASSERT_TRUE(last.has_finished()) << Describe(r.events);
  EXPECT_NE(last.finished().error().find(data + ":2"), std::string::npos) << last.finished().error();
  EXPECT_EQ(last.finished().output_path(), "");
  EXPECT_FALSE(last.finished().stopped());
  // The same text as the console's error line.
  EXPECT_NE(r.err.find("error: " + last.finished().error() + "\n"), std::string::npos) << r.err;
  for (const WorkerEvent& e : r.events) EXPECT_FALSE(e.has_progress()) << Describe(r.events);
}

TEST_F(WorkerEventsTest, BadJobFileEndsWithFinishedNamingFileAndKey) {
  const std::string job = WriteJob("job.yaml", "model:\n  path: " + kModel + "\n"
                                               "training:\n  learnig_rate: 1e-4\n"
                                               "data:\n  train: " + kTrain + "\n"
                                               "output:\n  dir: " + PathOf("run") + "\n");
  Outcome r = RunWithEvents({"run", job, "--events-fd", "3"}, /*socket=*/true);
  EXPECT_EQ(r.exit_code, kExitFailed) << r.err;
  ASSERT_EQ(r.events.size(), 1u) << Describe(r.events);
  ASSERT_TRUE(r.events[0].has_finished()) << Describe(r.events);
  EXPECT_NE(r.events[0].finished().error().find(job + ":4"), std::string::npos) << r.events[0].finished().error();
  EXPECT_NE(r.events[0].finished().error().find("learnig_rate"), std::string::npos) << r.events[0].finished().error();
}

TEST_F(WorkerEventsTest, SigtermEndsWithCheckpointAndFinishedStopped) {
  const std::string out = PathOf("run");
  const std::string job = WriteJob("job.yaml", LoraJobYaml(out,
                                                           "  max_steps: 400\n"
                                                           "  micro_batch_size: 2\n"
                                                           "  checkpoint_every: 0\n"
                                                           "  log_every: 1\n",
                                                           /*with_eval=*/false));
  int fds[2];
  ASSERT_EQ(::pipe2(fds, O_CLOEXEC), 0);
  WorkerProcess p({"run", job, "--events-fd", "3"}, dir_.path(), fds[1]);
  ::close(fds[1]);
  ASSERT_TRUE(p.started());
  bool signalled = false;
  std::vector<WorkerEvent> events = ReadEvents(fds[0], [&](const WorkerEvent& e) {
    if (!signalled && e.has_progress() && e.progress().step() >= 2) {
      signalled = true;
      EXPECT_TRUE(p.Signal(SIGTERM));
    }
    return true;
  });
  ::close(fds[0]);
  ASSERT_EQ(p.Wait(), kExitStopped) << p.err();
  ASSERT_TRUE(signalled) << Describe(events);
  ASSERT_GE(events.size(), 2u);
  const WorkerEvent& last = events.back();
  ASSERT_TRUE(last.has_finished()) << Describe(events);
  EXPECT_TRUE(last.finished().stopped());
  EXPECT_EQ(last.finished().error(), "");
  // One checkpoint (checkpoint_every: 0), the one it stopped after, at the last step reported.
  WorkerEvent checkpoint;
  int checkpoints = 0;
  int64_t last_step = 0;
  for (const WorkerEvent& e : events) {
    if (e.has_progress()) last_step = e.progress().step();
    if (e.has_checkpoint()) {
      checkpoint = e;
      ++checkpoints;
    }
  }
  ASSERT_EQ(checkpoints, 1) << Describe(events);
  EXPECT_EQ(checkpoint.checkpoint().step(), last_step);
  EXPECT_LT(last_step, 400);
  EXPECT_TRUE(fs::exists(checkpoint.checkpoint().path() + "/COMPLETE")) << checkpoint.checkpoint().path();
}

// ---------------------------------------------------------------------------
// Usage errors

TEST_F(WorkerEventsTest, EventsFdThatIsNotANumberExits2) {
  const std::string job = PathOf("job.yaml");
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"run", job, "--events-fd", "abc"},
           {"run", job, "--events-fd", "3x"},
           {"run", job, "--events-fd", "-3"},
           {"run", job, "--events-fd", ""},
           {"run", job, "--events-fd=99999999999999999999"},
           {"run", job, "--events-fd"},
       }) {
    Outcome r = RunPlain(args);
    EXPECT_EQ(r.exit_code, kExitUsage) << args.back() << "\n" << r.err;
    EXPECT_NE(r.err.find("--events-fd wants a file descriptor number"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("usage:"), std::string::npos) << r.err;
  }
}

TEST_F(WorkerEventsTest, EventsFdThatIsClosedOrUnwritableExits2) {
  const std::string out = PathOf("run");
  const std::string job = WriteJob("job.yaml", LoraJobYaml(out, "  max_steps: 2\n", false));
  // Nothing open at 3 (nor at 100000) in the child.
  Outcome closed = RunPlain({"run", job, "--events-fd", "3"});
  EXPECT_EQ(closed.exit_code, kExitUsage) << closed.err;
  EXPECT_NE(closed.err.find("fd 3 is not open"), std::string::npos) << closed.err;
  Outcome far = RunPlain({"run", job, "--events-fd", "100000"});
  EXPECT_EQ(far.exit_code, kExitUsage) << far.err;
  EXPECT_NE(far.err.find("fd 100000 is not open"), std::string::npos) << far.err;

  // A pipe's read end.
  int fds[2];
  ASSERT_EQ(::pipe2(fds, O_CLOEXEC), 0);
  Outcome read_only = RunPlain({"run", job, "--events-fd", "3"}, fds[0]);
  ::close(fds[0]);
  ::close(fds[1]);
  EXPECT_EQ(read_only.exit_code, kExitUsage) << read_only.err;
  EXPECT_NE(read_only.err.find("not open for writing"), std::string::npos) << read_only.err;

  // The console's own fds.
  Outcome stdout_fd = RunPlain({"run", job, "--events-fd", "1"});
  EXPECT_EQ(stdout_fd.exit_code, kExitUsage) << stdout_fd.err;
  EXPECT_NE(stdout_fd.err.find("3 or above"), std::string::npos) << stdout_fd.err;

  EXPECT_FALSE(fs::exists(out)) << "a usage error must not start the job";
}

TEST_F(WorkerEventsTest, UsageMentionsEventsFd) {
  Outcome r = RunPlain({"--help"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.out.find("usage: trainerd-worker run JOB.yaml [--resume] [--events-fd N]"), std::string::npos)
      << r.out;
}

// ---------------------------------------------------------------------------
// The reader goes away

TEST_F(WorkerEventsTest, ReaderClosingEarlyDoesNotStopTheJob) {
  for (const bool socket : {false, true}) {
    SCOPED_TRACE(socket ? "socketpair" : "pipe");
    const std::string out = PathOf(socket ? "run-socket" : "run-pipe");
    const std::string job = WriteJob("job.yaml", LoraJobYaml(out,
                                                             "  max_steps: 150\n"
                                                             "  log_every: 1\n"
                                                             "  checkpoint_every: 50\n",
                                                             /*with_eval=*/false));
    int fds[2];
    if (socket) {
      ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
    } else {
      ASSERT_EQ(::pipe2(fds, O_CLOEXEC), 0);
    }
    WorkerProcess p({"run", job, "--events-fd", "3"}, dir_.path(), fds[1]);
    ::close(fds[1]);
    ASSERT_TRUE(p.started());
    // Read up to the first progress event, then hang up: 149 steps (some seconds) are still to
    // come, so writes fail after this (frames sent before the hang-up may sit unread in the buffer).
    std::vector<WorkerEvent> events =
        ReadEvents(fds[0], [](const WorkerEvent& e) { return !e.has_progress(); });
    ::close(fds[0]);
    ASSERT_FALSE(events.empty());
    ASSERT_NE(FirstNonLogEvent(events), nullptr) << Describe(events);
    EXPECT_TRUE(FirstNonLogEvent(events)->has_started()) << Describe(events);
    EXPECT_TRUE(events.back().has_progress()) << Describe(events);

    const int code = p.Wait();
    EXPECT_EQ(p.signal(), 0) << "killed by signal " << p.signal() << "; stderr:\n" << p.err();
    ASSERT_EQ(code, 0) << "stdout:\n" << p.out() << "\nstderr:\n" << p.err();
    // Said once; every step still printed; the adapter written.
    EXPECT_EQ(Count(p.err(), "writing events to fd 3"), 1u) << p.err();
    EXPECT_EQ(Count(p.err(), "warning:"), 1u) << p.err();
    int printed = 0;
    for (const std::string& line : Lines(p.out())) {
      if (std::regex_search(line, std::regex(R"(^step \d+/150 \|)"))) ++printed;
    }
    EXPECT_EQ(printed, 150) << p.out();
    EXPECT_TRUE(fs::is_regular_file(out + "/adapter/adapter_model.safetensors"));
  }
}

}  // namespace
}  // namespace trainerd::worker
