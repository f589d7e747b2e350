//! docs/CONFIG.md lists exactly the settings `kvindex serve` accepts: every file key, flag and
//! env var, as the code declares them (clap's view of `ServeArgs`, serde's view of the file).

use std::collections::BTreeSet;

use kvindex_server::config::{serve_command, Settings};

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

/// The rows of the "Keys" table of docs/CONFIG.md.
fn documented() -> BTreeSet<Row> {
    let doc = include_str!("../../../docs/CONFIG.md");
    let table = doc.split("\n## Keys").nth(1).expect("a Keys section").split("\n#").next().unwrap();
    table
        .lines()
        .filter(|l| l.starts_with('|') && !l.starts_with("|---") && !l.starts_with("| file key"))
        .filter_map(|l| {
            let cells: Vec<&str> = l.split('|').skip(1).map(str::trim).collect();
            let flag = code(cells[1]).filter(|f| f.starts_with("--"))?; // RUST_LOG has none
            Some((code(cells[0]), flag, code(cells[2])))
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
fn the_file_accepts_exactly_the_settings_keys() {
    // serde names every key it accepts when it rejects an unknown one.
    let err = toml::from_str::<Settings>("not_a_setting = 0").unwrap_err().to_string();
    let expected = err.split("expected one of").nth(1).unwrap_or_else(|| panic!("{err}"));
    let file_keys: BTreeSet<String> = expected.split('`').skip(1).step_by(2).map(str::to_string).collect();
    let setting_keys: BTreeSet<String> = declared().into_iter().filter_map(|(key, _, _)| key).collect();
    assert_eq!(file_keys, setting_keys);
}
