#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>

#include "kvs/gguf/gguf.h"
#include "kvs/util/error.h"

namespace kvs::gguf {
namespace {

// A hand-built image, for layouts the Writer refuses to produce.
struct Img {
  std::vector<uint8_t> b;
  template <class T>
  Img& put(T x) {
    size_t n = b.size();
    b.resize(n + sizeof(T));
    std::memcpy(b.data() + n, &x, sizeof(T));
    return *this;
  }
  Img& u8(uint8_t x) { return put(x); }
  Img& u32(uint32_t x) { return put(x); }
  Img& u64(uint64_t x) { return put(x); }
  Img& str(std::string_view s) {
    u64(s.size());
    b.insert(b.end(), s.begin(), s.end());
    return *this;
  }
  Img& pad(size_t a) {
    b.resize((b.size() + a - 1) / a * a, 0);
    return *this;
  }
  Img& zeros(size_t n) {
    b.resize(b.size() + n, 0);
    return *this;
  }
};

Img header(uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
  Img i;
  i.b = {'G', 'G', 'U', 'F'};
  i.u32(version).u64(n_tensors).u64(n_kv);
  return i;
}

constexpr uint32_t T_U32 = 4, T_BOOL = 7, T_STRING = 8, T_ARRAY = 9;

// Parses `bytes`, expecting a kvs::Error whose message contains every one of `parts`.
void expect_error(std::vector<uint8_t> bytes, std::initializer_list<std::string_view> parts) {
  try {
    File::from_buffer(std::move(bytes), "bad.gguf");
    ADD_FAILURE() << "parsed without error";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("bad.gguf"), std::string::npos) << msg;
    for (std::string_view p : parts) EXPECT_NE(msg.find(p), std::string::npos) << msg;
  }
}

bool same(const Value& a, const Value& b) {
  if (a.type != b.type || a.v.index() != b.v.index()) return false;
  if (const auto* u = std::get_if<uint64_t>(&a.v)) return *u == std::get<uint64_t>(b.v);
  if (const auto* i = std::get_if<int64_t>(&a.v)) return *i == std::get<int64_t>(b.v);
  if (const auto* d = std::get_if<double>(&a.v)) return *d == std::get<double>(b.v);
  if (const auto* t = std::get_if<bool>(&a.v)) return *t == std::get<bool>(b.v);
  if (const auto* s = std::get_if<std::string>(&a.v)) return *s == std::get<std::string>(b.v);
  if (a.elem != b.elem) return false;
  const Array& x = std::get<Array>(a.v);
  const Array& y = std::get<Array>(b.v);
  if (x.size() != y.size()) return false;
  for (size_t i = 0; i < x.size(); i++) {
    if (!same(x[i], y[i])) return false;
  }
  return true;
}

std::vector<uint8_t> pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; i++) v[i] = static_cast<uint8_t>(seed + i * 7);
  return v;
}

struct Sample {
  Writer w;
  std::vector<std::pair<std::string, Value>> kv;
  std::vector<std::vector<uint8_t>> data;
};

