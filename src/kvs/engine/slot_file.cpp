// Slot files: a sequence's cached prefix written out and read back into the prompt cache
// (serve's POST /slots/ID?action=save|restore, chat's /save and /load). A file is a header
// (magic, version, the cache's fingerprint and entry sizes, the positions, which pages carry
// window layers, whether a recurrent state follows), the tokens, each page of the full layers
// (and of the window layers where it has them), the state at the end, then a checksum of all
// that, cut into the same pieces as the prompt cache's disk tier cuts its entries.
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>

#include "kvs/engine/cache_disk.h"
#include "kvs/engine/cache_link.h"
#include "kvs/util/error.h"

namespace kvs {
namespace {

constexpr char kMagic[8] = {'K', 'V', 'S', 'S', 'L', 'O', 'T', '1'};
constexpr uint32_t kVersion = 1;

struct SlotHeader {
  char magic[8];
  uint32_t version, n_tokens;
  uint64_t fingerprint, page_tokens, page_bytes, window_bytes, state_bytes;
  uint32_t n_pages, window_first, has_state, reserved;
};

struct FileCloser {
  void operator()(std::FILE* f) const {
    if (f) std::fclose(f);
  }
};
using FilePtr = std::unique_ptr<std::FILE, FileCloser>;

}  // namespace

int32_t PromptCacheLink::save(const std::vector<int32_t>& tokens, const std::string& path,
                              size_t* bytes) {
  const int32_t n = static_cast<int32_t>(tokens.size());
  KVS_CHECK(n > 0, "the slot holds no tokens to save");
  const CacheHit hit = cache_.find(tokens.data(), n);
  KVS_CHECK(hit.n > 0, "nothing of the slot's tokens is in the prompt cache (evicted?)");
  const PromptCacheShape& sh = cache_.shape();
  KVS_CHECK(sh.state_bytes == 0 || hit.state, "the slot's recurrent state at ", hit.n,
            " is not in the prompt cache");
  SlotHeader h{};
  std::memcpy(h.magic, kMagic, sizeof kMagic);
  h.version = kVersion;
  h.n_tokens = static_cast<uint32_t>(hit.n);
  h.fingerprint = fingerprint_;
  h.page_tokens = static_cast<uint64_t>(sh.page_tokens);
  h.page_bytes = sh.page_bytes;
  h.window_bytes = sh.window_bytes;
  h.state_bytes = sh.state_bytes;
  h.n_pages = static_cast<uint32_t>(hit.kv.size());
  // The window pages a resume needs are the last ones; those before may be absent.
  h.window_first = h.n_pages;
  if (sh.window_bytes > 0)
    while (h.window_first > 0 && hit.window[h.window_first - 1]) --h.window_first;
  h.has_state = hit.state ? 1 : 0;
  const std::string tmp = path + ".tmp";
  CacheChecksum sum;
  size_t written = 0;
  {
    FilePtr f(std::fopen(tmp.c_str(), "wb"));
    KVS_CHECK(f, "cannot write slot file '", tmp, "': ", std::strerror(errno));
    bool ok = true;
    auto put = [&](const void* p, size_t len) {
      sum.add(p, len);
      ok = ok && std::fwrite(p, 1, len, f.get()) == len;
      written += len;
    };
    put(&h, sizeof h);
    put(tokens.data(), static_cast<size_t>(hit.n) * sizeof(int32_t));
    for (uint32_t i = 0; i < h.n_pages; ++i) {
      put(hit.kv[i], sh.page_bytes);
      if (i >= h.window_first) put(hit.window[i], sh.window_bytes);
    }
    if (hit.state) put(hit.state, sh.state_bytes);
    ok = ok && std::fwrite(&sum.h, sizeof sum.h, 1, f.get()) == 1 && std::fflush(f.get()) == 0;
    written += sizeof sum.h;
    if (!ok) {
      const int err = errno;
      f.reset();
      std::remove(tmp.c_str());
      fail("writing slot file '", path, "' failed: ", std::strerror(err));
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  KVS_CHECK(!ec, "cannot rename '", tmp, "' to '", path, "': ", ec.message());
  if (bytes) *bytes = written;
  return hit.n;
}

void PromptCacheLink::load(const std::string& path, std::vector<int32_t>& tokens, size_t* bytes) {
  std::error_code ec;
  const uintmax_t size = std::filesystem::file_size(path, ec);
  KVS_CHECK(!ec, "cannot read slot file '", path, "': ", ec.message());
  FilePtr f(std::fopen(path.c_str(), "rb"));
  KVS_CHECK(f, "cannot read slot file '", path, "': ", std::strerror(errno));
  SlotHeader h{};
  KVS_CHECK(std::fread(&h, sizeof h, 1, f.get()) == 1 && std::memcmp(h.magic, kMagic, 8) == 0 &&
                h.version == kVersion,
            "'", path, "' is not a kvstream slot file (of version ", kVersion, ")");
  const PromptCacheShape& sh = cache_.shape();
  KVS_CHECK(h.fingerprint == fingerprint_ && h.page_tokens == uint64_t(sh.page_tokens) &&
                h.page_bytes == sh.page_bytes && h.window_bytes == sh.window_bytes &&
                h.state_bytes == sh.state_bytes,
            "slot file '", path,
            "' is of another model, KV type or page size than this server's; not loaded");
  const uint64_t P = h.page_tokens;
  KVS_CHECK(h.n_tokens > 0 && h.n_pages == (h.n_tokens + P - 1) / P &&
                h.window_first <= h.n_pages && (h.has_state == 0) == (sh.state_bytes == 0),
            "slot file '", path, "' has a corrupt header; not loaded");
  const uint64_t want = sizeof h + uint64_t{h.n_tokens} * 4 + uint64_t{h.n_pages} * h.page_bytes +
                        uint64_t{h.n_pages - h.window_first} * h.window_bytes +
                        (h.has_state ? h.state_bytes : 0) + sizeof(uint64_t);
  KVS_CHECK(size == want, "slot file '", path, "' is ", size, " bytes where its header says ", want,
            " (partial or corrupt); not loaded");
  CacheChecksum sum;
  sum.add(&h, sizeof h);
  bool ok = true;
  auto get = [&](void* p, size_t len) {
    ok = ok && std::fread(p, 1, len, f.get()) == len;
    if (ok) sum.add(p, len);
  };
  std::vector<int32_t> toks(h.n_tokens);
  get(toks.data(), toks.size() * sizeof(int32_t));
  std::vector<std::unique_ptr<uint8_t[]>> kv(h.n_pages), win(h.n_pages);
  for (uint32_t i = 0; i < h.n_pages && ok; ++i) {
    kv[i] = std::make_unique_for_overwrite<uint8_t[]>(h.page_bytes);
    get(kv[i].get(), h.page_bytes);
    if (i >= h.window_first) {
      win[i] = std::make_unique_for_overwrite<uint8_t[]>(h.window_bytes);
      get(win[i].get(), h.window_bytes);
    }
  }
  std::vector<Checkpoint> cps;
  if (h.has_state) {
    Checkpoint c{static_cast<int32_t>(h.n_tokens),
                 std::make_unique_for_overwrite<uint8_t[]>(h.state_bytes)};
    get(c.state.get(), h.state_bytes);
    cps.push_back(std::move(c));
  }
  uint64_t stored = 0;
  ok = ok && std::fread(&stored, sizeof stored, 1, f.get()) == 1;
  KVS_CHECK(ok && stored == sum.h, "slot file '", path, "' is corrupt (its checksum); not loaded");
  for (int32_t t : toks)
    KVS_CHECK(t >= 0 && t < cfg_.n_vocab, "slot file '", path, "' has token ", t,
              " outside the vocabulary; not loaded");
  cache_.insert(
      toks.data(), static_cast<int32_t>(h.n_tokens), static_cast<int32_t>(h.window_first),
      [&](int32_t i, uint8_t* to_kv, uint8_t* to_window) {
        if (to_kv) std::memcpy(to_kv, kv[static_cast<size_t>(i)].get(), h.page_bytes);
        if (to_window) std::memcpy(to_window, win[static_cast<size_t>(i)].get(), h.window_bytes);
      },
      std::move(cps));
  tokens = std::move(toks);
  if (bytes) *bytes = static_cast<size_t>(size);
}

}  // namespace kvs
