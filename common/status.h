// Errors as values at module boundaries.
//
// A Status is either ok or carries a message meant for the user: it says what
// was wrong, where (file:line, YAML key, tensor name, job id) and, where there
// is one, what to do. StatusOr<T> holds a T or a non-ok Status.
// Header-only and dependency-free so that every library, torch or not, can use it.
#pragma once

#include <cassert>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace trainerd {

class [[nodiscard]] Status {
 public:
  Status() = default;  // ok
  static Status Ok() { return Status(); }
  static Status Error(std::string message) { return Status(std::move(message)); }
  // Several errors found in one pass (a job spec's), one a line in the message;
  // ok when there are none. Programs print each line with their prefix
  // (common/error_lines.h).
  static Status Errors(const std::vector<std::string>& errors) {
    if (errors.empty()) return Status();
    std::string message = errors[0];
    for (size_t i = 1; i < errors.size(); ++i) message += "\n" + errors[i];
    return Status(std::move(message));
  }

  bool ok() const { return !message_.has_value(); }
  explicit operator bool() const { return ok(); }
  // Empty for an ok status.
  const std::string& message() const {
    static const std::string kEmpty;
    return message_ ? *message_ : kEmpty;
  }
  // Prefixes context to an error ("loading model /m: " + message); ok stays ok.
  Status WithContext(const std::string& context) const {
    if (ok()) return *this;
    return Status(context + ": " + *message_);
  }

 private:
  explicit Status(std::string message) : message_(std::move(message)) {}
  std::optional<std::string> message_;
};

template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design
  StatusOr(Status status) : status_(std::move(status)) {  // NOLINT
    assert(!status_.ok() && "StatusOr built from an ok Status without a value");
  }

  bool ok() const { return value_.has_value(); }
  const Status& status() const { return status_; }
  const T& value() const& { return *value_; }
  T& value() & { return *value_; }
  T&& value() && { return std::move(*value_); }
  const T& operator*() const& { return *value_; }
  T& operator*() & { return *value_; }
  const T* operator->() const { return &*value_; }
  T* operator->() { return &*value_; }

 private:
  Status status_;
  std::optional<T> value_;
};

}  // namespace trainerd

// Returns the error of an expression yielding a Status, from a function returning Status.
#define TRAINERD_RETURN_IF_ERROR(expr)            \
  do {                                            \
    ::trainerd::Status trainerd_status_ = (expr); \
    if (!trainerd_status_.ok()) return trainerd_status_; \
  } while (0)

#define TRAINERD_CONCAT_INNER(a, b) a##b
#define TRAINERD_CONCAT(a, b) TRAINERD_CONCAT_INNER(a, b)
// Declares `lhs` from a StatusOr expression or returns its error.
#define TRAINERD_ASSIGN_OR_RETURN(lhs, expr) \
  TRAINERD_ASSIGN_OR_RETURN_IMPL(TRAINERD_CONCAT(trainerd_or_, __LINE__), lhs, expr)
#define TRAINERD_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                   \
  if (!tmp.ok()) return tmp.status();                  \
  lhs = std::move(tmp).value()
