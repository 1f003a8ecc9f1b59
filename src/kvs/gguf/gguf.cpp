// GGUF reader and writer. The reader trusts nothing: every count is bounded by the bytes left
// in the file before anything is allocated, and every offset is checked for overflow.
#include "kvs/gguf/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <limits>
#include <utility>

#include "kvs/util/error.h"

namespace kvs::gguf {

static_assert(std::endian::native == std::endian::little, "GGUF is read as little-endian");

namespace {

constexpr uint32_t kMaxDepth = 8;  // arrays of arrays; real files use at most 1
constexpr uint32_t kMaxDims = 4;
constexpr uint64_t kDefaultAlignment = 32;
// Smallest possible encodings, to reject impossible counts up front.
constexpr uint64_t kMinKvBytes = 8 + 4 + 1;              // key length, type, 1-byte value
constexpr uint64_t kMinTensorBytes = 8 + 4 + 8 + 4 + 8;  // name length, n_dims, 1 dim, type, offset

bool valid_type(uint32_t t) {
  return t <= static_cast<uint32_t>(ValueType::F64);
}

uint64_t min_size(ValueType t) {
  switch (t) {
    case ValueType::U8:
    case ValueType::I8:
    case ValueType::BOOL:
      return 1;
    case ValueType::U16:
    case ValueType::I16:
      return 2;
    case ValueType::U32:
    case ValueType::I32:
    case ValueType::F32:
      return 4;
    case ValueType::U64:
    case ValueType::I64:
    case ValueType::F64:
    case ValueType::STRING:  // the length
      return 8;
    case ValueType::ARRAY:  // element type and length
      return 12;
  }
  return 1;
}

uint64_t align_up(uint64_t x, uint64_t a) {
  uint64_t r = x % a;
  return r == 0 ? x : x + (a - r);
}

// Names and keys from a hostile file may hold anything; keep error messages readable.
std::string printable(std::string_view s) {
  constexpr size_t kMax = 80;
  std::string out;
  for (size_t i = 0; i < s.size() && i < kMax; i++) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  if (s.size() > kMax) out += "...";
  return out;
}

std::string quoted(std::string_view s) {
  std::string out = "\"";
  for (char ch : s) {
    unsigned char c = static_cast<unsigned char>(ch);
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += ch;
    } else if (ch == '\n') {
      out += "\\n";
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += ch;  // UTF-8 passes through
    }
  }
  return out + "\"";
}

// Shortest round-trip digits; plain notation for whole-ish numbers ("100000", not "1e+05").
template <class T>
std::string shortest(T x) {
  char buf[128];
  T mag = x < 0 ? -x : x;
  auto fmt = mag >= 1 && mag < T(1e16) ? std::chars_format::fixed : std::chars_format::general;
  auto r = std::to_chars(buf, buf + sizeof buf, x, fmt);
  return std::string(buf, r.ptr);
}

std::string describe(const Value& v) {
  if (v.type == ValueType::ARRAY) return cat("array of ", value_type_name(v.elem));
  return value_type_name(v.type);
}

// A bounds-checked cursor over the file image.
class Reader {
 public:
  Reader(const uint8_t* base, uint64_t size, const std::string& file)
      : base_(base), size_(size), file_(file) {}

  uint64_t pos() const { return pos_; }
  uint64_t left() const { return size_ - pos_; }

  std::string ctx;  // what is being read ("metadata key 'x'"), for errors

  template <class... A>
  [[noreturn]] void bad(const A&... a) const {
    if (ctx.empty()) fail(file_, ": ", a...);
    fail(file_, ": ", ctx, ": ", a...);
  }

  const uint8_t* take(uint64_t n, const char* what) {
    if (n > left()) {
      bad("truncated: ", what, " needs ", n, " bytes at offset ", pos_, " but only ", left(),
          " are left (file is ", size_, " bytes)");
    }
    const uint8_t* p = base_ + pos_;
    pos_ += n;
    return p;
  }

  template <class T>
  T get(const char* what) {
    T x;
    std::memcpy(&x, take(sizeof(T), what), sizeof(T));
    return x;
  }

