// A Triton backend for tests only: its one model corrupts the server's heap on request, the way
// a use-after-free in the server process would, so that glibc aborts inside malloc while it
// holds the allocator's lock. What happens next is the question tests/server/test_stalls.py asks:
// Triton 2.51's own fatal-signal handler allocates and blocks forever (the server keeps
// answering "ready" and serves nothing); the admission gate's handler ends the process.
// Built by the test with the host's C++ compiler; never part of a deployment.
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include <unistd.h>

#include "triton_api.h"

namespace {

void Say(const char* s) { ::write(STDERR_FILENO, s, std::strlen(s)); }

// glibc's chunk header sits two words before the pointer malloc returns: the previous chunk's
// size, then this chunk's size with PREV_INUSE in bit 0.
uintptr_t ChunkSize(const void* p) { return static_cast<const uintptr_t*>(p)[-1] & ~uintptr_t{7}; }
bool PrevInUse(const void* p) { return (static_cast<const uintptr_t*>(p)[-1] & 1) != 0; }

}  // namespace

extern "C" {

TRITONSERVER_Error* TRITONBACKEND_ModelInstanceExecute(TRITONBACKEND_ModelInstance*, TRITONBACKEND_Request**,
                                                       const uint32_t) {
  Say("crasher: corrupting the heap\n");
  // A chunk too large for the thread cache goes to the unsorted bin when freed, unless it merges
  // with a free neighbour: a free chunk before it (then the bin holds the neighbour, and the
  // links overwritten below are plain data: once in CI the heap never aborted) or the top
  // chunk after it. So take a victim whose previous chunk is in use and whose next chunk is
  // the guard we hold (leaking the tries that are not).
  uintptr_t* victim = nullptr;
  uintptr_t* guard = nullptr;
  for (int i = 0; i < 10000; ++i) {
    auto* v = static_cast<uintptr_t*>(std::malloc(0x500));
    auto* g = static_cast<uintptr_t*>(std::malloc(0x40));
    if (v == nullptr || g == nullptr) break;
    if (PrevInUse(v) && reinterpret_cast<char*>(v) + ChunkSize(v) == reinterpret_cast<char*>(g)) {
      victim = v;
      guard = g;
      break;
    }
  }
  if (victim == nullptr) {
    Say("crasher: no victim chunk with both neighbours in use\n");
    return nullptr;
  }
  std::memset(guard, 0, 0x40);
  std::free(victim);
  // Overwrite the victim's back link with a readable address whose forward link is not the
  // victim (the guard's zeroed data), then ask for the same size: malloc walks the unsorted bin
  // and aborts with "malloc(): unsorted double linked list corrupted", the line seen in
  // production. It takes the bin from its oldest chunk, and older free chunks of the same size
  // are returned before the victim is looked at: keep asking, leaking what comes back.
  victim[1] = reinterpret_cast<uintptr_t>(guard) - 2 * sizeof(uintptr_t);
  for (int i = 0; i < 100000; ++i) {
    if (std::malloc(0x500) == nullptr) break;
  }
  Say("crasher: malloc never reached the corrupted chunk\n");
  return nullptr;
}

}  // extern "C"
