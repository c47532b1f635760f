//! INFO: Redis's `key:value` sections, plus critio's own.
//!
//! | section       | what                                                        |
//! |---------------|-------------------------------------------------------------|
//! | `server`      | versions, port, uptime                                      |
//! | `clients`     | connected and maximum clients                               |
//! | `memory`      | resident memory (`used_memory`, from /proc), the page cache's capacity, no `maxmemory` |
//! | `stats`       | connections, commands, protocol errors, bytes, keyspace hits |
//! | `replication` | `role:master`, no replicas                                   |
//! | `cpu`         | the process's CPU time, system and user (from /proc)         |
//! | `persistence` | checkpoints (count, mean/max ms), BGSAVE / BGREWRITEAOF in progress, how far (`current_fork_perc`, `current_save_keys_*`, as Redis names them), and last results |
//! | `critio`      | scheme, device, block layer per class, cache, log, inheritance, and where critical tasks waited (paper 000 Tables 2-3) |
//! | `keyspace`    | `db0:keys=N`                                                |
//!
//! `INFO`, `INFO default`, `INFO all` give every section; `INFO a b` the
//! ones named.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

use critio::context::{Class, InheritKind};
use critio::metrics::LatencySummary;
use parking_lot::Mutex;

use super::Shared;
use crate::engine::BackgroundStats;

/// A background job the server started.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Job {
    /// BGSAVE.
    Snapshot,
    /// BGREWRITEAOF.
    Rewrite,
}

/// One start of a job: the completions counted when it started, and its
/// result once known (None: not finished when last looked at).
#[derive(Clone, Copy)]
struct Mark {
    completions_before: u64,
    ok: Option<bool>,
}

/// The last start of each job, to tell its result once it has finished:
/// a job that ended without adding to its completion count failed.
#[derive(Default)]
pub(crate) struct JobLog {
    marks: Mutex<[Option<Mark>; 2]>,
}

fn completions(stats: &BackgroundStats, job: Job) -> u64 {
    match job {
        Job::Snapshot => stats.snapshots,
        Job::Rewrite => stats.rewrites,
    }
}

impl JobLog {
    pub(crate) fn started(&self, job: Job, before: &BackgroundStats) {
        self.marks.lock()[job as usize] = Some(Mark {
            completions_before: completions(before, job),
            ok: None,
        });
    }

    /// `ok` or `err` for the last finished run (`ok` if none ran).
    fn last_status(&self, job: Job, now: &BackgroundStats, running: bool) -> &'static str {
        let mut marks = self.marks.lock();
        let Some(mark) = &mut marks[job as usize] else {
            return "ok";
        };
        if mark.ok.is_none() && !running {
            mark.ok = Some(completions(now, job) > mark.completions_before);
        }
        match mark.ok {
            Some(false) => "err",
            _ => "ok",
        }
    }
}

const SECTIONS: [&str; 9] = [
    "server",
    "clients",
    "memory",
    "persistence",
    "stats",
    "replication",
    "cpu",
    "critio",
    "keyspace",
];

/// The INFO text for the sections asked for.
pub(crate) fn render(shared: &Shared, args: &[&[u8]]) -> String {
    let asked: Vec<String> = args
        .iter()
        .map(|a| String::from_utf8_lossy(a).to_ascii_lowercase())
        .collect();
    let all = asked.is_empty()
        || asked
            .iter()
            .any(|a| a == "all" || a == "default" || a == "everything");
    let mut out = String::new();
    for name in SECTIONS {
        if !all && !asked.iter().any(|a| a == name) {
            continue;
        }
        if !out.is_empty() {
            out += "\r\n";
        }
        let mut title = name.to_owned();
        title[..1].make_ascii_uppercase();
        if name == "cpu" {
            title.make_ascii_uppercase(); // Redis's spelling
        }
        let _ = write!(out, "# {title}\r\n");
        match name {
            "server" => server(shared, &mut out),
            "clients" => clients(shared, &mut out),
            "stats" => stats(shared, &mut out),
            "persistence" => persistence(shared, &mut out),
            "memory" => memory(shared, &mut out),
            "replication" => replication(&mut out),
            "cpu" => cpu(&mut out),
            "critio" => critio_section(shared, &mut out),
            _ => {
                let _ = write!(out, "db0:keys={}\r\n", shared.backend.engine.dbsize());
            }
        }
    }
    out
}

fn kv(out: &mut String, key: &str, value: impl std::fmt::Display) {
    let _ = write!(out, "{key}:{value}\r\n");
}

