//! The `ferrite-crashtest` program (same arguments as `ferrite crashtest`): listings,
//! a small run, replay, and clear errors for bad input.

use std::process::Command;

fn run(args: &[&str]) -> (i32, String, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_ferrite-crashtest")).args(args).output().unwrap();
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn list_faults_names_one_per_line() {
    let (code, out, _) = run(&["--list-faults"]);
    assert_eq!(code, 0);
    let v: Vec<&str> = out.lines().collect();
    assert_eq!(v, ferrite_crash::explore::FAULT_KINDS.to_vec());
}

#[test]
fn list_workloads_and_small_run() {
    let (code, out, _) = run(&["--list-workloads"]);
    assert_eq!(code, 0);
    assert!(out.lines().any(|l| l.starts_with("rename")));
    assert!(out.lines().count() >= 15);
    let (code, out, err) = run(&["--workload", "mkfs,attrs", "--states", "150", "--threads", "1"]);
    assert_eq!(code, 0, "{out}{err}");
    let last = out.lines().last().unwrap_or_default();
    assert!(last.starts_with("checked ") && last.contains("0 failure(s)"), "{out}");
}

#[test]
fn replay_of_a_passing_state() {
    let (code, out, err) =
        run(&["--replay", "workload=write-pages,seed=1,op=3,fence=3,subset=all"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("PASS"), "{out}");
}

#[test]
fn bad_input_is_a_clear_error() {
    let (code, _, err) = run(&["--inject", "no-such-fault"]);
    assert_eq!(code, 2);
    assert!(err.contains("unknown fault"), "{err}");
    let (code, _, err) = run(&["--workload", "nope"]);
    assert_eq!(code, 2);
    assert!(err.contains("unknown workload"), "{err}");
    let (code, _, err) = run(&["--replay", "workload=mkfs,fence=x"]);
    assert_eq!(code, 2);
    assert!(err.contains("replay spec"), "{err}");
    let (code, _, err) = run(&["--replay", "workload=mkfs,seed=1,fence=1,subset=words:0x3"]);
    assert_eq!(code, 2);
    assert!(err.contains("aligned"), "{err}");
    let (code, _, err) = run(&["--replay", "workload=write-pages,seed=1,op=7,fence=3,subset=all"]);
    assert_eq!(code, 2);
    assert!(err.contains("not op 7"), "{err}");
    let (code, _, err) = run(&["--replay", "workload=mkfs,seed=1,fence=999999,subset=all"]);
    assert_eq!(code, 2);
    assert!(err.contains("no fence point"), "{err}");
}

#[test]
fn concurrent_workloads_are_listed_selectable_and_summarised_in_json() {
    let (code, out, _) = run(&["--list-workloads"]);
    assert_eq!(code, 0);
    for name in [
        "mt-private",
        "mt-shared-file",
        "mt-dir",
        "mt-gc",
        "mt-random",
        "client-handover",
        "client-death",
        "client-revoke",
        "client-gc",
        "client-parallel",
    ] {
        assert!(out.lines().any(|l| l.split_whitespace().next() == Some(name)), "{name}: {out}");
    }
    let dir = std::env::temp_dir().join(format!("crashtest-json-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("summary.json");
    let (code, out, err) = run(&[
        "--workload",
        "mt-dir,mt-private,client-revoke",
        "--states",
        "450",
        "--threads",
        "1",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("mt-dir") && out.contains("mt-private"), "{out}");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(v["failures"], 0, "{v}");
    assert!(v["states"].as_u64().unwrap() >= 350, "{v}");
    let names: Vec<&str> =
        v["workloads"].as_array().unwrap().iter().map(|w| w["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["mt-dir", "mt-private", "client-revoke"]);
    assert_eq!(v["kinds"]["mt"]["workloads"], 2, "{v}");
    assert_eq!(v["kinds"]["client"]["workloads"], 1, "{v}");
    assert!(v["kinds"]["client"]["states"].as_u64().unwrap() > 0, "{v}");
    // A client workload's replay line rebuilds its state too.
    let (code, out, err) = run(&["--replay", "workload=client-revoke,seed=1,fence=4,subset=all"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("PASS"), "{out}");
    // A concurrent replay line rebuilds its state (fence 3 of mt-private).
    let (code, out, err) = run(&["--replay", "workload=mt-private,seed=1,fence=3,subset=all"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("PASS"), "{out}");
}
