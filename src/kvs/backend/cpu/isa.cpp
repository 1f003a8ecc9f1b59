#include "kvs/backend/cpu/isa.h"

#include <cpuid.h>

#include <cstdlib>
#include <cstring>

#include "kvs/util/error.h"

namespace kvs::cpu {
namespace {

const char* forced_name() {
  const char* e = std::getenv("KVS_CPU_ISA");
  return e != nullptr && *e != '\0' ? e : nullptr;
}

Isa choose() {
  if (const char* e = forced_name()) {
    for (const Isa i : {Isa::Avx2, Isa::AvxVnni, Isa::Avx512Vnni}) {
      if (std::strcmp(e, isa_name(i)) != 0) continue;
      KVS_CHECK(cpu_has(i), "KVS_CPU_ISA=", e, ": this CPU does not have ", isa_name(i));
      return i;
    }
    fail("KVS_CPU_ISA=", e, ": not avx2, avx-vnni or avx512-vnni");
  }
  return cpu_has(Isa::Avx512Vnni) ? Isa::Avx512Vnni
         : cpu_has(Isa::AvxVnni)  ? Isa::AvxVnni
                                  : Isa::Avx2;
}

}  // namespace

bool cpu_has(Isa isa) {
  switch (isa) {
    case Isa::Avx2:
      return true;
    case Isa::AvxVnni: {  // CPUID.(7, 1):EAX bit 4; not every compiler's builtin knows it
      unsigned a = 0, b = 0, c = 0, d = 0;
      return __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a >> 4 & 1) != 0;
    }
    case Isa::Avx512Vnni:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
             __builtin_cpu_supports("avx512vnni");
  }
  return false;
}

Isa best_isa() {
  static const Isa best = choose();
  return best;
}

const char* isa_origin() {
  return forced_name() != nullptr ? "forced by KVS_CPU_ISA" : "detected";
}

std::string cpu_brand() {
  unsigned r[12] = {};
  for (unsigned i = 0; i < 3; ++i)
    if (!__get_cpuid(0x80000002 + i, &r[4 * i], &r[4 * i + 1], &r[4 * i + 2], &r[4 * i + 3]))
      return "?";
  char b[49] = {};
  std::memcpy(b, r, 48);
  std::string s(b);
  const size_t f = s.find_first_not_of(' '), l = s.find_last_not_of(' ');
  return f == std::string::npos ? "?" : s.substr(f, l - f + 1);
}

std::vector<std::string> cpu_features() {
  std::vector<std::string> out;
  const auto add = [&](bool has, const char* name) {
    if (has) out.emplace_back(name);
  };
  add(__builtin_cpu_supports("avx2"), "avx2");
  add(__builtin_cpu_supports("fma"), "fma");
  unsigned a = 0, b = 0, c = 0, d = 0;  // f16c by CPUID.1:ECX bit 29: clang's builtin lacks it
  add(__get_cpuid(1, &a, &b, &c, &d) && (c >> 29 & 1) != 0, "f16c");
  add(cpu_has(Isa::AvxVnni), "avx-vnni");
  add(__builtin_cpu_supports("avx512f"), "avx512f");
  add(__builtin_cpu_supports("avx512bw"), "avx512bw");
  add(__builtin_cpu_supports("avx512vl"), "avx512vl");
  add(__builtin_cpu_supports("avx512vnni"), "avx512vnni");
  return out;
}

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::Avx2:
      return "avx2";
    case Isa::AvxVnni:
      return "avx-vnni";
    case Isa::Avx512Vnni:
      return "avx512-vnni";
  }
  return "?";
}

}  // namespace kvs::cpu
