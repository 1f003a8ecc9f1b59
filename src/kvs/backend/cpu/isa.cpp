#include "kvs/backend/cpu/isa.h"

namespace kvs::cpu {

bool cpu_has(Isa isa) {
  switch (isa) {
    case Isa::Avx2:
      return true;
    case Isa::AvxVnni:
      return __builtin_cpu_supports("avxvnni");
    case Isa::Avx512Vnni:
      return __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl");
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
