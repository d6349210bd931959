//! Worker processes: past `--max-per-process` connections the coordinator
//! starts copies of itself, each with a contiguous slice of the users.
//!
//! Protocol (one line each, worker stdout → coordinator):
//! - `P <established> <failed> <sent> <delivered>`: progress, every 500 ms;
//! - `READY`: sessions are up (idle, o2o), waiting for the coordinator;
//! - `R <json>`: the worker's [`RunResult`].
//!
//! Coordinator → worker stdin: `GO <start_unix_us>` (0 for "now"). Every
//! worker runs the same ramp from the same start time, so results merge
//! step by step; histograms merge exactly (HDR V2).

use crate::cli::ScenarioArgs;
use crate::engine::{idle_result, now_us, skeleton, Scenario};
use crate::procmem;
use crate::report::{ConnectResult, O2oResult, RunResult, SmResult};
use anyhow::Context as _;
use indicatif::{ProgressBar, ProgressStyle};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::mpsc;

enum Msg {
    Progress(usize, [u64; 4]),
    Ready,
    Result(usize, Box<RunResult>),
    Exited,
}

/// Runs the scenario over worker processes and merges their results.
pub async fn coordinate(sc: Scenario, args: &ScenarioArgs) -> anyhow::Result<RunResult> {
    let k = args.conn.users.div_ceil(args.sessions_per_process());
    let idle = if sc == Scenario::Idle {
        let pid = match args.server_pid {
            Some(p) => p,
            None => procmem::pid_listening_on(args.conn.port)?,
        };
        Some((pid, procmem::mem_reading(pid)?))
    } else {
        None
    };
    let exe = std::env::current_exe().context("cannot find my own executable")?;
    let base: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut children: Vec<Child> = Vec::new();
    let mut stdins: Vec<ChildStdin> = Vec::new();
    for i in 0..k {
        let mut child = Command::new(&exe)
            .args(&base)
            .args(["--worker-index", &i.to_string()])
            .args(["--worker-count", &k.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .context("cannot start a worker process")?;
        stdins.push(child.stdin.take().context("worker stdin")?);
        let out = child.stdout.take().context("worker stdout")?;
        let tx = tx.clone();
        let idx = i as usize;
        tokio::spawn(async move {
            let mut lines = BufReader::new(out).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                if let Some(p) = line.strip_prefix("P ") {
                    let v: Vec<u64> = p.split(' ').filter_map(|x| x.parse().ok()).collect();
                    if v.len() == 4 {
                        let _ = tx.send(Msg::Progress(idx, [v[0], v[1], v[2], v[3]]));
                    }
                } else if line == "READY" {
                    let _ = tx.send(Msg::Ready);
                } else if let Some(j) = line.strip_prefix("R ") {
                    match serde_json::from_str::<RunResult>(j) {
                        Ok(r) => {
                            let _ = tx.send(Msg::Result(idx, Box::new(r)));
                        }
                        Err(e) => eprintln!("worker {idx}: bad result: {e}"),
                    }
                }
            }
            let _ = tx.send(Msg::Exited);
        });
        children.push(child);
    }
    drop(tx);

    let pb = if args.quiet {
        ProgressBar::hidden()
    } else {
        let pb = ProgressBar::new(args.conn.users);
        pb.set_style(
            ProgressStyle::with_template(
                "{elapsed_precise} [{bar:30.cyan/blue}] {pos}/{len} sessions ({prefix} workers) {msg}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
        );
        pb.set_prefix(k.to_string());
        pb
    };
    let progress = Arc::new(Mutex::new(vec![[0u64; 4]; k as usize]));
    let mut ready = 0u64;
    let mut results: Vec<Option<RunResult>> = vec![None; k as usize];
    let mut exited = 0u64;
    let mut idle_after = None;
    let mut last = (0u64, 0u64, std::time::Instant::now());
    while exited < k {
        let Some(msg) = rx.recv().await else { break };
        match msg {
            Msg::Progress(i, v) => {
                let mut p = progress.lock().map_err(|_| anyhow::anyhow!("poisoned"))?;
                p[i] = v;
                let sum = p.iter().fold([0u64; 4], |mut a, x| {
                    for j in 0..4 {
                        a[j] += x[j];
                    }
                    a
                });
                pb.set_position(sum[0] + sum[1]);
                let dt = last.2.elapsed().as_secs_f64();
                if dt >= 1.0 {
                    pb.set_message(format!(
                        "{} failed | sent {:.0}/s delivered {:.0}/s",
                        sum[1],
                        sum[2].saturating_sub(last.0) as f64 / dt,
                        sum[3].saturating_sub(last.1) as f64 / dt
                    ));
                    last = (sum[2], sum[3], std::time::Instant::now());
                }
            }
            Msg::Ready => {
                ready += 1;
                if ready == k {
                    let go = if let Some((pid, _)) = idle {
                        pb.set_message(format!("settling {} s", args.settle_secs));
                        tokio::time::sleep(Duration::from_secs_f64(args.settle_secs)).await;
                        idle_after = Some(procmem::mem_reading(pid)?);
                        if args.hold_secs > 0.0 {
                            tokio::time::sleep(Duration::from_secs_f64(args.hold_secs)).await;
                        }
                        0
                    } else {
                        now_us() + 1_000_000
                    };
                    for s in &mut stdins {
                        s.write_all(format!("GO {go}\n").as_bytes()).await?;
                        s.flush().await?;
                    }
                }
            }
            Msg::Result(i, r) => results[i] = Some(*r),
            Msg::Exited => exited += 1,
        }
    }
    for mut c in children {
        let _ = c.wait().await;
    }
    pb.finish_and_clear();
    let parts: Vec<RunResult> = results.into_iter().flatten().collect();
    anyhow::ensure!(
        parts.len() as u64 == k,
        "only {} of {k} workers returned a result",
        parts.len()
    );
    let mut out = skeleton(sc, args, k as u32);
    out.connect =
        ConnectResult::merge(&parts.iter().map(|p| p.connect.clone()).collect::<Vec<_>>())?;
    if sc == Scenario::O2o {
        let o: Vec<O2oResult> = parts.iter().filter_map(|p| p.o2o.clone()).collect();
        out.o2o = Some(O2oResult::merge(&o)?);
        out.compute_cost(args.hourly_price);
    }
    let sm: Vec<SmResult> = parts.iter().filter_map(|p| p.sm.clone()).collect();
    if !sm.is_empty() {
        out.sm = Some(SmResult::merge(&sm));
    }
    if let (Some((pid, before)), Some(after)) = (idle, idle_after) {
        out.idle = Some(idle_result(
            pid,
            before,
            after,
            out.connect.established,
            args.settle_secs,
        ));
    }
    Ok(out)
}
