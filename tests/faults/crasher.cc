// A Triton backend for tests only: its one model corrupts the server's heap on request, the way
// a use-after-free in the server process would, so that glibc aborts inside malloc while it
// holds the allocator's lock. What happens next is the question tests/server/test_stalls.py asks:
// Triton 2.51's own fatal-signal handler allocates and blocks forever (the server keeps
// answering "ready" and serves nothing); the admission gate's handler ends the process.
// Built by the test with the host's C++ compiler; never part of a deployment.
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "triton_api.h"

extern "C" {

TRITONSERVER_Error* TRITONBACKEND_ModelInstanceExecute(TRITONBACKEND_ModelInstance*, TRITONBACKEND_Request**,
                                                       const uint32_t) {
  // A chunk too large for the thread cache goes to the unsorted bin when freed; overwrite its
  // back link with a readable address whose forward link is not the chunk (the guard's zeroed
  // data), then ask for the same size: malloc walks the unsorted bin and aborts with
  // "malloc(): unsorted double linked list corrupted", the line seen in production.
  auto* victim = static_cast<uintptr_t*>(std::malloc(0x500));
  auto* guard = static_cast<uintptr_t*>(std::malloc(0x40));
  std::memset(guard, 0, 0x40);
  std::free(victim);
  victim[1] = reinterpret_cast<uintptr_t>(guard) - 2 * sizeof(uintptr_t);
  // malloc takes the unsorted bin from its oldest chunk, and an older free chunk of the same
  // size is returned before the victim is looked at (the heap's state decides: a single call
  // missed the victim once in CI). Keep asking, leaking what comes back, until it is reached.
  for (int i = 0; i < 100000; ++i) {
    if (std::malloc(0x500) == nullptr) break;
  }
  return nullptr;  // not reached
}

}  // extern "C"
