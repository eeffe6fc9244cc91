// The shared-memory registry against real POSIX shared-memory objects: the test plays the client
// (shm_open, ftruncate, its own mapping) and the server's registry maps the same object. Runs in
// the plain, AddressSanitizer and ThreadSanitizer builds (make test-sanitize).
#include "inferd/shared_memory.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <limits.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <initializer_list>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "inferd/cuda_runtime.h"
#include "inferd/guarded_copy.h"

namespace inferd {
namespace {

const size_t kPage = static_cast<size_t>(sysconf(_SC_PAGESIZE));

// A client's POSIX shared-memory object: created with a unique name, mapped by the client, removed
// (shm_unlink) when the test ends, whether or not the registry still maps it.
class ClientObject {
 public:
  explicit ClientObject(size_t size) : name_(unique_name()), size_(size) {
    fd_ = shm_open(name_.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    EXPECT_GE(fd_, 0) << name_ << ": " << std::strerror(errno);
    EXPECT_EQ(ftruncate(fd_, static_cast<off_t>(size)), 0);
    void* map = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
    EXPECT_NE(map, MAP_FAILED);
    bytes_ = static_cast<unsigned char*>(map);
  }
  ~ClientObject() {
    munmap(bytes_, size_);
    close(fd_);
    shm_unlink(name_.c_str());
  }
  ClientObject(const ClientObject&) = delete;
  ClientObject& operator=(const ClientObject&) = delete;

  const std::string& name() const { return name_; }
  // The client's view of the object (only its first size() bytes may be touched after a shrink).
  unsigned char* bytes() const { return bytes_; }
  void resize(size_t size) const { ASSERT_EQ(ftruncate(fd_, static_cast<off_t>(size)), 0); }
  // Removes the name now (a death test's child never runs the destructor).
  void unlink() const { shm_unlink(name_.c_str()); }

 private:
  static std::string unique_name() {
    static std::atomic<int> counter{0};
    return "/inferd-shm-test-" + std::to_string(getpid()) + "-" + std::to_string(counter++);
  }
  std::string name_;
  size_t size_;
  int fd_ = -1;
  unsigned char* bytes_ = nullptr;
};

// How many mappings of the object this process holds (its /dev/shm file in /proc/self/maps).
int mappings(const ClientObject& object) {
  const std::string file = "/dev/shm" + object.name();
  std::ifstream maps("/proc/self/maps");
  int count = 0;
  for (std::string line; std::getline(maps, line);) {
    if (line.size() >= file.size() && line.compare(line.size() - file.size(), file.size(), file) == 0) ++count;
  }
  return count;
}

size_t open_descriptors() {
  size_t count = 0;
  for (int fd = 0; fd < 4096; ++fd) count += fcntl(fd, F_GETFD) != -1 ? 1 : 0;
  return count;
}

std::string read_slice(const SharedMemorySlice& slice, size_t size) {
  std::string out(size, '\0');
  std::string error;
  EXPECT_TRUE(copy_from_slice(reinterpret_cast<std::byte*>(out.data()), slice, size, &error)) << error;
  return out;
}

bool write_slice(const SharedMemorySlice& slice, std::string_view text, std::string* error) {
  return copy_to_slice(slice, reinterpret_cast<const std::byte*>(text.data()), text.size(), error);
}

// --- death tests first (gtest runs *DeathTest suites before the threads of the others exist) ---

using SharedMemoryDeathTest = ::testing::Test;

// In the child that is meant to die: no core file for it.
void no_core_file() {
  const rlimit none{0, 0};
  setrlimit(RLIMIT_CORE, &none);
}

// The guarded copy's SIGBUS handler must not swallow the faults it does not own: touching a page
// past a shrunk object's end outside a guarded copy still kills the process, as without inferd.
TEST_F(SharedMemoryDeathTest, AFaultOutsideAGuardedCopyStillKills) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        no_core_file();
        ClientObject object(4 * kPage);
        char byte = 0;
        object.unlink();
        ASSERT_TRUE(guarded_copy(&byte, object.bytes(), 1));  // installs the handler
        object.resize(kPage);
        std::fprintf(stderr, "touching a page past the end\n");
        const volatile unsigned char* past = object.bytes() + 2 * kPage;
        byte = static_cast<char>(*past);
        std::fprintf(stderr, "survived %d\n", byte);
      },
      "touching a page past the end");
}

