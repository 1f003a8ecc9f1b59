// GGUF files: a memory-mapped reader (versions 2 and 3) that checks every count, offset and
// size against the file before trusting it, and a writer.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "kvs/quant/types.h"

namespace kvs::gguf {

enum class ValueType : uint32_t {
  U8 = 0, I8 = 1, U16 = 2, I16 = 3, U32 = 4, I32 = 5, F32 = 6, BOOL = 7, STRING = 8,
  ARRAY = 9, U64 = 10, I64 = 11, F64 = 12,
};
const char* value_type_name(ValueType t);

struct Value;
using Array = std::vector<Value>;

// One metadata value. Arrays keep their element type so a round trip is exact.
struct Value {
  ValueType type = ValueType::U32;
  std::variant<uint64_t, int64_t, double, bool, std::string, Array> v;
  ValueType elem = ValueType::U32;  // element type, for arrays

  static Value u32(uint32_t x) { return {ValueType::U32, uint64_t{x}, {}}; }
  static Value i32(int32_t x) { return {ValueType::I32, int64_t{x}, {}}; }
  static Value u64(uint64_t x) { return {ValueType::U64, x, {}}; }
  static Value i64(int64_t x) { return {ValueType::I64, x, {}}; }
  static Value f64(double x) { return {ValueType::F64, x, {}}; }
  static Value f32(float x) { return {ValueType::F32, static_cast<double>(x), {}}; }
  static Value boolean(bool x) { return {ValueType::BOOL, x, {}}; }
  static Value str(std::string x) { return {ValueType::STRING, std::move(x), {}}; }
  static Value array(ValueType elem, Array a) { return {ValueType::ARRAY, std::move(a), elem}; }

  bool is_integer() const;  // any of the integer types
  bool is_float() const { return type == ValueType::F32 || type == ValueType::F64; }
  // Converting accessors; fail (kvs::Error) naming `key` when the type does not fit.
  int64_t as_int(std::string_view key) const;
  double as_float(std::string_view key) const;  // floats and integers
  bool as_bool(std::string_view key) const;
  const std::string& as_string(std::string_view key) const;
  const Array& as_array(std::string_view key) const;
  std::string to_string(size_t max_elems = 8) const;  // for `kvstream info`
};

struct TensorInfo {
  std::string name;
  DType type = DType::F32;
  std::vector<int64_t> dims;  // GGUF order: dims[0] is the contiguous (row) dimension
  uint64_t offset = 0;        // from the start of the data section
  uint64_t nbytes = 0;
  const uint8_t* data = nullptr;  // into the mapping (reader) or nullptr (writer)

  int64_t n_elements() const;
  int64_t rows() const;  // product of dims[1..]
};

class Writer;

// A parsed GGUF file. Owns its mapping (or its buffer); tensor data pointers stay valid for
// the lifetime of the File.
class File {
 public:
  // Maps and parses `path`; fails with an error naming the path and what is wrong.
  static std::unique_ptr<File> open(const std::string& path);
  // Parses an in-memory image (for synthetic models and tests); takes ownership.
  static std::unique_ptr<File> from_buffer(std::vector<uint8_t> bytes, std::string name);
  // The image a Writer would write, in memory without a copy of its tensors' data.
  static std::unique_ptr<File> from_writer(const Writer& w, std::string name);
  ~File();
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  const std::string& name() const { return name_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t size() const { return size_; }
  uint64_t data_offset() const { return data_offset_; }  // start of the data section in the file
  // Metadata in file order.
  const std::vector<std::pair<std::string, Value>>& metadata() const { return kv_; }
  const Value* find(std::string_view key) const;
  const Value& get(std::string_view key) const;  // fails naming the missing key
  // Typed getters with a default when absent; fail when present with the wrong type.
  int64_t get_int(std::string_view key, std::optional<int64_t> def = std::nullopt) const;
  double get_float(std::string_view key, std::optional<double> def = std::nullopt) const;
  bool get_bool(std::string_view key, std::optional<bool> def = std::nullopt) const;
  std::string get_string(std::string_view key, std::optional<std::string> def = std::nullopt) const;

  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find_tensor(std::string_view name) const;
  const TensorInfo& tensor(std::string_view name) const;  // fails naming the missing tensor

 private:
  File() = default;
  void parse();

  std::string name_;
  const uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
  void* map_ = nullptr;         // mmap'd region, if opened from a path
  std::vector<uint8_t> owned_;  // buffer, if built in memory
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<std::pair<std::string, Value>> kv_;
  std::map<std::string, size_t, std::less<>> kv_index_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
};

// Builds a GGUF v3 image. Tensor data is copied in; the layout follows the file's alignment.
class Writer {
 public:
  void set(std::string key, Value v);  // replaces an existing key
  // data nullptr: nbytes of zeros (a tensor of the right shape whose values do not matter)
  void add_tensor(std::string name, DType type, std::vector<int64_t> dims, const void* data,
                  size_t nbytes);
  std::vector<uint8_t> to_bytes() const;
  void write(const std::string& path) const;  // to a temporary name, then renamed
  // The image in two parts: the header (and the data section's size), then the tensors' data
  // put into a zeroed data section at dst.
  std::vector<uint8_t> header(uint64_t* data_bytes) const;
  void copy_data(uint8_t* dst) const;

 private:
  struct Pending {
    std::string name;
    DType type;
    std::vector<int64_t> dims;
    std::vector<uint8_t> data;  // empty: zeros
    size_t nbytes = 0;
  };
  uint64_t alignment() const;
  std::vector<std::pair<std::string, Value>> kv_;
  std::vector<Pending> tensors_;
};

}  // namespace kvs::gguf
