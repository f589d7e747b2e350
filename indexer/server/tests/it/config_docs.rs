//! docs/CONFIG.md lists exactly the settings `kvindex serve` accepts, as the settings table
//! declares them (`config::settings`): every file key, flag and env var, each default that is
//! one fixed value, and each range; and the config file accepts exactly those keys.

use std::collections::{BTreeMap, BTreeSet};

use kvindex_server::config::{serve_command, settings, Config};

/// (file key, flag, env var) of one setting; `--config` has no file key.
type Row = (Option<String>, String, Option<String>);

/// The settings as the code declares them.
fn declared() -> BTreeSet<Row> {
    serve_command()
        .get_arguments()
        .filter(|a| !matches!(a.get_id().as_str(), "help" | "version"))
        .map(|a| {
            let id = a.get_id().to_string();
            let flag = format!("--{}", a.get_long().expect("every setting has a long flag"));
            let env = a.get_env().map(|e| e.to_string_lossy().into_owned());
            ((id != "config").then_some(id), flag, env)
        })
        .collect()
}

/// The first `backticked` token of a table cell (its first word), if any.
fn code(cell: &str) -> Option<String> {
    let rest = cell.split_once('`')?.1;
    let token = rest.split_once('`')?.0;
    Some(token.split_whitespace().next()?.to_string())
}

/// The cells of each row of the "Keys" table of docs/CONFIG.md (`\|` inside a cell kept).
fn keys_table() -> Vec<Vec<String>> {
    let doc = include_str!("../../../../docs/CONFIG.md");
    let table = doc.split("\n## Keys").nth(1).expect("a Keys section").split("\n#").next().unwrap();
    table
        .lines()
        .filter(|l| l.starts_with('|') && !l.starts_with("|---") && !l.starts_with("| file key"))
        .map(|l| {
            let l = l.replace("\\|", "\u{0}");
            l.split('|').skip(1).map(|c| c.trim().replace('\u{0}', "\\|")).collect()
        })
        .collect()
}

/// The rows of the "Keys" table: (file key, flag, env var).
fn documented() -> BTreeSet<Row> {
    keys_table()
        .iter()
        .filter_map(|cells| {
            let flag = code(&cells[1]).filter(|f| f.starts_with("--"))?; // RUST_LOG has none
            Some((code(&cells[0]), flag, code(&cells[2])))
        })
        .collect()
}

#[test]
fn config_md_lists_every_setting_and_nothing_else() {
    let declared = declared();
    let documented = documented();
    let missing: Vec<&Row> = declared.difference(&documented).collect();
    let stale: Vec<&Row> = documented.difference(&declared).collect();
    assert!(missing.is_empty() && stale.is_empty(), "docs/CONFIG.md: missing {missing:?}, not accepted {stale:?}");
}

#[test]
fn config_md_states_each_default_and_range_as_declared() {
    let rows: BTreeMap<String, Vec<String>> =
        keys_table().into_iter().filter_map(|cells| Some((code(&cells[0])?, cells))).collect();
    let mut wrong = Vec::new();
    for s in settings::table() {
        let Some(cells) = rows.get(s.key) else {
            wrong.push(format!("{}: no row", s.key));
            continue;
        };
        if let Some(default) = s.spec.default_text() {
            if !cells[3].contains(&format!("`{default}`")) {
                wrong.push(format!("{}: default cell {:?} does not say `{default}`", s.key, cells[3]));
            }
        }
        let range = s.spec.range_text();
        if cells[4] != range {
            wrong.push(format!("{}: range cell {:?} should be {range}", s.key, cells[4]));
        }
    }
    assert!(wrong.is_empty(), "docs/CONFIG.md disagrees with config::settings:\n{}", wrong.join("\n"));
}

#[test]
fn the_file_accepts_exactly_the_settings_keys() {
    let dir = std::env::temp_dir().join(format!("kvindex-config-docs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let load = |text: String| {
        let path = dir.join("kvindex.toml");
        std::fs::write(&path, text).unwrap();
        Config::from_args(["--config", path.to_str().unwrap()]).map(|_| ()).map_err(|e| e.to_string())
    };
    let setting_keys: BTreeSet<String> = declared().into_iter().filter_map(|(key, _, _)| key).collect();
    // An unknown key is refused, naming every key the file accepts.
    let err = load("not_a_setting = 0".into()).unwrap_err();
    let expected = err.split("expected one of").nth(1).unwrap_or_else(|| panic!("{err}"));
    let file_keys: BTreeSet<String> = expected.split('`').skip(1).step_by(2).map(str::to_string).collect();
    assert!(err.contains("unknown field `not_a_setting`"), "{err}");
    assert_eq!(file_keys, setting_keys);
    // Each of them is read into its setting: a value of the wrong type is a type error, not
    // an unknown key, nor ignored.
    for key in &setting_keys {
        let err = load(format!("{key} = true")).expect_err(key);
        assert!(err.contains("invalid type"), "{key}: {err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
