#!/usr/bin/env bash
# The whole test suite, stage by stage, every build with -Werror and ccache where installed:
#   cpu tests       build/cpu, then ctest (extra arguments go to it: -L unit, -R gguf)
#   peers           the CPU backend against stock llama.cpp and Hugging Face transformers,
#                   and serve against llama.cpp's server tests with their expected failures
#                   (tests/peers/run.sh; llama.cpp, a torch venv and the tests' venv built
#                   once into ~/.cache/kvstream/peers)
#   sanitizers      the streams, fences, thread pool, the streaming engine (ring, write-back,
#                   smallest rings), split attention's worker, the prompt cache and the
#                   server's scheduler under
#                   ThreadSanitizer (build/tsan; each test a process, as many at once as there
#                   are cores)
#   fuzz            libFuzzer harnesses (tests/fuzz: the GGUF reader, the tokenizers, the
#                   server's request reader) under
#                   ASan and UBSan, built with clang (build/fuzz), each for KVS_FUZZ_SECONDS
#                   (default 40) from its checked-in seed corpus; a finding fails the stage
#   clang build     the library, kvstream and the CPU tests compiled with clang (build/clang;
#                   not run: the second compiler is there for its warnings)
#   cuda build      the CUDA backend for sm_86, the smallest shared memory of the consumer
#                   cards (build/cuda; tests/cuda need a GPU and run on the GPU machine); the
#                   CPU library's objects are build/cpu's, from ccache; sm_90's code paths
#                   compile in the timing build, and sm_89 and sm_120 take sm_86's, so CI
#                   skips them
#   null-gpu tests  the CUDA backend's host side under the null GPU (tests/nullgpu)
#   timing build    the timing build (KVS_TRACE, sm_90 only) compiles (build/trace)
# The last three need nvcc. A stage's output goes to build/logs/STAGE.log, its last lines shown
# when it fails; the stages after a failure still run, and the script ends with one summary
# and a last line "test.sh: N passed, N failed, N skipped", exiting 1 if any stage failed.
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/cuda/bin"
jobs=$(nproc)
logs=build/logs
mkdir -p "$logs"
ctest_args=("$@")

cfg=(-G Ninja -DKVS_WERROR=ON)
if command -v ccache >/dev/null 2>&1; then
  cfg+=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
cuda_cfg=("${cfg[@]}")
command -v ccache >/dev/null 2>&1 && cuda_cfg+=(-DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)

names=() results=() times=() notes=()
record() {  # NAME RESULT SECONDS NOTE
  names+=("$1") results+=("$2") times+=("$3") notes+=("$4")
}
mmss() { printf '%dm%02ds' $(($1 / 60)) $(($1 % 60)); }
# stage NAME LOG FUNCTION: runs FUNCTION with its output in build/logs/LOG.log.
stage() {
  local name=$1 log="$logs/$2.log" t0=$SECONDS result=passed
  echo "test.sh: $name ($log)"
  "$3" >"$log" 2>&1 || result=failed
  local dt=$((SECONDS - t0))
  echo "test.sh: $name $result in $(mmss "$dt")"
  if [ "$result" = failed ]; then
    tail -n 40 "$log" | sed 's/^/    | /'
  fi
  record "$name" "$result" "$dt" "$log"
}
skip() {  # NAME WHY
  echo "test.sh: $1 skipped: $2"
  record "$1" skipped 0 "$2"
}

