//! The Prometheus text exposition format as far as reading an engine's load needs: sample
//! lines split into name, label set and value, and one label's value. Shared by the parsers of
//! each engine family (`vllm_metrics.rs`, `sglang_metrics.rs`) so each keeps only
//! its own names and rules.

/// One sample line: the metric name, the label set as written (between the braces, empty
/// without), and the value.
pub struct Sample<'a> {
    pub name: &'a str,
    pub labels: &'a str,
    pub value: f64,
}

/// Splits a sample line into its metric name, labels and value; `None` for comments and lines
/// that are not samples.
pub fn sample(line: &str) -> Option<Sample<'_>> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let name_end = line.find(['{', ' ', '\t']).unwrap_or(line.len());
    let name = &line[..name_end];
    let mut rest = &line[name_end..];
    let mut labels = "";
    if rest.starts_with('{') {
        // Skip the label set, honouring quoted values (which may hold `}` or spaces).
        let mut quoted = false;
        let mut escaped = false;
        let mut end = None;
        for (i, c) in rest.char_indices() {
            match c {
                _ if escaped => escaped = false,
                '\\' if quoted => escaped = true,
                '"' => quoted = !quoted,
                '}' if !quoted => {
                    end = Some(i);
                    break;
                }
                _ => {}
            }
        }
        let end = end?;
        labels = &rest[1..end];
        rest = &rest[end + 1..];
    }
    let value = rest.split_whitespace().next()?;
    let value = match value {
        "NaN" => f64::NAN,
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().ok()?,
    };
    Some(Sample { name, labels, value })
}

/// The value of label `key` in a label set as written (`a="1",b="x \" y"`), unescaped only as
/// far as a number needs: `None` when absent or holding an escape.
pub fn label<'a>(labels: &'a str, key: &str) -> Option<&'a str> {
    let mut rest = labels;
    loop {
        let (name, after) = rest.split_once('=')?;
        let after = after.strip_prefix('"')?;
        // The value runs to the first unescaped quote.
        let mut end = None;
        let mut escaped = false;
        for (i, c) in after.char_indices() {
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => {
                    end = Some(i);
                    break;
                }
                _ => {}
            }
        }
        let end = end?;
        if name.trim() == key {
            let value = &after[..end];
            return (!value.contains('\\')).then_some(value);
        }
        rest = after[end + 1..].trim_start_matches([',', ' ']);
    }
}
