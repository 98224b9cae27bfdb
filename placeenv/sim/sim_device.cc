// placeenv.sim: a simulated accelerator for Paddle's CustomDevice runtime C API.
//
// Device memory is host memory and copies are memcpy. What it gives a CPU-only
// machine is N real Paddle places `sim:0..N-1`, so device isolation can be
// tested without GPUs. The current device is tracked per OS thread, as the CUDA
// runtime does.
//
// Device time (off by default; docs/library.md, "Device time on sim devices").
// PLACEENV_SIM_TRANSFER_US and PLACEENV_SIM_GBPS give every transfer into, out
// of or within a device's memory a device time: the fixed term plus bytes over
// the bandwidth. Sim has no kernels of its own: Paddle runs each op with a CPU
// kernel and moves its inputs off the device first, so a program's transfers
// are where its kernels are, and they stand for them. Each device runs its work
// on one timeline, one item after another; devices run in parallel. The data
// moves at once; only the time is simulated. The host waits where a GPU's host
// waits: in a synchronous copy (for the work queued before it and the copy
// itself) and in a stream, device or event synchronize, by sleeping in the
// calling thread (no CPU, and whatever GIL state Paddle holds there).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <thread>

#include "paddle/phi/backends/device_ext.h"

namespace {

constexpr size_t kTotalMemory = size_t(8) << 30;  // reported per device
constexpr size_t kAlignment = 64;

constexpr int kMaxDevices = 64;

using Clock = std::chrono::steady_clock;

size_t g_device_count = 4;
std::atomic<size_t> g_used[kMaxDevices];
thread_local int t_current_device = 0;

int64_t g_transfer_ns = 0;     // device time of every transfer, fixed term
double g_ns_per_byte = 0.0;    // and per byte (1 / bandwidth)

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

// One device's timeline: when the work queued so far is done, and what it has done.
struct Timeline {
  std::mutex lock;
  int64_t busy_until = 0;  // steady-clock ns
  uint64_t transfers = 0, bytes = 0, device_ns = 0, waits = 0, wait_ns = 0;
  uint64_t uploads = 0, downloads = 0;  // host to device, device to host (the rest stay on devices)
};
Timeline g_timeline[kMaxDevices];

// Which way a copy goes: the counters tell a program's round trips through the host from its copies
// that stay on devices.
enum Direction { kUpload, kDownload, kWithin };

// Queues a transfer of `size` bytes on `device`; returns when it will be done.
int64_t enqueue(int device, size_t size, Direction direction) {
  Timeline& t = g_timeline[device];
  // At most 1000 s a transfer: the settings are clamped, and this keeps busy_until far from overflow.
  double per_byte = std::min(g_ns_per_byte * static_cast<double>(size), 1e12);
  int64_t cost = std::min<int64_t>(g_transfer_ns + static_cast<int64_t>(per_byte), int64_t(1e12));
  std::lock_guard<std::mutex> guard(t.lock);
  t.busy_until = std::max(t.busy_until, now_ns()) + cost;
  t.transfers += 1;
  t.uploads += direction == kUpload;
  t.downloads += direction == kDownload;
  t.bytes += size;
  t.device_ns += static_cast<uint64_t>(cost);
  return t.busy_until;
}

int64_t done_at(int device) {
  std::lock_guard<std::mutex> guard(g_timeline[device].lock);
  return g_timeline[device].busy_until;
}

// The host waits for `until` on `device`: a sleep, with no lock held, so other devices go on.
void wait_until(int device, int64_t until) {
  int64_t now = now_ns();
  if (until <= now) return;
  std::this_thread::sleep_until(Clock::time_point(std::chrono::nanoseconds(until)));
  Timeline& t = g_timeline[device];
  std::lock_guard<std::mutex> guard(t.lock);
  t.waits += 1;
  t.wait_ns += static_cast<uint64_t>(until - now);
}

struct Token {
  int device;
  std::atomic<int64_t> at{0};  // an event: when the work before its record is done (any thread reads it)
};

bool valid(const C_Device device) {
  return device != nullptr && device->id >= 0 &&
         static_cast<size_t>(device->id) < g_device_count;
}

C_Status init_device(const C_Device device) { return valid(device) ? C_SUCCESS : C_ERROR; }
C_Status deinit_device(const C_Device device) { return valid(device) ? C_SUCCESS : C_ERROR; }

C_Status set_device(const C_Device device) {
  if (!valid(device)) return C_ERROR;
  t_current_device = device->id;
  return C_SUCCESS;
}

C_Status get_device(const C_Device device) {
  if (device == nullptr) return C_ERROR;
  device->id = t_current_device;
  return C_SUCCESS;
}

C_Status create_stream(const C_Device device, C_Stream* stream) {
  Token* token = new Token;
  token->device = device ? device->id : 0;
  *stream = reinterpret_cast<C_Stream>(token);
  return C_SUCCESS;
}

C_Status destroy_stream(const C_Device, C_Stream stream) {
  delete reinterpret_cast<Token*>(stream);
  return C_SUCCESS;
}

C_Status query_stream(const C_Device device, C_Stream) {
  return !valid(device) || done_at(device->id) <= now_ns() ? C_SUCCESS : C_ERROR;
}

C_Status stream_add_callback(const C_Device device, C_Stream stream,
                             C_Callback callback, void* user_data) {
  C_Status status = C_SUCCESS;
  // Run at once, not when the work is done: Paddle uses callbacks to free host buffers, and the
  // data has moved already.
  callback(device, stream, user_data, &status);
  return status;
}

C_Status create_event(const C_Device device, C_Event* event) {
  Token* token = new Token;
  token->device = device ? device->id : 0;
  *event = reinterpret_cast<C_Event>(token);
  return C_SUCCESS;
}

C_Status record_event(const C_Device device, C_Stream, C_Event event) {
  if (valid(device)) reinterpret_cast<Token*>(event)->at = done_at(device->id);
  return C_SUCCESS;
}

C_Status destroy_event(const C_Device, C_Event event) {
  delete reinterpret_cast<Token*>(event);
  return C_SUCCESS;
}

C_Status query_event(const C_Device, C_Event event) {
  return reinterpret_cast<Token*>(event)->at <= now_ns() ? C_SUCCESS : C_ERROR;
}

// One timeline a device: a stream's synchronize waits for all of the device's work.
C_Status sync_device(const C_Device device) {
  if (!valid(device)) return C_ERROR;
  wait_until(device->id, done_at(device->id));
  return C_SUCCESS;
}

C_Status sync_stream(const C_Device device, C_Stream) { return sync_device(device); }

C_Status sync_event(const C_Device device, C_Event event) {
  Token* token = reinterpret_cast<Token*>(event);
  wait_until(valid(device) ? device->id : token->device, token->at);
  return C_SUCCESS;
}

// The device's later work starts after the event: another device's, or its own (a no-op).
C_Status stream_wait_event(const C_Device device, C_Stream, C_Event event) {
  if (!valid(device)) return C_ERROR;
  Timeline& t = g_timeline[device->id];
  std::lock_guard<std::mutex> guard(t.lock);
  t.busy_until = std::max(t.busy_until, reinterpret_cast<Token*>(event)->at.load());
  return C_SUCCESS;
}

C_Status memory_allocate(const C_Device device, void** ptr, size_t size) {
  if (!valid(device)) return C_ERROR;
  size_t rounded = (size + kAlignment - 1) / kAlignment * kAlignment;
  void* p = std::aligned_alloc(kAlignment, rounded == 0 ? kAlignment : rounded);
  if (p == nullptr) return C_FAILED;
  g_used[device->id] += size;
  *ptr = p;
  return C_SUCCESS;
}

C_Status memory_deallocate(const C_Device device, void* ptr, size_t size) {
  if (!valid(device)) return C_ERROR;
  std::free(ptr);
  g_used[device->id] -= size;
  return C_SUCCESS;
}

C_Status host_allocate(const C_Device, void** ptr, size_t size) {
  *ptr = std::aligned_alloc(kAlignment, (size + kAlignment - 1) / kAlignment * kAlignment + kAlignment);
  return *ptr ? C_SUCCESS : C_FAILED;
}

C_Status host_deallocate(const C_Device, void* ptr, size_t) {
  std::free(ptr);
  return C_SUCCESS;
}

C_Status memory_set(const C_Device, void* ptr, unsigned char value, size_t size) {
  std::memset(ptr, value, size);
  return C_SUCCESS;
}

// A synchronous copy returns when it is done; an asynchronous one when it is queued.
C_Status copy(const C_Device device, void* dst, const void* src, size_t size, bool wait, Direction direction) {
  if (size) std::memcpy(dst, src, size);
  if (!valid(device)) return C_SUCCESS;
  int64_t done = enqueue(device->id, size, direction);
  if (wait) wait_until(device->id, done);
  return C_SUCCESS;
}

template <Direction direction>
C_Status memory_copy(const C_Device device, void* dst, const void* src, size_t size) {
  return copy(device, dst, src, size, true, direction);
}

template <Direction direction>
C_Status async_memory_copy(const C_Device device, C_Stream, void* dst, const void* src, size_t size) {
  return copy(device, dst, src, size, false, direction);
}

// Peer copies are charged to the device that issues them.
C_Status memory_copy_p2p(const C_Device device, const C_Device, void* dst, const void* src, size_t size) {
  return copy(device, dst, src, size, true, kWithin);
}

C_Status async_memory_copy_p2p(const C_Device device, const C_Device, C_Stream, void* dst,
                               const void* src, size_t size) {
  return copy(device, dst, src, size, false, kWithin);
}

C_Status get_device_count(size_t* count) {
  *count = g_device_count;
  return C_SUCCESS;
}

C_Status get_device_list(size_t* devices) {
  for (size_t i = 0; i < g_device_count; ++i) devices[i] = i;
  return C_SUCCESS;
}

C_Status memory_stats(const C_Device device, size_t* total, size_t* free_memory) {
  if (!valid(device)) return C_ERROR;
  size_t used = g_used[device->id];
  *total = kTotalMemory;
  *free_memory = used < kTotalMemory ? kTotalMemory - used : 0;
  return C_SUCCESS;
}

C_Status min_chunk_size(const C_Device, size_t* size) {
  *size = 512;
  return C_SUCCESS;
}

// A non-negative number from the environment, at most 10^9 (placeenv.sim checks what it writes).
int64_t setting(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? 0 : std::clamp(std::strtoll(value, nullptr, 10), 0LL, 1000000000LL);
}

}  // namespace

