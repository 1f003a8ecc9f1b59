// The prompt cache's disk tier: entries the RAM evicts are written and read back bit for bit,
// also by a later cache on the same directory; partial, corrupt and foreign files are refused
// by name; one process holds a directory; a failed write leaves the cache in RAM. And the
// engine's contract through it: a resume from disk after a restart gives the cold logits.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kvs/backend/device.h"
#include "kvs/engine/cache_disk.h"
#include "kvs/engine/engine.h"
#include "kvs/engine/prompt_cache.h"
#include "kvs/model/model.h"
#include "kvs/util/error.h"

namespace kvs {
namespace {

namespace fs = std::filesystem;

constexpr int32_t P = 4;
constexpr size_t kState = 16;

struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() / ("kvs_cache_disk_" + std::to_string(::getpid()) + "_" +
                                        std::to_string(std::random_device{}()));
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

PromptCacheShape shape() {
  PromptCacheShape s;
  s.page_tokens = P;
  s.page_bytes = 8;
  s.state_bytes = kState;
  return s;
}

std::unique_ptr<PromptCache> cache_on(const fs::path& dir, size_t ram_entries,
                                      uint64_t fingerprint = 1, size_t disk = 1 << 20) {
  auto c = std::make_unique<PromptCache>(ram_entries * (8 + P * 4) + kState, shape());
  c->use_disk(std::make_unique<CacheDisk>(dir.string(), disk, fingerprint, shape()));
  return c;
}

std::vector<int32_t> pages(std::initializer_list<int32_t> firsts) {
  std::vector<int32_t> t;
  for (int32_t v : firsts)
    for (int32_t i = 0; i < P; ++i) t.push_back(v);
  return t;
}

// Each page's bytes are its first token's value; the checkpoint's, its position.
void insert(PromptCache& c, const std::vector<int32_t>& t, int32_t checkpoint = 0) {
  std::vector<Checkpoint> cps;
  if (checkpoint > 0) {
    cps.push_back({checkpoint, std::make_unique<uint8_t[]>(kState)});
    std::memset(cps.back().state.get(), checkpoint, kState);
  }
  c.insert(
      t.data(), static_cast<int32_t>(t.size()), 0,
      [&](int32_t i, uint8_t* kv, uint8_t*) {
        if (kv) std::memset(kv, t[static_cast<size_t>(i * P)], 8);
      },
      std::move(cps));
}

// The first byte of every page found, and the state's first byte (0: none).
std::vector<int32_t> found(PromptCache& c, const std::vector<int32_t>& t,
                           int32_t* state = nullptr) {
  std::vector<int32_t> out;
  const CacheHit h = c.find(t.data(), static_cast<int32_t>(t.size()));
  for (const uint8_t* p : h.kv) {
    for (int i = 1; i < 8; ++i) EXPECT_EQ(p[i], p[0]);
    out.push_back(*p);
  }
  if (state) *state = h.state ? h.state[0] : 0;
  return out;
}

std::vector<fs::path> entry_files(const fs::path& dir) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".kvpc") out.push_back(e.path());
  return out;
}

bool warned(PromptCache& c, const std::string& what, const std::string& name) {
  for (const std::string& w : c.take_warnings())
    if (w.find(what) != std::string::npos && w.find(name) != std::string::npos) return true;
  return false;
}