fn server(s: &Shared, out: &mut String) {
    let up = s.started.elapsed().as_secs();
    // The Redis protocol level clients may assume.
    kv(out, "redis_version", super::admin::REDIS_VERSION);
    kv(out, "critio_kv_version", crate::VERSION);
    kv(out, "redis_mode", "standalone");
    kv(out, "os", std::env::consts::OS);
    kv(out, "arch_bits", usize::BITS);
    kv(out, "process_id", std::process::id());
    kv(out, "tcp_port", s.addr.port());
    kv(out, "uptime_in_seconds", up);
    kv(out, "uptime_in_days", up / 86_400);
}

/// Fields of /proc/self/stat after the command name: (utime, stime) in
/// clock ticks, and /proc/self/statm's resident pages. None off Linux.
fn proc_self() -> Option<((u64, u64), u64)> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state is field 3, utime 14, stime 15 (1-based).
    let (utime, stime) = (f.get(11)?.parse().ok()?, f.get(12)?.parse().ok()?);
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let resident: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(((utime, stime), resident))
}

/// Clock ticks per second for /proc's CPU times (USER_HZ: 100 on every
/// Linux architecture that has a stable ABI).
const USER_HZ: f64 = 100.0;
const PAGE_BYTES: u64 = 4096;

fn memory(s: &Shared, out: &mut String) {
    let rss = proc_self().map_or(0, |(_, pages)| pages * PAGE_BYTES);
    kv(out, "used_memory", rss);
    kv(out, "used_memory_human", human(rss));
    kv(out, "used_memory_rss", rss);
    kv(out, "maxmemory", 0);
    kv(out, "maxmemory_policy", "noeviction");
    kv(
        out,
        "critio_page_cache_bytes",
        s.backend.cache.config().capacity_bytes,
    );
}

fn human(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 30 => format!("{:.2}G", b as f64 / f64::from(1u32 << 30)),
        b if b >= 1 << 20 => format!("{:.2}M", b as f64 / f64::from(1u32 << 20)),
        b => format!("{:.2}K", b as f64 / 1024.0),
    }
}

fn replication(out: &mut String) {
    kv(out, "role", "master");
    kv(out, "connected_slaves", 0);
    kv(out, "master_repl_offset", 0);
}

fn cpu(out: &mut String) {
    let ((user, sys), _) = proc_self().unwrap_or(((0, 0), 0));
    kv(out, "used_cpu_sys", format!("{:.6}", sys as f64 / USER_HZ));
    kv(
        out,
        "used_cpu_user",
        format!("{:.6}", user as f64 / USER_HZ),
    );
}

fn clients(s: &Shared, out: &mut String) {
    kv(out, "connected_clients", s.connected());
    kv(out, "maxclients", s.cfg.max_clients);
}

fn stats(s: &Shared, out: &mut String) {
    let st = &s.stats;
    let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
    kv(
        out,
        "total_connections_received",
        get(&st.connections_received),
    );
    kv(out, "total_commands_processed", get(&st.commands_processed));
    kv(out, "rejected_connections", get(&st.rejected_connections));
    kv(out, "total_protocol_errors", get(&st.protocol_errors));
    kv(out, "total_error_replies", get(&st.error_replies));
    kv(out, "total_net_input_bytes", get(&st.net_input_bytes));
    kv(out, "total_net_output_bytes", get(&st.net_output_bytes));
    kv(out, "keyspace_hits", get(&st.keyspace_hits));
    kv(out, "keyspace_misses", get(&st.keyspace_misses));
    kv(out, "critio_reads_parked", get(&st.reads_parked));
    kv(
        out,
        "critio_requests_parked_on_locks",
        get(&st.parked_on_locks),
    );
}

