// Parsing of user-facing quantities: sizes ("2.2G", "512M", "4096") and token counts ("32k").
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kvs {

// Bytes; suffixes K, M, G, T (optionally followed by "iB" or "B") are powers of 1024.
uint64_t parse_size(std::string_view text, std::string_view flag);
// Token counts; k and m are powers of 1024 ("32k" = 32768), as llama-bench writes depths.
int64_t parse_count(std::string_view text, std::string_view flag);
// Comma-separated list of parse_count values.
std::vector<int64_t> parse_count_list(std::string_view text, std::string_view flag);
// Comma-separated integers ("1,2,3").
std::vector<int32_t> parse_int_list(std::string_view text, std::string_view flag);
// CPU numbers as taskset and llama.cpp's --cpu-range write them: "1-15", "0,2,4-7"; in the
// order given.
std::vector<int> parse_cpu_list(std::string_view text, std::string_view flag);
std::string cpu_list_name(const std::vector<int>& cpus);  // {0, 1, 2, 5} -> "0-2,5"

std::string format_bytes(uint64_t bytes);  // "2.20 GiB"

}  // namespace kvs
