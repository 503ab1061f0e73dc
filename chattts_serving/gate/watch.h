// The admission watch (`chattts_admission`, watch.cc): a model of the gate's backend whose
// subscribers learn whether each door is full, and the board of loaded gates it reads.
#pragma once

#include <cstdint>
#include <string>

#include "triton_api.h"

namespace chattts_gate __attribute__((visibility("hidden"))) {

struct Gate;
struct Watch;

// A gate has loaded: put it on the board under its name (a reload's new gate replaces the old
// one) and announce it to the watch.
void Post(const Gate* g);

// A gate is unloading: take it off the board (unless a reload's gate took its place) and end
// every subscription of the watch (docs/triton-workarounds.md, "watch subscriptions at unload").
void Withdraw(const Gate* g);

// Start the watch of `doors` (the config parameter watch_models: comma-separated gate names)
// with the config's cancel_poll_ms and heartbeat_ms (`json`: the model config in Triton's JSON
// form); on success `*watch` is the running watch, else an INVALID_ARG error.
TRITONSERVER_Error* WatchInitialize(const std::string& json, const std::string& doors, Watch** watch);

// Subscriptions: each request's factory goes to the watch's worker, which answers it at once
// with the doors' state; the request itself is released here (nothing of it is read).
TRITONSERVER_Error* WatchExecute(Watch* w, TRITONBACKEND_ModelInstance* instance, TRITONBACKEND_Request** requests,
                                 uint32_t count);

// Stop the watch: its worker ends what subscriptions are left, then `w` is deleted (Triton
// unloads the watch once no subscription holds it).
void WatchFinalize(Watch* w);

}  // namespace chattts_gate
