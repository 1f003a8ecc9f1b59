#include "kvs/backend/cpu/isa.h"

#include <cpuid.h>

namespace kvs::cpu {

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
  static const Isa best = cpu_has(Isa::Avx512Vnni) ? Isa::Avx512Vnni
                          : cpu_has(Isa::AvxVnni)  ? Isa::AvxVnni
                                                   : Isa::Avx2;
  return best;
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