// placeenv.sim.stats(): one device's counters, for tests, benchmarks and the service's metrics.
// out: transfers, bytes, device ns, host waits, host wait ns, device memory in use (bytes), uploads,
// downloads.
extern "C" int placeenv_sim_stats(int device, uint64_t* out) {
  if (device < 0 || static_cast<size_t>(device) >= g_device_count) return -1;
  Timeline& t = g_timeline[device];
  std::lock_guard<std::mutex> guard(t.lock);
  uint64_t values[] = {t.transfers, t.bytes, t.device_ns, t.waits, t.wait_ns, g_used[device].load(),
                       t.uploads, t.downloads};
  std::memcpy(out, values, sizeof values);
  return 0;
}

extern "C" void InitPlugin(CustomRuntimeParams* params) {
  PADDLE_CUSTOM_RUNTIME_CHECK_VERSION(params);

  const char* env = std::getenv("PLACEENV_SIM_DEVICES");
  if (env != nullptr) {
    long n = std::strtol(env, nullptr, 10);
    if (n >= 1 && n <= kMaxDevices) g_device_count = static_cast<size_t>(n);
  }

  g_transfer_ns = setting("PLACEENV_SIM_TRANSFER_US") * 1000;
  const char* gbps = std::getenv("PLACEENV_SIM_GBPS");
  double rate = gbps == nullptr ? 0.0 : std::strtod(gbps, nullptr);
  g_ns_per_byte = rate > 0 ? 1.0 / std::max(rate, 1e-6) : 0.0;  // 1 GB/s is 1 byte a ns; at least 1 kB/s

  params->device_type = const_cast<char*>("sim");
  params->sub_device_type = const_cast<char*>("v1");

  C_DeviceInterface* api = params->interface;
  api->init_device = init_device;
  api->deinit_device = deinit_device;
  api->set_device = set_device;
  api->get_device = get_device;
  api->create_stream = create_stream;
  api->destroy_stream = destroy_stream;
  api->query_stream = query_stream;
  api->stream_add_callback = stream_add_callback;
  api->create_event = create_event;
  api->record_event = record_event;
  api->destroy_event = destroy_event;
  api->query_event = query_event;
  api->synchronize_device = sync_device;
  api->synchronize_stream = sync_stream;
  api->synchronize_event = sync_event;
  api->stream_wait_event = stream_wait_event;
  api->device_memory_allocate = memory_allocate;
  api->device_memory_deallocate = memory_deallocate;
  api->device_memory_set = memory_set;
  api->host_memory_allocate = host_allocate;
  api->host_memory_deallocate = host_deallocate;
  api->memory_copy_h2d = memory_copy<kUpload>;
  api->memory_copy_d2h = memory_copy<kDownload>;
  api->memory_copy_d2d = memory_copy<kWithin>;
  api->memory_copy_p2p = memory_copy_p2p;
  api->async_memory_copy_h2d = async_memory_copy<kUpload>;
  api->async_memory_copy_d2h = async_memory_copy<kDownload>;
  api->async_memory_copy_d2d = async_memory_copy<kWithin>;
  api->async_memory_copy_p2p = async_memory_copy_p2p;
  api->get_device_count = get_device_count;
  api->get_device_list = get_device_list;
  api->device_memory_stats = memory_stats;
  api->device_min_chunk_size = min_chunk_size;
}
