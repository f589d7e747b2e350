//! Python's `json.dumps` over template values, because HF overrides Jinja's `tojson` with it
//! (no HTML escaping, `", "`/`": "` separators, Python float repr) and templates that embed tool
//! schemas produce different tokens if even one space differs.
use minijinja::value::{Value, ValueKind};
use minijinja::{Error, ErrorKind};

/// Options of HF's `tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`.
#[derive(Debug, Clone, Default)]
pub struct DumpOptions {
    pub ensure_ascii: bool,
    /// `None` is compact-on-one-line; `Some(s)` puts each item on its own line, indented by `s`.
    pub indent: Option<String>,
    /// `(item_separator, key_separator)`; defaults follow Python (depend on `indent`).
    pub separators: Option<(String, String)>,
    pub sort_keys: bool,
}

/// Serializes `value` exactly as CPython's `json.dumps` would with `opts`.
pub fn dumps(value: &Value, opts: &DumpOptions) -> Result<String, Error> {
    let (item_sep, key_sep) = match &opts.separators {
        Some((i, k)) => (i.clone(), k.clone()),
        None if opts.indent.is_some() => (",".to_string(), ": ".to_string()),
        None => (", ".to_string(), ": ".to_string()),
    };
    let mut out = String::new();
    let writer = Writer { opts, item_sep: &item_sep, key_sep: &key_sep };
    writer.write(&mut out, value, 0)?;
    Ok(out)
}

struct Writer<'a> {
    opts: &'a DumpOptions,
    item_sep: &'a str,
    key_sep: &'a str,
}

impl Writer<'_> {
    fn newline(&self, out: &mut String, depth: usize) {
        if let Some(indent) = &self.opts.indent {
            out.push('\n');
            for _ in 0..depth {
                out.push_str(indent);
            }
        }
    }

    fn write(&self, out: &mut String, value: &Value, depth: usize) -> Result<(), Error> {
        match value.kind() {
            ValueKind::None => out.push_str("null"),
            ValueKind::Undefined => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    "Object of type Undefined is not JSON serializable",
                ))
            }
            ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
            ValueKind::Number => write_number(out, value),
            ValueKind::String | ValueKind::Bytes => {
                write_string(out, value.as_str().unwrap_or_default(), self.opts.ensure_ascii)
            }
            ValueKind::Map => self.write_map(out, value, depth)?,
            ValueKind::Seq | ValueKind::Iterable => self.write_seq(out, value, depth)?,
            _ => write_string(out, &value.to_string(), self.opts.ensure_ascii),
        }
        Ok(())
    }

    fn write_seq(&self, out: &mut String, value: &Value, depth: usize) -> Result<(), Error> {
        let items: Vec<Value> = value.try_iter()?.collect();
        if items.is_empty() {
            out.push_str("[]");
            return Ok(());
        }
        out.push('[');
        for (i, item) in items.iter().enumerate() {
            if i > 0 {
                out.push_str(self.item_sep);
            }
            self.newline(out, depth + 1);
            self.write(out, item, depth + 1)?;
        }
        self.newline(out, depth);
        out.push(']');
        Ok(())
    }

    fn write_map(&self, out: &mut String, value: &Value, depth: usize) -> Result<(), Error> {
        let mut entries: Vec<(String, Value)> = Vec::new();
        for key in value.try_iter()? {
            let item = value.get_item(&key)?;
            entries.push((key_to_string(&key)?, item));
        }
        if entries.is_empty() {
            out.push_str("{}");
            return Ok(());
        }
        if self.opts.sort_keys {
            entries.sort_by(|a, b| a.0.cmp(&b.0));
        }
        out.push('{');
        for (i, (key, item)) in entries.iter().enumerate() {
            if i > 0 {
                out.push_str(self.item_sep);
            }
            self.newline(out, depth + 1);
            write_string(out, key, self.opts.ensure_ascii);
            out.push_str(self.key_sep);
            self.write(out, item, depth + 1)?;
        }
        self.newline(out, depth);
        out.push('}');
        Ok(())
    }
}

/// Python coerces non-string keys: `True` → "true", `None` → "null", numbers → their repr.
fn key_to_string(key: &Value) -> Result<String, Error> {
    Ok(match key.kind() {
        ValueKind::String => key.as_str().unwrap_or_default().to_string(),
        ValueKind::Bool => (if key.is_true() { "true" } else { "false" }).to_string(),
        ValueKind::None => "null".to_string(),
        ValueKind::Number => {
            let mut s = String::new();
            write_number(&mut s, key);
            s
        }
        _ => return Err(Error::new(ErrorKind::InvalidOperation, "keys must be str, int, float, bool or None")),
    })
}