// Every value type and tensors of several types. The last tensor's size is a multiple of the
// alignment, so the image has no trailing padding and every truncation loses needed bytes.
Sample sample() {
  Sample s;
  s.kv = {
      {"general.architecture", Value::str("llama")},
      {"t.u8", {ValueType::U8, uint64_t{250}, {}}},
      {"t.i8", {ValueType::I8, int64_t{-120}, {}}},
      {"t.u16", {ValueType::U16, uint64_t{65000}, {}}},
      {"t.i16", {ValueType::I16, int64_t{-32000}, {}}},
      {"t.u32", Value::u32(4000000000u)},
      {"t.i32", Value::i32(-2000000000)},
      {"t.u64", Value::u64(~uint64_t{0})},
      {"t.i64", Value::i64(-(int64_t{1} << 62))},
      {"t.f32", Value::f32(1e-5f)},
      {"t.f64", Value::f64(3.141592653589793)},
      {"t.bool", Value::boolean(true)},
      {"t.false", Value::boolean(false)},
      {"t.empty", Value::str("")},
      {"t.strings", Value::array(ValueType::STRING,
                                 {Value::str("a"), Value::str(""), Value::str("\xc4\xa0hello")})},
      {"t.u8s", Value::array(ValueType::U8, {{ValueType::U8, uint64_t{1}, {}},
                                             {ValueType::U8, uint64_t{255}, {}}})},
      {"t.f32s", Value::array(ValueType::F32, {Value::f32(0.5f), Value::f32(-2.0f)})},
      {"t.bools", Value::array(ValueType::BOOL, {Value::boolean(false), Value::boolean(true)})},
      {"t.nested", Value::array(ValueType::ARRAY,
                                {Value::array(ValueType::I32, {Value::i32(1), Value::i32(-2)}),
                                 Value::array(ValueType::STRING, {Value::str("x")}),
                                 Value::array(ValueType::U64, {})})},
      {"t.none", Value::array(ValueType::I64, {})},
  };
  for (auto& [k, v] : s.kv) s.w.set(k, v);
  s.data.push_back(pattern(4 * 3 * 2, 1));  // f32 [3, 2]
  s.w.add_tensor("a.f32", DType::F32, {3, 2}, s.data.back().data(), s.data.back().size());
  s.data.push_back(pattern(34 * 3, 2));  // q8_0 [32, 3]
  s.w.add_tensor("b.q8_0", DType::Q8_0, {32, 3}, s.data.back().data(), s.data.back().size());
  s.data.push_back(pattern(144 * 2, 3));  // q4_k [256, 1, 2]
  s.w.add_tensor("c.q4_k", DType::Q4_K, {256, 1, 2}, s.data.back().data(), s.data.back().size());
  s.data.push_back(pattern(2 * 16 * 2, 4));  // f16 [16, 2], 64 bytes
  s.w.add_tensor("d.f16", DType::F16, {16, 2}, s.data.back().data(), s.data.back().size());
  return s;
}

void check_sample(const File& f, const Sample& s) {
  ASSERT_EQ(f.metadata().size(), s.kv.size());
  for (size_t i = 0; i < s.kv.size(); i++) {
    EXPECT_EQ(f.metadata()[i].first, s.kv[i].first);
    EXPECT_TRUE(same(f.metadata()[i].second, s.kv[i].second)) << s.kv[i].first;
  }
  ASSERT_EQ(f.tensors().size(), 4u);
  const char* names[] = {"a.f32", "b.q8_0", "c.q4_k", "d.f16"};
  DType types[] = {DType::F32, DType::Q8_0, DType::Q4_K, DType::F16};
  for (size_t i = 0; i < 4; i++) {
    const TensorInfo& t = f.tensor(names[i]);
    EXPECT_EQ(&t, &f.tensors()[i]);
    EXPECT_EQ(t.type, types[i]);
    EXPECT_EQ(t.nbytes, s.data[i].size());
    EXPECT_EQ(t.offset % f.alignment(), 0u);
    EXPECT_EQ(std::memcmp(t.data, s.data[i].data(), t.nbytes), 0) << names[i];
  }
  EXPECT_EQ(f.tensor("c.q4_k").dims, (std::vector<int64_t>{256, 1, 2}));
  EXPECT_EQ(f.tensor("c.q4_k").n_elements(), 512);
  EXPECT_EQ(f.tensor("c.q4_k").rows(), 2);
  EXPECT_EQ(f.tensor("a.f32").rows(), 2);
}

std::string temp_path(const char* name) {
  return (std::filesystem::temp_directory_path() / (std::to_string(getpid()) + name)).string();
}

TEST(Gguf, RoundTripBuffer) {
  Sample s = sample();
  auto f = File::from_buffer(s.w.to_bytes(), "mem.gguf");
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->alignment(), 32u);
  EXPECT_EQ(f->data_offset() % 32, 0u);
  EXPECT_EQ(f->name(), "mem.gguf");
  check_sample(*f, s);
}