  std::string str(const char* what) {
    uint64_t n = get<uint64_t>(what);
    const uint8_t* p = take(n, what);  // checks n against the bytes left before allocating
    return std::string(reinterpret_cast<const char*>(p), n);
  }

  ValueType type(const char* what) {
    uint32_t t = get<uint32_t>(what);
    if (!valid_type(t)) bad("unknown value type ", t);
    return static_cast<ValueType>(t);
  }

  Value value(ValueType t, uint32_t depth) {
    Value v;
    v.type = t;
    switch (t) {
      case ValueType::U8:
        v.v = uint64_t{get<uint8_t>("u8 value")};
        break;
      case ValueType::I8:
        v.v = int64_t{get<int8_t>("i8 value")};
        break;
      case ValueType::U16:
        v.v = uint64_t{get<uint16_t>("u16 value")};
        break;
      case ValueType::I16:
        v.v = int64_t{get<int16_t>("i16 value")};
        break;
      case ValueType::U32:
        v.v = uint64_t{get<uint32_t>("u32 value")};
        break;
      case ValueType::I32:
        v.v = int64_t{get<int32_t>("i32 value")};
        break;
      case ValueType::U64:
        v.v = get<uint64_t>("u64 value");
        break;
      case ValueType::I64:
        v.v = get<int64_t>("i64 value");
        break;
      case ValueType::F32:
        v.v = static_cast<double>(get<float>("f32 value"));
        break;
      case ValueType::F64:
        v.v = get<double>("f64 value");
        break;
      case ValueType::BOOL: {
        uint8_t b = get<uint8_t>("bool value");
        if (b > 1) bad("bool value ", int{b}, " is neither 0 nor 1");
        v.v = b == 1;
        break;
      }
      case ValueType::STRING:
        v.v = str("string");
        break;
      case ValueType::ARRAY: {
        if (depth >= kMaxDepth) bad("arrays nested deeper than ", kMaxDepth, " levels");
        v.elem = type("array element type");
        uint64_t n = get<uint64_t>("array length");
        uint64_t each = min_size(v.elem);
        if (n > left() / each) {
          bad("array of ", n, " ", value_type_name(v.elem), " needs at least ", n, " x ", each,
              " bytes but only ", left(), " are left (file is ", size_, " bytes)");
        }
        Array a;
        a.reserve(n);
        for (uint64_t i = 0; i < n; i++) a.push_back(value(v.elem, depth + 1));
        v.v = std::move(a);
        break;
      }
    }
    return v;
  }

 private:
  const uint8_t* base_;
  uint64_t size_;
  uint64_t pos_ = 0;
  const std::string& file_;
};

}  // namespace

// ---- Value ----

const char* value_type_name(ValueType t) {
  switch (t) {
    case ValueType::U8:
      return "u8";
    case ValueType::I8:
      return "i8";
    case ValueType::U16:
      return "u16";
    case ValueType::I16:
      return "i16";
    case ValueType::U32:
      return "u32";
    case ValueType::I32:
      return "i32";
    case ValueType::F32:
      return "f32";
    case ValueType::BOOL:
      return "bool";
    case ValueType::STRING:
      return "string";
    case ValueType::ARRAY:
      return "array";
    case ValueType::U64:
      return "u64";
    case ValueType::I64:
      return "i64";
    case ValueType::F64:
      return "f64";
  }
  return "unknown";
}

bool Value::is_integer() const {
  switch (type) {
    case ValueType::U8:
    case ValueType::I8:
    case ValueType::U16:
    case ValueType::I16:
    case ValueType::U32:
    case ValueType::I32:
    case ValueType::U64:
    case ValueType::I64:
      return true;
    default:
      return false;
  }
}

int64_t Value::as_int(std::string_view key) const {
  if (is_integer()) {
    if (const auto* u = std::get_if<uint64_t>(&v)) {
      if (*u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        fail("metadata key '", key, "': value ", *u, " does not fit in a signed 64-bit integer");
      }
      return static_cast<int64_t>(*u);
    }
    if (const auto* i = std::get_if<int64_t>(&v)) return *i;
  }
  fail("metadata key '", key, "': expected an integer, got ", describe(*this));
}

