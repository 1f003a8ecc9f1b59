#include <gtest/gtest.h>

#include "kvs/util/error.h"
#include "kvs/util/parse.h"

namespace kvs {

TEST(Parse, Sizes) {
  EXPECT_EQ(parse_size("4096", "--x"), 4096u);
  EXPECT_EQ(parse_size("2K", "--x"), 2048u);
  EXPECT_EQ(parse_size("512M", "--x"), 512ull << 20);
  EXPECT_EQ(parse_size("2.5G", "--x"), 5ull << 29);
  EXPECT_EQ(parse_size("1GiB", "--x"), 1ull << 30);
  EXPECT_THROW(parse_size("", "--x"), Error);
  EXPECT_THROW(parse_size("12Q", "--x"), Error);
  EXPECT_THROW(parse_size("-1G", "--x"), Error);
}

TEST(Parse, Counts) {
  EXPECT_EQ(parse_count("32k", "--d"), 32768);
  EXPECT_EQ(parse_count("32K", "--d"), 32768);
  EXPECT_EQ(parse_count("1m", "--d"), 1048576);
  EXPECT_EQ(parse_count("1.5k", "--d"), 1536);
  EXPECT_EQ(parse_count("0", "--d"), 0);
  EXPECT_EQ(parse_count_list("0,4k,128k", "--d"), (std::vector<int64_t>{0, 4096, 131072}));
  EXPECT_EQ(parse_int_list("1,2,3", "--t"), (std::vector<int32_t>{1, 2, 3}));
  EXPECT_THROW(parse_int_list("1,,3", "--t"), Error);
  EXPECT_THROW(parse_count("abc", "--d"), Error);
}

TEST(Parse, CpuLists) {
  EXPECT_EQ(parse_cpu_list("3", "--c"), (std::vector<int>{3}));
  EXPECT_EQ(parse_cpu_list("1-3,7,5-6", "--c"), (std::vector<int>{1, 2, 3, 7, 5, 6}));
  for (const char* bad : {"", "a", "3-1", "1-", "-1", "1,,2", "2-x", "1 -2"})
    EXPECT_THROW(parse_cpu_list(bad, "--c"), Error) << bad;
  try {
    parse_cpu_list("4-2", "--split-cpus");
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "--split-cpus: the range '4-2' ends before it starts");
  }
  EXPECT_EQ(cpu_list_name({0, 1, 2, 5, 7, 8}), "0-2,5,7-8");
  EXPECT_EQ(cpu_list_name({4}), "4");
  EXPECT_EQ(cpu_list_name({}), "");
}

TEST(Parse, FormatBytes) {
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(3ull << 30), "3.00 GiB");
}

}  // namespace kvs
