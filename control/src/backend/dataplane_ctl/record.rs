//! The persisted dataplane choice: `weft-dataplane` next to the subnet file
//! (`/run/flannel/weft-dataplane`; `n1.weft-dataplane` for `n1.env`).
//!
//! Contract:
//! - weftd writes it (atomically) only after a switch asked for by
//!   `weft dataplane set` or SIGHUP succeeded, and only when the choice
//!   differs from `--dataplane`; back on the flag's choice it removes it.
//!   So the file exists exactly while a choice other than the flag's is in
//!   effect, and says which.
//! - It records what the choice was made for: the backend type and the
//!   `--dataplane` value at the time. A choice belongs to that
//!   configuration: when either changed, [`judge`] says to ignore it.
//! - Format: `key=value` lines (`dataplane`, `backend`, `flag`), `#`
//!   comments. A file holding one bare word (`kernel`), written by hand, is
//!   a choice without a record: SIGHUP applies it (and on success weftd
//!   rewrites it with its record), a start ignores it.

use std::path::{Path, PathBuf};

use crate::backend::DataplaneChoice;

/// The file's name (see [`weft_compat::subnet_env::beside`]).
pub const FILE_NAME: &str = "weft-dataplane";

/// The persisted choice for `subnet_file`.
pub fn path(subnet_file: &Path) -> PathBuf {
    weft_compat::subnet_env::beside(subnet_file, FILE_NAME)
}

/// What the file holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// The dataplane chosen.
    pub choice: DataplaneChoice,
    /// The configuration it was chosen under (`None`: written by hand).
    pub made_for: Option<MadeFor>,
}

/// The configuration a choice was made under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MadeFor {
    /// The network config's backend type (`vxlan`, ...).
    pub backend: String,
    /// `--dataplane` at the time.
    pub flag: DataplaneChoice,
}

/// What a start does with the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// No file: the flag decides.
    Absent,
    /// Use this choice (still to be checked against what the kernel can run).
    Use(DataplaneChoice, MadeFor),
    /// Ignore the file, for this reason (the caller removes it).
    Ignore(String),
}

/// What a start does with `read` (the file's content, `Ok(None)` when
/// absent) under backend `backend` and `--dataplane` `flag`.
pub fn judge(
    read: Result<Option<String>, String>,
    backend: &str,
    flag: DataplaneChoice,
) -> Verdict {
    let text = match read {
        Ok(None) => return Verdict::Absent,
        Ok(Some(t)) => t,
        Err(e) => return Verdict::Ignore(format!("cannot read it: {e}")),
    };
    let rec = match Record::parse(&text) {
        Ok(r) => r,
        Err(e) => return Verdict::Ignore(e),
    };
    let Some(made_for) = rec.made_for else {
        return Verdict::Ignore(format!(
            "it holds `{}` without the backend and --dataplane it was chosen for (written by hand \
             or by an older weft); a hand-written choice applies only to a running weftd, on SIGHUP",
            rec.choice.as_str()
        ));
    };
    if made_for.backend != backend || made_for.flag != flag {
        return Verdict::Ignore(format!(
            "its choice `{}` was made for backend {} with --dataplane={}, and weftd now runs backend {backend} with --dataplane={}",
            rec.choice.as_str(),
            made_for.backend,
            made_for.flag.as_str(),
            flag.as_str()
        ));
    }
    Verdict::Use(rec.choice, made_for)
}

impl Record {
    /// Parses the file's text (see the module docs).
    pub fn parse(text: &str) -> Result<Record, String> {
        let (mut choice, mut backend, mut flag) = (None, None, None);
        let word = |v: &str, what: &str| {
            DataplaneChoice::parse(v)
                .ok_or_else(|| format!("{what} {v:?} is not auto, kernel or userspace"))
        };
        for line in text.lines().map(str::trim) {
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (key, value) = match line.split_once('=') {
                Some((k, v)) => (k.trim(), v.trim()),
                None if choice.is_none() && backend.is_none() => ("dataplane", line),
                None => return Err(format!("line {line:?} is not key=value")),
            };
            let slot_taken = match key {
                "dataplane" => choice.replace(word(value, "dataplane")?).is_some(),
                "flag" => flag.replace(word(value, "flag")?).is_some(),
                "backend" if !value.is_empty() => backend.replace(value.to_string()).is_some(),
                "backend" => return Err("backend is empty".into()),
                other => return Err(format!("unknown key {other:?}")),
            };
            if slot_taken {
                return Err(format!("{key} is given twice"));
            }
        }
        let choice = choice.ok_or("it names no dataplane")?;
        let made_for = match (backend, flag) {
            (Some(backend), Some(flag)) => Some(MadeFor { backend, flag }),
            (None, None) => None,
            _ => return Err("it names only one of backend and flag".into()),
        };
        Ok(Record { choice, made_for })
    }

