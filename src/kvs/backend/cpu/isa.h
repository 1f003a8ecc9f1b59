// The x86 instruction sets the CPU kernels choose between at run time: the build targets AVX2
// (KVS_CPU_ARCH), and integer dot products of 16-bit pairs run as vpdpwssd where the CPU has
// AVX-VNNI or AVX-512 VNNI (with VL, for the 256-bit form), as vpmaddwd + vpaddd otherwise.
#pragma once

#include <string>
#include <vector>

namespace kvs::cpu {

enum class Isa { Avx2, AvxVnni, Avx512Vnni };

bool cpu_has(Isa isa);
// The instruction set the kernels use, chosen once: KVS_CPU_ISA (avx2, avx-vnni, avx512-vnni)
// where set, so a CPU's lesser paths can be run and timed (an error if the CPU lacks it), else
// the fastest the CPU has.
Isa best_isa();
const char* isa_name(Isa isa);
// "forced by KVS_CPU_ISA" or "detected": how best_isa() was chosen, for info and bench.
const char* isa_origin();

// The CPU's brand string (CPUID) and the x86 extensions of the kernels' concern it has, for
// benchmarks' records: figures from one CPU do not stand for another's.
std::string cpu_brand();
std::vector<std::string> cpu_features();

}  // namespace kvs::cpu
