//! Where the processes of a server comparison run: `--server-cpus` for the
//! servers (and fio, which stands in for them), `--client-cpus` for
//! redis-benchmark. Unset, the kernel places them, as it does for a user.
//!
//! Why it is an option: on a small virtual machine the host's own work for
//! the disk competes with the guest's CPUs. On this project's VM (2 vCPUs,
//! the disk's interrupts on CPU 1), I/O while both vCPUs are busy makes the
//! host stop the whole guest for tens of milliseconds (steal). Placing the
//! servers on one CPU and the load generator on the other shows what each
//! server does when the guest leaves the host room, and every server gets
//! the same placement, so the comparison stays fair.
//!
//! ```text
//!  spawn(cpus, f):  mask = this thread's CPUs ─> set them to `cpus`
//!                   ─> f() spawns the child (it inherits the thread's CPUs;
//!                      so do its threads and its children: BGSAVE's fork)
//!                   ─> set `mask` back
//! ```

use rustix::thread::{sched_getaffinity, sched_setaffinity, CpuSet};

/// The CPUs of the servers and of the load generator.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Placement {
    /// The servers' CPUs (and fio's); `None`: the kernel's choice.
    pub server: Option<Vec<usize>>,
    /// redis-benchmark's CPUs; `None`: the kernel's choice.
    pub client: Option<Vec<usize>>,
}

impl Placement {
    /// From the command line's CPU lists (`1`, `0-3`, `0,2-3`); each CPU
    /// must be one this process may run on.
    pub fn parse(server: Option<&str>, client: Option<&str>) -> Result<Self, String> {
        if server.is_none() && client.is_none() {
            return Ok(Self::default());
        }
        let allowed = allowed_cpus()?;
        let one = |flag: &str, list: Option<&str>| -> Result<Option<Vec<usize>>, String> {
            let Some(list) = list else { return Ok(None) };
            let cpus = parse_cpu_list(list).map_err(|e| format!("{flag} {list}: {e}"))?;
            if let Some(bad) = cpus.iter().find(|c| !allowed.contains(c)) {
                return Err(format!(
                    "{flag} {list}: CPU {bad} is not one this process may run on ({})",
                    format_cpu_list(&allowed)
                ));
            }
            Ok(Some(cpus))
        };
        Ok(Self {
            server: one("--server-cpus", server)?,
            client: one("--client-cpus", client)?,
        })
    }

    /// Whether anything is placed.
    pub fn is_set(&self) -> bool {
        self.server.is_some() || self.client.is_some()
    }

    /// One line for an experiment's description.
    pub fn describe(&self) -> String {
        let on = |cpus: &Option<Vec<usize>>| {
            cpus.as_deref().map_or_else(
                || "where the kernel puts them".to_owned(),
                |c| format!("on CPU {}", format_cpu_list(c)),
            )
        };
        if self.is_set() {
            format!(
                "servers and fio {}, redis-benchmark {}",
                on(&self.server),
                on(&self.client)
            )
        } else {
            "no process pinned (the kernel places them)".to_owned()
        }
    }
}

/// Runs `f`, which starts a process, with this thread on `cpus` (if any),
/// so that the process starts there; this thread's CPUs are restored.
pub fn spawn_on<R>(
    cpus: Option<&[usize]>,
    f: impl FnOnce() -> Result<R, String>,
) -> Result<R, String> {
    let Some(cpus) = cpus else { return f() };
    let before =
        sched_getaffinity(None).map_err(|e| format!("cannot read this thread's CPUs: {e}"))?;
    let mut set = CpuSet::new();
    for &c in cpus {
        set.set(c);
    }
    sched_setaffinity(None, &set).map_err(|e| {
        format!(
            "cannot place a process on CPU {}: {e}",
            format_cpu_list(cpus)
        )
    })?;
    let out = f();
    sched_setaffinity(None, &before)
        .map_err(|e| format!("cannot restore this thread's CPUs: {e}"))?;
    out
}

/// The CPUs this thread may run on.
fn allowed_cpus() -> Result<Vec<usize>, String> {
    let set =
        sched_getaffinity(None).map_err(|e| format!("cannot read this thread's CPUs: {e}"))?;
    Ok((0..CpuSet::MAX_CPU).filter(|&c| set.is_set(c)).collect())
}

/// Parses a kernel CPU list (`0`, `1-3`, `0,2-3`) into sorted CPUs.
pub fn parse_cpu_list(list: &str) -> Result<Vec<usize>, String> {
    let mut cpus = Vec::new();
    for part in list.split(',').map(str::trim) {
        let num = |s: &str| {
            s.trim()
                .parse::<usize>()
                .map_err(|_| format!("`{s}` is not a CPU number"))
        };
        let (lo, hi) = match part.split_once('-') {
            Some((lo, hi)) => (num(lo)?, num(hi)?),
            None => (num(part)?, num(part)?),
        };
        if lo > hi {
            return Err(format!("`{part}` is an empty range"));
        }
        if hi >= CpuSet::MAX_CPU {
            return Err(format!(
                "CPU {hi} is beyond the largest, {}",
                CpuSet::MAX_CPU - 1
            ));
        }
        cpus.extend(lo..=hi);
    }
    cpus.sort_unstable();
    cpus.dedup();
    Ok(cpus)
}

/// `[0, 1, 2, 5]` as `0-2,5`.
pub fn format_cpu_list(cpus: &[usize]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < cpus.len() {
        let mut j = i;
        while j + 1 < cpus.len() && cpus[j + 1] == cpus[j] + 1 {
            j += 1;
        }
        out.push(if i == j {
            cpus[i].to_string()
        } else {
            format!("{}-{}", cpus[i], cpus[j])
        });
        i = j + 1;
    }
    out.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_parse_and_print_as_the_kernel_writes_them() {
        assert_eq!(parse_cpu_list("1").unwrap(), vec![1]);
        assert_eq!(parse_cpu_list("0-2,5").unwrap(), vec![0, 1, 2, 5]);
        assert_eq!(parse_cpu_list("5, 0-1,1").unwrap(), vec![0, 1, 5]);
        assert_eq!(format_cpu_list(&[0, 1, 2, 5]), "0-2,5");
        assert_eq!(format_cpu_list(&[3]), "3");
        for bad in ["", "x", "2-1", "1-", "-1", "0,,1", "99999"] {
            assert!(parse_cpu_list(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_cpu_this_process_may_not_use_is_refused() {
        let e = Placement::parse(Some("1000"), None).unwrap_err();
        assert!(e.contains("--server-cpus 1000"), "{e}");
        assert_eq!(Placement::parse(None, None).unwrap(), Placement::default());
        assert!(!Placement::default().is_set());
    }

    #[test]
    fn a_child_starts_on_the_given_cpus_and_the_thread_gets_its_own_back() {
        let allowed = allowed_cpus().unwrap();
        let first = allowed[0];
        let out = spawn_on(Some(&[first]), || {
            std::process::Command::new("sh")
                .args(["-c", "grep Cpus_allowed_list /proc/self/status"])
                .output()
                .map_err(|e| e.to_string())
        })
        .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            text.split_whitespace().last(),
            Some(first.to_string().as_str()),
            "{text}"
        );
        assert_eq!(allowed_cpus().unwrap(), allowed);
    }
}