double Value::as_float(std::string_view key) const {
  if (is_float()) {
    if (const auto* d = std::get_if<double>(&v)) return *d;
  }
  if (is_integer()) {
    if (const auto* u = std::get_if<uint64_t>(&v)) return static_cast<double>(*u);
    if (const auto* i = std::get_if<int64_t>(&v)) return static_cast<double>(*i);
  }
  fail("metadata key '", key, "': expected a number, got ", describe(*this));
}

bool Value::as_bool(std::string_view key) const {
  if (type == ValueType::BOOL) {
    if (const auto* b = std::get_if<bool>(&v)) return *b;
  }
  fail("metadata key '", key, "': expected a bool, got ", describe(*this));
}

const std::string& Value::as_string(std::string_view key) const {
  if (type == ValueType::STRING) {
    if (const auto* s = std::get_if<std::string>(&v)) return *s;
  }
  fail("metadata key '", key, "': expected a string, got ", describe(*this));
}

const Array& Value::as_array(std::string_view key) const {
  if (type == ValueType::ARRAY) {
    if (const auto* a = std::get_if<Array>(&v)) return *a;
  }
  fail("metadata key '", key, "': expected an array, got ", describe(*this));
}

std::string Value::to_string(size_t max_elems) const {
  if (const auto* a = std::get_if<Array>(&v)) {
    std::string s = "[";
    size_t shown = std::min(a->size(), max_elems);
    for (size_t i = 0; i < shown; i++) {
      if (i > 0) s += ", ";
      const Value& e = (*a)[i];
      s += e.type == ValueType::STRING ? quoted(e.as_string("")) : e.to_string(max_elems);
    }
    if (shown < a->size()) s += cat(shown > 0 ? ", " : "", "... (", a->size(), " items)");
    return s + "]";
  }
  if (const auto* u = std::get_if<uint64_t>(&v)) return std::to_string(*u);
  if (const auto* i = std::get_if<int64_t>(&v)) return std::to_string(*i);
  if (const auto* b = std::get_if<bool>(&v)) return *b ? "true" : "false";
  if (const auto* d = std::get_if<double>(&v)) {
    // An f32 prints as the float it is ("1e-05", not "9.99999974737875e-06").
    return type == ValueType::F32 ? shortest(static_cast<float>(*d)) : shortest(*d);
  }
  return std::get<std::string>(v);
}

// ---- TensorInfo ----