TEST(CacheDisk, EvictedEntriesComeBackAlsoAfterARestart) {
  TempDir d;
  const auto a = pages({1, 2}), b = pages({5, 6});
  {
    auto c = cache_on(d.path, 3);  // 3 entries and a checkpoint
    insert(*c, a, 2 * P);
    insert(*c, b, 2 * P);  // a's leaf goes to disk, its checkpoint with it
    EXPECT_EQ(c->stats().disk_writes, 1);
    EXPECT_EQ(entry_files(d.path).size(), 1u);
    int32_t state = 0;
    EXPECT_EQ(found(*c, a, &state), (std::vector<int32_t>{1, 2}));  // read back, b's leaf out
    EXPECT_EQ(state, 2 * P);
    EXPECT_EQ(c->stats().disk_reads, 1);
    EXPECT_EQ(c->stats().disk_writes, 2);
    EXPECT_EQ(c->stats().checkpoints, 1);
  }                                           // everything still held goes to disk
  auto c = cache_on(d.path / "", 3);          // DIR/ is DIR
  EXPECT_EQ(entry_files(d.path).size(), 4u);  // b's leaf, then the three held at the end
  int32_t state = 0;
  EXPECT_EQ(found(*c, b, &state), (std::vector<int32_t>{5, 6}));
  EXPECT_EQ(state, 2 * P);
  EXPECT_EQ(found(*c, a, &state), (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(state, 2 * P);
  // A prefix that leaves a disk entry inside its page takes the rows that match.
  auto e = pages({1, 2});
  e[P + 2] = 9;
  c.reset();
  c = cache_on(d.path, 3);
  EXPECT_EQ(c->find(e.data(), static_cast<int32_t>(e.size())).n, 0);  // no checkpoint before
  EXPECT_TRUE(c->take_warnings().empty());
}

TEST(CacheDisk, BrokenAndForeignFilesAreRefusedByName) {
  TempDir d;
  const auto a = pages({1, 2}), b = pages({5, 6});
  {
    auto c = cache_on(d.path, 3);
    insert(*c, a, 2 * P);
    insert(*c, b, 2 * P);
  }
  auto files = entry_files(d.path);
  ASSERT_EQ(files.size(), 4u);
  // One file corrupt inside (found only when read), one cut short, one of another model.
  std::sort(files.begin(), files.end());
  {
    std::fstream f(files[0], std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(fs::file_size(files[0]) - 12));
    f.put('\x7f');
  }
  fs::resize_file(files[1], fs::file_size(files[1]) - 3);
  std::ofstream(d.path / ".tmp-1-0000000000000001.kvpc") << "a write a kill cut";
  auto c = cache_on(d.path, 3);
  EXPECT_TRUE(warned(*c, "partial", files[1].filename().string()));
  EXPECT_FALSE(fs::exists(d.path / ".tmp-1-0000000000000001.kvpc"));
  found(*c, a);
  found(*c, b);
  EXPECT_TRUE(warned(*c, "corrupt", files[0].filename().string()));
  EXPECT_LE(c->stats().disk_reads, 2);
  c.reset();
  auto other = cache_on(d.path, 3, /*fingerprint=*/2);
  EXPECT_TRUE(warned(*other, "another model", ".kvpc"));
  EXPECT_TRUE(found(*other, a).empty());
}

// A long match reads its pages' files all at once; one that does not check ends the match
// before it, and the pages after it that did check stay cached.
TEST(CacheDisk, ACorruptPageEndsAMatchReadAtOnce) {
  TempDir d;
  const auto a = pages({1, 2, 3});
  {
    auto c = cache_on(d.path, 6);
    for (int32_t n = 1; n <= 3; ++n)
      insert(*c, std::vector<int32_t>(a.begin(), a.begin() + n * P), n * P);
  }  // all three written as the cache goes
  ASSERT_EQ(entry_files(d.path).size(), 3u);
  // The middle page's file: its first token (after the 80-byte header) is 2.
  int corrupted = 0;
  for (const fs::path& f : entry_files(d.path)) {
    std::fstream io(f, std::ios::in | std::ios::out | std::ios::binary);
    int32_t first = 0;
    io.seekg(80);
    io.read(reinterpret_cast<char*>(&first), 4);
    if (first != 2) continue;
    io.seekp(static_cast<std::streamoff>(fs::file_size(f) - 12));
    io.put('\x7f');
    ++corrupted;
  }
  ASSERT_EQ(corrupted, 1);
  auto c = cache_on(d.path, 6);  // room for the pages and their checkpoints
  int32_t state = 0;
  EXPECT_EQ(found(*c, a, &state), (std::vector<int32_t>{1}));
  EXPECT_EQ(state, P);
  EXPECT_TRUE(warned(*c, "corrupt", ".kvpc"));
  EXPECT_EQ(c->stats().disk_reads, 2);
  EXPECT_TRUE(entry_files(d.path).empty());  // every file read went to RAM or was dropped
}

TEST(CacheDisk, OneProcessADirectoryAndWritesThatFailWarn) {
  TempDir d;
  auto c = cache_on(d.path, 2);
  try {
    CacheDisk second(d.path.string(), 1 << 20, 1, shape());
    FAIL() << "a second holder of the directory";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("another kvstream process"), std::string::npos);
  }
  // The directory replaced by a file: no write can succeed there, not even root's.
  fs::remove_all(d.path);
  std::ofstream(d.path) << "not a directory";
  insert(*c, pages({1, 2}));
  insert(*c, pages({3, 4}), 2 * P);  // evicts 1, 2: the write fails
  EXPECT_TRUE(warned(*c, "RAM only", d.path.string()));
  EXPECT_EQ(found(*c, pages({3, 4})), (std::vector<int32_t>{3, 4}));
  EXPECT_EQ(c->stats().disk_writes, 0);
}

// A disk limit keeps the most recently written entries: room for 3 files of one page and its
// checkpoint here (a header of 80 bytes, 4 tokens, a position, 8 bytes of page, 16 of state, a
// checksum: 132 bytes).
TEST(CacheDisk, TheLimitDropsTheOldestFiles) {
  TempDir d;
  auto c = cache_on(d.path, 1, 1, 3 * 132 + 50);
  for (int32_t v = 1; v <= 6; ++v) insert(*c, pages({v}), P);  // 1 to 5 written, 3 kept
  EXPECT_EQ(c->stats().disk_bytes, 3u * 132);
  EXPECT_EQ(entry_files(d.path).size(), 3u);
  EXPECT_EQ(found(*c, pages({5})), (std::vector<int32_t>{5}));
  EXPECT_TRUE(found(*c, pages({1})).empty());
}

std::vector<int32_t> random_tokens(std::mt19937& g, int32_t n, int32_t vocab) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = static_cast<int32_t>(g() % static_cast<uint32_t>(vocab));
  return t;
}