TEST(Gguf, RoundTripFile) {
  Sample s = sample();
  std::string path = temp_path("_rt.gguf");
  s.w.write(path);
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  {
    auto f = File::open(path);
    EXPECT_EQ(f->size(), std::filesystem::file_size(path));
    check_sample(*f, s);
  }
  std::filesystem::remove(path);
}

TEST(Gguf, OpenErrorsNameThePath) {
  try {
    File::open("/nonexistent/dir/x.gguf");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/dir/x.gguf"), std::string::npos);
  }
  try {
    sample().w.write("/nonexistent/dir/y.gguf");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/dir/y.gguf"), std::string::npos);
  }
  std::string empty = temp_path("_empty.gguf");
  std::fclose(std::fopen(empty.c_str(), "wb"));
  EXPECT_THROW(File::open(empty), Error);
  std::filesystem::remove(empty);
}

TEST(Gguf, Version2) {
  // v2 has the same layout as v3 (64-bit counts and lengths).
  Img i = header(2, 1, 2);
  i.str("general.architecture").u32(T_STRING).str("llama");
  i.str("n").u32(T_ARRAY).u32(T_U32).u64(2).u32(7).u32(9);
  i.str("w").u32(2).u64(4).u64(2).u32(0).u64(0);  // f32 [4, 2]
  i.pad(32);
  std::vector<uint8_t> data = pattern(32, 5);
  i.b.insert(i.b.end(), data.begin(), data.end());
  auto f = File::from_buffer(i.b, "v2.gguf");
  EXPECT_EQ(f->version(), 2u);
  EXPECT_EQ(f->get_string("general.architecture"), "llama");
  EXPECT_EQ(f->get("n").as_array("n").size(), 2u);
  EXPECT_EQ(f->get("n").as_array("n")[1].as_int("n"), 9);
  EXPECT_EQ(f->tensor("w").nbytes, 32u);
  EXPECT_EQ(std::memcmp(f->tensor("w").data, data.data(), 32), 0);
}

TEST(Gguf, Alignment) {
  Writer w;
  w.set("general.alignment", Value::u32(64));
  std::vector<uint8_t> a = pattern(12, 1), b = pattern(34, 2), c = pattern(4, 3);
  w.add_tensor("a", DType::F32, {3}, a.data(), a.size());
  w.add_tensor("b", DType::Q8_0, {32}, b.data(), b.size());
  w.add_tensor("c", DType::F32, {1}, c.data(), c.size());
  std::vector<uint8_t> img = w.to_bytes();
  auto f = File::from_buffer(img, "al.gguf");
  EXPECT_EQ(f->alignment(), 64u);
  EXPECT_EQ(f->data_offset() % 64, 0u);
  EXPECT_EQ(img.size() % 64, 0u);
  uint64_t prev_end = 0;
  for (const TensorInfo& t : f->tensors()) {
    EXPECT_EQ(t.offset % 64, 0u) << t.name;
    EXPECT_GE(t.offset, prev_end);
    prev_end = t.offset + t.nbytes;
    EXPECT_EQ(std::memcmp(img.data() + f->data_offset() + t.offset, t.data, t.nbytes), 0);
  }
  EXPECT_EQ(std::memcmp(f->tensor("b").data, b.data(), b.size()), 0);

  // An offset aligned to 32 but not to 64 is rejected.
  Img i = header(3, 1, 1);
  i.str("general.alignment").u32(T_U32).u32(64);
  i.str("t").u32(1).u64(8).u32(0).u64(32).pad(64).zeros(128);
  expect_error(i.b, {"tensor 't'", "not a multiple of the alignment 64"});
}