setup() { scripts/setup.sh; }
# KVS_TESTS=ON: build/cpu may come from scripts/demo.sh, which turns them off.
cpu_tests() {
  cmake --preset cpu "${cfg[@]}" -DKVS_TESTS=ON &&
    cmake --build build/cpu -j "$jobs" &&
    ctest --test-dir build/cpu --output-on-failure -j "$jobs" "${ctest_args[@]}"
}
# Every test of the given GoogleTest binaries in a process of its own, $jobs at a time (as
# ctest runs them): one such process keeps about one core busy, and under ThreadSanitizer the
# longest tests take minutes. Fails if any test fails or none is found.
each_test() {  # BINARY...
  local list
  list=$(for b in "$@"; do
    "$b" --gtest_list_tests | awk -v b="$b" '/^[^ ]/ { s = $1 } /^  / { print b, s $1 }' || exit 1
  done) || return 1
  [ -n "$list" ] || return 1
  [ -z "${SKIP_TESTS:-}" ] || list=$(echo "$list" | grep -Ev " ($SKIP_TESTS)\$")
  # shellcheck disable=SC2016  # $0 and $1 are the inner shell's: the binary and the test
  echo "$list" | xargs -P "$jobs" -n 2 sh -c 'exec "$0" --gtest_brief=1 --gtest_filter="$1"'
}
sanitizers() {
  export TSAN_OPTIONS="halt_on_error=1"
  local tests=(kvs_unit_test_device kvs_unit_test_threadpool kvs_unit_test_stream
               kvs_unit_test_scheduler kvs_unit_test_prompt_cache kvs_unit_test_split)
  cmake --preset tsan "${cfg[@]}" &&
    cmake --build build/tsan -j "$jobs" --target "${tests[@]}" &&
    # Window layers change only what the compute thread attends; their test's copies and
    # threads are the other streaming tests': minutes under TSan for no race those miss.
    SKIP_TESTS="StreamExact.WindowLayersAreBitIdenticalToResident" \
      each_test "${tests[@]/#/build/tsan/tests/}"
}
# Without optimisation, which clang's warnings do not depend on.
clang_build() {
  CC=clang CXX=clang++ cmake -S . -B build/clang "${cfg[@]}" -DKVS_CUDA=OFF -DKVS_TESTS=ON \
    -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG=-O0 &&
    cmake --build build/clang -j "$jobs"
}
# kvstream and every library and test target but the CPU test binaries, which build/cpu has
# built and run already.
cuda_build() {
  cmake --preset cuda "${cuda_cfg[@]}" -DCMAKE_CUDA_ARCHITECTURES=86 || return 1
  local targets
  targets=$(cmake --build build/cuda --target help | sed -n 's/^\([A-Za-z0-9_]*\): phony$/\1/p' |
    grep -Ev '^(kvs_unit_|kvs_e2e_|all$|clean$|help$|test$|edit_cache$|rebuild_cache$|install)')
  # shellcheck disable=SC2086  # one target a word
  cmake --build build/cuda -j "$jobs" --target kvstream $targets
}
peers() { tests/peers/run.sh build/cpu/kvstream; }
# Each harness from a copy of its seeds (what it finds new stays in build/fuzz/corpus); a crash,
# leak, sanitizer report or timeout leaves its input in build/fuzz/findings and fails.
fuzz() {
  local targets=(gguf tokenizer request) t rc=0 secs=${KVS_FUZZ_SECONDS:-40}
  cmake --preset fuzz "${cfg[@]}" &&
    cmake --build build/fuzz -j "$jobs" --target "${targets[@]/#/kvs_fuzz_}" || return 1
  mkdir -p build/fuzz/findings
  local models=models/SmolLM2-135M-Instruct.Q4_1.gguf:models/gemma-3-270m-q4_k_m.gguf
  for t in "${targets[@]}"; do
    mkdir -p "build/fuzz/corpus/$t"
    echo "fuzz: $t for ${secs} s"
    KVS_FUZZ_MODELS=$models "build/fuzz/kvs_fuzz_$t" -max_total_time="$secs" -timeout=10 \
      -rss_limit_mb=4096 -print_final_stats=1 -artifact_prefix=build/fuzz/findings/"$t"- \
      "build/fuzz/corpus/$t" "tests/fuzz/corpus/$t" || rc=1
  done
  return $rc
}
nullgpu_tests() { ctest --test-dir build/cuda --output-on-failure -L nullgpu; }
timing_build() {
  cmake --preset trace-sm90 "${cuda_cfg[@]}" &&
    cmake --build build/trace -j "$jobs" --target kvstream
}

start=$SECONDS
stage "setup" setup setup
stage "cpu tests" cpu cpu_tests
if [ -x build/cpu/kvstream ]; then
  stage "peers" peers peers
else
  skip "peers" "build/cpu has no kvstream"
fi
stage "sanitizers" tsan sanitizers
if command -v clang++ >/dev/null 2>&1; then
  stage "fuzz" fuzz fuzz
  stage "clang build" clang clang_build
else
  skip "fuzz" "no clang++ (scripts/setup.sh installs it)"
  skip "clang build" "no clang++ (scripts/setup.sh installs it)"
fi
if command -v nvcc >/dev/null 2>&1; then
  stage "cuda build" cuda cuda_build
  if [ "${results[-1]}" = passed ]; then
    stage "null-gpu tests" nullgpu nullgpu_tests
  else
    skip "null-gpu tests" "the cuda build failed"
  fi
  stage "timing build" trace timing_build
else
  for s in "cuda build" "null-gpu tests" "timing build"; do skip "$s" "no nvcc"; done
fi

# ctest's own count, for the summary.
ctest_count=$(grep -Eo '[0-9]+% tests passed, [0-9]+ tests? failed out of [0-9]+' "$logs/cpu.log" |
  tail -n 1 || true)
passed=0 failed=0 skipped=0
echo
echo "==================== test.sh summary ===================="
for i in "${!names[@]}"; do
  r=${results[$i]} note=${notes[$i]}
  case "$r" in
    passed) passed=$((passed + 1)) ;;
    failed) failed=$((failed + 1)) ;;
    skipped) skipped=$((skipped + 1)) ;;
  esac
  [ "${names[$i]}" = "cpu tests" ] && [ -n "$ctest_count" ] && note="$ctest_count; $note"
  t=$(mmss "${times[$i]}")
  [ "$r" = skipped ] && t=""
  printf '  %-15s %-8s %7s  %s\n' "${names[$i]}" "$r" "$t" "$note"
done
printf '  %-15s %-8s %7s\n' "total" "" "$(mmss $((SECONDS - start)))"
echo "test.sh: $passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
