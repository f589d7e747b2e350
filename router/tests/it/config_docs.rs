//! The flag tables of docs/ROUTER-CONFIG.md name only flags `kvindex-router serve` declares, and
//! each default they state as a number is clap's default for that flag (the declaration in
//! `config::ServeArgs`), so the page cannot drift from the command line.

use clap::{Args, Command};

/// The number a default cell states (`262,144`, `16 MiB`, `1 GiB`, `30000`), if it is one.
fn number(cell: &str) -> Option<f64> {
    let cell = cell.trim().trim_matches('`').replace(',', "");
    let (n, unit) = cell.split_once(' ').unwrap_or((cell.as_str(), ""));
    let scale = match unit {
        "" => 1.0,
        "KiB" => 1024.0,
        "MiB" => 1024.0 * 1024.0,
        "GiB" => 1024.0 * 1024.0 * 1024.0,
        _ => return None,
    };
    Some(n.parse::<f64>().ok()? * scale)
}

#[test]
fn readme_flag_tables_name_declared_flags_with_their_defaults() {
    let command = kvindex_router::config::ServeArgs::augment_args(Command::new("serve"));
    let readme = include_str!("../../../docs/ROUTER-CONFIG.md");
    let mut wrong = Vec::new();
    let mut checked = 0;
    for line in readme.lines().filter(|l| l.starts_with("| `--")) {
        let escaped = line.replace("\\|", "\u{0}");
        let cells: Vec<&str> = escaped.split('|').skip(1).map(str::trim).collect();
        let flag = cells[0].trim_matches('`').split([' ', '`', '\u{0}']).next().unwrap().trim_start_matches("--");
        let Some(arg) = command.get_arguments().find(|a| a.get_long() == Some(flag)) else {
            wrong.push(format!("--{flag} is documented but not declared"));
            continue;
        };
        let Some(documented) = number(cells[1]) else { continue };
        let declared = arg.get_default_values().first().and_then(|v| v.to_str()).and_then(|v| v.parse::<f64>().ok());
        checked += 1;
        if declared != Some(documented) {
            wrong.push(format!("--{flag}: documented default {documented}, declared {declared:?}"));
        }
    }
    assert!(checked >= 10, "only {checked} numeric defaults found in docs/ROUTER-CONFIG.md");
    assert!(wrong.is_empty(), "docs/ROUTER-CONFIG.md disagrees with config::ServeArgs:\n{}", wrong.join("\n"));
}