// kill -BUS (a SIGBUS that is no fault: returning from the handler does not repeat it) kills too.
TEST_F(SharedMemoryDeathTest, ASignalSentOutsideAGuardedCopyStillKills) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        no_core_file();
        char byte = 0;
        const char source = 1;
        ASSERT_TRUE(guarded_copy(&byte, &source, 1));  // installs the handler
        std::fprintf(stderr, "raising SIGBUS\n");
        raise(SIGBUS);
        std::fprintf(stderr, "survived SIGBUS\n");
      },
      "raising SIGBUS");
}

// --- keys ---------------------------------------------------------------------------------------

TEST(SharedMemoryKey, AcceptsObjectNamesOnly) {
  EXPECT_TRUE(is_valid_shared_memory_key("name"));
  EXPECT_TRUE(is_valid_shared_memory_key("/name"));
  EXPECT_TRUE(is_valid_shared_memory_key("/input_data.0"));
  EXPECT_TRUE(is_valid_shared_memory_key(std::string(NAME_MAX, 'a')));
  EXPECT_TRUE(is_valid_shared_memory_key("/" + std::string(NAME_MAX, 'a')));
  for (const std::string& key :
       std::vector<std::string>{"", "/", "//name", "/a/b", "a/b", "name/", ".", "..", "/.", "/..", "../etc/passwd",
                                "/dev/shm/name", std::string(NAME_MAX + 1, 'a'), "/" + std::string(NAME_MAX + 1, 'a'),
                                std::string("a\0b", 3), "a\nb", "a\x1b[2Jb", "a\x7f", "\t"}) {
    EXPECT_FALSE(is_valid_shared_memory_key(key)) << "'" << key << "' (" << key.size() << " bytes)";
  }
}

TEST(SharedMemoryRegistry, RefusesABadKeyBeforeOpeningAnything) {
  SharedMemoryRegistry registry;
  for (const std::string& key : std::vector<std::string>{"../../etc/passwd", "/dev/shm/x", "..", ""}) {
    const Status status = registry.register_system("r", key, 0, 1);
    EXPECT_EQ(status.code, StatusCode::kInvalidArgument) << key;
    EXPECT_NE(status.message.find("not a POSIX shared-memory object name"), std::string::npos) << status.message;
  }
  EXPECT_EQ(registry.region_count(), 0u);
}

// --- register, slice, status, unregister ----------------------------------------------------------

TEST(SharedMemoryRegistry, RegistersSlicesReportsAndUnregisters) {
  ClientObject object(4 * kPage);
  SharedMemoryRegistry registry;
  // An offset that is not page-aligned: the registry maps from the page below it.
  const uint64_t offset = kPage + 100;
  ASSERT_TRUE(registry.register_system("input", object.name(), offset, 2 * kPage).ok());
  EXPECT_EQ(registry.region_count(), 1u);
  EXPECT_EQ(registry.registered_bytes(), 2 * kPage);

  std::vector<SharedMemoryRegionStatus> regions;
  ASSERT_TRUE(registry.status(SharedMemoryKind::kSystem, "", &regions).ok());
  ASSERT_EQ(regions.size(), 1u);
  EXPECT_EQ(regions[0].name, "input");
  EXPECT_EQ(regions[0].kind, SharedMemoryKind::kSystem);
  EXPECT_EQ(regions[0].key, object.name());
  EXPECT_EQ(regions[0].offset, offset);
  EXPECT_EQ(regions[0].byte_size, 2 * kPage);
  ASSERT_TRUE(registry.status(SharedMemoryKind::kSystem, "input", &regions).ok());
  EXPECT_EQ(regions.size(), 1u);
  EXPECT_EQ(registry.status(SharedMemoryKind::kSystem, "other", &regions).code, StatusCode::kNotFound);
  EXPECT_TRUE(regions.empty());
  // One namespace, two kinds: a CUDA status neither lists nor finds a system region.
  ASSERT_TRUE(registry.status(SharedMemoryKind::kCuda, "", &regions).ok());
  EXPECT_TRUE(regions.empty());
  EXPECT_EQ(registry.status(SharedMemoryKind::kCuda, "input", &regions).code, StatusCode::kNotFound);

  // The client writes, the server reads; the server writes, the client reads: the same bytes.
  std::memcpy(object.bytes() + offset + 10, "from the client", 15);
  SharedMemorySlice slice;
  ASSERT_TRUE(registry.slice("input", 10, 15, &slice).ok());
  EXPECT_EQ(slice.kind(), SharedMemoryKind::kSystem);
  EXPECT_EQ(slice.size, 15u);
  EXPECT_EQ(slice.offset, 10u);
  EXPECT_EQ(read_slice(slice, 15), "from the client");
  SharedMemorySlice out;
  ASSERT_TRUE(registry.slice("input", 2 * kPage - 15, 15, &out).ok());
  std::string error;
  ASSERT_TRUE(write_slice(out, "from the server", &error)) << error;
  EXPECT_EQ(std::memcmp(object.bytes() + offset + 2 * kPage - 15, "from the server", 15), 0);

  // Unregistering a CUDA region of that name leaves the system one alone.
  ASSERT_TRUE(registry.unregister(SharedMemoryKind::kCuda, "input").ok());
  EXPECT_EQ(registry.region_count(), 1u);
  ASSERT_TRUE(registry.unregister(SharedMemoryKind::kSystem, "no such region").ok());  // not an error
  ASSERT_TRUE(registry.unregister(SharedMemoryKind::kSystem, "input").ok());
  EXPECT_EQ(registry.region_count(), 0u);
  EXPECT_EQ(registry.registered_bytes(), 0u);
  SharedMemorySlice gone;
  const Status status = registry.slice("input", 0, 1, &gone);
  EXPECT_EQ(status.code, StatusCode::kInvalidArgument);
  EXPECT_NE(status.message.find("'input'"), std::string::npos) << status.message;
  EXPECT_EQ(gone.region, nullptr);
}

