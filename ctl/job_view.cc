#include "ctl/job_view.h"

#include <algorithm>
#include <utility>

#include "ctl/format.h"
#include "ctl/table.h"

namespace trainerd::ctl {
namespace {

std::string NameOf(const ViewOptions& options, uint32_t uid) {
  return options.user_name ? options.user_name(uid) : UserName(uid);
}

std::string Coloured(const ViewOptions& options, const std::string& text, const std::string& sgr) {
  if (!options.colour || sgr.empty()) return text;
  return "\x1b[" + sgr + "m" + text + "\x1b[0m";
}

}  // namespace

std::string StateSgr(proto::JobState state) {
  switch (state) {
    case proto::JOB_STATE_QUEUED:
      return "33";
    case proto::JOB_STATE_RUNNING:
      return "36";
    case proto::JOB_STATE_SUCCEEDED:
      return "32";
    case proto::JOB_STATE_FAILED:
      return "31";
    case proto::JOB_STATE_CANCELLED:
      return "2";
    case proto::JOB_STATE_INTERRUPTED:
      return "35";
    default:
      return "";
  }
}

std::string RenderJobTable(const std::vector<proto::Job>& jobs, const ViewOptions& options) {
  using Align = Table::Align;
  Table table({{"ID", Align::kRight},
               {"NAME"},
               {"STATE"},
               {"OWNER"},
               {"PRIORITY", Align::kRight},
               {"PROGRESS"},
               {"SUBMITTED"},
               {"DEVICE"}});
  for (const proto::Job& job : jobs) {
    table.AddRow({std::to_string(job.id()), job.name(),
                  Table::Cell(JobStateName(static_cast<int>(job.state())), StateSgr(job.state())),
                  NameOf(options, job.owner_uid()), std::to_string(job.priority()),
                  ProgressSummary(job.progress().step(), job.progress().total_steps()),
                  options.terminal ? FormatAgo(job.submitted_unix_ms(), options.now_unix_ms)
                                   : FormatLocalTime(job.submitted_unix_ms()),
                  job.device().empty() ? "-" : job.device()});
  }
  return table.Render(options.colour);
}

std::string RenderJobStatus(const proto::Job& job, const ViewOptions& options) {
  const proto::Progress& p = job.progress();
  const proto::JobResult& r = job.result();
  const bool running = job.state() == proto::JOB_STATE_RUNNING;
  std::vector<std::pair<std::string, std::string>> fields;
  auto add = [&fields](std::string label, std::string value) {
    fields.emplace_back(std::move(label), std::move(value));
  };
  auto when = [&options](int64_t unix_ms) {
    return FormatLocalTime(unix_ms) + " (" + FormatAgo(unix_ms, options.now_unix_ms) + ")";
  };

  const std::string owner = NameOf(options, job.owner_uid());
  add("owner", owner == std::to_string(job.owner_uid()) ? "uid " + owner
                                                          : owner + " (uid " + std::to_string(job.owner_uid()) + ")");
  add("priority", std::to_string(job.priority()));
  if (!job.device().empty()) add("device", job.device());
  if (job.attempt() > 0) add("attempt", std::to_string(job.attempt()));
  if (p.total_steps() > 0 || p.step() > 0) {
    std::string progress;
    if (p.total_steps() > 0) {
      progress = ProgressBar(p.step(), p.total_steps()) + "  step " + std::to_string(p.step()) + "/" +
                 std::to_string(p.total_steps());
    } else {
      progress = "step " + std::to_string(p.step());
    }
    if (p.epoch() > 0) progress += "  epoch " + FormatFixed(p.epoch(), 2);
    add("progress", progress);
  }
  if (p.step() > 0) add("loss", FormatFixed(p.loss(), 4));
  const double eval_loss = p.eval_loss() != 0 ? p.eval_loss() : r.eval_loss();
  if (eval_loss != 0) add("eval loss", FormatFixed(eval_loss, 4));
  if (p.step() > 0) add("learning rate", FormatScientific(p.learning_rate()));
  if (p.grad_norm() != 0) add("grad norm", FormatFixed(p.grad_norm(), 3));
  if (p.tokens_per_second() > 0) {
    add("tokens/s", FormatCount(static_cast<int64_t>(p.tokens_per_second() + 0.5)));
  }
  if (p.mfu() > 0) add("MFU", FormatFixed(p.mfu() * 100, 1) + "%");
  if (p.peak_memory_bytes() > 0) add("peak GPU memory", FormatBytes(p.peak_memory_bytes()));
  if (p.elapsed_seconds() > 0) add("elapsed", FormatDuration(p.elapsed_seconds()));
  if (running && p.eta_seconds() > 0) add("ETA", FormatDuration(p.eta_seconds()));
  if (job.submitted_unix_ms() != 0) add("submitted", when(job.submitted_unix_ms()));
  if (job.started_unix_ms() != 0) add("started", when(job.started_unix_ms()));
  if (job.finished_unix_ms() != 0) add("finished", when(job.finished_unix_ms()));
  if (!job.output_dir().empty()) add("output dir", job.output_dir());
  if (!r.output_path().empty()) add("output", r.output_path());
  if (!job.reason().empty()) add("reason", job.reason());
  if (r.signal() != 0) {
    add("worker", "killed by " + SignalName(r.signal()) + " (signal " + std::to_string(r.signal()) + ")");
  } else if (r.exit_code() != 0) {
    add("worker", "exit code " + std::to_string(r.exit_code()));
  }
  if (!job.spec().source().empty()) add("spec", job.spec().source());

  size_t width = 0;
  for (const auto& field : fields) width = std::max(width, field.first.size() + 1);
  std::string out = "job " + std::to_string(job.id()) + " (" + job.name() + "): " +
                    Coloured(options, JobStateName(static_cast<int>(job.state())), StateSgr(job.state())) + "\n";
  // A value of several lines (a reason quoting the worker's last lines)
  // continues in the value column.
  const std::string indent(2 + width + 2, ' ');
  for (const auto& [label, value] : fields) {
    std::string key = label + ":";
    key.append(width - key.size(), ' ');
    out += "  " + key + "  ";
    for (size_t at = 0;;) {
      const size_t nl = value.find('\n', at);
      out.append(value, at, nl == std::string::npos ? std::string::npos : nl - at);
      out += '\n';
      if (nl == std::string::npos || nl + 1 == value.size()) break;
      at = nl + 1;
      out += indent;
    }
  }
  return out;
}

}  // namespace trainerd::ctl
