//! A minijinja environment that behaves like the Jinja2 sandbox `transformers` renders chat
//! templates in (trim/lstrip blocks, loop controls, `raise_exception`, HF's `tojson`,
//! `strftime_now`, Python string methods and Python value printing), and compiled templates on it.
use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{AutoEscape, Environment, Error, ErrorKind};

use crate::error::{Result, TokenizerError};
use crate::python_json::{dumps, DumpOptions};
use crate::python_repr::{python_formatter, python_str};

/// A chat template compiled once and rendered many times.
pub struct ChatTemplate {
    env: Environment<'static>,
    name: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate").field("name", &self.name).finish()
    }
}

impl ChatTemplate {
    /// Compiles `source`; `name` appears in every error (e.g. `Qwen3-8B/default`).
    pub fn compile(name: &str, source: &str) -> Result<Self> {
        Self::compile_with_fuel(name, source, TEMPLATE_FUEL)
    }

    /// [`Self::compile`] with another instruction budget per render (client templates get
    /// [`CLIENT_TEMPLATE_FUEL`]).
    pub fn compile_with_fuel(name: &str, source: &str, fuel: u64) -> Result<Self> {
        let mut env = hf_environment();
        env.set_fuel(Some(fuel));
        let source = rewrite_jinja2_quirks(source);
        env.add_template_owned(name.to_string(), source).map_err(|e| template_error(name, &e))?;
        Ok(Self { env, name: name.to_string() })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Renders with `context` as the template's globals.
    pub fn render(&self, context: Value) -> Result<String> {
        let template = self.env.get_template(&self.name).map_err(|e| template_error(&self.name, &e))?;
        template.render(context).map_err(|e| template_error(&self.name, &e))
    }

    /// Renders like [`Self::render`], writing into a buffer that refuses to grow past
    /// `max_output_bytes`: the render stops at the first write beyond it.
    pub fn render_bounded(&self, context: Value, max_output_bytes: usize) -> Result<String, BoundedRenderError> {
        let template = self.env.get_template(&self.name).map_err(|e| template_error(&self.name, &e))?;
        let mut out = BoundedOutput { buf: Vec::new(), limit: max_output_bytes, overflowed: false };
        match template.render_captured_to(context, &mut out) {
            Ok(_) => String::from_utf8(out.buf).map_err(|_| {
                BoundedRenderError::Template(TokenizerError::Template {
                    template: self.name.clone(),
                    line: None,
                    reason: "rendered output is not UTF-8".into(),
                })
            }),
            Err(_) if out.overflowed => Err(BoundedRenderError::OutputLimit),
            Err(e) if e.kind() == ErrorKind::OutOfFuel => Err(BoundedRenderError::OutOfFuel),
            Err(e) => Err(BoundedRenderError::Template(template_error(&self.name, &e))),
        }
    }
}

/// Why [`ChatTemplate::render_bounded`] produced no text.
#[derive(Debug)]
pub enum BoundedRenderError {
    /// The output reached its byte budget.
    OutputLimit,
    /// The instruction budget (fuel) ran out.
    OutOfFuel,
    /// Any other template error (syntax, `raise_exception`, type errors, ...).
    Template(TokenizerError),
}

impl From<TokenizerError> for BoundedRenderError {
    fn from(e: TokenizerError) -> Self {
        BoundedRenderError::Template(e)
    }
}

/// An output buffer with a hard size: a write that would pass `limit` fails (and is remembered),
/// so the render ends there instead of growing the buffer.
struct BoundedOutput {
    buf: Vec<u8>,
    limit: usize,
    overflowed: bool,
}

impl std::io::Write for BoundedOutput {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        if self.buf.len() + bytes.len() > self.limit {
            self.overflowed = true;
            return Err(std::io::Error::other("output budget exceeded"));
        }
        self.buf.extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Instruction budget per render. Templates can arrive with requests, so a hostile one (nested
/// `range` loops) must end with an error instead of pinning a core; real templates rendering a
/// long multi-turn chat use well under 1 % of this.
pub const TEMPLATE_FUEL: u64 = 50_000_000;

/// Instruction budget per render of a template sent with a request (rendered only in the
/// sandbox, see [`crate::client_template`]): about a second of CPU for a tight loop in a
/// release build, far above what real chat templates use on long chats. The sandbox's
/// wall-clock deadline bounds the rest (filters that loop without spending fuel).
pub const CLIENT_TEMPLATE_FUEL: u64 = 10_000_000;

/// The environment HF's `_compile_jinja_template` builds, in minijinja.
fn hf_environment() -> Environment<'static> {
    let mut env = Environment::new();
    env.set_fuel(Some(TEMPLATE_FUEL));
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_keep_trailing_newline(false);
    env.set_auto_escape_callback(|_| AutoEscape::None);
    env.set_formatter(python_formatter);
    minijinja_contrib::add_to_environment(&mut env);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_filter("tojson", tojson);
    env.add_filter("trim", trim);
    env.add_filter("escape", escape);
    env.add_filter("e", escape);
    env.add_filter("string", |v: &Value| python_str(v));
    env.add_filter("join", join);
    env.add_filter("length", length);
    env.add_filter("count", length);
    env.add_test("iterable", is_iterable);
    env.add_filter("py_iter", py_iter);
    env.add_function("raise_exception", raise_exception);
    env.add_function("strftime_now", strftime_now);
    env
}

/// Maps a minijinja error to ours, keeping the template name and the failing line.
fn template_error(name: &str, err: &Error) -> TokenizerError {
    let mut reason = match err.detail() {
        Some(detail) => format!("{}: {}", err.kind(), detail),
        None => err.kind().to_string(),
    };
    let mut source = std::error::Error::source(err);
    while let Some(inner) = source {
        reason.push_str(&format!(" (caused by: {inner})"));
        source = inner.source();
    }
    TokenizerError::Template { template: name.to_string(), line: err.line(), reason }
}

/// Source rewrites for the two places where Jinja2's *syntax* handling differs from minijinja:
/// * HF's `{% generation %}` tag only marks assistant spans for `return_assistant_tokens_mask`;
///   for rendering it is a plain block, so it becomes an always-true `if` with the same
///   whitespace-control markers.
/// * Jinja2 does not apply `trim_blocks` to the newline right after `{% raw %}`; minijinja does,
///   so that newline is doubled. Raw block bodies are copied verbatim.
fn rewrite_jinja2_quirks(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(start) = rest.find("{%") {
        out.push_str(&rest[..start]);
        let tag = &rest[start..];
        let Some(end) = tag.find("%}") else {
            out.push_str(tag);
            return out;
        };
        let inner = &tag[2..end];
        let (lead, body) = split_marker_front(inner);
        let (body, trail) = split_marker_back(body);
        rest = &tag[end + 2..];
        match body.trim() {
            "generation" => out.push_str(&format!("{{%{lead} if true {trail}%}}")),
            "endgeneration" => out.push_str(&format!("{{%{lead} endif {trail}%}}")),
            "raw" => {
                out.push_str(&tag[..end + 2]);
                if trail != "-" && rest.starts_with('\n') {
                    out.push('\n');
                }
                let body_len = find_endraw(rest).unwrap_or(rest.len());
                out.push_str(&rest[..body_len]);
                rest = &rest[body_len..];
            }
            trimmed => match strict_for_loop(trimmed) {
                Some(rewritten) => out.push_str(&format!("{{%{lead} {rewritten} {trail}%}}")),
                None => out.push_str(&tag[..end + 2]),
            },
        }
    }
    out.push_str(rest);
    out
}

/// `for x in EXPR [if COND] [recursive]` becomes `for x in (EXPR)|py_iter ...`: Python raises
/// `TypeError` iterating `None` (e.g. `tools` when none are given) where minijinja iterates
/// nothing, and transformers rejects such requests, so we must too.
fn strict_for_loop(body: &str) -> Option<String> {
    let rest = body.strip_prefix("for ")?;
    let in_at = find_top_level_word(rest, "in")?;
    let targets = &rest[..in_at];
    let after_in = &rest[in_at + 2..];
    let iter_end = [find_top_level_word(after_in, "if"), find_top_level_word(after_in, "recursive")]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or(after_in.len());
    let iterable = after_in[..iter_end].trim();
    if iterable.is_empty() {
        return None;
    }
    Some(format!("for {}in ({iterable})|py_iter {}", targets, &after_in[iter_end..]))
}

/// Byte offset of `word` as a whole word outside strings and brackets.
fn find_top_level_word(s: &str, word: &str) -> Option<usize> {
    let bytes = s.as_bytes();
    let (mut depth, mut quote) = (0i32, None::<u8>);
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        match quote {
            Some(_) if c == b'\\' => i += 1,
            Some(q) if c == q => quote = None,
            Some(_) => {}
            None => match c {
                b'\'' | b'"' => quote = Some(c),
                b'(' | b'[' | b'{' => depth += 1,
                b')' | b']' | b'}' => depth -= 1,
                _ if depth == 0
                    && s[i..].starts_with(word)
                    && (i == 0 || !is_ident(bytes[i - 1]))
                    && bytes.get(i + word.len()).is_none_or(|&b| !is_ident(b)) =>
                {
                    return Some(i);
                }
                _ => {}
            },
        }
        i += 1;
    }
    None
}

fn is_ident(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// Python's `iter()`: `None` is not iterable; everything else is left to the loop.
fn py_iter(value: Value) -> Result<Value, Error> {
    if value.is_none() {
        return Err(Error::new(ErrorKind::InvalidOperation, "'NoneType' object is not iterable"));
    }
    Ok(value)
}

/// Byte offset of the `{%` opening the `endraw` tag in `s`, if any.
fn find_endraw(s: &str) -> Option<usize> {
    let mut from = 0;
    while let Some(pos) = s[from..].find("{%") {
        let at = from + pos;
        let after = s[at + 2..].trim_start_matches(['-', '+']).trim_start();
        if after.starts_with("endraw") {
            return Some(at);
        }
        from = at + 2;
    }
    None
}

fn split_marker_front(s: &str) -> (&str, &str) {
    match s.chars().next() {
        Some('-') | Some('+') => (&s[..1], &s[1..]),
        _ => ("", s),
    }
}

fn split_marker_back(s: &str) -> (&str, &str) {
    match s.chars().last() {
        Some('-') | Some('+') => (&s[..s.len() - 1], &s[s.len() - 1..]),
        _ => (s, ""),
    }
}

/// `tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`.
fn tojson(value: Value, kwargs: Kwargs) -> Result<Value, Error> {
    let mut opts = DumpOptions {
        ensure_ascii: kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false),
        sort_keys: kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false),
        ..Default::default()
    };
    if let Some(indent) = kwargs.get::<Option<Value>>("indent")? {
        opts.indent = match indent.kind() {
            ValueKind::None | ValueKind::Undefined => None,
            ValueKind::Number => Some(" ".repeat(indent.as_i64().unwrap_or(0).max(0) as usize)),
            ValueKind::String => Some(indent.as_str().unwrap_or_default().to_string()),
            _ => return Err(Error::new(ErrorKind::InvalidOperation, "tojson: indent must be an int or a string")),
        };
    }
    if let Some(seps) = kwargs.get::<Option<Value>>("separators")? {
        if !seps.is_none() {
            let parts: Vec<Value> = seps.try_iter()?.collect();
            match parts.as_slice() {
                [item, key] => {
                    opts.separators = Some((item.to_string(), key.to_string()));
                }
                _ => return Err(Error::new(ErrorKind::InvalidOperation, "tojson: separators must be a pair")),
            }
        }
    }
    kwargs.assert_all_used()?;
    // A plain string, as HF's `json.dumps` returns: a later `| e` must still escape it.
    Ok(Value::from(dumps(&value, &opts)?))
}