TEST(SharedMemoryRegistry, UnregisterWithNoNameRemovesEveryRegionOfThatKind) {
  ClientObject a(kPage), b(2 * kPage);
  SharedMemoryRegistry registry;
  ASSERT_TRUE(registry.register_system("a", a.name(), 0, kPage).ok());
  ASSERT_TRUE(registry.register_system("b", b.name(), 0, 2 * kPage).ok());
  ASSERT_TRUE(registry.register_system("b2", b.name(), kPage, kPage).ok());  // one object, two regions
  EXPECT_EQ(registry.region_count(), 3u);
  EXPECT_EQ(registry.registered_bytes(), 4 * kPage);
  ASSERT_TRUE(registry.unregister(SharedMemoryKind::kCuda, "").ok());
  EXPECT_EQ(registry.region_count(), 3u);
  ASSERT_TRUE(registry.unregister(SharedMemoryKind::kSystem, "").ok());
  EXPECT_EQ(registry.region_count(), 0u);
  EXPECT_EQ(registry.registered_bytes(), 0u);
  std::vector<SharedMemoryRegionStatus> regions;
  ASSERT_TRUE(registry.status(SharedMemoryKind::kSystem, "", &regions).ok());
  EXPECT_TRUE(regions.empty());
}

TEST(SharedMemoryRegistry, UnmapsAndClosesWhenTheLastOwnerLetsGo) {
  ClientObject object(2 * kPage);
  const size_t descriptors = open_descriptors();
  {
    SharedMemoryOptions options;
    options.max_regions = 1;
    SharedMemoryRegistry registry(options);
    ASSERT_TRUE(registry.register_system("r", object.name(), 0, 2 * kPage).ok());
    EXPECT_EQ(mappings(object), 2);  // the client's mapping and the registry's
    EXPECT_EQ(open_descriptors(), descriptors + 1);
    // A refusal after the object was opened and mapped (here: the limit) keeps nothing of it.
    ASSERT_EQ(registry.register_system("s", object.name(), 0, kPage).code, StatusCode::kResourceExhausted);
    EXPECT_EQ(mappings(object), 2);
    EXPECT_EQ(open_descriptors(), descriptors + 1);
    ASSERT_TRUE(registry.unregister(SharedMemoryKind::kSystem, "r").ok());
    EXPECT_EQ(mappings(object), 1);
    EXPECT_EQ(open_descriptors(), descriptors);
    ASSERT_TRUE(registry.register_system("r", object.name(), 0, kPage).ok());
  }  // the registry's destructor releases the rest
  EXPECT_EQ(mappings(object), 1);
  EXPECT_EQ(open_descriptors(), descriptors);
}

// --- refusals -------------------------------------------------------------------------------------

