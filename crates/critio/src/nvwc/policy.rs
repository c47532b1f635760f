//! Admission policies (paper 002, Section 7.1): which writes the cache
//! takes. Everything else goes straight to the backing device.
//!
//! | policy      | admits a write when                          | what it is                          |
//! |-------------|----------------------------------------------|-------------------------------------|
//! | `all`       | always                                       | FlashCache's default                |
//! | `sync`      | `hint.sync`                                  | synchronous writes (I/O-centric)    |
//! | `cp`        | `hint.sync && hint.foreground`               | critical processes' sync writes     |
//! | `cp+pi`     | `class == Critical`                          | + writes of tasks that inherit      |
//! | `cp+pi+ioi` | `class == Critical`, and reissues in flight  | + in-flight writes a critical task  |
//! |             | non-critical writes a critical task waits on | waits for (I/O inheritance)         |
//!
//! The block layer sets `class = Critical` for synchronous writes of a
//! critical task (foreground or inheriting) and for requests promoted before
//! dispatch, which is why `cp+pi` reads the class and `cp` the hints.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::class::Class;
use crate::device::{Command, Op};

/// Which writes the cache admits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Policy {
    /// Every write.
    All,
    /// Synchronous writes (the submitter waits for them).
    Sync,
    /// Synchronous writes of foreground tasks.
    Cp,
    /// Critical writes: of foreground tasks and of tasks that inherit.
    #[serde(alias = "cp+pi")]
    CpPi,
    /// Critical writes, and in-flight non-critical writes that a critical
    /// task waits for, reissued to the cache ([`WriteCache::reissue`]).
    ///
    /// [`WriteCache::reissue`]: super::WriteCache::reissue
    #[default]
    #[serde(alias = "cp+pi+ioi")]
    CpPiIoi,
}

impl Policy {
    /// Every policy, in the paper's order.
    pub const ALL: [Policy; 5] = [
        Policy::All,
        Policy::Sync,
        Policy::Cp,
        Policy::CpPi,
        Policy::CpPiIoi,
    ];

    /// Whether the cache admits `cmd` (a write).
    pub fn admits(self, cmd: &Command) -> bool {
        assert_eq!(cmd.op, Op::Write, "admission is decided for writes");
        match self {
            Policy::All => true,
            Policy::Sync => cmd.hint.sync,
            Policy::Cp => cmd.hint.sync && cmd.hint.foreground,
            Policy::CpPi | Policy::CpPiIoi => cmd.class == Class::Critical,
        }
    }

    /// Whether in-flight bypassed writes are kept for reissue.
    pub fn reissues(self) -> bool {
        self == Policy::CpPiIoi
    }

    /// The stable name: `all`, `sync`, `cp`, `cp-pi`, `cp-pi-ioi` (config
    /// files, JSON).
    pub fn as_str(self) -> &'static str {
        match self {
            Policy::All => "all",
            Policy::Sync => "sync",
            Policy::Cp => "cp",
            Policy::CpPi => "cp-pi",
            Policy::CpPiIoi => "cp-pi-ioi",
        }
    }

    /// The paper's label: `ALL`, `SYNC`, `CP`, `CP+PI`, `CP+PI+IOI` (plots).
    pub fn paper_name(self) -> &'static str {
        match self {
            Policy::All => "ALL",
            Policy::Sync => "SYNC",
            Policy::Cp => "CP",
            Policy::CpPi => "CP+PI",
            Policy::CpPiIoi => "CP+PI+IOI",
        }
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A name that is not a policy.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "`{0}` is not a write-cache policy: use all, sync, cp, cp+pi (cp-pi) or cp+pi+ioi (cp-pi-ioi)"
)]
pub struct ParsePolicyError(pub String);

impl FromStr for Policy {
    type Err = ParsePolicyError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "all" => Ok(Policy::All),
            "sync" => Ok(Policy::Sync),
            "cp" => Ok(Policy::Cp),
            "cp+pi" | "cp-pi" => Ok(Policy::CpPi),
            "cp+pi+ioi" | "cp-pi-ioi" => Ok(Policy::CpPiIoi),
            _ => Err(ParsePolicyError(s.to_owned())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::{AlignedBuf, IoHint};

    fn write(class: Class, sync: bool, foreground: bool) -> Command {
        let mut cmd = Command::write(0, AlignedBuf::zeroed(4096), class);
        cmd.hint = IoHint {
            sync,
            foreground,
            tag: 7,
        };
        cmd
    }

    /// Every combination a write can arrive with, and what each policy does.
    #[test]
    fn each_policy_admits_what_the_paper_says() {
        use Class::{Critical as C, NonCritical as N};
        // (class, sync, foreground) -> admitted by [ALL, SYNC, CP, CP+PI, CP+PI+IOI]
        let table = [
            ((C, true, true), [true, true, true, true, true]), // foreground sync write
            ((C, true, false), [true, true, false, true, true]), // inheriting task's sync write
            ((N, true, false), [true, true, false, false, false]), // background sync write
            ((N, false, false), [true, false, false, false, false]), // writeback
            ((C, false, false), [true, false, false, true, true]), // promoted before dispatch
            ((N, false, true), [true, false, false, false, false]), // foreground async write
            ((N, true, true), [true, true, true, false, false]), // sync-first scheme's oddity
        ];
        for ((class, sync, fg), want) in table {
            for (policy, want) in Policy::ALL.into_iter().zip(want) {
                assert_eq!(
                    policy.admits(&write(class, sync, fg)),
                    want,
                    "{policy}: class {class:?} sync {sync} foreground {fg}"
                );
            }
        }
    }

    #[test]
    fn names_parse_both_spellings_and_round_trip() {
        for p in Policy::ALL {
            assert_eq!(p.as_str().parse::<Policy>(), Ok(p));
            assert_eq!(p.paper_name().parse::<Policy>(), Ok(p));
            let toml = format!("p = \"{p}\"");
            #[derive(Deserialize)]
            struct T {
                p: Policy,
            }
            assert_eq!(toml::from_str::<T>(&toml).unwrap().p, p);
        }
        assert_eq!("cp+pi".parse(), Ok(Policy::CpPi));
        assert_eq!("cp-pi-ioi".parse(), Ok(Policy::CpPiIoi));
        #[derive(Deserialize)]
        struct T {
            p: Policy,
        }
        assert_eq!(
            toml::from_str::<T>("p = \"cp+pi+ioi\"").unwrap().p,
            Policy::CpPiIoi
        );
        let e = "cpp".parse::<Policy>().unwrap_err().to_string();
        assert!(e.contains("cp+pi+ioi"), "{e}");
        assert!(Policy::CpPiIoi.reissues() && !Policy::CpPi.reissues());
    }
}
