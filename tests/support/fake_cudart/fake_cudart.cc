// A fake CUDA runtime for CPU-only machines: the subset of libcudart's C API that the daemon
// binds (daemon/device/cuda_runtime.h: the CUDA IPC intake, the device reduce paths, the NCCL
// transport), plus cudaMemcpy for test code. Loaded through SPARSYNC_CUDART by the daemon and by
// workers, in place of libcudart.
//
//   device memory  memfd-backed host mappings; an IPC handle carries (pid, fd, size, id) and the
//                  importer maps /proc/<pid>/fd/<fd>, so two processes share the bytes as two
//                  processes share a real allocation through CUDA IPC.
//   pinned memory  cudaMallocHost: page-aligned host memory, tracked so that cudaFreeHost can
//                  refuse what it did not hand out.
//   events         a small shared memfd record whose counter each cudaEventRecord increments.
//   streams        work runs at once (copies are synchronous), in call order, so cudaStreamQuery
//                  always finds a stream drained.
//   devices        4, or as many as sparsync_fake_cuda_set_devices says (0: cudaGetDeviceCount
//                  fails with cudaErrorNoDevice, as on a machine without a GPU).
//
// It is stricter than CUDA where a real GPU would fail silently or later: waiting on an event
// that was never recorded, closing a handle that is not open, destroying an unknown event or
// stream, and copies that leave a device allocation fail and are listed as misuse
// (sparsync_fake_cuda_misuse). Every wait, record and copy is appended to a journal that tests
// read to check the order of operations (sparsync_fake_cuda_journal). sparsync_fake_cuda_fail_next
// makes the next cudaMalloc, cudaMallocHost, cudaMemcpyAsync or cudaStreamQuery fail with a given
// error; cudaGetLastError returns (and resets) the calling thread's last error.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace {

// Codes of cudaError_t (driver_types.h).
constexpr int kSuccess = 0;
constexpr int kInvalidValue = 1;
constexpr int kMemoryAllocation = 2;
constexpr int kNoDevice = 100;
constexpr int kInvalidDevice = 101;
constexpr int kInvalidResourceHandle = 400;
constexpr int kNotReady = 600;
constexpr int kHostMemoryAlreadyRegistered = 712;
constexpr int kHostMemoryNotRegistered = 713;

constexpr unsigned kInterprocess = 0x04;
constexpr unsigned kDisableTiming = 0x02;
constexpr uint32_t kMemMagic = 0x4d465343;    // handle of a fake allocation
constexpr uint32_t kEventMagic = 0x45465343;  // handle of a fake event

struct Handle {  // laid out in the 64 opaque bytes of cudaIpc{Mem,Event}Handle_t
  uint32_t magic;
  int32_t pid;
  int32_t fd;
  int32_t device;
  uint64_t bytes;
  uint64_t id;
  char unused[32];
};
static_assert(sizeof(Handle) == 64);

struct EventRecord {  // shared between the processes that hold the event
  uint64_t id;
  std::atomic<uint64_t> records;
};

struct Allocation {
  int fd = -1;
  size_t bytes = 0;
  size_t mapped = 0;
  int device = 0;
  uint64_t id = 0;
  bool imported = false;
  int refs = 0;  // imported: opens not yet closed
  int32_t owner_pid = 0;
};

struct Event {
  int fd = -1;
  EventRecord* record = nullptr;
  unsigned flags = 0;
  bool imported = false;
};

struct Stream {
  int device = 0;
};

struct State {
  std::mutex mu;
  std::map<uintptr_t, Allocation> allocations;                 // by base address
  std::map<std::pair<int32_t, uint64_t>, uintptr_t> imported;  // (pid, id) -> base
  std::map<void*, Event> events;
  std::set<void*> streams;
  std::map<uintptr_t, size_t> pinned;        // page-locked host ranges: start -> bytes
  std::map<void*, size_t> host_allocations;  // cudaMallocHost: start -> bytes
  std::map<std::string, int> fail_next;      // call name -> error to return once
  int devices = 4;
  std::vector<std::string> journal;
  std::vector<std::string> misuse;
  uint64_t next_id = 1;
};