TEST(SharedMemoryRegistry, RefusesRegionsOutsideTheObject) {
  ClientObject object(2 * kPage);
  SharedMemoryRegistry registry;
  struct Case {
    uint64_t offset, byte_size;
    const char* why;
  };
  for (const Case& c : std::vector<Case>{
           {0, 2 * kPage + 1, "one byte past the end"},
           {2 * kPage, 1, "starts at the end"},
           {kPage, 2 * kPage, "ends a page past the end"},
           {3 * kPage, 1, "starts past the end"},
           {0, 0, "empty"},
           {UINT64_MAX, 1, "offset + size overflows"},
           {1, UINT64_MAX, "size overflows"},
           {UINT64_MAX - kPage + 1, 2 * kPage, "wraps around to within the object"},
           {UINT64_MAX, UINT64_MAX, "both at the top"},
       }) {
    const Status status = registry.register_system("r", object.name(), c.offset, c.byte_size);
    EXPECT_EQ(status.code, StatusCode::kInvalidArgument) << c.why;
    EXPECT_FALSE(status.message.empty());
  }
  EXPECT_EQ(registry.region_count(), 0u);
  EXPECT_EQ(registry.register_system("r", "/inferd-shm-test-no-such-object", 0, 1).code, StatusCode::kInvalidArgument);
  EXPECT_EQ(registry.register_system("", object.name(), 0, 1).code, StatusCode::kInvalidArgument);
  ASSERT_TRUE(registry.register_system("r", object.name(), 0, 2 * kPage).ok());  // exactly the object
}

TEST(SharedMemoryRegistry, RefusesSlicesOutsideTheRegion) {
  ClientObject object(4 * kPage);
  SharedMemoryRegistry registry;
  const uint64_t size = 2 * kPage;
  ASSERT_TRUE(registry.register_system("r", object.name(), kPage, size).ok());
  struct Case {
    uint64_t offset, byte_size;
    const char* why;
  };
  for (const Case& c : std::vector<Case>{
           {0, size + 1, "one byte past the end (still within the object)"},
           {size, 1, "starts at the end"},
           {size + 1, 0, "empty, past the end"},
           {UINT64_MAX, 1, "offset + size overflows"},
           {UINT64_MAX - 1, 4, "offset near the top"},
           {1, UINT64_MAX, "size overflows"},
           {8, UINT64_MAX - 7, "wraps to exactly zero"},
       }) {
    SharedMemorySlice slice;
    const Status status = registry.slice("r", c.offset, c.byte_size, &slice);
    EXPECT_EQ(status.code, StatusCode::kInvalidArgument) << c.why;
    EXPECT_NE(status.message.find("'r'"), std::string::npos) << status.message;
    EXPECT_EQ(slice.region, nullptr) << c.why;
  }
  SharedMemorySlice whole, end;
  EXPECT_TRUE(registry.slice("r", 0, size, &whole).ok());
  EXPECT_TRUE(registry.slice("r", size, 0, &end).ok());  // an empty tensor at the very end
  EXPECT_EQ(registry.slice("unknown", 0, 1, &end).code, StatusCode::kInvalidArgument);
}

TEST(SharedMemoryRegistry, RefusesALiveNameAndTakesItBackAfterUnregister) {
  ClientObject first(kPage), second(2 * kPage);
  SharedMemoryRegistry registry;
  ASSERT_TRUE(registry.register_system("r", first.name(), 0, kPage).ok());
  const Status status = registry.register_system("r", second.name(), 0, 2 * kPage);
  EXPECT_EQ(status.code, StatusCode::kAlreadyExists);
  EXPECT_NE(status.message.find("'r'"), std::string::npos) << status.message;
  // The live registration is untouched.
  std::vector<SharedMemoryRegionStatus> regions;
  ASSERT_TRUE(registry.status(SharedMemoryKind::kSystem, "r", &regions).ok());
  EXPECT_EQ(regions.at(0).key, first.name());
  EXPECT_EQ(registry.registered_bytes(), kPage);
  ASSERT_TRUE(registry.unregister(SharedMemoryKind::kSystem, "r").ok());
  ASSERT_TRUE(registry.register_system("r", second.name(), 0, 2 * kPage).ok());
  ASSERT_TRUE(registry.status(SharedMemoryKind::kSystem, "r", &regions).ok());
  EXPECT_EQ(regions.at(0).key, second.name());
}

