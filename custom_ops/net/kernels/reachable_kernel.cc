// Tfps>CheckReachable: a TCP connection to each address, within a deadline.
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/op_requires.h"

namespace tfps {
namespace {

using Clock = std::chrono::steady_clock;

// Splits "[protocol://]host:port" (host may be "[v6]"); false if there is no port.
bool SplitAddress(std::string address, std::string* host, std::string* port) {
  const size_t scheme = address.find("://");
  if (scheme != std::string::npos) address = address.substr(scheme + 3);
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon + 1 == address.size() || colon == 0) return false;
  *host = address.substr(0, colon);
  *port = address.substr(colon + 1);
  if (host->size() >= 2 && host->front() == '[' && host->back() == ']') {
    *host = host->substr(1, host->size() - 2);
  }
  return port->find_first_not_of("0123456789") == std::string::npos;
}

// One attempt to connect to any address of host:port, waiting at most `wait`; on failure
// `why` says what went wrong.
bool ConnectOnce(const std::string& host, const std::string& port, Clock::duration wait,
                 std::string* why) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int resolved = getaddrinfo(host.c_str(), port.c_str(), &hints, &found);
  if (resolved != 0) {
    *why = absl::StrCat("cannot resolve ", host, ": ", gai_strerror(resolved));
    return false;
  }
  bool connected = false;
  const int wait_ms = static_cast<int>(
      std::max<int64_t>(1, std::chrono::duration_cast<std::chrono::milliseconds>(wait).count()));
  for (addrinfo* a = found; a != nullptr && !connected; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      *why = absl::StrCat("socket: ", std::strerror(errno));
      continue;
    }
    int error = connect(fd, a->ai_addr, a->ai_addrlen) == 0 ? 0 : errno;
    if (error == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      const int ready = poll(&p, 1, wait_ms);
      socklen_t length = sizeof(error);
      if (ready == 1) {
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length);
      } else {
        error = ready == 0 ? ETIMEDOUT : errno;
      }
    }
    close(fd);
    if (error == 0) {
      connected = true;
    } else {
      *why = std::strerror(error);
    }
  }
  freeaddrinfo(found);
  return connected;
}

class CheckReachableOp : public ::tensorflow::OpKernel {
 public:
  explicit CheckReachableOp(::tensorflow::OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("timeout_seconds", &timeout_seconds_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("what", &what_));
    OP_REQUIRES(ctx, std::isfinite(timeout_seconds_) && timeout_seconds_ >= 0 && timeout_seconds_ <= 86400,
                absl::InvalidArgumentError(absl::StrCat(
                    "Tfps>CheckReachable: timeout_seconds must be in [0, 86400], got ", timeout_seconds_)));
  }

  void Compute(::tensorflow::OpKernelContext* ctx) override {
    const ::tensorflow::Tensor& addresses = ctx->input(0);
    OP_REQUIRES(ctx, addresses.dims() == 1,
                absl::InvalidArgumentError(absl::StrCat(
                    "Tfps>CheckReachable: addresses must be a vector, got shape ",
                    addresses.shape().DebugString())));
    const auto flat = addresses.flat<::tensorflow::tstring>();
    const Clock::time_point deadline =
        Clock::now() + std::chrono::duration_cast<Clock::duration>(
                           std::chrono::duration<double>(timeout_seconds_));
    for (int64_t i = 0; i < flat.size(); ++i) {
      const std::string address(flat(i));
      std::string host, port, why = "no attempt";
      OP_REQUIRES(ctx, SplitAddress(address, &host, &port),
                  absl::InvalidArgumentError(absl::StrCat(
                      "Tfps>CheckReachable: ", what_, " has the address '", address,
                      "', which is not host:port")));
      while (true) {
        const Clock::duration left = deadline - Clock::now();
        // One attempt waits at most 5 s, so a refused or lost connection is tried again.
        if (ConnectOnce(host, port, std::min<Clock::duration>(std::max(left, Clock::duration::zero()),
                                                              std::chrono::seconds(5)),
                        &why)) {
          break;
        }
        OP_REQUIRES(ctx, !ctx->cancellation_manager() || !ctx->cancellation_manager()->IsCancelled(),
                    absl::CancelledError(absl::StrCat("Tfps>CheckReachable: cancelled while trying ",
                                                      address)));
        OP_REQUIRES(ctx, Clock::now() < deadline,
                    absl::DeadlineExceededError(absl::StrCat(
                        "tfps: this task cannot reach ", what_, " at ", address, " (", why,
                        ", for ", timeout_seconds_, " s); every address one task hands another "
                        "must be one the other reaches")));
        std::this_thread::sleep_for(std::min<Clock::duration>(deadline - Clock::now(),
                                                              std::chrono::milliseconds(200)));
      }
    }
  }

 private:
  float timeout_seconds_ = 0;
  std::string what_;
};

REGISTER_KERNEL_BUILDER(Name("Tfps>CheckReachable").Device(::tensorflow::DEVICE_CPU), CheckReachableOp);

}  // namespace
}  // namespace tfps
