//! `kvindex-policies --plot`: the PNG is written, decodes, and has its text. Text matters most:
//! plotters' default font path needs system fonts, which a bare CI machine lacks, so the
//! policy names (drawn left of the hit-rate bars, where nothing else is) must leave ink.

use std::path::PathBuf;
use std::process::Command;

use kvindex_loadtest::driver::PolicyReport;

fn report(policy: &str, hit_rate: f64, ttft_p50_s: f64, ttft_p99_s: f64) -> PolicyReport {
    PolicyReport {
        policy: policy.to_string(),
        requests: 10,
        hit_rate,
        ttft_p50_s,
        ttft_p90_s: ttft_p99_s,
        ttft_p99_s,
        kv_usage_per_pod: vec![0.1, 0.2],
        requests_per_pod: vec![5, 5],
        preemptions: 0,
        makespan_s: 1.0,
    }
}

fn temp_png(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("kvindex-plot-{}-{name}.png", std::process::id()))
}

fn decode(path: &PathBuf) -> image::RgbImage {
    let bytes = std::fs::read(path).expect("the PNG was written");
    assert!(bytes.len() > 1000, "{} bytes", bytes.len());
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "PNG signature");
    image::load_from_memory_with_format(&bytes, image::ImageFormat::Png).expect("the PNG decodes").to_rgb8()
}

#[test]
fn the_plot_decodes_and_has_labels() {
    let path = temp_png("lib");
    let reports = [
        report("round-robin", 0.36, 0.33, 0.78),
        report("precise", 0.83, 0.07, 0.51),
        report("approximate ×4", 0.39, 0.33, 0.89),
    ];
    kvindex_loadtest::plot::write_png(&path, "test", &reports).expect("plot");
    let image = decode(&path);
    let _ = std::fs::remove_file(&path);
    assert_eq!(image.width(), 1400);
    // The y-label area of the left panel (190 px wide after a 12 px margin) holds only the
    // policy names: dark pixels there mean the embedded font rendered.
    let ink = (12..190)
        .flat_map(|x| (60..image.height() - 60).map(move |y| (x, y)))
        .filter(|&(x, y)| image.get_pixel(x, y).0.iter().all(|&channel| channel < 128))
        .count();
    assert!(ink > 200, "policy names drew {ink} dark pixels");
    // The hit-rate bars are there too.
    let blue = image.pixels().filter(|p| p.0 == [46, 117, 182]).count();
    assert!(blue > 1000, "{blue} bar pixels");
}

#[test]
fn nothing_to_plot_is_an_error_not_a_panic() {
    let path = temp_png("empty");
    assert!(kvindex_loadtest::plot::write_png(&path, "t", &[]).is_err());
}

#[test]
fn one_policy_and_zero_latencies_still_plot() {
    let path = temp_png("one");
    kvindex_loadtest::plot::write_png(&path, "t", &[report("only", 0.0, 0.0, 0.0)]).expect("plot");
    decode(&path);
    let _ = std::fs::remove_file(&path);
}

#[test]
fn the_cli_writes_the_plot_and_reports_a_bad_path() {
    let path = temp_png("cli");
    let run = |plot: &std::path::Path| {
        Command::new(env!("CARGO_BIN_EXE_kvindex-policies"))
            .args(["--scale-down", "16", "--conversations", "8", "--turns", "2"])
            .arg("--plot")
            .arg(plot)
            .output()
            .expect("run kvindex-policies")
    };
    let output = run(&path);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    decode(&path);
    let _ = std::fs::remove_file(&path);

    let output = run(std::path::Path::new("/nonexistent-dir/for/plot.png"));
    assert_eq!(output.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&output.stderr).contains("--plot"));
}
