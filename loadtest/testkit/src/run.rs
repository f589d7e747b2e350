//! Running a helper program to the end (a Python checker, `kubectl kustomize`) and failing the
//! test with everything it printed when it does not succeed.

use std::io::Write;
use std::process::{Command, Output, Stdio};

/// Runs `command` to the end; panics with its status, stdout and stderr unless it succeeds.
pub fn output_ok(command: &mut Command) -> Output {
    let out = command.output().unwrap_or_else(|e| panic!("cannot run {command:?}: {e}"));
    assert_success("", command, &out);
    out
}

/// [`output_ok`] with `input` written to the program's standard input (then closed); a
/// failure is reported under `what` (what the input was).
pub fn output_ok_with_stdin(command: &mut Command, input: &[u8], what: &str) -> Output {
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {command:?}: {e}"));
    // A program that exits without reading all of it fails on its own terms, reported below.
    let _ = child.stdin.take().expect("piped stdin").write_all(input);
    let out = child.wait_with_output().unwrap_or_else(|e| panic!("wait for {command:?}: {e}"));
    assert_success(&format!("{what}: "), command, &out);
    out
}

fn assert_success(what: &str, command: &Command, out: &Output) {
    assert!(
        out.status.success(),
        "{what}{command:?} failed ({}):\n--- stdout\n{}\n--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stdin_reaches_the_program_and_its_output_comes_back() {
        let out = output_ok_with_stdin(Command::new("tr").args(["a-z", "A-Z"]), b"kvindex", "a word");
        assert_eq!(out.stdout, b"KVINDEX");
    }

    #[test]
    #[should_panic(expected = "--- stderr\nbroken")]
    fn a_failure_names_what_it_printed() {
        output_ok(Command::new("sh").args(["-c", "echo broken >&2; exit 3"]));
    }
}
