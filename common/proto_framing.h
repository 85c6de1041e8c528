// Protobuf messages as frame payloads (common/framing.h frames the bytes).
//
// Includes protobuf headers: only for protobuf-side code (daemon, client, the
// worker's event writer), never in a translation unit that includes torch
// (shared/gpu/README.md, trap 1). Target: trainerd_proto_framing.
#pragma once

#include <string>
#include <string_view>

#include "common/framing.h"
#include "common/status.h"

namespace trainerd {

// The serialized bytes of `message`, to pass to EncodeFrame or WriteFrame.
// M is a generated message class (proto/trainerd.pb.h).
template <class M>
std::string Serialize(const M& message) {
  return message.SerializeAsString();
}

// Parses a frame's payload into `*out` (cleared first). Error: "not a valid
// trainerd.proto.Request (N bytes)" when the bytes are not such a message.
template <class M>
Status ParseFrame(std::string_view payload, M* out) {
  if (payload.size() > kMaxFrameBytes ||
      !out->ParseFromArray(payload.data(), static_cast<int>(payload.size()))) {
    return Status::Error("not a valid " + std::string(M::descriptor()->full_name()) + " (" +
                         std::to_string(payload.size()) + " bytes)");
  }
  return Status::Ok();
}

}  // namespace trainerd
