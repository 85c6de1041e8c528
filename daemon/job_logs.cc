#include "daemon/job_logs.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <string_view>
#include <utility>

namespace trainerd::daemon {
namespace {

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

StatusOr<std::vector<std::string>> ReadLogTail(const std::string& path, int64_t tail) {
  std::vector<std::string> lines;
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    if (errno == ENOENT) return lines;  // nothing logged yet
    return Status::Error("reading " + path + ": " + std::strerror(errno));
  }
  in.seekg(0, std::ios::end);
  const int64_t size = static_cast<int64_t>(in.tellg());
  const int64_t start = size > kMaxLogTailBytes ? size - kMaxLogTailBytes : 0;
  in.seekg(start);
  std::string text(static_cast<size_t>(size - start), '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  size_t pos = 0;
  if (start > 0) {  // drop the partial first line
    const size_t nl = text.find('\n');
    pos = nl == std::string::npos ? text.size() : nl + 1;
  }
  std::string_view view(text);
  while (pos < view.size()) {
    size_t nl = view.find('\n', pos);
    if (nl == std::string_view::npos) nl = view.size();
    lines.emplace_back(view.substr(pos, nl - pos));
    pos = nl + 1;
  }
  if (tail > 0 && lines.size() > static_cast<size_t>(tail)) {
    lines.erase(lines.begin(), lines.end() - tail);
  }
  return lines;
}

JobLogs::~JobLogs() {
  for (const auto& [id, fd] : files_) ::close(fd);
}

Status JobLogs::Open(int64_t id, const std::string& path) {
  if (files_.count(id)) return Status::Ok();
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0640);
  if (fd < 0) return Status::Error("opening job " + std::to_string(id) + "'s log " + path + ": " + std::strerror(errno));
  files_[id] = fd;
  return Status::Ok();
}

Status JobLogs::Append(int64_t id, const std::string& line) {
  Status status;
  auto file = files_.find(id);
  if (file != files_.end()) {
    std::string text = line + "\n";
    size_t done = 0;
    while (done < text.size()) {
      const ssize_t n = ::write(file->second, text.data() + done, text.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        status = Status::Error("writing job " + std::to_string(id) + "'s log: " + std::strerror(errno));
        break;
      }
      done += static_cast<size_t>(n);
    }
  }
  auto followers = followers_.find(id);
  if (followers != followers_.end() && !followers->second.empty()) {
    proto::Reply reply;
    proto::LogLine* out = reply.mutable_logs()->add_lines();
    out->set_unix_ms(NowMs());
    out->set_text(line);
    for (ReplyWriter& writer : followers->second) writer.Send(reply);
  }
  return status;
}

void JobLogs::Close(int64_t id) {
  auto file = files_.find(id);
  if (file != files_.end()) {
    ::close(file->second);
    files_.erase(file);
  }
  auto followers = followers_.find(id);
  if (followers == followers_.end()) return;
  std::list<ReplyWriter> ending = std::move(followers->second);
  followers_.erase(followers);
  for (ReplyWriter& writer : ending) writer.EndStream();
}

void JobLogs::Follow(int64_t id, ReplyWriter writer) {
  std::list<ReplyWriter>& list = followers_[id];
  auto it = list.insert(list.end(), std::move(writer));
  // The connection went away: forget the follower (never called after EndStream).
  it->OnClose([this, id, it] {
    auto followers = followers_.find(id);
    if (followers == followers_.end()) return;
    followers->second.erase(it);
    if (followers->second.empty()) followers_.erase(followers);
  });
}

size_t JobLogs::follower_count(int64_t id) const {
  auto it = followers_.find(id);
  return it == followers_.end() ? 0 : it->second.size();
}

}  // namespace trainerd::daemon