// A first engine reads a prompt, decodes, closes the sequence and goes; a second one on the same
// directory (a restart) resumes a longer prompt from disk with the logits of an engine without
// a cache: full, window and recurrent layers, resident and streamed.
TEST(CacheDisk, AResumeAfterARestartGivesTheColdLogits) {
  for (const char* preset : {"tiny", "tiny-gemma3", "tiny-qwen35"})
    for (const KvMode mode : {KvMode::Resident, KvMode::Stream}) {
      SCOPED_TRACE(std::string(preset) + " " + kv_mode_name(mode));
      TempDir d;
      auto m = Model::load(std::string("synthetic:") + preset);
      std::mt19937 g(5);
      const int32_t V = m->config.n_vocab;
      const auto prompt = random_tokens(g, 70, V);
      const auto gen = random_tokens(g, 5, V);
      std::vector<int32_t> next = prompt;
      next.insert(next.end(), gen.begin(), gen.end());
      const auto more = random_tokens(g, 20, V);
      next.insert(next.end(), more.begin(), more.end());
      EngineOptions o;
      o.n_ctx = 256;
      o.n_batch = 32;
      o.page_size = 16;
      o.kv_mode = mode;
      o.ring_chunk_bytes = 1024;
      if (mode == KvMode::Stream) {
        const KvLayout l = KvLayout::make(o.k_type, o.v_type, o.page_size, m->config.n_head_kv,
                                          m->config.head_dim);
        o.kv_arena = min_arena_bytes(l.page_bytes(), Engine::fixed_frames(m->config, o));
      }
      std::vector<float> want, got;
      {
        auto dev = make_cpu_device(0);
        Engine e(*m, *dev, o);
        Sequence s = e.open_sequence();
        const float* l = e.eval(s, next.data(), static_cast<int32_t>(next.size()));
        want.assign(l, l + V);
      }
      o.cache_ram = size_t{64} << 20;
      o.cache_disk = d.path.string();
      {
        auto dev = make_cpu_device(0);
        Engine e(*m, *dev, o);
        Sequence s = e.open_sequence();
        e.eval(s, prompt.data(), static_cast<int32_t>(prompt.size()));
        for (const int32_t t : gen) e.step({BatchEntry{&s, &t, 1}});
        e.close_sequence(s);
      }
      ASSERT_FALSE(entry_files(d.path).empty());
      auto dev = make_cpu_device(0);
      Engine e(*m, *dev, o);
      Sequence s = e.open_sequence();
      const int32_t reused = e.reuse_prefix(s, next.data(), static_cast<int32_t>(next.size()));
      EXPECT_EQ(reused, 75);
      const float* l = e.eval(s, next.data() + reused, static_cast<int32_t>(next.size()) - reused);
      got.assign(l, l + V);
      ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);
      const PromptCacheStats* st = e.prompt_cache_stats();
      ASSERT_NE(st, nullptr);
      EXPECT_GT(st->disk_reads, 0);
      EXPECT_TRUE(e.prompt_cache_warnings().empty());
    }
}

}  // namespace
}  // namespace kvs
