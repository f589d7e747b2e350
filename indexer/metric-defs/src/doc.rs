//! Reads the metric tables of a Markdown page (`| metric | type | labels | meaning |`) and
//! compares them with the declared tables.
//!
//! The labels cell names each label first, in backticks, then optionally its values:
//! ``` `reason` = `a` \| `b`; `source` ``` or ``` `from`, `to` (`EXACT`, ...) ```. Label names
//! are the first backticked word of each part, parts being split at `;` and `,` outside
//! parentheses; the values after `=` or inside parentheses are not labels.

use std::collections::BTreeSet;

use crate::Metric;

/// One documented metric.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DocRow {
    pub name: String,
    /// The first word of the type cell (`histogram (buckets ...)` is `histogram`).
    pub kind: String,
    pub labels: BTreeSet<String>,
}

/// Every row of every metric table of `markdown`.
pub fn rows(markdown: &str) -> Vec<DocRow> {
    let mut rows = Vec::new();
    let mut in_table = false;
    for line in markdown.lines() {
        if !line.starts_with('|') {
            in_table = false;
            continue;
        }
        if line.starts_with("| metric | type | labels |") {
            in_table = true;
            continue;
        }
        if !in_table || line.starts_with("|---") {
            continue;
        }
        let escaped = line.replace("\\|", "\u{0}");
        let cells: Vec<&str> = escaped.split('|').skip(1).map(str::trim).collect();
        if cells.len() < 3 {
            continue;
        }
        let Some(name) = first_code(cells[0]) else { continue };
        let kind = cells[1].split_whitespace().next().unwrap_or_default().to_string();
        rows.push(DocRow { name, kind, labels: labels(cells[2]) });
    }
    rows
}

/// The first `backticked` word of `text`.
fn first_code(text: &str) -> Option<String> {
    let rest = text.split_once('`')?.1;
    let code = rest.split_once('`')?.0;
    Some(code.split_whitespace().next()?.to_string())
}

/// The label names of a labels cell.
fn labels(cell: &str) -> BTreeSet<String> {
    let mut parts = Vec::new();
    let (mut depth, mut current) = (0usize, String::new());
    for c in cell.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ';' | ',' if depth == 0 => {
                parts.push(std::mem::take(&mut current));
                continue;
            }
            _ => {}
        }
        if depth == 0 || c == '(' {
            current.push(c);
        }
    }
    parts.push(current);
    parts.iter().filter_map(|p| first_code(p.split(['=', '(']).next().unwrap_or_default())).collect()
}

/// Every disagreement between the page and the tables: a metric undocumented, documented
/// twice, documented but not declared, or documented with another kind or other labels.
pub fn check(tables: &[&[Metric]], markdown: &str) -> Vec<String> {
    let rows = rows(markdown);
    let declared: Vec<&Metric> = tables.iter().flat_map(|t| t.iter()).collect();
    let mut problems = Vec::new();
    for m in &declared {
        match rows.iter().filter(|r| r.name == m.name).count() {
            0 => problems.push(format!("{} is not documented", m.name)),
            1 => {}
            n => problems.push(format!("{} is documented {n} times", m.name)),
        }
    }
    for row in &rows {
        let Some(m) = declared.iter().find(|m| m.name == row.name) else {
            problems.push(format!("{} is documented but no table declares it", row.name));
            continue;
        };
        if row.kind != m.kind.as_str() {
            problems.push(format!("{}: documented as {}, declared {}", m.name, row.kind, m.kind.as_str()));
        }
        let labels: BTreeSet<String> = m.labels.iter().map(|l| l.to_string()).collect();
        if row.labels != labels {
            problems.push(format!("{}: documented labels {:?}, declared {:?}", m.name, row.labels, labels));
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Kind;

    const PAGE: &str = "\
| metric | type | labels | meaning |
|---|---|---|---|
| `a_total` | counter | `reason` = `x` \\| `y` (z); `source` | a |
| `b` | histogram (buckets 1, 2) | | b |
| `c` | gauge | `from`, `to` (`A`, `B`), `why` (`p`, `q`) | c |

| other | table |
|---|---|
| `d` | e |
";

    #[test]
    fn label_names_are_the_first_word_of_each_part() {
        let rows = rows(PAGE);
        assert_eq!(rows.len(), 3, "{rows:?}");
        let names = |r: &DocRow| r.labels.iter().cloned().collect::<Vec<_>>();
        assert_eq!(names(&rows[0]), ["reason", "source"]);
        assert_eq!((rows[1].kind.as_str(), rows[1].labels.len()), ("histogram", 0));
        assert_eq!(names(&rows[2]), ["from", "to", "why"]);
    }

    #[test]
    fn disagreements_are_each_named() {
        let table = [
            Metric { name: "a_total", kind: Kind::Counter, labels: &["reason"], unit: None, help: "a" },
            Metric { name: "b", kind: Kind::Gauge, labels: &[], unit: None, help: "b" },
            Metric { name: "e", kind: Kind::Gauge, labels: &[], unit: None, help: "e" },
        ];
        let problems = check(&[&table], PAGE);
        assert_eq!(
            problems,
            [
                "e is not documented",
                "a_total: documented labels {\"reason\", \"source\"}, declared {\"reason\"}",
                "b: documented as histogram, declared gauge",
                "c is documented but no table declares it",
            ]
        );
    }
}