State& S() {
  static State* state = new State;  // never destroyed: worker threads may call at exit
  return *state;
}

thread_local int current_device = 0;
thread_local int last_error = 0;  // cudaGetLastError

// Returns `code`, and makes it the calling thread's last error when it is one.
int Result(int code) {
  if (code != kSuccess) last_error = code;
  return code;
}

size_t PageRound(size_t bytes) {
  size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return std::max(page, (bytes + page - 1) / page * page);
}

int Misuse(State& s, int code, std::string what) {  // REQUIRES: s.mu held
  s.misuse.push_back(std::move(what));
  return Result(code);
}

// True, with *code set, when a failure was injected for `call`. REQUIRES: s.mu held.
bool TakeInjected(State& s, const char* call, int* code) {
  auto it = s.fail_next.find(call);
  if (it == s.fail_next.end()) return false;
  *code = Result(it->second);
  s.fail_next.erase(it);
  s.journal.push_back(std::string("fail ") + call);
  return true;
}

// The allocation holding [p, p + bytes), or null. REQUIRES: s.mu held.
const Allocation* Holding(State& s, const void* p, size_t bytes, uintptr_t* base = nullptr) {
  uintptr_t a = reinterpret_cast<uintptr_t>(p);
  auto it = s.allocations.upper_bound(a);
  if (it == s.allocations.begin()) return nullptr;
  --it;
  if (a < it->first || a + bytes > it->first + it->second.bytes || a + bytes < a) return nullptr;
  if (base) *base = it->first;
  return &it->second;
}

bool KnownStream(State& s, void* stream) { return stream == nullptr || s.streams.count(stream); }

std::string EventName(const Event& e) { return "E" + std::to_string(e.record->id); }

void* MapPeer(int32_t pid, int32_t fd, size_t bytes, int* out_fd) {
  std::string path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(fd);
  int local = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (local < 0) return nullptr;
  struct stat st {};
  if (fstat(local, &st) != 0 || static_cast<size_t>(st.st_size) < bytes) {
    close(local);
    return nullptr;
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, local, 0);
  if (p == MAP_FAILED) {
    close(local);
    return nullptr;
  }
  *out_fd = local;
  return p;
}

int Copy(void* dst, const void* src, size_t bytes, int kind, void* stream) {
  State& s = S();
  std::lock_guard lock(s.mu);
  if (!KnownStream(s, stream))
    return Misuse(s, kInvalidResourceHandle, "memcpy on an unknown stream");
  const char* name = nullptr;
  bool ok = false;
  switch (kind) {
    case 1:
      name = "H2D";
      ok = Holding(s, dst, bytes) != nullptr;
      break;
    case 2:
      name = "D2H";
      ok = Holding(s, src, bytes) != nullptr;
      break;
    case 3:
      name = "D2D";
      ok = Holding(s, dst, bytes) && Holding(s, src, bytes);
      break;
    default:
      return Misuse(s, kInvalidValue, "memcpy kind " + std::to_string(kind));
  }
  if (!ok) {
    return Misuse(s, kInvalidValue,
                  std::string(name) + " copy of " + std::to_string(bytes) +
                      " bytes outside a device allocation");
  }
  if (bytes) std::memmove(dst, src, bytes);
  s.journal.push_back(std::string(name) + " " + std::to_string(bytes));
  return kSuccess;
}

size_t CopyOut(const std::vector<std::string>& lines, char* buf, size_t len) {
  std::string all;
  for (const auto& l : lines) all += l + "\n";
  if (buf && len) {
    size_t n = std::min(all.size(), len - 1);
    std::memcpy(buf, all.data(), n);
    buf[n] = '\0';
  }
  return all.size();
}

}  // namespace

