//! `benches/compare.py`, the table `just bench-vs-torch` prints: each row's
//! issue-19 goal marked met in every pair, by the median, or not
//! (`--goals`), and the machine's state and the pairs' distance in time
//! under the table.

use std::path::Path;
use std::process::Command;

use serde_json::{json, Value};

/// Writes one side's run: a JSON list of `records`.
fn write_records(path: &Path, records: &[Value]) {
    std::fs::write(path, serde_json::to_string(records).unwrap()).unwrap();
}

/// Writes one side's run: records of `(config, workload, tokens_per_s)`.
fn write_run(path: &Path, side: &str, rows: &[(&str, &str, f64)]) {
    let records: Vec<_> = rows
        .iter()
        .map(|(config, workload, tps)| {
            json!({"impl": side, "config": config, "workload": workload, "tokens_per_s": tps})
        })
        .collect();
    write_records(path, &records);
}

/// `compare.py` with `args` (files joined by commas per side); its stdout.
fn compare(args: &[String]) -> String {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("compare.py");
    let out = Command::new("python3")
        .arg(&script)
        .args(args)
        .output()
        .expect("python3 runs benches/compare.py");
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// `compare.py --goals` on runs of burn and PyTorch, row by row: `(config,
/// workload, burn's tok/s per run, PyTorch's)`. Returns the goal column by
/// `config workload`.
fn goal_column(rows: &[(&str, &str, Vec<f64>, Vec<f64>)]) -> Vec<(String, String)> {
    let stdout = compare_goals(rows);
    stdout
        .lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| config"))
        .map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            // ["", config, workload, burn, torch, ratio, goal, ""]
            (format!("{} {}", cells[1], cells[2]), cells[6].to_owned())
        })
        .collect()
}

/// `compare.py --goals` on `rows` as in [`goal_column`]; its whole stdout.
fn compare_goals(rows: &[(&str, &str, Vec<f64>, Vec<f64>)]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let runs = rows[0].2.len();
    let mut sides = [Vec::new(), Vec::new()];
    for run in 0..runs {
        for (s, side) in ["burn-flex", "pytorch"].into_iter().enumerate() {
            let path = dir.path().join(format!("{side}-{run}.json"));
            let of_run: Vec<(&str, &str, f64)> = rows
                .iter()
                .map(|(c, w, burn, torch)| (*c, *w, [burn, torch][s][run]))
                .collect();
            write_run(&path, side, &of_run);
            sides[s].push(path.to_str().unwrap().to_owned());
        }
    }
    compare(&["--goals".into(), sides[0].join(","), sides[1].join(",")])
}

#[test]
fn each_goal_is_marked_by_its_pairs_and_their_median() {
    let column = goal_column(&[
        // Ratios 1.4, 1.5, 1.6: the median reaches 1.5x, one pair does not.
        (
            "1m",
            "train_step",
            vec![14_000.0, 18_000.0, 20_000.0],
            vec![10_000.0, 12_000.0, 12_500.0],
        ),
        // 2x in every pair.
        ("25m", "forward", vec![2_000.0; 3], vec![1_000.0; 3]),
        // Ratios 0.9, 0.95, 1.2: the median misses 1.0x.
        (
            "25m",
            "train_step",
            vec![900.0, 950.0, 1_200.0],
            vec![1_000.0; 3],
        ),
        // No goal for this row.
        ("smol-b8", "forward", vec![600.0; 3], vec![500.0; 3]),
    ]);
    let expected = [
        (
            "1m train_step",
            ">= 1.5x: met by the median, in 2 of 3 pairs (sign test p = 0.5); \
             floor 1.0x: met in every pair (sign test p = 0.125)",
        ),
        (
            "25m forward",
            ">= 1.0x: met in every pair (sign test p = 0.125)",
        ),
        (
            "25m train_step",
            ">= 1.0x: **not met** (met in 1 of 3 pairs; sign test p = 0.875)",
        ),
        ("smol-b8 forward", ""),
    ];
    let expected: Vec<(String, String)> = expected
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    assert_eq!(column, expected);
}

#[test]
fn a_goal_is_shown_by_the_sign_test_from_enough_pairs() {
    // Five pairs: all above 1.5x on the 1m step, four of five on 25m's.
    let stdout = compare_goals(&[
        ("1m", "train_step", vec![16_000.0; 5], vec![10_000.0; 5]),
        (
            "25m",
            "train_step",
            vec![1_100.0, 1_100.0, 1_100.0, 1_100.0, 900.0],
            vec![1_000.0; 5],
        ),
    ]);
    assert!(
        stdout.contains(
            "| >= 1.5x: met in every pair (sign test p = 0.0312); \
             floor 1.0x: met in every pair (sign test p = 0.0312) |"
        ),
        "{stdout}"
    );
    assert!(
        stdout.contains("| >= 1.0x: met by the median, in 4 of 5 pairs (sign test p = 0.188) |"),
        "{stdout}"
    );
    assert!(
        stdout.contains("; 5 or more of the 5 pairs show it (p < 0.05)."),
        "{stdout}"
    );
    // Three pairs cannot show a goal, whatever they hold.
    let stdout = compare_goals(&[("1m", "forward", vec![2.0; 3], vec![1.0; 3])]);
    assert!(
        stdout.contains("; no count of 3 pairs can show it at p < 0.05 (5 pairs can)."),
        "{stdout}"
    );
}