/// Jinja2's `trim` stringifies with Python's `str()` first (`[{'type': 'text'}]`), then strips.
fn trim(value: &Value, chars: Option<String>) -> String {
    let text = python_str(value);
    match chars {
        Some(chars) => text.trim_matches(|c| chars.contains(c)).to_string(),
        None => text.trim().to_string(),
    }
}

/// markupsafe's escaping (`&#34;`, `&#39;`), which differs from minijinja's HTML entities.
fn escape(value: &Value) -> Value {
    if value.is_safe() {
        return value.clone();
    }
    let text = python_str(value);
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&#34;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    Value::from_safe_string(out)
}

/// Jinja2's `join` uses Python's `str()` on every item (`True`, not `true`).
fn join(value: &Value, separator: Option<String>) -> Result<String, Error> {
    if value.is_undefined() || value.is_none() {
        return Ok(String::new());
    }
    if let Some(s) = value.as_str() {
        let sep = separator.unwrap_or_default();
        return Ok(s.chars().map(String::from).collect::<Vec<_>>().join(&sep));
    }
    let items: Vec<String> = value.try_iter()?.map(|v| python_str(&v)).collect();
    Ok(items.join(&separator.unwrap_or_default()))
}

/// Python's `len()`: an undefined value has length 0 in Jinja2; `None` has no length.
fn length(value: &Value) -> Result<usize, Error> {
    if value.is_undefined() {
        return Ok(0);
    }
    value
        .len()
        .ok_or_else(|| Error::new(ErrorKind::InvalidOperation, format!("object of type {} has no len()", value.kind())))
}