extern "C" {

int cudaGetDeviceCount(int* count) {
  State& s = S();
  std::lock_guard lock(s.mu);
  *count = s.devices;
  return Result(s.devices > 0 ? kSuccess : kNoDevice);
}

int cudaSetDevice(int device) {
  State& s = S();
  std::lock_guard lock(s.mu);
  if (device < 0 || device >= s.devices) return Result(s.devices > 0 ? kInvalidDevice : kNoDevice);
  current_device = device;
  return kSuccess;
}

int cudaGetLastError() { return std::exchange(last_error, kSuccess); }

int cudaGetDevice(int* device) {
  *device = current_device;
  return kSuccess;
}

int cudaMalloc(void** ptr, size_t bytes) {
  State& s = S();
  {
    std::lock_guard lock(s.mu);
    int code = kSuccess;
    if (TakeInjected(s, "cudaMalloc", &code)) return code;
  }
  size_t mapped = PageRound(bytes);
  int fd = memfd_create("fake-cuda", MFD_CLOEXEC);
  if (fd < 0 || ftruncate(fd, static_cast<off_t>(mapped)) != 0) {
    if (fd >= 0) close(fd);
    return kMemoryAllocation;
  }
  void* p = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    close(fd);
    return kMemoryAllocation;
  }
  std::lock_guard lock(s.mu);
  Allocation a;
  a.fd = fd;
  a.bytes = bytes;
  a.mapped = mapped;
  a.device = current_device;
  a.id = s.next_id++;
  a.owner_pid = getpid();
  s.allocations[reinterpret_cast<uintptr_t>(p)] = a;
  *ptr = p;
  return kSuccess;
}

int cudaFree(void* ptr) {
  State& s = S();
  std::lock_guard lock(s.mu);
  auto it = s.allocations.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == s.allocations.end() || it->second.imported) {
    return Misuse(s, kInvalidValue, "cudaFree of a pointer that cudaMalloc did not return");
  }
  munmap(ptr, it->second.mapped);
  close(it->second.fd);
  s.allocations.erase(it);
  return kSuccess;
}

int cudaIpcGetMemHandle(Handle* handle, void* ptr) {
  State& s = S();
  std::lock_guard lock(s.mu);
  auto it = s.allocations.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == s.allocations.end() || it->second.imported) {
    return Misuse(s, kInvalidValue,
                  "cudaIpcGetMemHandle of a pointer that is not the base of an "
                  "allocation of this process");
  }
  Handle h{};
  h.magic = kMemMagic;
  h.pid = getpid();
  h.fd = it->second.fd;
  h.device = it->second.device;
  h.bytes = it->second.bytes;
  h.id = it->second.id;
  *handle = h;
  return kSuccess;
}

int cudaIpcOpenMemHandle(void** ptr, Handle handle, unsigned flags) {
  State& s = S();
  std::lock_guard lock(s.mu);
  if (flags != 1) return Misuse(s, kInvalidValue, "cudaIpcOpenMemHandle flags must be 1");
  if (handle.magic != kMemMagic) return kInvalidResourceHandle;  // not a handle of ours
  auto key = std::make_pair(handle.pid, handle.id);
  if (auto it = s.imported.find(key); it != s.imported.end()) {
    ++s.allocations.at(it->second).refs;  // CUDA counts repeated opens in one context
    *ptr = reinterpret_cast<void*>(it->second);
    return kSuccess;
  }
  int fd = -1;
  size_t mapped = PageRound(handle.bytes);
  void* p = MapPeer(handle.pid, handle.fd, mapped, &fd);
  if (p == nullptr) return kInvalidResourceHandle;  // the exporter is gone or freed it
  Allocation a;
  a.fd = fd;
  a.bytes = handle.bytes;
  a.mapped = mapped;
  a.device = handle.device;
  a.id = handle.id;
  a.imported = true;
  a.refs = 1;
  a.owner_pid = handle.pid;
  s.allocations[reinterpret_cast<uintptr_t>(p)] = a;
  s.imported[key] = reinterpret_cast<uintptr_t>(p);
  *ptr = p;
  return kSuccess;
}

int cudaIpcCloseMemHandle(void* ptr) {
  State& s = S();
  std::lock_guard lock(s.mu);
  auto it = s.allocations.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == s.allocations.end() || !it->second.imported) {
    return Misuse(s, kInvalidValue, "cudaIpcCloseMemHandle of a pointer that is not open");
  }
  if (--it->second.refs > 0) return kSuccess;
  munmap(ptr, it->second.mapped);
  close(it->second.fd);
  s.imported.erase({it->second.owner_pid, it->second.id});
  s.allocations.erase(it);
  return kSuccess;
}