TEST(SharedMemoryRegistry, LimitsRegionsAndBytes) {
  ClientObject object(4 * kPage);
  SharedMemoryOptions options;
  options.max_regions = 2;
  options.max_bytes = 3 * kPage;
  SharedMemoryRegistry registry(options);
  ASSERT_TRUE(registry.register_system("a", object.name(), 0, kPage).ok());
  ASSERT_TRUE(registry.register_system("b", object.name(), 0, kPage).ok());
  Status status = registry.register_system("c", object.name(), 0, 1);
  EXPECT_EQ(status.code, StatusCode::kResourceExhausted);
  EXPECT_NE(status.message.find("--shared-memory-max-regions"), std::string::npos) << status.message;
  ASSERT_TRUE(registry.unregister(SharedMemoryKind::kSystem, "b").ok());
  // A region free and 2 pages of bytes left: 2 pages and a byte is one byte too many.
  status = registry.register_system("c", object.name(), 0, 2 * kPage + 1);
  EXPECT_EQ(status.code, StatusCode::kResourceExhausted);
  EXPECT_NE(status.message.find("--shared-memory-max-bytes"), std::string::npos) << status.message;
  EXPECT_EQ(registry.region_count(), 1u);
  EXPECT_EQ(registry.registered_bytes(), kPage);
  ASSERT_TRUE(registry.register_system("c", object.name(), 0, 2 * kPage).ok());  // exactly the limit
  EXPECT_EQ(registry.registered_bytes(), 3 * kPage);
}

TEST(SharedMemoryRegistry, AnswersUnimplementedWhenSwitchedOff) {
  ClientObject object(kPage);
  SharedMemoryOptions options;
  options.system = false;
  options.cuda = false;
  SharedMemoryRegistry registry(options);
  EXPECT_EQ(registry.register_system("r", object.name(), 0, kPage).code, StatusCode::kUnimplemented);
  const Status cuda = registry.register_cuda("g", std::string(64, '\0'), 0, 16);
  EXPECT_EQ(cuda.code, StatusCode::kUnimplemented);
  EXPECT_NE(cuda.message.find("switched off"), std::string::npos) << cuda.message;
  EXPECT_EQ(registry.region_count(), 0u);
}

// --- a region in use, a client that shrinks its object ------------------------------------------

TEST(SharedMemoryRegistry, ASliceHeldAcrossUnregisterKeepsTheMapping) {
  ClientObject object(2 * kPage);
  SharedMemoryRegistry registry;
  ASSERT_TRUE(registry.register_system("r", object.name(), 0, 2 * kPage).ok());
  SharedMemorySlice slice;
  ASSERT_TRUE(registry.slice("r", kPage, 8, &slice).ok());
  ASSERT_TRUE(registry.unregister(SharedMemoryKind::kSystem, "r").ok());
  EXPECT_EQ(registry.region_count(), 0u);
  EXPECT_EQ(registry.registered_bytes(), 0u);
  EXPECT_EQ(mappings(object), 2);  // still the request's
  // A new region may take the name meanwhile; the old slice still reaches the old object.
  ClientObject other(kPage);
  ASSERT_TRUE(registry.register_system("r", other.name(), 0, kPage).ok());
  std::memcpy(object.bytes() + kPage, "old-one!", 8);
  EXPECT_EQ(read_slice(slice, 8), "old-one!");
  std::string error;
  ASSERT_TRUE(write_slice(slice, "written!", &error)) << error;
  EXPECT_EQ(std::memcmp(object.bytes() + kPage, "written!", 8), 0);
  slice = SharedMemorySlice{};  // the request finishes
  EXPECT_EQ(mappings(object), 1);
}

