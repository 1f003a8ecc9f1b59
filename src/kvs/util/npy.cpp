#include "kvs/util/npy.h"

#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>

#include "kvs/util/error.h"

namespace kvs {

void write_npy(const std::string& path, const float* data, const std::vector<int64_t>& shape) {
  std::string dims;
  int64_t n = 1;
  for (int64_t d : shape) {
    dims += std::to_string(d) + ",";
    n *= d;
  }
  if (shape.size() > 1) dims.pop_back();
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + dims + "), }";
  // Magic (6) + version (2) + header length (2) + header, padded with spaces to 64 bytes.
  size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header.push_back('\n');
  std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) fail("cannot write '", path, "'");
    const char magic[8] = {'\x93', 'N', 'U', 'M', 'P', 'Y', 1, 0};
    out.write(magic, 8);
    uint16_t hl = static_cast<uint16_t>(header.size());
    out.write(reinterpret_cast<const char*>(&hl), 2);
    out.write(header.data(), static_cast<std::streamsize>(header.size()));
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(n * 4));
    if (!out) fail("cannot write '", path, "'");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) fail("cannot rename to '", path, "'");
}

NpyArray read_npy(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot open '", path, "'");
  char magic[8];
  in.read(magic, 8);
  if (!in || std::memcmp(magic, "\x93NUMPY", 6) != 0) fail("'", path, "' is not a .npy file");
  uint32_t hl = 0;
  if (magic[6] == 1) {
    uint16_t h16;
    in.read(reinterpret_cast<char*>(&h16), 2);
    hl = h16;
  } else {
    in.read(reinterpret_cast<char*>(&hl), 4);
  }
  if (!in || hl > (1u << 20)) fail("'", path, "': bad .npy header");
  std::string header(hl, '\0');
  in.read(header.data(), hl);
  auto field = [&](const std::string& key) {
    size_t p = header.find("'" + key + "'");
    if (p == std::string::npos) fail("'", path, "': .npy header lacks ", key);
    return p + key.size() + 2;
  };
  size_t dp = header.find('\'', field("descr"));
  std::string descr = header.substr(dp + 1, header.find('\'', dp + 1) - dp - 1);
  if (header.find("True", field("fortran_order")) < header.find(',', field("fortran_order")))
    fail("'", path, "': Fortran-order arrays are not supported");
  size_t sp = header.find('(', field("shape"));
  size_t se = header.find(')', sp);
  NpyArray a;
  int64_t n = 1;
  std::string s = header.substr(sp + 1, se - sp - 1);
  for (size_t i = 0; i < s.size();) {
    size_t j = s.find(',', i);
    if (j == std::string::npos) j = s.size();
    std::string tok = s.substr(i, j - i);
    if (tok.find_first_not_of(' ') != std::string::npos) {
      a.shape.push_back(std::stoll(tok));
      n *= a.shape.back();
    }
    i = j + 1;
  }
  size_t esz = descr == "<f4" || descr == "<i4" ? 4 : descr == "<f8" || descr == "<i8" ? 8 : 0;
  if (esz == 0) fail("'", path, "': unsupported dtype ", descr);
  std::vector<char> raw(static_cast<size_t>(n) * esz);
  in.read(raw.data(), static_cast<std::streamsize>(raw.size()));
  if (!in) fail("'", path, "': truncated data");
  a.data.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const char* p = raw.data() + i * static_cast<int64_t>(esz);
    if (descr == "<f4") {
      std::memcpy(&a.data[i], p, 4);
    } else if (descr == "<f8") {
      double d;
      std::memcpy(&d, p, 8);
      a.data[i] = static_cast<float>(d);
    } else if (descr == "<i4") {
      int32_t v;
      std::memcpy(&v, p, 4);
      a.data[i] = static_cast<float>(v);
    } else {
      int64_t v;
      std::memcpy(&v, p, 8);
      a.data[i] = static_cast<float>(v);
    }
  }
  return a;
}

}  // namespace kvs
