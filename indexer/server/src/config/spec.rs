//! What one setting of `kvindex serve` is, beside its flag, env var and file key: its default
//! and the values it accepts. Each setting declares these once, in its entry of
//! [`super::settings`]; `validate`, the unknown-key check of the file loader and the test that
//! holds docs/CONFIG.md to the code all read them from there (ripgrep's `flags/defs.rs` is the
//! model: one entry per flag, everything else reads it).

use clap::Command;

/// An integer setting: its key, its default and the inclusive range it must fall in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IntSpec {
    pub key: &'static str,
    /// `None`: computed from other settings or the machine (the entry's doc says how).
    pub default: Option<i64>,
    pub min: i64,
    pub max: i64,
}

/// A text setting (an address, a path, a name): its default as written, or `None` when unset
/// means off (or is computed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TextSpec {
    pub key: &'static str,
    pub default: Option<&'static str>,
}

/// A setting that names one of a few choices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChoiceSpec {
    pub key: &'static str,
    pub default: &'static str,
    pub choices: &'static [&'static str],
}

/// A repeatable setting: each flag adds an entry to the file's list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListSpec {
    pub key: &'static str,
}

/// Any setting's spec, as the table lists it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spec {
    Int(IntSpec),
    Text(TextSpec),
    Choice(ChoiceSpec),
    List(ListSpec),
}

impl IntSpec {
    pub const fn entry(self) -> Spec {
        Spec::Int(self)
    }

    /// The check's error when `v` is out of range (the wording every integer setting uses).
    pub fn check(&self, v: i64) -> Result<i64, String> {
        self.check_within(v, self.max)
    }

    /// The same with an upper bound that another setting lowers (`max` at most `self.max`).
    pub fn check_within(&self, v: i64, max: i64) -> Result<i64, String> {
        let (lo, hi) = (self.min, max.min(self.max));
        if v < lo || v > hi {
            return Err(format!("must be between {lo} and {hi}, got {v}"));
        }
        Ok(v)
    }
}

impl TextSpec {
    pub const fn entry(self) -> Spec {
        Spec::Text(self)
    }

    /// The value, or the default (`""` when there is none).
    pub fn or_default(&self, v: Option<&str>) -> String {
        v.or(self.default).unwrap_or_default().to_string()
    }
}

impl ChoiceSpec {
    pub const fn entry(self) -> Spec {
        Spec::Choice(self)
    }

    /// The value (or the default) if it is one of the choices, else the error naming them.
    pub fn pick<'a>(&self, v: Option<&'a str>) -> Result<&'a str, String> {
        let v = v.unwrap_or(self.default);
        if self.choices.contains(&v) {
            return Ok(v);
        }
        let names: Vec<String> = self.choices.iter().map(|c| format!("{c:?}")).collect();
        Err(format!("must be {}, got {v:?}", names.join(" or ")))
    }
}

impl ListSpec {
    pub const fn entry(self) -> Spec {
        Spec::List(self)
    }
}

impl Spec {
    pub fn key(&self) -> &'static str {
        match self {
            Spec::Int(s) => s.key,
            Spec::Text(s) => s.key,
            Spec::Choice(s) => s.key,
            Spec::List(s) => s.key,
        }
    }

    /// The default as docs/CONFIG.md writes it in backticks, when it is one fixed value.
    pub fn default_text(&self) -> Option<String> {
        match self {
            Spec::Int(s) => s.default.map(|d| d.to_string()),
            Spec::Text(s) => s.default.map(str::to_string),
            Spec::Choice(s) => Some(s.default.to_string()),
            Spec::List(_) => None,
        }
    }

    /// The values accepted, as the "range" column of docs/CONFIG.md writes them.
    pub fn range_text(&self) -> String {
        match self {
            Spec::Int(s) => format!("`{}`–`{}`", s.min, s.max),
            Spec::Choice(s) => s.choices.iter().map(|c| format!("`{c}`")).collect::<Vec<_>>().join(" \\| "),
            Spec::Text(_) | Spec::List(_) => "—".to_string(),
        }
    }
}

/// One row of the settings table: the spec, and what clap declares for the same key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Setting {
    pub key: &'static str,
    /// `--kebab-case`.
    pub flag: String,
    /// `KVINDEX_UPPER_SNAKE`; `None` for list settings.
    pub env: Option<String>,
    /// The flag's help (its doc comment).
    pub doc: String,
    pub spec: Spec,
}

/// Every setting of `command` that has a spec in `specs`, in the command's order. A clap
/// argument without a spec (or a spec without an argument) is a declaration mistake: the
/// settings tests fail on it.
pub fn table(command: &Command, specs: &[Spec]) -> Vec<Setting> {
    command
        .get_arguments()
        .filter_map(|a| {
            let spec = *specs.iter().find(|s| s.key() == a.get_id().as_str())?;
            Some(Setting {
                key: spec.key(),
                flag: format!("--{}", a.get_long().unwrap_or(spec.key())),
                env: a.get_env().map(|e| e.to_string_lossy().into_owned()),
                doc: a.get_help().map(|h| h.to_string()).unwrap_or_default(),
                spec,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checks_word_their_errors_as_the_config_always_has() {
        let s = IntSpec { key: "block_size", default: Some(16), min: 1, max: 1 << 16 };
        assert_eq!(s.check(0).unwrap_err(), "must be between 1 and 65536, got 0");
        assert_eq!(s.check_within(9, 8).unwrap_err(), "must be between 1 and 8, got 9");
        let c = ChoiceSpec { key: "dp_naming", default: "port-offset", choices: &["port-offset", "topic"] };
        assert_eq!(c.pick(None), Ok("port-offset"));
        assert_eq!(c.pick(Some("sideways")).unwrap_err(), "must be \"port-offset\" or \"topic\", got \"sideways\"");
        assert_eq!(c.entry().range_text(), "`port-offset` \\| `topic`");
    }
}