fn persistence(s: &Shared, out: &mut String) {
    let engine = &s.backend.engine;
    // Whether each job runs and how far it has gone, read together: a job
    // ending in between cannot show as running with no progress.
    let (snapshot_at, rewrite_at) = engine.background_progress();
    let (snapshot, rewrite) = (snapshot_at.is_some(), rewrite_at.is_some());
    let b = engine.background_stats();
    let mean = if b.checkpoints == 0 {
        0.0
    } else {
        b.checkpoint_ms_total / b.checkpoints as f64
    };
    kv(out, "loading", 0);
    kv(out, "aof_enabled", 1);
    kv(out, "checkpoints", b.checkpoints);
    kv(out, "checkpoint_mean_ms", format!("{mean:.3}"));
    kv(
        out,
        "checkpoint_max_ms",
        format!("{:.3}", b.checkpoint_ms_max),
    );
    kv(out, "checkpoint_errors", b.checkpoint_errors);
    kv(out, "last_checkpoint_lsn", b.last_checkpoint_lsn);
    kv(out, "rdb_bgsave_in_progress", u8::from(snapshot));
    kv(
        out,
        "rdb_last_bgsave_status",
        s.jobs.last_status(Job::Snapshot, &b, snapshot),
    );
    kv(out, "rdb_saves", b.snapshots);
    kv(
        out,
        "rdb_last_bgsave_time_ms",
        format!("{:.3}", b.last_snapshot_ms),
    );
    kv(out, "rdb_last_bgsave_keys", b.last_snapshot_keys);
    kv(out, "rdb_last_bgsave_bytes", b.last_snapshot_bytes);
    kv(out, "rdb_last_bgsave_raw_bytes", b.last_snapshot_raw_bytes);
    kv(out, "aof_rewrite_in_progress", u8::from(rewrite));
    kv(
        out,
        "aof_last_bgrewrite_status",
        s.jobs.last_status(Job::Rewrite, &b, rewrite),
    );
    kv(out, "aof_rewrites", b.rewrites);
    kv(out, "aof_last_rewrite_records", b.last_rewrite_records);
    // Redis's names for its fork child's progress: here the BGSAVE's if
    // one runs, else the BGREWRITEAOF's; 0 while neither runs.
    let at = snapshot_at.or(rewrite_at).unwrap_or_default();
    kv(
        out,
        "current_fork_perc",
        format!("{:.2}", at.fraction * 100.0),
    );
    kv(out, "current_save_keys_processed", at.keys_processed);
    kv(out, "current_save_keys_total", at.keys_total);
    kv(out, "vlog_cleaned_records", b.cleaned_records);
    kv(out, "vlog_cleaned_bytes", b.cleaned_bytes);
    kv(out, "vlog_expiry_sweeps", b.expiry_sweeps);
    kv(
        out,
        "last_background_error",
        b.last_error.as_deref().unwrap_or(""),
    );
}

fn latency(out: &mut String, key: &str, l: &LatencySummary) {
    let _ = write!(
        out,
        "{key}:count={},mean_us={:.1},p50_us={:.1},p99_us={:.1},p999_us={:.1},max_us={:.1}\r\n",
        l.count, l.mean_us, l.p50_us, l.p99_us, l.p999_us, l.max_us
    );
}

/// A wait point's name as an INFO key: lower case, `_` for the rest.
fn key_of(point: &str) -> String {
    point
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '_'
            }
        })
        .collect::<String>()
        .split('_')
        .filter(|w| !w.is_empty())
        .collect::<Vec<_>>()
        .join("_")
}

fn critio_section(s: &Shared, out: &mut String) {
    let b = &s.backend;
    kv(out, "scheme", b.scheme);
    kv(out, "device", &b.device);
    kv(
        out,
        "device_capacity_bytes",
        b.block.device().info().capacity,
    );
    {
        let t = s.stats.rounds.lock();
        latency(out, "round_run", &t.run.summary());
        latency(out, "round_commit", &t.commit.summary());
        latency(out, "round_send", &t.send.summary());
    }
    block(s, out);
    cache(s, out);
    log(s, out);
    inheritance(s, out);
    background_cpu(out);
}

/// The background's CPU: its nice and the CPU floor (process-wide).
fn background_cpu(out: &mut String) {
    kv(
        out,
        "background_cpu_nice",
        critio::context::background_nice(),
    );
    kv(
        out,
        "background_cpu_min_share",
        critio::context::background_cpu_min_share(),
    );
    let f = critio::context::cpu_floor_stats();
    kv(out, "background_cpu_floor_raises", f.raises);
    kv(out, "background_cpu_relieved_threads", f.relieved);
}

fn block(s: &Shared, out: &mut String) {
    let st = s.backend.block.stats();
    for class in Class::ALL {
        let c = st.class(class);
        let name = key_of(class.as_str());
        kv(out, &format!("block_{name}_completions"), c.completions);
        kv(out, &format!("block_{name}_bytes"), c.bytes);
        latency(
            out,
            &format!("block_{name}_admission_wait"),
            &c.admission_wait,
        );
        latency(out, &format!("block_{name}_queue_wait"), &c.queue_wait);
        latency(out, &format!("block_{name}_device_time"), &c.device_time);
    }
    let k = st.counters;
    kv(
        out,
        "block_promoted_awaiting_admission",
        k.promoted_awaiting_admission,
    );
    kv(out, "block_promoted_queued", k.promoted_queued);
    kv(out, "block_promoted_at_device", k.promoted_at_device);
    kv(out, "block_starvation_dispatches", k.starvation_dispatches);
    kv(out, "block_anticipation_holds", k.anticipation_holds);
    kv(out, "block_shared_dispatch_turns", st.shared_dispatch_turns);
    kv(out, "block_fast_sent", k.fast_sent);
    kv(out, "block_fast_adopted", k.fast_adopted);
    kv(out, "block_cap_stalls", k.cap_stalls);
    kv(out, "block_noncritical_cap", st.noncritical_cap);
    kv(
        out,
        "block_noncritical_pacing_mib_s",
        st.pacing_mib_s
            .map_or("off".to_owned(), |r| format!("{r:.1}")),
    );
    kv(
        out,
        "block_background_own_mib_s",
        st.background_own_mib_s
            .map_or("unknown".to_owned(), |r| format!("{r:.1}")),
    );
    // What the adaptive cap decides on: critical device latency with no
    // background about (the clean baseline) and with it (the last window's
    // trimmed mean); it cuts while the second is over target_ratio times
    // the first.
    let us = |v: Option<f64>| v.map_or("unknown".to_owned(), |v| format!("{v:.0}"));
    kv(out, "block_critical_clean_us", us(st.auto_clean_us));
    kv(out, "block_critical_mixed_us", us(st.auto_mixed_us));
}