int64_t TensorInfo::n_elements() const {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

int64_t TensorInfo::rows() const {
  int64_t n = 1;
  for (size_t i = 1; i < dims.size(); i++) n *= dims[i];
  return n;
}

// ---- File ----

std::unique_ptr<File> File::open(const std::string& path) {
  std::unique_ptr<File> f(new File());
  f->name_ = path;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(path, ": cannot open: ", std::strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    fail(path, ": cannot stat: ", std::strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail(path, ": not a regular file");
  }
  f->size_ = static_cast<uint64_t>(st.st_size);
  if (f->size_ > 0) {
    void* m = mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
      int e = errno;
      ::close(fd);
      fail(path, ": cannot map ", f->size_, " bytes: ", std::strerror(e));
    }
    f->map_ = m;
    f->base_ = static_cast<const uint8_t*>(m);
  }
  ::close(fd);  // the mapping keeps the file alive
  f->parse();
  return f;
}

std::unique_ptr<File> File::from_writer(const Writer& w, std::string name) {
  uint64_t n = 0;
  const std::vector<uint8_t> h = w.header(&n);
  std::unique_ptr<File> f(new File());
  f->name_ = std::move(name);
  f->size_ = h.size() + n;
  // Anonymous pages: those of tensors without data stay untouched zeros, taking no memory.
  void* m = mmap(nullptr, f->size_, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) fail(f->name_, ": cannot map ", f->size_, " bytes: ", std::strerror(errno));
  f->map_ = m;
  f->base_ = static_cast<const uint8_t*>(m);
  std::memcpy(m, h.data(), h.size());
  w.copy_data(static_cast<uint8_t*>(m) + h.size());
  f->parse();
  return f;
}

std::unique_ptr<File> File::from_buffer(std::vector<uint8_t> bytes, std::string name) {
  std::unique_ptr<File> f(new File());
  f->name_ = std::move(name);
  f->owned_ = std::move(bytes);
  f->base_ = f->owned_.data();
  f->size_ = f->owned_.size();
  f->parse();
  return f;
}

namespace {

// general.alignment (a, or the default where the file has none), checked.
uint64_t alignment_of(Reader& r, const Value* a) {
  if (a == nullptr) return kDefaultAlignment;
  if (!a->is_integer()) r.bad("expected an integer, got ", describe(*a));
  const auto* i = std::get_if<int64_t>(&a->v);
  if (i != nullptr && *i < 0) r.bad("alignment ", *i, " is negative");
  uint64_t al = i != nullptr ? static_cast<uint64_t>(*i) : std::get<uint64_t>(a->v);
  if (!std::has_single_bit(al)) r.bad("alignment ", al, " is not a nonzero power of two");
  return al;
}

// A tensor info's dimensions, type, size and data offset, after its name.
void read_tensor_info(Reader& r, TensorInfo& ti) {
  uint32_t nd = r.get<uint32_t>("n_dims");
  if (nd == 0 || nd > kMaxDims) r.bad("n_dims ", nd, " is out of range (1..", kMaxDims, ")");
  int64_t ne = 1;
  for (uint32_t d = 0; d < nd; d++) {
    auto x = static_cast<int64_t>(r.get<uint64_t>("dimension"));
    if (x <= 0) r.bad("dimension ", d, " is ", x, " (must be positive)");
    if (__builtin_mul_overflow(ne, x, &ne)) r.bad("element count overflows 64 bits");
    ti.dims.push_back(x);
  }
  uint32_t id = r.get<uint32_t>("type");
  const DTypeTraits* tr = dtype_traits(id);
  if (tr == nullptr) r.bad("unknown tensor type id ", id);
  ti.type = static_cast<DType>(id);
  if (ti.dims[0] % tr->block != 0) {
    r.bad("row length ", ti.dims[0], " is not a multiple of the ", tr->name, " block size ",
          tr->block);
  }
  if (__builtin_mul_overflow(static_cast<uint64_t>(ne / tr->block), uint64_t{tr->block_bytes},
                             &ti.nbytes)) {
    r.bad("size in bytes overflows 64 bits");
  }
  ti.offset = r.get<uint64_t>("data offset");
}

}  // namespace

File::~File() {
  if (map_ != nullptr) munmap(map_, size_);
}

void File::parse() {
  Reader r(base_, size_, name_);
  r.ctx = "header";
  const uint8_t* magic = r.take(4, "magic");
  if (std::memcmp(magic, "GGUF", 4) != 0) {
    r.bad("not a GGUF file (magic is ",
          quoted(std::string_view(reinterpret_cast<const char*>(magic), 4)),
          ", expected \"GGUF\")");
  }
  version_ = r.get<uint32_t>("version");
  if (version_ == 1) r.bad("GGUF version 1 is not supported (only versions 2 and 3)");
  if (version_ != 2 && version_ != 3) {
    uint32_t swapped = __builtin_bswap32(version_);
    if (swapped == 2 || swapped == 3) r.bad("big-endian GGUF files are not supported");
    r.bad("unsupported GGUF version ", version_, " (only versions 2 and 3)");
  }
  uint64_t n_tensors = r.get<uint64_t>("tensor count");
  uint64_t n_kv = r.get<uint64_t>("metadata count");
  // Each entry takes some bytes, so the counts cannot exceed what is left.
  if (n_kv > r.left() / kMinKvBytes) {
    r.bad("metadata count ", n_kv, " is impossible with ", r.left(), " bytes left");
  }
  if (n_tensors > r.left() / kMinTensorBytes) {
    r.bad("tensor count ", n_tensors, " is impossible with ", r.left(), " bytes left");
  }
  if (n_kv * kMinKvBytes + n_tensors * kMinTensorBytes > r.left()) {
    r.bad(n_kv, " metadata entries and ", n_tensors, " tensors cannot fit in the ", r.left(),
          " bytes left");
  }

  kv_.reserve(n_kv);
  for (uint64_t i = 0; i < n_kv; i++) {
    r.ctx = cat("metadata entry ", i);
    std::string key = r.str("key");
    r.ctx = cat("metadata key '", printable(key), "'");
    if (kv_index_.count(key) != 0) r.bad("duplicate key");
    ValueType t = r.type("value type");
    Value v = r.value(t, 0);
    kv_index_.emplace(key, kv_.size());
    kv_.emplace_back(std::move(key), std::move(v));
  }

  r.ctx = "metadata key 'general.alignment'";
  alignment_ = alignment_of(r, find("general.alignment"));

  tensors_.reserve(n_tensors);
  for (uint64_t i = 0; i < n_tensors; i++) {
    r.ctx = cat("tensor info ", i);
    TensorInfo ti;
    ti.name = r.str("tensor name");
    r.ctx = cat("tensor '", printable(ti.name), "'");
    if (tensor_index_.count(ti.name) != 0) r.bad("duplicate tensor name");
    read_tensor_info(r, ti);
    tensor_index_.emplace(ti.name, tensors_.size());
    tensors_.push_back(std::move(ti));
  }

  // The data section starts at the next aligned offset; every tensor must lie inside the file.
  uint64_t data_start = align_up(r.pos(), alignment_);
  data_offset_ = data_start;
  for (TensorInfo& ti : tensors_) {
    r.ctx = cat("tensor '", printable(ti.name), "'");
    if (ti.offset % alignment_ != 0) {
      r.bad("data offset ", ti.offset, " is not a multiple of the alignment ", alignment_);
    }
    if (data_start > size_ || ti.offset > size_ - data_start ||
        ti.nbytes > size_ - data_start - ti.offset) {
      r.bad("data [offset ", ti.offset, ", ", ti.nbytes,
            " bytes] extends past the end of the file (", size_, " bytes; data section starts at ",
            data_start, ")");
    }
    ti.data = base_ + data_start + ti.offset;
  }
}

const Value* File::find(std::string_view key) const {
  auto it = kv_index_.find(key);
  return it == kv_index_.end() ? nullptr : &kv_[it->second].second;
}

const Value& File::get(std::string_view key) const {
  const Value* v = find(key);
  if (v == nullptr) fail(name_, ": missing metadata key '", key, "'");
  return *v;
}

namespace {
// Typed lookups: a default when absent; the file's name on a type error.
template <class T, class F>
T lookup(const File& f, std::string_view key, const std::optional<T>& def, F conv) {
  const Value* v = f.find(key);
  if (v == nullptr) {
    if (def) return *def;
    fail(f.name(), ": missing metadata key '", key, "'");
  }
  try {
    return conv(*v);
  } catch (const Error& e) {
    fail(f.name(), ": ", e.what());
  }
}
}  // namespace

int64_t File::get_int(std::string_view key, std::optional<int64_t> def) const {
  return lookup<int64_t>(*this, key, def, [&](const Value& v) { return v.as_int(key); });
}

double File::get_float(std::string_view key, std::optional<double> def) const {
  return lookup<double>(*this, key, def, [&](const Value& v) { return v.as_float(key); });
}

bool File::get_bool(std::string_view key, std::optional<bool> def) const {
  return lookup<bool>(*this, key, def, [&](const Value& v) { return v.as_bool(key); });
}

std::string File::get_string(std::string_view key, std::optional<std::string> def) const {
  return lookup<std::string>(*this, key, def, [&](const Value& v) { return v.as_string(key); });
}

const TensorInfo* File::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const TensorInfo& File::tensor(std::string_view name) const {
  const TensorInfo* t = find_tensor(name);
  if (t == nullptr) fail(name_, ": no tensor named '", name, "'");
  return *t;
}

// ---- Writer ----

namespace {

class Out {
 public:
  std::vector<uint8_t> b;

  template <class T>
  void put(T x) {
    size_t n = b.size();
    b.resize(n + sizeof(T));
    std::memcpy(b.data() + n, &x, sizeof(T));
  }
  void str(std::string_view s) {
    put<uint64_t>(s.size());
    b.insert(b.end(), s.begin(), s.end());
  }
  void pad(uint64_t alignment) { b.resize(align_up(b.size(), alignment), 0); }
};

// Writes an integer of type T, checking that the value fits.
template <class T>
void put_int(Out& o, const Value& v, std::string_view key) {
  bool ok = false;
  T x{};
  if (const auto* u = std::get_if<uint64_t>(&v.v)) {
    ok = std::in_range<T>(*u);
    x = static_cast<T>(*u);
  } else if (const auto* i = std::get_if<int64_t>(&v.v)) {
    ok = std::in_range<T>(*i);
    x = static_cast<T>(*i);
  }
  if (!ok) fail("gguf writer: key '", key, "': value does not fit in ", value_type_name(v.type));
  o.put<T>(x);
}

[[noreturn]] void wrong_repr(const Value& v, std::string_view key) {
  fail("gguf writer: key '", key, "': value of type ", value_type_name(v.type),
       " holds the wrong representation");
}

void put_value(Out& o, const Value& v, std::string_view key, uint32_t depth) {
  switch (v.type) {
    case ValueType::U8:
      put_int<uint8_t>(o, v, key);
      break;
    case ValueType::I8:
      put_int<int8_t>(o, v, key);
      break;
    case ValueType::U16:
      put_int<uint16_t>(o, v, key);
      break;
    case ValueType::I16:
      put_int<int16_t>(o, v, key);
      break;
    case ValueType::U32:
      put_int<uint32_t>(o, v, key);
      break;
    case ValueType::I32:
      put_int<int32_t>(o, v, key);
      break;
    case ValueType::U64:
      put_int<uint64_t>(o, v, key);
      break;
    case ValueType::I64:
      put_int<int64_t>(o, v, key);
      break;
    case ValueType::F32:
    case ValueType::F64: {
      const auto* d = std::get_if<double>(&v.v);
      if (d == nullptr) wrong_repr(v, key);
      if (v.type == ValueType::F32) {
        o.put<float>(static_cast<float>(*d));
      } else {
        o.put<double>(*d);
      }
      break;
    }
    case ValueType::BOOL: {
      const auto* b = std::get_if<bool>(&v.v);
      if (b == nullptr) wrong_repr(v, key);
      o.put<uint8_t>(*b ? 1 : 0);
      break;
    }
    case ValueType::STRING: {
      const auto* s = std::get_if<std::string>(&v.v);
      if (s == nullptr) wrong_repr(v, key);
      o.str(*s);
      break;
    }
    case ValueType::ARRAY: {
      const auto* a = std::get_if<Array>(&v.v);
      if (a == nullptr) wrong_repr(v, key);
      if (depth >= kMaxDepth) fail("gguf writer: key '", key, "': arrays nested too deeply");
      if (!valid_type(static_cast<uint32_t>(v.elem))) {
        fail("gguf writer: key '", key, "': bad array element type");
      }
      o.put<uint32_t>(static_cast<uint32_t>(v.elem));
      o.put<uint64_t>(a->size());
      for (const Value& e : *a) {
        if (e.type != v.elem) {
          fail("gguf writer: key '", key, "': array of ", value_type_name(v.elem), " holds a ",
               value_type_name(e.type));
        }
        put_value(o, e, key, depth + 1);
      }
      break;
    }
    default:
      fail("gguf writer: key '", key, "': bad value type ", static_cast<uint32_t>(v.type));
  }
}

}  // namespace

void Writer::set(std::string key, Value v) {
  for (auto& [k, old] : kv_) {
    if (k == key) {
      old = std::move(v);
      return;
    }
  }
  kv_.emplace_back(std::move(key), std::move(v));
}

void Writer::add_tensor(std::string name, DType type, std::vector<int64_t> dims, const void* data,
                        size_t nbytes) {
  for (const Pending& p : tensors_) {
    if (p.name == name) fail("gguf writer: duplicate tensor '", name, "'");
  }
  const DTypeTraits* tr = dtype_traits(static_cast<uint32_t>(type));
  if (tr == nullptr) fail("gguf writer: tensor '", name, "': unknown type");
  if (dims.empty() || dims.size() > kMaxDims) {
    fail("gguf writer: tensor '", name, "': ", dims.size(), " dimensions (must be 1..4)");
  }
  int64_t ne = 1;
  for (int64_t d : dims) {
    if (d <= 0 || __builtin_mul_overflow(ne, d, &ne)) {
      fail("gguf writer: tensor '", name, "': bad dimension ", d);
    }
  }
  size_t expect = static_cast<size_t>(ne / dims[0]) * row_bytes(type, dims[0]);
  if (nbytes != expect) {
    fail("gguf writer: tensor '", name, "': ", nbytes, " bytes of data, expected ", expect);
  }
  const auto* p = static_cast<const uint8_t*>(data);
  tensors_.push_back({std::move(name), type, std::move(dims),
                      p ? std::vector<uint8_t>(p, p + nbytes) : std::vector<uint8_t>(), nbytes});
}

uint64_t Writer::alignment() const {
  for (const auto& [k, v] : kv_) {
    if (k != "general.alignment") continue;
    int64_t a = v.as_int(k);
    if (a <= 0 || !std::has_single_bit(static_cast<uint64_t>(a))) {
      fail("gguf writer: general.alignment ", a, " is not a nonzero power of two");
    }
    return static_cast<uint64_t>(a);
  }
  return kDefaultAlignment;
}

std::vector<uint8_t> Writer::header(uint64_t* data_bytes) const {
  const uint64_t alignment = this->alignment();
  Out o;
  for (char c : std::string_view("GGUF")) o.put<char>(c);
  o.put<uint32_t>(3);
  o.put<uint64_t>(tensors_.size());
  o.put<uint64_t>(kv_.size());
  for (const auto& [k, v] : kv_) {
    o.str(k);
    o.put<uint32_t>(static_cast<uint32_t>(v.type));
    put_value(o, v, k, 0);
  }
  uint64_t offset = 0;
  for (const Pending& t : tensors_) {
    o.str(t.name);
    o.put<uint32_t>(static_cast<uint32_t>(t.dims.size()));
    for (int64_t d : t.dims) o.put<uint64_t>(static_cast<uint64_t>(d));
    o.put<uint32_t>(static_cast<uint32_t>(t.type));
    o.put<uint64_t>(offset);
    // as llama.cpp writes it: every tensor, the last too, is padded
    offset = align_up(offset + t.nbytes, alignment);
  }
  o.pad(alignment);
  *data_bytes = offset;
  return std::move(o.b);
}

void Writer::copy_data(uint8_t* dst) const {
  const uint64_t alignment = this->alignment();
  uint64_t offset = 0;
  for (const Pending& t : tensors_) {
    if (!t.data.empty()) std::memcpy(dst + offset, t.data.data(), t.data.size());
    offset = align_up(offset + t.nbytes, alignment);
  }
}

std::vector<uint8_t> Writer::to_bytes() const {
  uint64_t n = 0;
  std::vector<uint8_t> b = header(&n);
  const size_t start = b.size();
  b.resize(start + n, 0);
  copy_data(b.data() + start);
  return b;
}

// Header first, then each tensor at its offset; tensors of zeros are never written, so the file
// is sparse where they lie (a preset's whole tensor table costs its header's bytes).
void Writer::write(const std::string& path) const {
  uint64_t data_bytes = 0;
  const std::vector<uint8_t> head = header(&data_bytes);
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0644);
  if (fd < 0) fail(path, ": cannot create ", tmp, ": ", std::strerror(errno));
  auto put = [&](const uint8_t* p, size_t n, uint64_t at) {
    while (n > 0) {
      const ssize_t w = ::pwrite(fd, p, n, static_cast<off_t>(at));
      if (w <= 0) return false;
      p += w, n -= static_cast<size_t>(w), at += static_cast<uint64_t>(w);
    }
    return true;
  };
  bool ok = put(head.data(), head.size(), 0);
  const uint64_t alignment = this->alignment();
  uint64_t offset = head.size();
  for (const Pending& t : tensors_) {
    if (ok && !t.data.empty()) ok = put(t.data.data(), t.data.size(), offset);
    offset = align_up(offset + t.nbytes, alignment);
  }
  ok = ok && ::ftruncate(fd, static_cast<off_t>(head.size() + data_bytes)) == 0;
  int e = errno;
  ok = ::close(fd) == 0 && ok;
  if (!ok) {
    std::remove(tmp.c_str());
    fail(path, ": cannot write ", tmp, ": ", std::strerror(e != 0 ? e : errno));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    e = errno;
    std::remove(tmp.c_str());
    fail(path, ": cannot rename ", tmp, ": ", std::strerror(e));
  }
}

}  // namespace kvs::gguf