int cudaEventCreateWithFlags(void** event, unsigned flags) {
  State& s = S();
  int fd = memfd_create("fake-cuda-event", MFD_CLOEXEC);
  size_t mapped = PageRound(sizeof(EventRecord));
  if (fd < 0 || ftruncate(fd, static_cast<off_t>(mapped)) != 0) {
    if (fd >= 0) close(fd);
    return kMemoryAllocation;
  }
  void* p = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    close(fd);
    return kMemoryAllocation;
  }
  std::lock_guard lock(s.mu);
  auto* rec = new (p) EventRecord;
  rec->id = (static_cast<uint64_t>(getpid()) << 24) | s.next_id++;  // unique across processes
  rec->records = 0;
  Event e;
  e.fd = fd;
  e.record = rec;
  e.flags = flags;
  auto* key = new char;  // a unique cudaEvent_t value
  s.events[key] = e;
  *event = key;
  return kSuccess;
}

int cudaEventDestroy(void* event) {
  State& s = S();
  std::lock_guard lock(s.mu);
  auto it = s.events.find(event);
  if (it == s.events.end())
    return Misuse(s, kInvalidResourceHandle, "cudaEventDestroy of an unknown event");
  munmap(it->second.record, PageRound(sizeof(EventRecord)));
  close(it->second.fd);
  s.events.erase(it);
  delete static_cast<char*>(event);
  return kSuccess;
}

int cudaIpcGetEventHandle(Handle* handle, void* event) {
  State& s = S();
  std::lock_guard lock(s.mu);
  auto it = s.events.find(event);
  if (it == s.events.end())
    return Misuse(s, kInvalidResourceHandle, "cudaIpcGetEventHandle of an unknown event");
  if ((it->second.flags & (kInterprocess | kDisableTiming)) != (kInterprocess | kDisableTiming)) {
    return Misuse(s, kInvalidResourceHandle,
                  "cudaIpcGetEventHandle of an event without cudaEventInterprocess | "
                  "cudaEventDisableTiming");
  }
  Handle h{};
  h.magic = kEventMagic;
  h.pid = getpid();
  h.fd = it->second.fd;
  h.id = it->second.record->id;
  *handle = h;
  return kSuccess;
}

int cudaIpcOpenEventHandle(void** event, Handle handle) {
  State& s = S();
  if (handle.magic != kEventMagic) return kInvalidResourceHandle;
  int fd = -1;
  void* p = MapPeer(handle.pid, handle.fd, PageRound(sizeof(EventRecord)), &fd);
  if (p == nullptr) return kInvalidResourceHandle;
  std::lock_guard lock(s.mu);
  Event e;
  e.fd = fd;
  e.record = static_cast<EventRecord*>(p);
  e.flags = kInterprocess | kDisableTiming;
  e.imported = true;
  auto* key = new char;
  s.events[key] = e;
  *event = key;
  return kSuccess;
}

int cudaEventRecord(void* event, void* stream) {
  State& s = S();
  std::lock_guard lock(s.mu);
  auto it = s.events.find(event);
  if (it == s.events.end())
    return Misuse(s, kInvalidResourceHandle, "cudaEventRecord of an unknown event");
  if (!KnownStream(s, stream))
    return Misuse(s, kInvalidResourceHandle, "cudaEventRecord on an unknown stream");
  ++it->second.record->records;
  s.journal.push_back("record " + EventName(it->second));
  return kSuccess;
}

int cudaEventSynchronize(void* event) {
  State& s = S();
  std::lock_guard lock(s.mu);
  auto it = s.events.find(event);
  if (it == s.events.end())
    return Misuse(s, kInvalidResourceHandle, "cudaEventSynchronize of an unknown event");
  if (it->second.record->records == 0) {
    return Misuse(
        s, kNotReady,
        "cudaEventSynchronize of " + EventName(it->second) + ", which was never recorded");
  }
  return kSuccess;
}

