// The prompt cache's disk tier: entry files, their index, the directory's lock.
#include "kvs/engine/cache_disk.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>

#include "kvs/util/error.h"
#include "kvs/util/threadpool.h"

namespace kvs {
namespace {

constexpr char kMagic[8] = {'K', 'V', 'S', 'P', 'C', 'A', 'C', 'H'};
constexpr uint32_t kVersion = 1;
constexpr const char* kSuffix = ".kvpc";

struct Header {
  char magic[8];
  uint32_t version, n_tokens;
  uint64_t fingerprint, key, parent;
  uint64_t page_bytes, window_bytes, state_bytes;
  uint32_t window, n_checkpoints;
  uint64_t used;
};

size_t file_size(const Header& h) {
  return sizeof(Header) + 4 * size_t{h.n_tokens} + 4 * size_t{h.n_checkpoints} + h.page_bytes +
         (h.window ? h.window_bytes : 0) + h.n_checkpoints * h.state_bytes + sizeof(uint64_t);
}

struct File {
  std::FILE* f;
  ~File() {
    if (f) std::fclose(f);
  }
};

}  // namespace

CacheDisk::CacheDisk(const std::string& dir, size_t limit, uint64_t fingerprint,
                     const PromptCacheShape& shape)
    : dir_(dir), limit_(limit), fingerprint_(fingerprint), shape_(shape) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  KVS_CHECK(!ec, "--cache-disk ", dir, ": ", ec.message());
  const std::string lock = dir + "/lock";
  lock_fd_ = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  KVS_CHECK(lock_fd_ >= 0, "--cache-disk ", dir, ": cannot open ", lock, ": ",
            std::strerror(errno));
  if (::flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    ::close(lock_fd_);
    fail("--cache-disk ", dir, ": another kvstream process uses this directory");
  }
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(".tmp-", 0) == 0) {  // a write a kill interrupted: never an entry
      std::filesystem::remove(e.path(), ec);
      continue;
    }
    if (name.size() > 5 && name.compare(name.size() - 5, 5, kSuffix) == 0)
      index_file(e.path().string());
  }
  // Past the limit (a smaller one than the last process's): the least recently written go.
  while (bytes_ > limit_ && forget_oldest()) {
  }
}

CacheDisk::~CacheDisk() {
  if (lock_fd_ >= 0) ::close(lock_fd_);  // closing releases the lock
}

std::string CacheDisk::path_of(uint64_t key) const {
  char name[32];
  std::snprintf(name, sizeof(name), "/%016" PRIx64 "%s", key, kSuffix);
  return dir_ + name;
}

void CacheDisk::index_file(const std::string& path) {
  const auto refuse = [&](const char* why) {
    warnings_.push_back(cat("--cache-disk: ", path, ": ", why, "; not loaded"));
  };
  File f{std::fopen(path.c_str(), "rb")};
  Header h{};
  if (!f.f || std::fread(&h, sizeof(h), 1, f.f) != 1) return refuse("unreadable or partial");
  if (std::memcmp(h.magic, kMagic, 8) != 0 || h.version != kVersion)
    return refuse("not a prompt-cache entry of this version");
  if (h.fingerprint != fingerprint_ || h.page_bytes != shape_.page_bytes ||
      h.window_bytes != shape_.window_bytes || h.state_bytes != shape_.state_bytes)
    return refuse("of another model, KV type or page size");
  if (h.n_tokens < 1 || h.n_tokens > static_cast<uint32_t>(shape_.page_tokens) ||
      h.n_checkpoints > static_cast<uint32_t>(shape_.page_tokens) ||
      (h.window && shape_.window_bytes == 0))
    return refuse("corrupt header");
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  if (ec || size != file_size(h)) return refuse("partial or corrupt (its size)");
  DiskEntry d;
  d.key = h.key;
  d.parent = h.parent;
  d.tokens.resize(h.n_tokens);
  d.checkpoints.resize(h.n_checkpoints);
  d.window = h.window != 0;
  d.file_bytes = size;
  d.used = h.used;
  if (std::fread(d.tokens.data(), 4, d.tokens.size(), f.f) != d.tokens.size() ||
      std::fread(d.checkpoints.data(), 4, d.checkpoints.size(), f.f) != d.checkpoints.size())
    return refuse("partial");
  if (std::filesystem::path(path).filename() != std::filesystem::path(path_of(d.key)).filename() ||
      index_.count(d.key))
    return refuse("misnamed");
  clock_ = std::max(clock_, d.used + 1);
  bytes_ += size;
  children_.emplace(d.parent, d.key);
  index_.emplace(d.key, std::move(d));
}

const DiskEntry* CacheDisk::find(uint64_t key) const {
  const auto it = index_.find(key);
  return it == index_.end() ? nullptr : &it->second;
}

std::vector<const DiskEntry*> CacheDisk::children(uint64_t parent) const {
  std::vector<const DiskEntry*> out;
  for (auto [it, end] = children_.equal_range(parent); it != end; ++it)
    out.push_back(&index_.at(it->second));
  return out;
}

void CacheDisk::forget(uint64_t key) {
  const auto it = index_.find(key);
  if (it == index_.end()) return;
  for (auto [c, end] = children_.equal_range(it->second.parent); c != end; ++c)
    if (c->second == key) {
      children_.erase(c);
      break;
    }
  bytes_ -= it->second.file_bytes;
  index_.erase(it);
  std::error_code ec;
  std::filesystem::remove(path_of(key), ec);
}