/// Python's `iter()` succeeds for strings, lists, dicts (and Jinja2's Undefined), not for `None`.
fn is_iterable(value: &Value) -> bool {
    matches!(
        value.kind(),
        ValueKind::Seq | ValueKind::Map | ValueKind::Iterable | ValueKind::String | ValueKind::Undefined
    )
}

/// Templates call this to reject unsupported conversations; it becomes our template error.
fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

/// `datetime.now().strftime(format)`; an unsupported format is an error, not a panic.
fn strftime_now(format: String) -> Result<String, Error> {
    use chrono::format::{Item, StrftimeItems};
    let items: Vec<Item<'_>> = StrftimeItems::new(&format).collect();
    if items.iter().any(|i| matches!(i, Item::Error)) {
        return Err(Error::new(ErrorKind::InvalidOperation, format!("strftime_now: unsupported format {format:?}")));
    }
    let mut out = String::new();
    use std::fmt::Write;
    write!(out, "{}", chrono::Local::now().format_with_items(items.into_iter()))
        .map_err(|_| Error::new(ErrorKind::InvalidOperation, "strftime_now: formatting failed"))?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(src: &str, ctx: serde_json::Value) -> Result<String> {
        ChatTemplate::compile("t", src)?.render(Value::from_serialize(ctx))
    }

    #[test]
    fn trims_blocks_like_hf() {
        let out = render(
            "{% for m in messages %}\n  {% if true %}\n[{{ m }}]\n  {% endif %}\n{% endfor %}",
            serde_json::json!({"messages": ["a", "b"]}),
        )
        .unwrap();
        assert_eq!(out, "[a]\n[b]\n");
    }

    #[test]
    fn python_values_and_methods() {
        let out = render(
            "{{ x }} {{ n }} {{ ' hi '.strip() }} {{ d.items() | list | length }} {{ s.split(',')[1] }}",
            serde_json::json!({"x": true, "n": null, "d": {"a": 1}, "s": "a,b"}),
        )
        .unwrap();
        assert_eq!(out, "True None hi 1 b");
    }

    #[test]
    fn tojson_matches_hf() {
        let out =
            render("{{ t | tojson }}|{{ t | tojson(indent=2) }}", serde_json::json!({"t": {"a": "<é>"}})).unwrap();
        assert_eq!(out, "{\"a\": \"<é>\"}|{\n  \"a\": \"<é>\"\n}");
    }

    #[test]
    fn loop_controls_and_generation_tag() {
        let out = render("{% for i in [1,2,3] %}{% if i == 2 %}{% continue %}{% endif %}{% generation %}{{ i }}{% endgeneration %}{% endfor %}", serde_json::json!({})).unwrap();
        assert_eq!(out, "13");
    }

    #[test]
    fn raw_blocks_keep_jinja2_whitespace() {
        // Expected values are what Jinja2 3.1.6 renders with trim_blocks + lstrip_blocks.
        let cases = [
            ("{% raw %}\nX{% endraw %}\nY", "\nXY"),
            ("a\n  {% raw %}\nX\n  {% endraw %}\nY", "a\n\nX\nY"),
            ("{% raw -%}\n  X{%- endraw %}\nY", "XY"),
            ("{% raw %}{% generation %}{% endraw %}", "{% generation %}"),
        ];
        for (src, expected) in cases {
            assert_eq!(render(src, serde_json::json!({})).unwrap(), expected, "{src:?}");
        }
    }

    #[test]
    fn iterating_none_fails_like_python() {
        let ctx = serde_json::json!({"tools": null, "xs": [1, 2, 3]});
        assert!(render("{% for t in tools %}{{ t }}{% endfor %}", ctx.clone())
            .unwrap_err()
            .to_string()
            .contains("NoneType"));
        assert_eq!(
            render("{%- for t in nothing -%}x{%- endfor -%}", ctx.clone()).unwrap(),
            "",
            "undefined iterates as empty"
        );
        let loops = "{% for a, b in [[1, 'in'], [2, 'if']] %}{{ a }}{{ b }}{% endfor %}|{% for x in xs if x != 2 %}{{ x }}{% endfor %}|{% for x in xs|reverse %}{{ loop.index }}{% endfor %}|{% for x in (xs if tools else xs[1:]) %}{{ x }}{% endfor %}";
        assert_eq!(render(loops, ctx).unwrap(), "1in2if|13|123|23");
    }

    #[test]
    fn raise_exception_names_template_and_line() {
        let err = render("ok\n{{ raise_exception('Roles must alternate') }}", serde_json::json!({})).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("\"t\" line 2") && msg.contains("Roles must alternate"), "{msg}");
    }

    #[test]
    fn syntax_error_is_an_error_not_a_panic() {
        let err = ChatTemplate::compile("broken", "{% if %}").unwrap_err();
        assert!(
            matches!(err, TokenizerError::Template { ref template, line: Some(1), .. } if template == "broken"),
            "{err}"
        );
    }

    #[test]
    fn runaway_templates_run_out_of_fuel() {
        let started = std::time::Instant::now();
        let err = render(
            "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}",
            serde_json::json!({}),
        )
        .unwrap_err();
        assert!(err.to_string().contains("fuel"), "{err}");
        assert!(started.elapsed() < std::time::Duration::from_secs(60));
    }

    #[test]
    fn strftime_now_rejects_bad_format() {
        assert!(render("{{ strftime_now('%Y') }}", serde_json::json!({})).unwrap().len() == 4);
        assert!(render("{{ strftime_now('%Q%') }}", serde_json::json!({})).is_err());
    }
}
