//! Guarded figures (`./x test --extended`, issue 39): the fleet simulator
//! (`kumo-load fleet`) against this build's server at a small size, its
//! figures taken as ratios to a baseline measured in the same run (plain
//! API reads with no fleet), so the machine's speed cancels out. Each
//! ratio may be at most twice what BENCHMARKS.md records
//! (`<!-- guard NAME: VALUE -->`).

use crate::harness::{bin, Backend, TestServer};

fn recorded(name: &str) -> f64 {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../BENCHMARKS.md");
    let text = std::fs::read_to_string(path).unwrap();
    kumo_scheduler::bench::guarded_figure(&text, name)
        .unwrap_or_else(|| panic!("BENCHMARKS.md records no `<!-- guard {name}: VALUE -->`"))
}

fn load(s: &TestServer, args: &[&str]) -> serde_json::Value {
    let out = std::process::Command::new(bin("kumo-load"))
        .args(["--url", &s.url, "--token", &s.admin_token])
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "kumo-load {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fleet_simulators_figures_stay_within_twice_the_recorded_ones() {
    if std::env::var_os("KUMO_EXTENDED").is_none() {
        eprintln!("skipped: set KUMO_EXTENDED=1 (./x test --extended)");
        return;
    }
    let s = TestServer::start(Backend::Sqlite).await;
    let s = tokio::task::spawn_blocking(move || {
        let base = load(&s, &["api", "--rate", "50", "--seconds", "5"]);
        let fleet = load(
            &s,
            &[
                "fleet",
                "--hosts",
                "200",
                "--seconds",
                "25",
                "--change-rate",
                "5",
                "--read-rate",
                "20",
            ],
        );
        eprintln!("baseline {base}\nfleet {fleet}");
        assert_eq!(fleet["registered"], 200);
        let baseline = base["p50_ms"].as_f64().unwrap().max(0.5);
        // Medians: a 25-second run's p99 is a handful of samples (the
        // registrations' first beats among them) and would guard noise.
        let mut over = Vec::new();
        for (name, figure) in [
            (
                "fleet_heartbeat_p50_over_read_p50",
                &fleet["heartbeat"]["p50_ms"],
            ),
            (
                "fleet_create_p50_over_read_p50",
                &fleet["create_to_scheduled"]["p50_ms"],
            ),
            (
                "fleet_running_p50_over_read_p50",
                &fleet["create_to_running"]["p50_ms"],
            ),
        ] {
            let v = figure
                .as_f64()
                .unwrap_or_else(|| panic!("no {name} in {fleet}"))
                / baseline;
            let r = recorded(name);
            eprintln!("{name}: {v:.2} (recorded {r})");
            if v > 2.0 * r {
                over.push(format!("{name}: {v:.2}, more than twice the recorded {r}"));
            }
        }
        assert!(over.is_empty(), "{over:?}");
        s
    })
    .await
    .unwrap();
    s.stop().await;
}