    /// The file's text.
    pub fn render(&self) -> String {
        let mut out = String::from(
            "# The dataplane weftd switched to with `weft dataplane set`, kept across restarts\n\
             # while the backend and --dataplane below stay the same. `weft dataplane reset`\n\
             # (or deleting this file, then SIGHUP or a restart) returns to --dataplane.\n",
        );
        out.push_str(&format!("dataplane={}\n", self.choice.as_str()));
        if let Some(m) = &self.made_for {
            out.push_str(&format!(
                "backend={}\nflag={}\n",
                m.backend,
                m.flag.as_str()
            ));
        }
        out
    }
}

/// Reads the file: `Ok(None)` when it does not exist.
pub fn read(path: &Path) -> Result<Option<String>, String> {
    use std::io::Read;
    let f = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.to_string()),
    };
    let mut text = String::new();
    // A few lines; anything longer is not ours.
    f.take(4096)
        .read_to_string(&mut text)
        .map_err(|e| e.to_string())?;
    Ok(Some(text))
}

/// Writes `rec` atomically (temporary file, rename).
pub fn write(path: &Path, rec: &Record) -> std::io::Result<()> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.tmp"));
    std::fs::write(&tmp, rec.render())?;
    std::fs::rename(&tmp, path).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

/// Removes the file; a missing file is fine.
pub fn remove(path: &Path) -> std::io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use DataplaneChoice::{Auto, Kernel, Userspace};

    fn rec(choice: DataplaneChoice, backend: &str, flag: DataplaneChoice) -> Record {
        Record {
            choice,
            made_for: Some(MadeFor {
                backend: backend.into(),
                flag,
            }),
        }
    }

    #[test]
    fn a_record_round_trips_and_a_bare_word_has_no_record() {
        let r = rec(Kernel, "vxlan", Auto);
        assert_eq!(Record::parse(&r.render()), Ok(r));
        assert_eq!(
            Record::parse("userspace\n"),
            Ok(Record {
                choice: Userspace,
                made_for: None
            })
        );
        assert_eq!(
            Record::parse("# c\n dataplane = kernel \nflag=auto\nbackend=udp\n")
                .map(|r| r.made_for),
            Ok(Some(MadeFor {
                backend: "udp".into(),
                flag: Auto
            }))
        );
    }

    #[test]
    fn malformed_files_say_what_is_wrong() {
        for (text, want) in [
            ("", "names no dataplane"),
            ("fast\n", "\"fast\" is not auto"),
            ("dataplane=kernel\ndataplane=userspace\n", "given twice"),
            ("dataplane=kernel\nbackend=vxlan\n", "only one of"),
            ("dataplane=kernel\ncolour=blue\n", "unknown key"),
            (
                "dataplane=kernel\nflag=sometimes\nbackend=x\n",
                "flag \"sometimes\"",
            ),
            ("dataplane=kernel\nuserspace\n", "not key=value"),
            (
                "dataplane=kernel\nbackend=\nflag=auto\n",
                "backend is empty",
            ),
        ] {
            let e = Record::parse(text).expect_err(text);
            assert!(e.contains(want), "{text:?}: {e}");
        }
    }

    /// The findings of issue 29: a choice outlives neither its backend nor
    /// its flag, and a hand-written word is not applied at start.
    #[test]
    fn a_start_uses_a_choice_only_under_the_configuration_it_was_made_for() {
        let file = |r: &Record| Ok(Some(r.render()));
        assert_eq!(judge(Ok(None), "vxlan", Auto), Verdict::Absent);
        let made = rec(Kernel, "vxlan", Auto);
        assert!(matches!(
            judge(file(&made), "vxlan", Auto),
            Verdict::Use(Kernel, _)
        ));
        for (backend, flag, why) in [
            ("host-gw", Auto, "made for backend vxlan"),
            ("vxlan", Userspace, "with --dataplane=auto"),
        ] {
            match judge(file(&made), backend, flag) {
                Verdict::Ignore(w) => assert!(w.contains(why), "{w}"),
                v => panic!("{backend} {flag:?}: {v:?}"),
            }
        }
        for text in ["kernel\n", "garbage=1\n"] {
            assert!(
                matches!(
                    judge(Ok(Some(text.into())), "vxlan", Auto),
                    Verdict::Ignore(_)
                ),
                "{text}"
            );
        }
        assert!(matches!(
            judge(Err("Permission denied".into()), "vxlan", Auto),
            Verdict::Ignore(w) if w.contains("Permission denied")
        ));
    }

    #[test]
    fn write_read_remove() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = path(&dir.path().join("n1.env"));
        assert_eq!(p, dir.path().join("n1.weft-dataplane"));
        assert_eq!(read(&p), Ok(None));
        let r = rec(Userspace, "wireguard", Kernel);
        write(&p, &r).expect("write");
        assert_eq!(
            read(&p).map(|t| t.map(|t| Record::parse(&t))),
            Ok(Some(Ok(r)))
        );
        remove(&p).expect("remove");
        remove(&p).expect("missing is fine");
        let names: Vec<_> = std::fs::read_dir(dir.path()).expect("dir").collect();
        assert!(names.is_empty(), "no temporary file left: {names:?}");
    }
}
