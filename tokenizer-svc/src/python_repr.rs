//! How Jinja2 prints a value (`str(x)` in Python), because templates written for HF print
//! booleans, `None`, lists and dicts in Python spelling (`True`, `None`, `{'a': 1}`), and
//! minijinja's defaults (`true`, `none`, `{"a": 1}`) would change the rendered prompt.
use minijinja::value::{Value, ValueKind};
use minijinja::{Error, Output, State};

use crate::python_json::python_float_repr;

/// The minijinja formatter installed in the HF-compatible environment.
pub fn python_formatter(out: &mut Output, _state: &State, value: &Value) -> Result<(), Error> {
    match value.kind() {
        ValueKind::Undefined => Ok(()),
        ValueKind::String => out.write_str(value.as_str().unwrap_or_default()).map_err(Error::from),
        _ => out.write_str(&python_str(value)).map_err(Error::from),
    }
}

/// Python's `str(value)`.
pub fn python_str(value: &Value) -> String {
    match value.kind() {
        ValueKind::String => value.as_str().unwrap_or_default().to_string(),
        ValueKind::Undefined => String::new(),
        _ => {
            let mut s = String::new();
            write_repr(&mut s, value);
            s
        }
    }
}

fn write_repr(out: &mut String, value: &Value) {
    match value.kind() {
        ValueKind::None | ValueKind::Undefined => out.push_str("None"),
        ValueKind::Bool => out.push_str(if value.is_true() { "True" } else { "False" }),
        ValueKind::Number if value.is_integer() => out.push_str(&value.to_string()),
        ValueKind::Number => {
            let f = f64::try_from(value.clone()).unwrap_or(f64::NAN);
            out.push_str(&match python_float_repr(f).as_str() {
                "NaN" => "nan".to_string(),
                "Infinity" => "inf".to_string(),
                "-Infinity" => "-inf".to_string(),
                other => other.to_string(),
            });
        }
        ValueKind::String => write_str_repr(out, value.as_str().unwrap_or_default()),
        ValueKind::Seq | ValueKind::Iterable => {
            out.push('[');
            if let Ok(iter) = value.try_iter() {
                for (i, item) in iter.enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    write_repr(out, &item);
                }
            }
            out.push(']');
        }
        ValueKind::Map => {
            out.push('{');
            if let Ok(iter) = value.try_iter() {
                for (i, key) in iter.enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    write_repr(out, &key);
                    out.push_str(": ");
                    write_repr(out, &value.get_item(&key).unwrap_or_default());
                }
            }
            out.push('}');
        }
        _ => out.push_str(&value.to_string()),
    }
}

/// Python's `repr(str)`: single quotes unless the text has `'` and no `"`.
fn write_str_repr(out: &mut String, s: &str) {
    let quote = if s.contains('\'') && !s.contains('"') { '"' } else { '\'' };
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c as u32 == 0x7f => out.push_str(&format!("\\x{:02x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push(quote);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prints_like_python_str() {
        let v = Value::from_serialize(serde_json::json!({"a": [1, 2.0, true, null], "b": "it's"}));
        assert_eq!(python_str(&v), r#"{'a': [1, 2.0, True, None], 'b': "it's"}"#);
        assert_eq!(python_str(&Value::from(false)), "False");
        assert_eq!(python_str(&Value::from(())), "None");
    }
}