TEST(SharedMemoryRegistry, AShrunkObjectFailsItsRequestsCleanly) {
  ClientObject object(4 * kPage);
  SharedMemoryRegistry registry;
  ASSERT_TRUE(registry.register_system("r", object.name(), 0, 4 * kPage).ok());
  SharedMemorySlice before;  // taken while the object was whole: a request already queued
  ASSERT_TRUE(registry.slice("r", 0, 4 * kPage, &before).ok());
  object.resize(kPage);

  // A new slice is refused at once (check_in_use), even one within what is left.
  SharedMemorySlice after;
  Status status = registry.slice("r", 0, 16, &after);
  EXPECT_EQ(status.code, StatusCode::kInvalidArgument);
  EXPECT_NE(status.message.find("smaller than the region's end"), std::string::npos) << status.message;

  // The earlier slice's copies touch pages past the new end: a failed copy, not a SIGBUS.
  std::vector<std::byte> host(4 * kPage, std::byte{7});
  std::string error;
  EXPECT_FALSE(copy_from_slice(host.data(), before, host.size(), &error));
  EXPECT_NE(error.find("shrank while it was read"), std::string::npos) << error;
  error.clear();
  EXPECT_FALSE(copy_to_slice(before, host.data(), host.size(), &error));
  EXPECT_NE(error.find("shrank while it was written"), std::string::npos) << error;
  // What is still there is still copied, and the guard is ready for the next fault.
  std::fill(host.begin(), host.end(), std::byte{7});
  EXPECT_TRUE(copy_to_slice(before, host.data(), kPage, &error)) << error;
  EXPECT_EQ(object.bytes()[kPage - 1], 7);
  EXPECT_FALSE(copy_from_slice(host.data(), before, 2 * kPage, &error));

  // Grown back, the region is usable again.
  object.resize(4 * kPage);
  EXPECT_TRUE(registry.slice("r", 0, 4 * kPage, &after).ok());
  EXPECT_TRUE(copy_from_slice(host.data(), after, host.size(), &error)) << error;
}

