//! One table printer: GitHub-flavoured markdown, which reads as plain text
//! in a terminal and pastes into the README as a table.

use std::fmt;

/// How a column's cells line up when the markdown is rendered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Align {
    /// `---`: text.
    #[default]
    Left,
    /// `---:`: numbers.
    Right,
}

/// A markdown table: a header row, an alignment row, then the rows as
/// added. Cells are written as given (`| a | b |`), with no padding, so a
/// cell may hold any text without a `|`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Table {
    header: Vec<String>,
    align: Vec<Align>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these column headers, every column left-aligned.
    pub fn new<S: Into<String>>(header: impl IntoIterator<Item = S>) -> Self {
        let header: Vec<String> = header.into_iter().map(Into::into).collect();
        Table {
            align: vec![Align::Left; header.len()],
            header,
            rows: Vec::new(),
        }
    }

    /// The alignment of the columns, in order (columns not named stay
    /// left-aligned).
    pub fn align(mut self, align: impl IntoIterator<Item = Align>) -> Self {
        for (slot, a) in self.align.iter_mut().zip(align) {
            *slot = a;
        }
        self
    }

    /// Adds a row of cells.
    pub fn row<S: Into<String>>(&mut self, cells: impl IntoIterator<Item = S>) -> &mut Self {
        self.rows.push(cells.into_iter().map(Into::into).collect());
        self
    }

    /// Rows added so far.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// Whether no row was added.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }
}

fn write_row(f: &mut fmt::Formatter<'_>, cells: &[String]) -> fmt::Result {
    writeln!(f, "| {} |", cells.join(" | "))
}

impl fmt::Display for Table {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_row(f, &self.header)?;
        let rule: Vec<&str> = self
            .align
            .iter()
            .map(|a| match a {
                Align::Left => "---",
                Align::Right => "---:",
            })
            .collect();
        writeln!(f, "|{}|", rule.join("|"))?;
        for row in &self.rows {
            write_row(f, row)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prints_markdown_with_alignment_and_empty_cells() {
        let mut t = Table::new(["measure", "a", "b", "ratio"]).align([
            Align::Left,
            Align::Right,
            Align::Right,
            Align::Right,
        ]);
        t.row(["requests", "7", "7", ""]);
        t.row(["warm rate", "1%", "2%", "÷2"]);
        assert_eq!(t.len(), 2);
        assert_eq!(
            t.to_string(),
            "| measure | a | b | ratio |\n|---|---:|---:|---:|\n| requests | 7 | 7 |  |\n| warm rate | 1% | 2% | ÷2 |\n"
        );
    }
}