fn write_number(out: &mut String, value: &Value) {
    if value.is_integer() {
        out.push_str(&value.to_string());
    } else {
        let f = f64::try_from(value.clone()).unwrap_or(f64::NAN);
        out.push_str(&python_float_repr(f));
    }
}

/// CPython's `float.__repr__` (shortest round-trip digits; exponent outside 1e-4..1e16), and
/// json's spellings of the non-finite values.
pub fn python_float_repr(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity".into() } else { "-Infinity".into() };
    }
    if f == 0.0 {
        return if f.is_sign_negative() { "-0.0".into() } else { "0.0".into() };
    }
    // `{:e}` gives the shortest round-trip digits, e.g. "1.2345e-5".
    let sci = format!("{:e}", f);
    let (mantissa, exp) = sci.split_once('e').expect("`{:e}` always has an exponent");
    let exp: i32 = exp.parse().expect("`{:e}` exponent is an integer");
    let negative = mantissa.starts_with('-');
    let digits: String = mantissa.chars().filter(|c| c.is_ascii_digit()).collect();
    let sign = if negative { "-" } else { "" };
    if (-4..16).contains(&exp) {
        let point = exp + 1; // digits before the decimal point
        let body = if point <= 0 {
            format!("0.{}{}", "0".repeat((-point) as usize), digits)
        } else if (point as usize) >= digits.len() {
            format!("{}{}.0", digits, "0".repeat(point as usize - digits.len()))
        } else {
            format!("{}.{}", &digits[..point as usize], &digits[point as usize..])
        };
        format!("{sign}{body}")
    } else {
        let mant = if digits.len() == 1 { digits.clone() } else { format!("{}.{}", &digits[..1], &digits[1..]) };
        let exp_sign = if exp < 0 { "-" } else { "+" };
        format!("{sign}{mant}e{exp_sign}{:02}", exp.abs())
    }
}

/// A JSON string literal with Python's escaping rules.
pub fn write_string(out: &mut String, s: &str, ensure_ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c if ensure_ascii && (c as u32) > 0x7e => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    out.push_str(&format!("\\u{:04x}", unit));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(json: &str) -> Value {
        Value::from_serialize(serde_json::from_str::<serde_json::Value>(json).unwrap())
    }

    #[test]
    fn matches_python_default_separators_and_key_order() {
        let out = dumps(&v(r#"{"b": [1, 2.5, true, null], "a": "é<>&'"}"#), &DumpOptions::default()).unwrap();
        assert_eq!(out, r#"{"b": [1, 2.5, true, null], "a": "é<>&'"}"#);
    }

    #[test]
    fn indent_uses_compact_item_separator_like_python() {
        let opts = DumpOptions { indent: Some("    ".into()), ..Default::default() };
        let out = dumps(&v(r#"{"a": [1], "b": {}}"#), &opts).unwrap();
        assert_eq!(out, "{\n    \"a\": [\n        1\n    ],\n    \"b\": {}\n}");
    }

    #[test]
    fn ensure_ascii_escapes_astral_chars_as_surrogates() {
        let opts = DumpOptions { ensure_ascii: true, ..Default::default() };
        assert_eq!(dumps(&v(r#""é😀""#), &opts).unwrap(), r#""\u00e9\ud83d\ude00""#);
    }

    #[test]
    fn float_repr_matches_cpython() {
        assert_eq!(python_float_repr(1.0), "1.0");
        assert_eq!(python_float_repr(0.1), "0.1");
        assert_eq!(python_float_repr(1e16), "1e+16");
        assert_eq!(python_float_repr(123456789012345.6), "123456789012345.6");
        assert_eq!(python_float_repr(0.0001), "0.0001");
        assert_eq!(python_float_repr(0.00001), "1e-05");
        assert_eq!(python_float_repr(-2.5e-7), "-2.5e-07");
    }

    #[test]
    fn sort_keys_and_custom_separators() {
        let opts = DumpOptions { sort_keys: true, separators: Some((",".into(), ":".into())), ..Default::default() };
        assert_eq!(dumps(&v(r#"{"b": 1, "a": 2}"#), &opts).unwrap(), r#"{"a":2,"b":1}"#);
    }
}
