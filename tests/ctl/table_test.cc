// The aligned text table of `trainctl list` (ctl/table.h).
#include "ctl/table.h"

#include <string>

#include <gtest/gtest.h>

namespace trainerd::ctl {
namespace {

using Align = Table::Align;

TEST(TableTest, ColumnsArePaddedToTheWidestCellAndSeparatedByTwoSpaces) {
  Table table({{"ID", Align::kRight}, {"NAME"}, {"STATE"}});
  table.AddRow({"7", "llama-lora", "running"});
  table.AddRow({"12", "x", "queued"});
  EXPECT_EQ(table.Render(false),
            "ID  NAME        STATE\n"
            " 7  llama-lora  running\n"
            "12  x           queued\n");
}

TEST(TableTest, NoTrailingSpacesWhenTheLastColumnIsShortOrEmpty) {
  Table table({{"NAME"}, {"DEVICE"}});
  table.AddRow({"a", ""});
  table.AddRow({"bbbbbbbb", "cuda:0"});
  EXPECT_EQ(table.Render(false),
            "NAME      DEVICE\n"
            "a\n"
            "bbbbbbbb  cuda:0\n");
}

TEST(TableTest, RightAlignedColumnsPadOnTheLeft) {
  Table table({{"N"}, {"PRIORITY", Align::kRight}});
  table.AddRow({"a", "5"});
  table.AddRow({"b", "-10"});
  EXPECT_EQ(table.Render(false),
            "N  PRIORITY\n"
            "a         5\n"
            "b       -10\n");
}

TEST(TableTest, HeaderOnlyWhenThereAreNoRows) {
  Table table({{"ID", Align::kRight}, {"NAME"}});
  EXPECT_EQ(table.rows(), 0u);
  EXPECT_EQ(table.Render(false), "ID  NAME\n");
}

TEST(TableTest, WidthCountsUtf8CharactersNotBytes) {
  EXPECT_EQ(DisplayWidth("abc"), 3u);
  EXPECT_EQ(DisplayWidth("h\xc3\xa9llo"), 5u);  // "héllo"
  Table table({{"NAME"}, {"STATE"}});
  table.AddRow({"h\xc3\xa9llo", "queued"});
  table.AddRow({"abcdefg", "failed"});
  EXPECT_EQ(table.Render(false),
            "NAME     STATE\n"
            "h\xc3\xa9llo    queued\n"
            "abcdefg  failed\n");
}

TEST(TableTest, ColourWrapsCellsWithoutChangingTheAlignment) {
  Table table({{"ID", Align::kRight}, {"STATE"}, {"NAME"}});
  table.AddRow({"7", Table::Cell("failed", "31"), "x"});
  EXPECT_EQ(table.Render(true),
            "\x1b[1mID\x1b[0m  \x1b[1mSTATE\x1b[0m   \x1b[1mNAME\x1b[0m\n"
            " 7  \x1b[31mfailed\x1b[0m  x\n");
  // Without colour the same table has no escapes at all.
  EXPECT_EQ(table.Render(false), "ID  STATE   NAME\n 7  failed  x\n");
}

}  // namespace
}  // namespace trainerd::ctl