int cudaStreamCreateWithFlags(void** stream, unsigned flags) {
  State& s = S();
  std::lock_guard lock(s.mu);
  auto* st = new Stream{current_device};
  s.streams.insert(st);
  *stream = st;
  return kSuccess;
}

int cudaStreamDestroy(void* stream) {
  State& s = S();
  std::lock_guard lock(s.mu);
  if (stream == nullptr || !s.streams.erase(stream)) {
    return Misuse(s, kInvalidResourceHandle, "cudaStreamDestroy of an unknown stream");
  }
  delete static_cast<Stream*>(stream);
  return kSuccess;
}

int cudaStreamWaitEvent(void* stream, void* event, unsigned flags) {
  State& s = S();
  std::lock_guard lock(s.mu);
  auto it = s.events.find(event);
  if (it == s.events.end())
    return Misuse(s, kInvalidResourceHandle, "cudaStreamWaitEvent on an unknown event");
  if (!KnownStream(s, stream))
    return Misuse(s, kInvalidResourceHandle, "cudaStreamWaitEvent of an unknown stream");
  // CUDA would not wait at all (a silent race): the fake refuses.
  if (it->second.record->records == 0) {
    return Misuse(s, kInvalidResourceHandle,
                  "cudaStreamWaitEvent on " + EventName(it->second) + ", which was never recorded");
  }
  s.journal.push_back("wait " + EventName(it->second));
  return kSuccess;
}

int cudaStreamSynchronize(void* stream) {
  State& s = S();
  std::lock_guard lock(s.mu);
  if (!KnownStream(s, stream))
    return Misuse(s, kInvalidResourceHandle, "cudaStreamSynchronize of an unknown stream");
  s.journal.push_back("sync");
  return kSuccess;
}

int cudaMemcpyAsync(void* dst, const void* src, size_t bytes, int kind, void* stream) {
  {
    State& s = S();
    std::lock_guard lock(s.mu);
    int code = kSuccess;
    if (TakeInjected(s, "cudaMemcpyAsync", &code)) return code;
  }
  return Copy(dst, src, bytes, kind, stream);
}

// Work runs at once, so every known stream has drained.
int cudaStreamQuery(void* stream) {
  State& s = S();
  std::lock_guard lock(s.mu);
  int code = kSuccess;
  if (TakeInjected(s, "cudaStreamQuery", &code)) return code;
  if (!KnownStream(s, stream))
    return Misuse(s, kInvalidResourceHandle, "cudaStreamQuery of an unknown stream");
  return kSuccess;
}

int cudaMallocHost(void** ptr, size_t bytes) {
  State& s = S();
  std::lock_guard lock(s.mu);
  int code = kSuccess;
  if (TakeInjected(s, "cudaMallocHost", &code)) return code;
  if (ptr == nullptr) return Misuse(s, kInvalidValue, "cudaMallocHost with a null pointer");
  void* p = std::aligned_alloc(static_cast<size_t>(sysconf(_SC_PAGESIZE)), PageRound(bytes));
  if (p == nullptr) return Result(kMemoryAllocation);
  s.host_allocations[p] = bytes;
  *ptr = p;
  return kSuccess;
}

int cudaFreeHost(void* ptr) {
  State& s = S();
  std::lock_guard lock(s.mu);
  auto it = s.host_allocations.find(ptr);
  if (it == s.host_allocations.end()) {
    return Misuse(s, kInvalidValue, "cudaFreeHost of a pointer that cudaMallocHost did not return");
  }
  s.host_allocations.erase(it);
  std::free(ptr);
  return kSuccess;
}

int cudaMemsetAsync(void* ptr, int value, size_t bytes, void* stream) {
  State& s = S();
  std::lock_guard lock(s.mu);
  if (!KnownStream(s, stream))
    return Misuse(s, kInvalidResourceHandle, "cudaMemsetAsync on an unknown stream");
  if (!Holding(s, ptr, bytes)) {
    return Misuse(s, kInvalidValue, "cudaMemsetAsync of " + std::to_string(bytes) +
                                        " bytes outside a device allocation");
  }
  if (bytes) std::memset(ptr, value, bytes);
  s.journal.push_back("memset " + std::to_string(bytes));
  return kSuccess;
}