TEST(Gguf, BadAlignment) {
  for (uint32_t al : {0u, 48u, 3u}) {
    Img i = header(3, 0, 1);
    i.str("general.alignment").u32(T_U32).u32(al);
    expect_error(i.b, {"general.alignment", "power of two"});
  }
  Img neg = header(3, 0, 1);
  neg.str("general.alignment").u32(5).u32(static_cast<uint32_t>(-32));
  expect_error(neg.b, {"general.alignment", "negative"});
  Img s = header(3, 0, 1);
  s.str("general.alignment").u32(T_STRING).str("32");
  expect_error(s.b, {"general.alignment", "expected an integer"});
  Writer w;
  w.set("general.alignment", Value::u32(24));
  EXPECT_THROW(w.to_bytes(), Error);
}

TEST(Gguf, TruncatedEverywhere) {
  std::vector<uint8_t> img = sample().w.to_bytes();
  uint64_t data_start = File::from_buffer(img, "ok.gguf")->data_offset();
  for (size_t cut = 0; cut < img.size(); cut++) {
    std::vector<uint8_t> part(img.begin(), img.begin() + static_cast<ptrdiff_t>(cut));
    try {
      File::from_buffer(std::move(part), "cut.gguf");
      ADD_FAILURE() << "no error when cut at " << cut;
    } catch (const Error& e) {
      std::string msg = e.what();
      EXPECT_EQ(msg.rfind("cut.gguf: ", 0), 0u) << msg;
      if (cut >= data_start) {
        EXPECT_NE(msg.find("tensor '"), std::string::npos) << msg;
        EXPECT_NE(msg.find("extends past the end of the file"), std::string::npos) << msg;
      }
    }
  }
}

TEST(Gguf, BadHeader) {
  expect_error({}, {"truncated", "magic"});
  Img m = header(3, 0, 0);
  m.b[3] = 'X';
  expect_error(m.b, {"not a GGUF file"});
  expect_error(header(1, 0, 0).b, {"version 1 is not supported"});
  expect_error(header(4, 0, 0).b, {"unsupported GGUF version 4"});
  expect_error(header(0x03000000, 0, 0).b, {"big-endian"});
  expect_error(header(3, 0, uint64_t{1} << 60).b, {"metadata count"});
  expect_error(header(3, ~uint64_t{0}, 0).b, {"tensor count"});
  Img both = header(3, 1, 2);
  both.zeros(40);  // enough for either count alone, not for both
  expect_error(both.b, {"cannot fit"});
  // An empty file (no kv, no tensors) is valid.
  auto f = File::from_buffer(header(3, 0, 0).b, "empty.gguf");
  EXPECT_TRUE(f->metadata().empty());
  EXPECT_TRUE(f->tensors().empty());
}

TEST(Gguf, BadMetadata) {
  Img key = header(3, 0, 1);
  key.u64(uint64_t{1} << 62).zeros(16);
  expect_error(key.b, {"metadata entry 0", "truncated", "key"});

  Img str = header(3, 0, 1);
  str.str("k").u32(T_STRING).u64(~uint64_t{0} - 3).zeros(16);
  expect_error(str.b, {"metadata key 'k'", "truncated", "string"});

  Img arr = header(3, 0, 1);
  arr.str("k").u32(T_ARRAY).u32(T_U32).u64(uint64_t{1} << 61).zeros(64);
  expect_error(arr.b, {"metadata key 'k'", "array of"});

  // Strings need 8 bytes each (their length), so 10 of them cannot fit in 40 bytes.
  Img sarr = header(3, 0, 1);
  sarr.str("k").u32(T_ARRAY).u32(T_STRING).u64(10).zeros(40);
  expect_error(sarr.b, {"array of 10 string"});

  Img type = header(3, 0, 1);
  type.str("k").u32(13).u32(0);
  expect_error(type.b, {"metadata key 'k'", "unknown value type 13"});

  Img etype = header(3, 0, 1);
  etype.str("k").u32(T_ARRAY).u32(0xffffffff).u64(0);
  expect_error(etype.b, {"unknown value type 4294967295"});

  Img boolean = header(3, 0, 1);
  boolean.str("k").u32(T_BOOL).u8(2).zeros(12);
  expect_error(boolean.b, {"bool value 2"});

  Img dup = header(3, 0, 2);
  dup.str("k").u32(T_U32).u32(1).str("k").u32(T_U32).u32(2);
  expect_error(dup.b, {"metadata key 'k'", "duplicate"});

  // Deep nesting: each level an array of one array.
  Img deep = header(3, 0, 1);
  deep.str("k").u32(T_ARRAY);
  for (int d = 0; d < 20; d++) deep.u32(T_ARRAY).u64(1);
  deep.u32(T_U32).u64(0);
  expect_error(deep.b, {"nested deeper"});

  // Hostile bytes in a key are escaped in the message.
  Img ctl = header(3, 0, 1);
  ctl.str("a\x01\n").u32(13).u32(0);
  expect_error(ctl.b, {"'a\\x01\\x0a'"});
}