TEST(GuardedCopy, CopiesAndReportsFaultsOnEveryThread) {
  constexpr int kThreads = 4;
  std::vector<std::unique_ptr<ClientObject>> objects;  // one each: the bytes are not what is shared
  for (int t = 0; t < kThreads; ++t) {
    objects.push_back(std::make_unique<ClientObject>(8 * kPage));
    objects.back()->resize(2 * kPage);
  }
  std::vector<std::thread> threads;
  std::atomic<int> wrong{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      unsigned char* client = objects[t]->bytes();
      std::vector<unsigned char> host(8 * kPage);
      for (int i = 0; i < 100; ++i) {
        if (!guarded_copy(host.data(), client, 2 * kPage)) ++wrong;         // within: copies
        if (guarded_copy(host.data(), client, 3 * kPage)) ++wrong;          // past the end: faults
        if (guarded_copy(client + kPage, host.data(), 4 * kPage)) ++wrong;  // writes past it
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_TRUE(guarded_copy(nullptr, nullptr, 0));
}

// --- threads -------------------------------------------------------------------------------------

// Registering, slicing, copying and unregistering from several threads at once, some on one
// shared name: each call answers OK or its documented refusal, and the books balance at the end.
TEST(SharedMemoryRegistry, ThreadsRegisterSliceAndUnregisterConcurrently) {
  constexpr int kThreads = 4;
  constexpr int kRounds = 200;
  std::vector<std::unique_ptr<ClientObject>> objects;
  for (int t = 0; t <= kThreads; ++t) objects.push_back(std::make_unique<ClientObject>(2 * kPage));
  SharedMemoryOptions options;
  options.max_regions = kThreads;  // one short: some registrations meet the limit
  SharedMemoryRegistry registry(options);
  std::atomic<int> unexpected{0};
  auto expect = [&](const Status& status, std::initializer_list<StatusCode> allowed) {
    for (StatusCode code : allowed) {
      if (status.code == code) return;
    }
    ++unexpected;
    std::fprintf(stderr, "unexpected status %d: %s\n", static_cast<int>(status.code), status.message.c_str());
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const std::string own = "own" + std::to_string(t);
      const ClientObject& object = *objects[t];
      const ClientObject& shared = *objects[kThreads];
      for (int i = 0; i < kRounds; ++i) {
        expect(registry.register_system(own, object.name(), 0, 2 * kPage),
               {StatusCode::kOk, StatusCode::kResourceExhausted});
        expect(registry.register_system("shared", shared.name(), 0, kPage),
               {StatusCode::kOk, StatusCode::kAlreadyExists, StatusCode::kResourceExhausted});
        // Each thread its own 64 bytes of the shared region: the bytes are the clients' business.
        for (const auto& [name, offset] : {std::pair<std::string, uint64_t>{own, 0}, {"shared", 64 * t}}) {
          SharedMemorySlice slice;
          const Status status = registry.slice(name, offset, 64, &slice);
          expect(status, {StatusCode::kOk, StatusCode::kInvalidArgument});
          if (status.ok()) {
            std::vector<std::byte> host(64, std::byte{static_cast<unsigned char>(t)});
            std::string error;
            if (!copy_to_slice(slice, host.data(), host.size(), &error) ||
                !copy_from_slice(host.data(), slice, host.size(), &error)) {
              ++unexpected;
            }
          }
        }
        std::vector<SharedMemoryRegionStatus> regions;
        expect(registry.status(SharedMemoryKind::kSystem, "", &regions), {StatusCode::kOk});
        if (regions.size() > options.max_regions) ++unexpected;
        expect(registry.unregister(SharedMemoryKind::kSystem, own), {StatusCode::kOk});
        if (i % 3 == 0) expect(registry.unregister(SharedMemoryKind::kSystem, "shared"), {StatusCode::kOk});
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(unexpected.load(), 0);
  ASSERT_TRUE(registry.unregister(SharedMemoryKind::kSystem, "").ok());
  EXPECT_EQ(registry.region_count(), 0u);
  EXPECT_EQ(registry.registered_bytes(), 0u);
}

// --- CUDA: what runs without a GPU (make gpu-check exercises the IPC path from another process) ---

TEST(CudaSharedMemory, RefusesAHandleOfTheWrongSize) {
  SharedMemoryRegistry registry;
  for (const size_t size : {0, 1, 63, 65, 128}) {
    const Status status = registry.register_cuda("g", std::string(size, '\x01'), 0, 16);
    EXPECT_EQ(status.code, StatusCode::kInvalidArgument) << size;
    EXPECT_NE(status.message.find("64 bytes"), std::string::npos) << status.message;
  }
  EXPECT_EQ(registry.register_cuda("g", std::string(64, '\x01'), -1, 16).code, StatusCode::kInvalidArgument);
  EXPECT_EQ(registry.region_count(), 0u);
}

TEST(CudaSharedMemory, AnswersUnimplementedWithoutTheRuntime) {
  const CudaRuntime& cuda = CudaRuntime::get();
  SharedMemoryRegistry registry;
  const Status status = registry.register_cuda("g", std::string(64, '\0'), 0, 16);
  if (cuda.available()) {
    // A handle of zeros names no allocation: the driver refuses it.
    EXPECT_EQ(status.code, StatusCode::kInvalidArgument) << status.message;
    EXPECT_EQ(registry.register_cuda("g", std::string(64, '\0'), cuda.device_count(), 16).code,
              StatusCode::kInvalidArgument);
  } else {
    EXPECT_EQ(status.code, StatusCode::kUnimplemented);
    EXPECT_NE(status.message.find("CUDA shared memory needs the CUDA runtime and a GPU; " + cuda.description()),
              std::string::npos)
        << status.message;
  }
  EXPECT_EQ(registry.region_count(), 0u);
}

}  // namespace
// Issue 25, item 8: the kernel's rule for opening a file for reading and writing, for a peer who
// is the owner, in the file's group, or neither; root always may.
TEST(PeerCredentials, MayReadAndWriteFollowsTheKernelsRule) {
  struct stat st{};
  st.st_uid = 1000;
  st.st_gid = 2000;
  const auto allowed = [&](mode_t mode, uid_t uid, gid_t gid) {
    st.st_mode = S_IFREG | mode;
    std::string why;
    const bool ok = may_read_and_write(st, PeerCredentials{0, uid, gid}, &why);
    EXPECT_EQ(ok, why.empty()) << why;
    return ok;
  };
  EXPECT_TRUE(allowed(0600, 1000, 1));
  EXPECT_FALSE(allowed(0400, 1000, 1)) << "the owner without write";
  EXPECT_FALSE(allowed(0066, 1000, 2000)) << "the owner gets the owner's bits only";
  EXPECT_TRUE(allowed(0660, 1001, 2000));
  EXPECT_FALSE(allowed(0640, 1001, 2000)) << "the group may only read";
  EXPECT_FALSE(allowed(0606, 1001, 2000)) << "a member gets the group's bits only";
  EXPECT_TRUE(allowed(0606, 1001, 3000));
  EXPECT_FALSE(allowed(0600, 65534, 65534));
  EXPECT_TRUE(allowed(0000, 0, 0)) << "root";
  st.st_mode = S_IFREG | 0600;
  std::string why;
  EXPECT_FALSE(may_read_and_write(st, PeerCredentials{0, 65534, 65534}, &why));
  EXPECT_EQ(
      why,
      "the client (uid 65534, gid 65534) may not read and write it itself (owner uid 1000, group 2000, mode 0600)");
}

}  // namespace inferd
