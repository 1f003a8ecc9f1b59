// The x86 instruction sets the CPU kernels choose between at run time: the build targets AVX2
// (KVS_CPU_ARCH), and integer dot products of 16-bit pairs run as vpdpwssd where the CPU has
// AVX-VNNI or AVX-512 VNNI (with VL, for the 256-bit form), as vpmaddwd + vpaddd otherwise.
#pragma once

namespace kvs::cpu {

enum class Isa { Avx2, AvxVnni, Avx512Vnni };

bool cpu_has(Isa isa);
Isa best_isa();  // the fastest the CPU has, detected once
const char* isa_name(Isa isa);

}  // namespace kvs::cpu