bool CacheDisk::forget_oldest() {
  const auto old = std::min_element(index_.begin(), index_.end(), [](const auto& a, const auto& b) {
    return a.second.used < b.second.used;
  });
  if (old == index_.end()) return false;
  forget(old->first);
  return true;
}

void CacheDisk::put(const DiskEntry& head, const uint8_t* kv, const uint8_t* window,
                    const std::vector<const uint8_t*>& states) {
  if (!writable_) return;
  Header h{};
  std::memcpy(h.magic, kMagic, 8);
  h.version = kVersion;
  h.n_tokens = static_cast<uint32_t>(head.tokens.size());
  h.fingerprint = fingerprint_;
  h.key = head.key;
  h.parent = head.parent;
  h.page_bytes = shape_.page_bytes;
  h.window_bytes = shape_.window_bytes;
  h.state_bytes = shape_.state_bytes;
  h.window = window ? 1 : 0;
  h.n_checkpoints = static_cast<uint32_t>(head.checkpoints.size());
  h.used = clock_++;
  const size_t size = file_size(h);
  if (size > limit_) return;
  forget(head.key);  // an older copy
  while (bytes_ + size > limit_ && forget_oldest()) {
  }
  const std::string path = path_of(head.key);
  const std::string tmp =
      cat(dir_, "/.tmp-", static_cast<long>(::getpid()), "-", path.substr(dir_.size() + 1));
  CacheChecksum sum;
  bool ok = true;
  {
    File f{std::fopen(tmp.c_str(), "wb")};
    ok = f.f != nullptr;
    const auto write = [&](const void* p, size_t n) {
      if (!ok || n == 0) return;
      ok = std::fwrite(p, 1, n, f.f) == n;
      sum.add(p, n);
    };
    std::vector<int32_t> ints = head.tokens;  // the tokens, then the checkpoints' positions
    ints.insert(ints.end(), head.checkpoints.begin(), head.checkpoints.end());
    write(&h, sizeof(h));
    write(ints.data(), 4 * ints.size());
    write(kv, shape_.page_bytes);
    if (window) write(window, shape_.window_bytes);
    for (const uint8_t* s : states) write(s, shape_.state_bytes);
    const uint64_t v = sum.h;
    if (ok) ok = std::fwrite(&v, sizeof(v), 1, f.f) == 1;
    if (ok) ok = std::fflush(f.f) == 0 && ::fsync(::fileno(f.f)) == 0;
    if (f.f) ok = std::fclose(f.f) == 0 && ok;
    f.f = nullptr;
  }
  if (ok) ok = std::rename(tmp.c_str(), path.c_str()) == 0;
  if (!ok) {
    warnings_.push_back(cat("--cache-disk ", dir_, ": writing an entry failed (",
                            std::strerror(errno), "); the prompt cache goes on in RAM only"));
    std::error_code ec;
    std::filesystem::remove(tmp, ec);
    writable_ = false;
    return;
  }
  DiskEntry d = head;
  d.window = window != nullptr;
  d.file_bytes = size;
  d.used = h.used;
  bytes_ += size;
  children_.emplace(d.parent, d.key);
  index_.emplace(d.key, std::move(d));
  ++writes_;
}

bool CacheDisk::read(const DiskEntry& d, const Take& t) const {
  File f{std::fopen(path_of(d.key).c_str(), "rb")};
  Header h{};
  CacheChecksum sum;
  bool ok = f.f != nullptr;
  const auto get = [&](void* p, size_t n) {
    if (!ok || n == 0) return;
    ok = std::fread(p, 1, n, f.f) == n;
    sum.add(p, n);
  };
  get(&h, sizeof(h));
  ok = ok && std::memcmp(h.magic, kMagic, 8) == 0 && h.version == kVersion &&
       h.fingerprint == fingerprint_ && h.key == d.key && h.n_tokens == d.tokens.size() &&
       h.n_checkpoints == d.checkpoints.size() && (h.window != 0) == d.window &&
       h.page_bytes == shape_.page_bytes && h.window_bytes == shape_.window_bytes &&
       h.state_bytes == shape_.state_bytes && t.states.size() == d.checkpoints.size();
  std::vector<int32_t> skip(ok ? h.n_tokens + h.n_checkpoints : 0);
  get(skip.data(), 4 * skip.size());
  get(t.kv, shape_.page_bytes);
  if (d.window) get(t.window, shape_.window_bytes);
  for (uint8_t* s : t.states) get(s, shape_.state_bytes);
  uint64_t v = 0;
  if (ok) ok = std::fread(&v, sizeof(v), 1, f.f) == 1 && v == sum.h;
  return ok && std::fgetc(f.f) == EOF;
}

void CacheDisk::take(std::vector<Take>& takes) {
  std::vector<const DiskEntry*> entries;
  for (const Take& t : takes) entries.push_back(find(t.key));
  thread_pool().parallel_for(static_cast<int64_t>(takes.size()), 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      auto& t = takes[static_cast<size_t>(i)];
      const DiskEntry* d = entries[static_cast<size_t>(i)];
      t.ok = d && read(*d, t);
    }
  });
  for (size_t i = 0; i < takes.size(); ++i) {
    if (!entries[i]) continue;
    if (!takes[i].ok)
      warnings_.push_back(
          cat("--cache-disk: ", path_of(takes[i].key), ": corrupt (its checksum); not loaded"));
    reads_ += takes[i].ok;
    forget(takes[i].key);
  }
}

}  // namespace kvs