// One tensor info with the given fields, then 256 bytes of data.
std::vector<uint8_t> one_tensor(std::string_view name, std::vector<uint64_t> dims, uint32_t type,
                                uint64_t offset, uint32_t n_dims = 0) {
  Img i = header(3, 1, 0);
  i.str(name).u32(n_dims != 0 ? n_dims : static_cast<uint32_t>(dims.size()));
  for (uint64_t d : dims) i.u64(d);
  i.u32(type).u64(offset).pad(32).zeros(256);
  return i.b;
}

TEST(Gguf, BadTensors) {
  EXPECT_NO_THROW(File::from_buffer(one_tensor("w", {64}, 0, 0), "ok.gguf"));
  EXPECT_NO_THROW(File::from_buffer(one_tensor("w", {32, 2}, 2, 32), "ok.gguf"));
  expect_error(one_tensor("w", {64}, 5, 0), {"tensor 'w'", "unknown tensor type id 5"});
  expect_error(one_tensor("w", {64}, 1000, 0), {"tensor 'w'", "unknown tensor type id 1000"});
  expect_error(one_tensor("w", {1, 1, 1, 1, 1}, 0, 0), {"tensor 'w'", "n_dims 5"});
  expect_error(one_tensor("w", {}, 0, 0), {"tensor 'w'", "n_dims 0"});
  expect_error(one_tensor("w", {4, 0}, 0, 0), {"tensor 'w'", "dimension 1 is 0"});
  expect_error(one_tensor("w", {~uint64_t{0}}, 0, 0), {"tensor 'w'", "dimension 0 is -1"});
  expect_error(one_tensor("w", {uint64_t{1} << 32, uint64_t{1} << 32}, 0, 0), {"overflows"});
  expect_error(one_tensor("w", {uint64_t{1} << 62}, 0, 0), {"tensor 'w'", "overflows"});
  expect_error(one_tensor("w", {33}, 2, 0), {"tensor 'w'", "not a multiple", "q4_0", "32"});
  expect_error(one_tensor("w", {128, 2}, 23, 0), {"tensor 'w'", "not a multiple", "iq4_xs", "256"});
  expect_error(one_tensor("w", {384}, 11, 0), {"tensor 'w'", "not a multiple", "q3_k", "256"});
  expect_error(one_tensor("w", {200}, 10, 0), {"tensor 'w'", "not a multiple", "q2_k", "256"});
  expect_error(one_tensor("w", {48}, 20, 0), {"tensor 'w'", "not a multiple", "iq4_nl", "32"});
  expect_error(one_tensor("w", {4}, 0, 4), {"tensor 'w'", "not a multiple of the alignment 32"});
  expect_error(one_tensor("w", {4}, 0, 256), {"tensor 'w'", "extends past the end"});
  expect_error(one_tensor("w", {128}, 0, 0), {"tensor 'w'", "[offset 0, 512 bytes]"});
  expect_error(one_tensor("w", {4}, 0, ~uint64_t{31}), {"tensor 'w'", "extends past the end"});
  expect_error(one_tensor("w", {uint64_t{1} << 60}, 0, 0), {"tensor 'w'", "extends past"});
  expect_error(one_tensor("w", {uint64_t{1} << 58}, 0, 32), {"tensor 'w'", "extends past"});
  // The name length is checked before allocating.
  Img name = header(3, 1, 0);
  name.u64(uint64_t{1} << 50).zeros(64);
  expect_error(name.b, {"tensor info 0", "truncated", "tensor name"});

  Img dup = header(3, 2, 0);
  dup.str("w").u32(1).u64(8).u32(0).u64(0);
  dup.str("w").u32(1).u64(8).u32(0).u64(32);
  dup.pad(32).zeros(64);
  expect_error(dup.b, {"tensor 'w'", "duplicate"});
}

