// The GGML type table: names and block layouts by type id.
#include "kvs/quant/types.h"

#include <array>
#include <cctype>

#include "kvs/util/error.h"

namespace kvs {

namespace {

constexpr uint32_t kMaxId = 39;

struct Entry {
  uint32_t id;
  DTypeTraits t;
};

// id, name, elements per block, bytes per block, supported.
constexpr Entry kEntries[] = {
    {0, {"f32", 1, 4, true}},          {1, {"f16", 1, 2, true}},
    {2, {"q4_0", 32, 18, true}},       {3, {"q4_1", 32, 20, true}},
    {6, {"q5_0", 32, 22, true}},       {7, {"q5_1", 32, 24, true}},
    {8, {"q8_0", 32, 34, true}},       {9, {"q8_1", 32, 40, false}},
    {10, {"q2_k", 256, 84, true}},     {11, {"q3_k", 256, 110, true}},
    {12, {"q4_k", 256, 144, true}},    {13, {"q5_k", 256, 176, true}},
    {14, {"q6_k", 256, 210, true}},    {15, {"q8_k", 256, 292, false}},
    {16, {"iq2_xxs", 256, 66, false}}, {17, {"iq2_xs", 256, 74, false}},
    {18, {"iq3_xxs", 256, 98, false}}, {19, {"iq1_s", 256, 50, false}},
    {20, {"iq4_nl", 32, 18, true}},    {21, {"iq3_s", 256, 110, false}},
    {22, {"iq2_s", 256, 82, false}},   {23, {"iq4_xs", 256, 136, true}},
    {24, {"i8", 1, 1, false}},         {25, {"i16", 1, 2, false}},
    {26, {"i32", 1, 4, false}},        {27, {"i64", 1, 8, false}},
    {28, {"f64", 1, 8, false}},        {29, {"iq1_m", 256, 56, false}},
    {30, {"bf16", 1, 2, true}},        {34, {"tq1_0", 256, 54, false}},
    {35, {"tq2_0", 256, 66, false}},   {39, {"mxfp4", 32, 17, false}},
};

// Indexed by id; a null name marks an id GGML does not define.
constexpr std::array<DTypeTraits, kMaxId + 1> make_table() {
  std::array<DTypeTraits, kMaxId + 1> t{};
  for (const Entry& e : kEntries) t[e.id] = e.t;
  return t;
}
constexpr auto kTable = make_table();

std::string supported_names() {
  std::string s;
  for (const Entry& e : kEntries) {
    if (!e.t.supported) continue;
    if (!s.empty()) s += ", ";
    s += e.t.name;
  }
  return s;
}

}  // namespace

const DTypeTraits* dtype_traits(uint32_t id) {
  if (id > kMaxId || kTable[id].name == nullptr) return nullptr;
  return &kTable[id];
}

const DTypeTraits& traits(DType t) {
  const DTypeTraits* tr = dtype_traits(static_cast<uint32_t>(t));
  if (tr == nullptr) fail("unknown tensor type id ", static_cast<uint32_t>(t));
  return *tr;
}

size_t row_bytes(DType t, int64_t n) {
  const DTypeTraits& tr = traits(t);
  if (n < 0 || n % tr.block != 0) {
    fail("a ", tr.name, " row of ", n, " elements is not a multiple of the block size ", tr.block);
  }
  return static_cast<size_t>(n / tr.block) * tr.block_bytes;
}

DType parse_dtype(std::string_view name, std::string_view what) {
  std::string lower(name);
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (const Entry& e : kEntries) {
    if (lower != e.t.name) continue;
    if (!e.t.supported) {
      fail(what, ": type '", name, "' is not supported (accepted: ", supported_names(), ")");
    }
    return static_cast<DType>(e.id);
  }
  fail(what, ": unknown type '", name, "' (accepted: ", supported_names(), ")");
}

std::string supported_dtype_names() {
  return supported_names();
}

bool is_supported(DType t) {
  const DTypeTraits* tr = dtype_traits(static_cast<uint32_t>(t));
  return tr != nullptr && tr->supported;
}

}  // namespace kvs
