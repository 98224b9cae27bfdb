// placeenv.sim: a simulated accelerator for Paddle's CustomDevice runtime C API.
//
// Device memory is host memory, copies are memcpy, streams and events are
// tokens, and everything is synchronous. What it gives a CPU-only machine is N
// real Paddle places `sim:0..N-1`, so device isolation can be tested without GPUs.
// The current device is tracked per OS thread, as the CUDA runtime does.
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <new>

#include "paddle/phi/backends/device_ext.h"

namespace {

constexpr size_t kTotalMemory = size_t(8) << 30;  // reported per device
constexpr size_t kAlignment = 64;

size_t g_device_count = 4;
std::atomic<size_t> g_used[64];
thread_local int t_current_device = 0;

struct Token {
  int device;
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
  *stream = reinterpret_cast<C_Stream>(new Token{device ? device->id : 0});
  return C_SUCCESS;
}

C_Status destroy_stream(const C_Device, C_Stream stream) {
  delete reinterpret_cast<Token*>(stream);
  return C_SUCCESS;
}

C_Status query_stream(const C_Device, C_Stream) { return C_SUCCESS; }

C_Status stream_add_callback(const C_Device device, C_Stream stream,
                             C_Callback callback, void* user_data) {
  C_Status status = C_SUCCESS;
  callback(device, stream, user_data, &status);  // work is already done
  return status;
}

C_Status create_event(const C_Device device, C_Event* event) {
  *event = reinterpret_cast<C_Event>(new Token{device ? device->id : 0});
  return C_SUCCESS;
}

C_Status record_event(const C_Device, C_Stream, C_Event) { return C_SUCCESS; }

C_Status destroy_event(const C_Device, C_Event event) {
  delete reinterpret_cast<Token*>(event);
  return C_SUCCESS;
}

C_Status query_event(const C_Device, C_Event) { return C_SUCCESS; }
C_Status sync_device(const C_Device) { return C_SUCCESS; }
C_Status sync_stream(const C_Device, C_Stream) { return C_SUCCESS; }
C_Status sync_event(const C_Device, C_Event) { return C_SUCCESS; }
C_Status stream_wait_event(const C_Device, C_Stream, C_Event) { return C_SUCCESS; }

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

C_Status memory_copy(const C_Device, void* dst, const void* src, size_t size) {
  if (size) std::memcpy(dst, src, size);
  return C_SUCCESS;
}

C_Status async_memory_copy(const C_Device, C_Stream, void* dst, const void* src,
                           size_t size) {
  if (size) std::memcpy(dst, src, size);
  return C_SUCCESS;
}

C_Status memory_copy_p2p(const C_Device, const C_Device, void* dst, const void* src,
                         size_t size) {
  if (size) std::memcpy(dst, src, size);
  return C_SUCCESS;
}

C_Status async_memory_copy_p2p(const C_Device, const C_Device, C_Stream, void* dst,
                               const void* src, size_t size) {
  if (size) std::memcpy(dst, src, size);
  return C_SUCCESS;
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

}  // namespace

extern "C" void InitPlugin(CustomRuntimeParams* params) {
  PADDLE_CUSTOM_RUNTIME_CHECK_VERSION(params);

  const char* env = std::getenv("PLACEENV_SIM_DEVICES");
  if (env != nullptr) {
    long n = std::strtol(env, nullptr, 10);
    if (n >= 1 && n <= 64) g_device_count = static_cast<size_t>(n);
  }

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
  api->memory_copy_h2d = memory_copy;
  api->memory_copy_d2h = memory_copy;
  api->memory_copy_d2d = memory_copy;
  api->memory_copy_p2p = memory_copy_p2p;
  api->async_memory_copy_h2d = async_memory_copy;
  api->async_memory_copy_d2h = async_memory_copy;
  api->async_memory_copy_d2d = async_memory_copy;
  api->async_memory_copy_p2p = async_memory_copy_p2p;
  api->get_device_count = get_device_count;
  api->get_device_list = get_device_list;
  api->device_memory_stats = memory_stats;
  api->device_min_chunk_size = min_chunk_size;
}