// Page-locking is bookkeeping only; overlapping registrations and unknown ranges fail as in CUDA.
int cudaHostRegister(void* ptr, size_t bytes, unsigned flags) {
  State& s = S();
  std::lock_guard lock(s.mu);
  uintptr_t a = reinterpret_cast<uintptr_t>(ptr);
  if (ptr == nullptr || bytes == 0 || flags > 0x0f) {
    return Misuse(s, kInvalidValue, "cudaHostRegister of " + std::to_string(bytes) + " bytes");
  }
  auto next = s.pinned.lower_bound(a);
  bool overlaps = (next != s.pinned.end() && next->first < a + bytes) ||
                  (next != s.pinned.begin() && std::prev(next)->first + std::prev(next)->second > a);
  if (overlaps) return Misuse(s, kHostMemoryAlreadyRegistered, "cudaHostRegister twice");
  s.pinned[a] = bytes;
  s.journal.push_back("pin " + std::to_string(bytes));
  return kSuccess;
}

int cudaHostUnregister(void* ptr) {
  State& s = S();
  std::lock_guard lock(s.mu);
  auto it = s.pinned.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == s.pinned.end()) {
    return Misuse(s, kHostMemoryNotRegistered, "cudaHostUnregister of memory never registered");
  }
  s.journal.push_back("unpin " + std::to_string(it->second));
  s.pinned.erase(it);
  return kSuccess;
}

int cudaMemcpy(void* dst, const void* src, size_t bytes, int kind) {
  return Copy(dst, src, bytes, kind, nullptr);
}

const char* cudaGetErrorName(int error) {
  switch (error) {
    case kSuccess:
      return "cudaSuccess";
    case kInvalidValue:
      return "cudaErrorInvalidValue";
    case kMemoryAllocation:
      return "cudaErrorMemoryAllocation";
    case kNoDevice:
      return "cudaErrorNoDevice";
    case kInvalidDevice:
      return "cudaErrorInvalidDevice";
    case kInvalidResourceHandle:
      return "cudaErrorInvalidResourceHandle";
    case kNotReady:
      return "cudaErrorNotReady";
    case kHostMemoryAlreadyRegistered:
      return "cudaErrorHostMemoryAlreadyRegistered";
    case kHostMemoryNotRegistered:
      return "cudaErrorHostMemoryNotRegistered";
  }
  return "cudaErrorUnknown";
}

const char* cudaGetErrorString(int error) {
  switch (error) {
    case kSuccess:
      return "no error";
    case kInvalidValue:
      return "invalid argument";
    case kMemoryAllocation:
      return "out of memory";
    case kNoDevice:
      return "no CUDA-capable device is detected";
    case kInvalidDevice:
      return "invalid device ordinal";
    case kInvalidResourceHandle:
      return "invalid resource handle";
    case kNotReady:
      return "device not ready";
    case kHostMemoryAlreadyRegistered:
      return "part or all of the requested memory range is already mapped";
    case kHostMemoryNotRegistered:
      return "pointer does not correspond to a registered memory region";
  }
  return "unknown error";
}

// cuMemGetAddressRange_v2 as the driver entry point hands it out.
static int FakeMemGetAddressRange(unsigned long long* base, size_t* size, unsigned long long ptr) {
  State& s = S();
  std::lock_guard lock(s.mu);
  uintptr_t b = 0;
  const Allocation* a = Holding(s, reinterpret_cast<void*>(ptr), 1, &b);
  if (a == nullptr) return 1;  // CUDA_ERROR_INVALID_VALUE
  if (base) *base = b;
  if (size) *size = a->bytes;
  return 0;
}

// CUDA 12.5 and later hand out driver entry points by ABI version; 12.0 to 12.4 only through
// cudaGetDriverEntryPoint. Built with SPARSYNC_FAKE_CUDART_PLAIN_ENTRY_POINT, the fake is the
// older kind (libsparsync_fake_cudart_plain.so), so that both lookups of the loader are tested.
static int EntryPoint(const char* symbol, void** fn, int* status) {
  bool known = std::strcmp(symbol, "cuMemGetAddressRange") == 0;
  *fn = known ? reinterpret_cast<void*>(&FakeMemGetAddressRange) : nullptr;
  if (status) *status = known ? 0 : 1;  // cudaDriverEntryPointSymbolNotFound
  return kSuccess;
}