TEST(Gguf, FuzzByteFlips) {
  std::vector<uint8_t> img = sample().w.to_bytes();
  size_t header_end = File::from_buffer(img, "ok.gguf")->data_offset();
  std::mt19937 rng(1234);
  int ok = 0, failed = 0;
  for (int it = 0; it < 2000; it++) {
    std::vector<uint8_t> b = img;
    int flips = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < flips; k++) {
      // Mostly in the header, where the structure is; sometimes anywhere.
      size_t pos = rng() % 8 == 0 ? rng() % b.size() : rng() % header_end;
      b[pos] = rng() % 2 == 0 ? static_cast<uint8_t>(b[pos] ^ (1u << (rng() % 8)))
                              : static_cast<uint8_t>(rng());
    }
    if (rng() % 16 == 0) b.resize(rng() % b.size());
    try {
      auto f = File::from_buffer(std::move(b), "fuzz.gguf");
      // Touch everything the parse handed out, for the sanitizers.
      size_t sum = 0;
      for (const auto& [k, v] : f->metadata()) sum += k.size() + v.to_string().size();
      for (const TensorInfo& t : f->tensors()) {
        for (uint64_t i = 0; i < t.nbytes; i++) sum += t.data[i];
      }
      EXPECT_GT(sum, 0u);
      ok++;
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()).rfind("fuzz.gguf: ", 0), 0u) << e.what();
      failed++;
    }
  }
  EXPECT_GT(ok, 0);
  EXPECT_GT(failed, 0);
}

TEST(Gguf, Getters) {
  auto f = File::from_buffer(sample().w.to_bytes(), "get.gguf");
  EXPECT_EQ(f->get_string("general.architecture"), "llama");
  EXPECT_EQ(f->get_int("t.u8"), 250);
  EXPECT_EQ(f->get_int("t.i64"), -(int64_t{1} << 62));
  EXPECT_EQ(f->get_int("absent", 7), 7);
  EXPECT_FLOAT_EQ(static_cast<float>(f->get_float("t.f32")), 1e-5f);
  EXPECT_DOUBLE_EQ(f->get_float("t.u32"), 4e9);  // integers convert
  EXPECT_DOUBLE_EQ(f->get_float("absent", 0.5), 0.5);
  EXPECT_TRUE(f->get_bool("t.bool"));
  EXPECT_FALSE(f->get_bool("absent", false));
  EXPECT_EQ(f->get_string("absent", "d"), "d");
  EXPECT_EQ(f->find("absent"), nullptr);
  EXPECT_EQ(f->find_tensor("absent"), nullptr);
  EXPECT_TRUE(f->get("t.u16").is_integer());
  EXPECT_TRUE(f->get("t.f64").is_float());
  auto throws_with = [](auto fn, std::initializer_list<std::string_view> parts) {
    try {
      fn();
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      for (std::string_view p : parts) {
        EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
      }
    }
  };
  throws_with([&] { f->get("nope"); }, {"get.gguf", "nope"});
  throws_with([&] { f->get_int("nope"); }, {"get.gguf", "nope"});
  throws_with([&] { f->get_int("t.f32", 1); }, {"get.gguf", "t.f32", "integer"});
  throws_with([&] { f->get_int("t.u64"); }, {"get.gguf", "t.u64", "does not fit"});
  throws_with([&] { f->get_string("t.u32"); }, {"get.gguf", "t.u32", "string"});
  throws_with([&] { f->get_bool("t.u8"); }, {"get.gguf", "t.u8", "bool"});
  throws_with([&] { f->get_float("t.strings"); }, {"get.gguf", "array of string"});
  throws_with([&] { f->tensor("nope.weight"); }, {"get.gguf", "nope.weight"});
  throws_with([&] { f->get("t.u32").as_array("t.u32"); }, {"t.u32", "array"});
}

