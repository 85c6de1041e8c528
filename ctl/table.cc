#include "ctl/table.h"

#include <algorithm>
#include <cassert>
#include <utility>

namespace trainerd::ctl {

size_t DisplayWidth(std::string_view text) {
  size_t width = 0;
  for (unsigned char c : text) {
    if ((c & 0xC0) != 0x80) ++width;  // not a continuation byte
  }
  return width;
}

Table::Table(std::vector<Column> columns) : columns_(std::move(columns)) {}

void Table::AddRow(std::vector<Cell> cells) {
  assert(cells.size() == columns_.size() && "one cell per column");
  cells.resize(columns_.size(), Cell(""));
  rows_.push_back(std::move(cells));
}

std::string Table::Render(bool colour) const {
  std::vector<size_t> widths(columns_.size());
  for (size_t c = 0; c < columns_.size(); ++c) {
    widths[c] = DisplayWidth(columns_[c].header);
    for (const auto& row : rows_) widths[c] = std::max(widths[c], DisplayWidth(row[c].text));
  }

  std::string out;
  // Appends one line: each cell padded to its column, trailing spaces dropped.
  auto line = [&](const std::vector<Cell>& cells, const std::string& all_sgr) {
    std::string text;
    size_t pending_spaces = 0;  // padding not yet written: dropped at the end of the line
    for (size_t c = 0; c < cells.size(); ++c) {
      const Cell& cell = cells[c];
      const size_t pad = widths[c] - DisplayWidth(cell.text);
      const std::string& sgr = all_sgr.empty() ? cell.sgr : all_sgr;
      const bool right = columns_[c].align == Align::kRight;
      if (c > 0) pending_spaces += 2;
      if (right) pending_spaces += pad;
      if (!cell.text.empty()) {
        text.append(pending_spaces, ' ');
        pending_spaces = 0;
        if (colour && !sgr.empty()) {
          text += "\x1b[" + sgr + "m" + cell.text + "\x1b[0m";
        } else {
          text += cell.text;
        }
      }
      if (!right) pending_spaces += pad;
    }
    out += text;
    out += '\n';
  };

  std::vector<Cell> header;
  for (const Column& column : columns_) header.emplace_back(column.header);
  line(header, colour ? "1" : "");
  for (const auto& row : rows_) line(row, "");
  return out;
}

}  // namespace trainerd::ctl
