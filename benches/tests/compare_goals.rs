//! `benches/compare.py --goals`, the table `just bench-vs-torch` prints: each
//! row's issue-19 goal marked met in every pair, by the median, or not.

use std::path::Path;
use std::process::Command;

use serde_json::json;

/// Writes one side's run: records of `(config, workload, tokens_per_s)`.
fn write_run(path: &Path, side: &str, rows: &[(&str, &str, f64)]) {
    let records: Vec<_> = rows
        .iter()
        .map(|(config, workload, tps)| {
            json!({"impl": side, "config": config, "workload": workload, "tokens_per_s": tps})
        })
        .collect();
    std::fs::write(path, serde_json::to_string(&records).unwrap()).unwrap();
}

/// `compare.py --goals` on runs of burn and PyTorch, row by row: `(config,
/// workload, burn's tok/s per run, PyTorch's)`. Returns the goal column by
/// `config workload`.
fn goal_column(rows: &[(&str, &str, Vec<f64>, Vec<f64>)]) -> Vec<(String, String)> {
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
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("compare.py");
    let out = Command::new("python3")
        .arg(&script)
        .arg("--goals")
        .arg(sides[0].join(","))
        .arg(sides[1].join(","))
        .output()
        .expect("python3 runs benches/compare.py");
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
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
            ">= 1.5x: met by the median, in 2 of 3 pairs; floor 1.0x: met in every pair",
        ),
        ("25m forward", ">= 1.0x: met in every pair"),
        (
            "25m train_step",
            ">= 1.0x: **not met** (met in 1 of 3 pairs)",
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
fn a_single_run_is_met_or_not() {
    let column = goal_column(&[
        ("1m", "generate", vec![5_000.0], vec![2_000.0]),
        ("1m", "train_step", vec![1_200.0], vec![1_000.0]),
    ]);
    assert_eq!(column[0].1, ">= 2.0x: met");
    assert_eq!(column[1].1, ">= 1.5x: **not met**; floor 1.0x: met");
}