TEST(Gguf, ToString) {
  Array many;
  for (uint32_t i = 1; i <= 49152; i++) many.push_back(Value::u32(i));
  Value big = Value::array(ValueType::U32, std::move(many));
  EXPECT_EQ(big.to_string(3), "[1, 2, 3, ... (49152 items)]");
  EXPECT_EQ(big.to_string(0), "[... (49152 items)]");
  EXPECT_EQ(Value::array(ValueType::I32, {}).to_string(), "[]");
  EXPECT_EQ(Value::array(ValueType::STRING, {Value::str("a\"b"), Value::str("\n")}).to_string(),
            "[\"a\\\"b\", \"\\n\"]");
  EXPECT_EQ(Value::str("llama").to_string(), "llama");
  EXPECT_EQ(Value::f32(1e-5f).to_string(), "1e-05");
  EXPECT_EQ(Value::f32(100000.0f).to_string(), "100000");
  EXPECT_EQ(Value::f64(0.1).to_string(), "0.1");
  EXPECT_EQ(Value::f32(-2.5f).to_string(), "-2.5");
  EXPECT_EQ(Value::f64(1e300).to_string(), "1e+300");
  EXPECT_EQ(Value::boolean(true).to_string(), "true");
  EXPECT_EQ(Value::i32(-3).to_string(), "-3");
  EXPECT_EQ(
      Value::array(ValueType::ARRAY, {Value::array(ValueType::I32, {Value::i32(1), Value::i32(2)})})
          .to_string(),
      "[[1, 2]]");
  EXPECT_STREQ(value_type_name(ValueType::F64), "f64");
  EXPECT_STREQ(value_type_name(ValueType::ARRAY), "array");
}

TEST(Gguf, WriterErrors) {
  std::vector<uint8_t> d(64);
  Writer w;
  EXPECT_THROW(w.add_tensor("a", DType::F32, {4}, d.data(), 15), Error);   // wrong size
  EXPECT_THROW(w.add_tensor("a", DType::Q4_0, {16}, d.data(), 9), Error);  // partial block
  EXPECT_THROW(w.add_tensor("a", DType::F32, {1, 1, 1, 1, 1}, d.data(), 4), Error);
  EXPECT_THROW(w.add_tensor("a", DType::F32, {0}, d.data(), 0), Error);
  EXPECT_THROW(w.add_tensor("a", static_cast<DType>(5), {4}, d.data(), 16), Error);
  w.add_tensor("a", DType::F32, {4}, d.data(), 16);
  EXPECT_THROW(w.add_tensor("a", DType::F32, {4}, d.data(), 16), Error);  // duplicate

  Writer range;
  range.set("k", {ValueType::U8, uint64_t{300}, {}});
  EXPECT_THROW(range.to_bytes(), Error);
  Writer mixed;
  mixed.set("k", Value::array(ValueType::U32, {Value::u32(1), Value::str("x")}));
  EXPECT_THROW(mixed.to_bytes(), Error);
  Writer repr;
  repr.set("k", {ValueType::STRING, uint64_t{1}, {}});
  EXPECT_THROW(repr.to_bytes(), Error);

  // set() replaces in place, keeping the first position.
  Writer r;
  r.set("a", Value::u32(1));
  r.set("b", Value::u32(2));
  r.set("a", Value::str("x"));
  auto f = File::from_buffer(r.to_bytes(), "r.gguf");
  ASSERT_EQ(f->metadata().size(), 2u);
  EXPECT_EQ(f->metadata()[0].first, "a");
  EXPECT_EQ(f->get_string("a"), "x");
}