#[test]
fn a_single_run_is_met_or_not() {
    let column = goal_column(&[
        ("1m", "generate", vec![5_000.0], vec![2_000.0]),
        ("1m", "train_step", vec![1_200.0], vec![1_000.0]),
    ]);
    assert_eq!(column[0].1, ">= 2.0x: met");
    assert_eq!(column[1].1, ">= 1.5x: **not met**; floor 1.0x: met");
}

#[test]
fn the_machines_state_follows_the_table() {
    // Two runs of burn's rows with the round trip and each CPU's loop time
    // (the second run with one CPU slowed), and PyTorch's without them.
    let dir = tempfile::tempdir().unwrap();
    let (mut burn, mut torch) = (Vec::new(), Vec::new());
    for (run, loops) in [
        [[1_600.0, 1_610.0], [1_620.0, 1_600.0]],
        [[1_600.0, 2_400.0], [3_000.0, 1_650.0]],
    ]
    .iter()
    .enumerate()
    {
        let records: Vec<_> = ["forward", "train_step"]
            .iter()
            .zip(loops)
            .map(|(workload, cpu_loop_us)| {
                json!({"impl": "burn-flex", "config": "1m", "workload": workload,
                       "tokens_per_s": 100.0, "core_round_trip_ns": 90.0 + run as f64,
                       "cpu_loop_us": cpu_loop_us})
            })
            .collect();
        let path = dir.path().join(format!("burn-{run}.json"));
        write_records(&path, &records);
        burn.push(path.to_str().unwrap().to_owned());
        let path = dir.path().join(format!("torch-{run}.json"));
        write_run(
            &path,
            "pytorch",
            &[("1m", "forward", 50.0), ("1m", "train_step", 50.0)],
        );
        torch.push(path.to_str().unwrap().to_owned());
    }
    let stdout = compare(&[burn.join(","), torch.join(",")]);
    assert!(
        stdout.contains("median (min-max) per run: run 1: 90 (90-90); run 2: 91 (91-91)"),
        "{stdout}"
    );
    assert!(
        stdout.contains(
            "burn-flex: the slowest CPU's time for the same loop before each workload, us, \
             median (min-max) per run: run 1: 1615 (1610-1620); run 2: 2700 (2400-3000)"
        ),
        "{stdout}"
    );
    assert!(!stdout.contains("pytorch: the"), "{stdout}");
}

#[test]
fn the_pairs_distance_in_time_follows_the_table() {
    // Two runs of two rows; PyTorch's timing of a row began 2, 4, 6 and 30
    // seconds from burn's, after it or before it.
    let dir = tempfile::tempdir().unwrap();
    let mut sides: [Vec<String>; 3] = Default::default();
    for (run, offsets) in [[2.0, -4.0], [6.0, -30.0]].iter().enumerate() {
        // Each side's records, with burn's timings starting at `start`.
        let run_of = |side: &str, offsets: Option<[f64; 2]>| -> Vec<Value> {
            let start = 1_000.0 * (run + 1) as f64;
            let workloads = ["forward", "train_step"].iter().enumerate();
            workloads
                .map(|(r, workload)| {
                    let mut record = json!({"impl": side, "config": "1m", "workload": workload,
                                            "tokens_per_s": 100.0});
                    if let Some(offsets) = offsets {
                        record["started_unix_s"] = json!(start + 100.0 * r as f64 + offsets[r]);
                    }
                    record
                })
                .collect()
        };
        let runs = [
            ("burn", run_of("burn-flex", Some([0.0; 2]))),
            ("torch", run_of("pytorch", Some(*offsets))),
            ("torch-untimed", run_of("pytorch", None)),
        ];
        for (paths, (name, records)) in sides.iter_mut().zip(runs) {
            let path = dir.path().join(format!("{name}-{run}.json"));
            write_records(&path, &records);
            paths.push(path.to_str().unwrap().to_owned());
        }
    }
    let [burn, torch, torch_untimed] = sides.map(|paths| paths.join(","));
    let stdout = compare(&[burn.clone(), torch]);
    assert!(
        stdout.contains(
            "Seconds between the two sides' timings of a row, over every row and pair: 5 (2-30)"
        ),
        "{stdout}"
    );
    let stdout = compare(&[burn, torch_untimed]);
    assert!(!stdout.contains("Seconds between"), "{stdout}");
}
