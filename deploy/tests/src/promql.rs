//! The metric names a PromQL expression reads. A small tokenizer, enough for dashboards:
//! string literals, label matchers `{…}`, range and subquery brackets `[…]`, label lists after
//! `by`/`without`/`on`/`ignoring`/`group_left`/`group_right`, functions and aggregations
//! (an identifier followed by `(`, or by `by`/`without`), keywords and numbers are not metric names; every other
//! identifier is.

const KEYWORDS: &[&str] = &[
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "inf",
    "nan",
    "atan2",
];
const LABEL_LIST_BEFORE: &[&str] = &["by", "without", "on", "ignoring", "group_left", "group_right"];

/// Metric names in `expr`, in order of appearance.
pub fn metric_names(expr: &str) -> Vec<String> {
    let chars: Vec<char> = expr.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    let mut last_word = String::new();
    while i < chars.len() {
        let c = chars[i];
        if c == '"' || c == '\'' || c == '`' {
            i = skip_string(&chars, i);
        } else if c == '{' {
            i = skip_until(&chars, i, '}');
        } else if c == '[' {
            i = skip_until(&chars, i, ']');
        } else if c == '(' && LABEL_LIST_BEFORE.contains(&last_word.as_str()) {
            i = skip_until(&chars, i, ')');
            last_word.clear();
        } else if c.is_ascii_alphabetic() || c == '_' || c == ':' {
            let start = i;
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == ':') {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let mut j = i;
            while j < chars.len() && chars[j].is_whitespace() {
                j += 1;
            }
            // `sum(…)`, and `sum by (…) (…)` / `sum without (…) (…)`: an aggregation, not a metric.
            let next: String = chars[j..].iter().take_while(|c| c.is_ascii_alphabetic() || **c == '_').collect();
            let is_call = (j < chars.len() && chars[j] == '(') || next == "by" || next == "without";
            let lower = word.to_ascii_lowercase();
            if !is_call && !KEYWORDS.contains(&lower.as_str()) && !word.starts_with('$') {
                out.push(word.clone());
            }
            last_word = lower;
        } else if c.is_ascii_digit() {
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.') {
                i += 1;
            }
        } else {
            if c == '$' {
                // Grafana variables ($job, ${datasource}) outside matchers.
                i += 1;
                while i < chars.len() && (chars[i].is_ascii_alphanumeric() || "_{}".contains(chars[i])) {
                    i += 1;
                }
                continue;
            }
            i += 1;
        }
    }
    out
}

fn skip_string(chars: &[char], start: usize) -> usize {
    let quote = chars[start];
    let mut i = start + 1;
    while i < chars.len() && chars[i] != quote {
        if chars[i] == '\\' {
            i += 1;
        }
        i += 1;
    }
    i + 1
}

/// Skips to after the matching `close`, stepping over strings (label values may hold `}`).
fn skip_until(chars: &[char], start: usize, close: char) -> usize {
    let mut i = start + 1;
    while i < chars.len() && chars[i] != close {
        if chars[i] == '"' || chars[i] == '\'' || chars[i] == '`' {
            i = skip_string(chars, i);
        } else {
            i += 1;
        }
    }
    i + 1
}

#[cfg(test)]
mod tests {
    use super::metric_names;

    #[test]
    fn finds_only_metric_names() {
        let expr = r#"histogram_quantile(0.99, sum by (le, stage) (rate(kvindex_router_route_seconds_bucket{job=~"$job", stage!="a}b"}[$__rate_interval])))
            / on (job) group_left (pod) sum without (instance) (kvindex_ready offset 5m) > bool 0.5 or vector(1) and up"#;
        assert_eq!(metric_names(expr), ["kvindex_router_route_seconds_bucket", "kvindex_ready", "up"]);
    }

    #[test]
    fn a_misspelt_metric_is_still_a_metric() {
        assert_eq!(metric_names("sum(rate(kvindex_gap_total[5m]))"), ["kvindex_gap_total"]);
    }
}
