// A text table with aligned columns, for `trainctl list`.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace trainerd::ctl {

// The width of `text` in terminal cells, counted as UTF-8 code points (each
// byte that does not continue a sequence is one cell; wide CJK characters are
// not special-cased).
size_t DisplayWidth(std::string_view text);

class Table {
 public:
  enum class Align { kLeft, kRight };
  struct Column {
    std::string header;
    Align align = Align::kLeft;
  };
  struct Cell {
    Cell(std::string text, std::string sgr = "") : text(std::move(text)), sgr(std::move(sgr)) {}  // NOLINT
    Cell(const char* text) : text(text) {}  // NOLINT: implicit, so rows read {"7", "llama", ...}
    std::string text;
    // ANSI SGR parameters for this cell when rendered with colour ("32" green,
    // "1;31" bold red); empty: plain.
    std::string sgr;
  };

  explicit Table(std::vector<Column> columns);

  // Precondition (asserted): one cell per column.
  void AddRow(std::vector<Cell> cells);
  size_t rows() const { return rows_.size(); }

  // The header line, then one line per row, each ending in '\n'. Columns are
  // separated by two spaces and padded to their widest cell (DisplayWidth),
  // left- or right-aligned; lines carry no trailing spaces. With `colour`, the
  // header is bold and cells with an sgr are wrapped in its escape codes
  // (padding stays outside them, so alignment is the same).
  std::string Render(bool colour) const;

 private:
  std::vector<Column> columns_;
  std::vector<std::vector<Cell>> rows_;
};

}  // namespace trainerd::ctl