#ifdef SPARSYNC_FAKE_CUDART_PLAIN_ENTRY_POINT
int cudaGetDriverEntryPoint(const char* symbol, void** fn, unsigned long long, int* status) {
  return EntryPoint(symbol, fn, status);
}
#else
int cudaGetDriverEntryPointByVersion(const char* symbol, void** fn, unsigned, unsigned long long,
                                     int* status) {
  return EntryPoint(symbol, fn, status);
}
#endif

// ---- Test-only inspection. ----

// Live objects of a kind: "ipc_memory" (opened handles, counting repeats), "events", "streams",
// "allocations" (this process's cudaMalloc), "pinned" (cudaHostRegister ranges),
// "host_allocations" (cudaMallocHost).
int sparsync_fake_cuda_live(const char* what) {
  State& s = S();
  std::lock_guard lock(s.mu);
  std::string w = what;
  int n = 0;
  if (w == "ipc_memory") {
    for (const auto& [base, a] : s.allocations) n += a.imported ? a.refs : 0;
  } else if (w == "allocations") {
    for (const auto& [base, a] : s.allocations) n += a.imported ? 0 : 1;
  } else if (w == "events") {
    n = static_cast<int>(s.events.size());
  } else if (w == "streams") {
    n = static_cast<int>(s.streams.size());
  } else if (w == "pinned") {
    n = static_cast<int>(s.pinned.size());
  } else if (w == "host_allocations") {
    n = static_cast<int>(s.host_allocations.size());
  } else {
    n = -1;
  }
  return n;
}

// The journal since the last call, one operation a line ("wait E3", "D2H 16", "sync",
// "H2D 16", "record E4"); returns its length and clears it.
size_t sparsync_fake_cuda_journal(char* buf, size_t len) {
  State& s = S();
  std::lock_guard lock(s.mu);
  size_t n = CopyOut(s.journal, buf, len);
  s.journal.clear();
  return n;
}

// Misuse since the last call, one a line; returns its length (0: none) and clears it.
size_t sparsync_fake_cuda_misuse(char* buf, size_t len) {
  State& s = S();
  std::lock_guard lock(s.mu);
  size_t n = CopyOut(s.misuse, buf, len);
  s.misuse.clear();
  return n;
}

// How often `event` was recorded (by any process), and its journal name's number.
uint64_t sparsync_fake_cuda_event_records(void* event) {
  State& s = S();
  std::lock_guard lock(s.mu);
  auto it = s.events.find(event);
  return it == s.events.end() ? 0 : it->second.record->records.load();
}

uint64_t sparsync_fake_cuda_event_id(void* event) {
  State& s = S();
  std::lock_guard lock(s.mu);
  auto it = s.events.find(event);
  return it == s.events.end() ? 0 : it->second.record->id;
}

// The device of the allocation (cudaMalloc'd, or opened through CUDA IPC) that holds
// [ptr, ptr + bytes), or -1 when no allocation does: how the fake NCCL checks its buffers.
int sparsync_fake_cuda_device_of(const void* ptr, size_t bytes) {
  State& s = S();
  std::lock_guard lock(s.mu);
  const Allocation* a = Holding(s, ptr, bytes);
  return a == nullptr ? -1 : a->device;
}

// The number of devices cudaGetDeviceCount reports from now on (4 at first).
void sparsync_fake_cuda_set_devices(int devices) {
  State& s = S();
  std::lock_guard lock(s.mu);
  s.devices = std::max(devices, 0);
}

// The next call named `call` (cudaMalloc, cudaMallocHost, cudaMemcpyAsync, cudaStreamQuery)
// returns `error` without doing anything. A later injection for the same name replaces an unused
// one.
void sparsync_fake_cuda_fail_next(const char* call, int error) {
  State& s = S();
  std::lock_guard lock(s.mu);
  if (call) s.fail_next[call] = error;
}

}  // extern "C"