fn cache(s: &Shared, out: &mut String) {
    let c = s.backend.cache.stats();
    let lookups = c.hits + c.misses;
    let rate = if lookups == 0 {
        0.0
    } else {
        c.hits as f64 / lookups as f64
    };
    kv(out, "cache_frames", c.frames);
    kv(out, "cache_free_frames", c.free_frames);
    kv(out, "cache_hits", c.hits);
    kv(out, "cache_misses", c.misses);
    kv(out, "cache_hit_rate", format!("{rate:.4}"));
    kv(out, "cache_dirty_critical", c.dirty_critical);
    kv(out, "cache_dirty_noncritical", c.dirty_noncritical);
    kv(out, "cache_throttled", c.throttled);
    kv(out, "cache_reclaims", c.reclaims);
    kv(out, "cache_writeback_pages", c.writeback_pages);
    kv(out, "cache_writeback_errors", c.writeback_errors);
    kv(out, "cache_discarded", c.discarded);
    kv(out, "cache_written_around_pages", c.written_around_pages);
    kv(out, "cache_busy", c.busy);
    kv(out, "cache_prefaulted_bytes", c.prefaulted_bytes);
}

fn log(s: &Shared, out: &mut String) {
    let engine = &s.backend.engine;
    let l = engine.log().stats();
    kv(out, "log_batches", l.batches);
    kv(out, "log_committer_batches", l.committer_batches);
    kv(out, "log_records", l.records);
    kv(out, "log_bytes_written", l.bytes_written);
    kv(out, "log_truncations", l.truncations);
    kv(out, "log_used_bytes", l.used_bytes);
    kv(out, "log_capacity_bytes", l.capacity_bytes);
    kv(
        out,
        "log_used_pct",
        format!("{:.2}", engine.log().used_pct()),
    );
    kv(out, "log_poisoned", u8::from(engine.log().is_poisoned()));
    let (live, span, size) = engine.space();
    kv(out, "vlog_live_bytes", live);
    kv(out, "vlog_used_bytes", span);
    kv(out, "vlog_capacity_bytes", size);
}

fn inheritance(s: &Shared, out: &mut String) {
    let m = s.backend.metrics().snapshot();
    for kind in InheritKind::ALL {
        let c = m.inheritance.iter().find(|c| c.kind == kind);
        let (b, r, x) = c.map_or((0, 0, 0), |c| (c.boosts, c.revocations, c.resolutions));
        let _ = write!(
            out,
            "inherit_{}:boosts={b},revocations={r},resolutions={x}\r\n",
            kind.as_str()
        );
    }
    kv(out, "chain_steps", m.chain_steps);
    kv(out, "chain_truncated", m.chain_truncated);
    kv(out, "chain_cycles", m.chain_cycles);
    kv(out, "helpers_dropped", m.helpers_dropped);
    // Paper 000 Tables 2-3: where critical tasks waited.
    for w in m.wait_points.iter().filter(|w| w.class == Class::Critical) {
        let _ = write!(
            out,
            "critical_wait_{}:waits={},mean_ms={:.3},max_ms={:.3}\r\n",
            key_of(&w.point),
            w.latency.count,
            w.latency.mean_us / 1000.0,
            w.latency.max_us / 1000.0
        );
    }
}

#[cfg(test)]
mod tests {
    use super::key_of;

    #[test]
    fn wait_points_become_info_keys() {
        assert_eq!(key_of("log: commit wait"), "log_commit_wait");
        assert_eq!(key_of("kv: epoch"), "kv_epoch");
        assert_eq!(key_of("non-critical"), "non_critical");
    }
}