TEST(GgufTypes, Table) {
  EXPECT_EQ(dtype_traits(3)->block_bytes, 20u);
  EXPECT_EQ(dtype_traits(4), nullptr);
  EXPECT_EQ(dtype_traits(40), nullptr);
  EXPECT_EQ(dtype_traits(~0u), nullptr);
  EXPECT_STREQ(dtype_name(DType::Q6_K), "q6_k");
  EXPECT_EQ(traits(DType::MXFP4).block_bytes, 17u);
  EXPECT_EQ(traits(DType::IQ4_XS).block, 256u);
  EXPECT_EQ(row_bytes(DType::Q4_K, 512), 288u);
  EXPECT_EQ(row_bytes(DType::BF16, 3), 6u);
  EXPECT_THROW(row_bytes(DType::Q8_0, 33), Error);
  EXPECT_EQ(parse_dtype("Q4_K", "--type"), DType::Q4_K);
  EXPECT_EQ(parse_dtype("bf16", "--type"), DType::BF16);
  EXPECT_TRUE(is_supported(DType::Q5_1));
  EXPECT_TRUE(is_supported(DType::Q2_K));
  EXPECT_FALSE(is_supported(DType::IQ2_XXS));
  try {
    parse_dtype("q9", "--type");
    FAIL();
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("--type"), std::string::npos) << msg;
    EXPECT_NE(msg.find("q4_k"), std::string::npos) << msg;
  }
  EXPECT_EQ(parse_dtype("IQ4_XS", "--type"), DType::IQ4_XS);
  EXPECT_THROW(parse_dtype("iq3_s", "--type"), Error);  // known but not supported
}

TEST(Gguf, RealModel) {
  const char* dir = std::getenv("KVS_MODEL_DIR");
  std::string path = std::string(dir != nullptr ? dir : KVS_TEST_SOURCE_DIR "/models") +
                     "/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << path << " not found";
  auto f = File::open(path);
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->get_string("general.architecture"), "llama");
  EXPECT_EQ(f->get_int("llama.block_count"), 30);
  EXPECT_EQ(f->get_int("llama.embedding_length"), 576);
  EXPECT_FLOAT_EQ(static_cast<float>(f->get_float("llama.attention.layer_norm_rms_epsilon")),
                  1e-5f);
  EXPECT_FALSE(f->get_bool("tokenizer.ggml.add_bos_token"));
  EXPECT_EQ(f->metadata().size(), 33u);
  EXPECT_EQ(f->tensors().size(), 272u);
  EXPECT_EQ(f->data_offset(), 1785664u);
  const Value& tokens = f->get("tokenizer.ggml.tokens");
  EXPECT_EQ(tokens.elem, ValueType::STRING);
  EXPECT_EQ(tokens.as_array("tokenizer.ggml.tokens").size(), 49152u);
  EXPECT_NE(tokens.to_string().find("... (49152 items)]"), std::string::npos);
  const TensorInfo& emb = f->tensor("token_embd.weight");
  EXPECT_EQ(emb.type, DType::Q8_0);
  EXPECT_EQ(emb.dims, (std::vector<int64_t>{576, 49152}));
  EXPECT_EQ(emb.nbytes, 49152u * 18 * 34);
  const TensorInfo& down = f->tensor("blk.0.ffn_down.weight");
  EXPECT_EQ(down.type, DType::Q4_1);
  EXPECT_EQ(down.dims, (std::vector<int64_t>{1536, 576}));
  EXPECT_EQ(down.rows(), 576);
  for (const TensorInfo& t : f->tensors()) {
    EXPECT_LE(t.data + t.nbytes, emb.data - emb.offset + (f->size() - f->data_offset()));
  }
}

}  // namespace
}  // namespace kvs::gguf
