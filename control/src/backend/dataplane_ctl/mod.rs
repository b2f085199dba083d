//! The operator's handle on the dataplane of a running weftd.
//!
//! - `weft dataplane set auto|kernel|userspace` and `weft dataplane reset`
//!   ask the running weftd over its status socket (`{"op":"dataplane",...}`,
//!   see [`crate::status::server`]); the main loop turns each into a
//!   [`SwitchRequest`], the backend's task switches ([`switch`], which calls
//!   [`super::Switch::switch_dataplane`]) and the loop hands the
//!   [`SwitchOutcome`] back here ([`DataplaneControl::on_switched`]), which
//!   answers once the switch is done, or with the backend's own reason when
//!   it is refused. A switch the old path must delay (WireGuard's handover)
//!   is answered when it completes; the loop keeps serving meanwhile.
//!   [`DataplaneControl`] itself does no I/O but the record file: it is the
//!   state machine, the backend's task does the work.
//! - A switch that succeeded is persisted in the [`record`] file
//!   (`weft-dataplane` next to the subnet file), with the backend type and
//!   `--dataplane` it was made under; a failed one never is. Back on the
//!   flag's choice (`reset`, or `set` to the flag's value) the file is
//!   removed. At start ([`DataplaneControl::start`]) a recorded choice is
//!   used only under the same backend type and flag and only if this kernel
//!   can run it; otherwise weftd warns once, naming the file and why, removes
//!   it and runs the flag's choice: a stale choice can never stop a start.
//! - SIGHUP re-reads the file, for operators who write it by hand (one word
//!   is enough): the choice is validated the same way (switched to, and
//!   persisted with its record only if that succeeded); a file that cannot
//!   be used is put back to what runs, and the error logged.
//! - What runs is read from the status socket: the backend, its dataplane,
//!   and `requested`, the choice in effect (or being switched to).

pub mod client;
pub mod record;

use std::path::{Path, PathBuf};

use std::time::SystemTime;

use tokio::sync::{mpsc, oneshot};

use self::record::{MadeFor, Record, Verdict};
use super::{Backend, BackendError, Dataplane, DataplaneChoice, Switch};
use crate::status::server::Command;

/// Commands queued for the main loop before the socket waits.
const COMMAND_QUEUE: usize = 4;

/// See the module docs.
#[derive(Debug)]
pub struct DataplaneControl {
    file: PathBuf,
    backend_type: String,
    flag: DataplaneChoice,
    /// The choice in effect: persisted in `file`, or the flag's.
    effective: DataplaneChoice,
    /// What runs or is being switched to (= `effective` unless pending).
    requested: DataplaneChoice,
    /// Who waits for the pending switch's outcome.
    waiter: Option<oneshot::Sender<serde_json::Value>>,
    tx: mpsc::Sender<Command>,
    rx: mpsc::Receiver<Command>,
}

impl DataplaneControl {
    /// Chooses the dataplane at start and builds the backend with it (see
    /// the module docs): the choice persisted next to `subnet_file` if it was
    /// made for `backend_type` and `flag` and `build`'s backend can run it,
    /// else `flag`.
    pub async fn start(
        subnet_file: &Path,
        backend_type: &str,
        flag: DataplaneChoice,
        build: impl Fn(DataplaneChoice) -> Result<Box<dyn Backend<dyn Switch>>, BackendError>,
    ) -> Result<(DataplaneControl, Box<dyn Backend<dyn Switch>>), BackendError> {
        let file = record::path(subnet_file);
        let (tx, rx) = mpsc::channel(COMMAND_QUEUE);
        let mut ctl = DataplaneControl {
            file,
            backend_type: backend_type.to_string(),
            flag,
            effective: flag,
            requested: flag,
            waiter: None,
            tx,
            rx,
        };
        let ignore = |ctl: &DataplaneControl, why: &str| {
            let removed = match record::remove(&ctl.file) {
                Ok(()) => "removed it".to_string(),
                Err(e) => format!("could not remove it ({e}): delete it by hand"),
            };
            tracing::warn!(
                "{}: ignored the persisted dataplane choice: {why}; {removed}; running --dataplane={} \
                 (`weft dataplane set` records a new choice)",
                ctl.file.display(),
                flag.as_str()
            );
        };
        let verdict = record::judge(record::read(&ctl.file), backend_type, flag);
        let (choice, made_for) = match verdict {
            Verdict::Absent => return Ok((ctl, build(flag)?)),
            Verdict::Ignore(why) => {
                ignore(&ctl, &why);
                return Ok((ctl, build(flag)?));
            }
            Verdict::Use(choice, made_for) => (choice, made_for),
        };
        let mut backend = build(choice)?;
        match backend.can_run(choice).await {
            Ok(path) => {
                tracing::info!(
                    "dataplane: {} ({}) as persisted in {} by `weft dataplane set` for backend {} with --dataplane={}; \
                     `weft dataplane reset` returns to --dataplane={}",
                    choice.as_str(),
                    path.as_str(),
                    ctl.file.display(),
                    made_for.backend,
                    made_for.flag.as_str(),
                    flag.as_str()
                );
                ctl.effective = choice;
                ctl.requested = choice;
                Ok((ctl, backend))
            }
            Err(e) => {
                ignore(&ctl, &format!("`{}` cannot run here: {e}", choice.as_str()));
                Ok((ctl, build(flag)?))
            }
        }
    }

    /// The choice in effect or being switched to (`requested` in status).
    pub fn requested(&self) -> DataplaneChoice {
        self.requested
    }

    /// Where the status socket sends `{"op":"dataplane"}` commands.
    pub fn commands(&self) -> mpsc::Sender<Command> {
        self.tx.clone()
    }

    /// The next command (for the main loop's `select!`; never ends while
    /// this control lives, it holds a sender).
    pub async fn next_command(&mut self) -> Option<Command> {
        self.rx.recv().await
    }

    /// A `{"op":"dataplane","set":...}` or `{"op":"dataplane","reset":true}`
    /// command: the switch to ask the backend for (a malformed command is
    /// answered here, and asks for none).
    pub fn on_command(&mut self, cmd: Command, backend: &'static str) -> Option<SwitchRequest> {
        let want = match parse_command(&cmd.request, self.flag) {
            Ok(w) => w,
            Err(e) => {
                let _ = cmd.reply.send(error_reply(&e));
                return None;
            }
        };
        tracing::info!(
            "dataplane {} requested (weft dataplane) for the {backend} backend",
            want.as_str(),
        );
        Some(SwitchRequest {
            want,
            reply: Some(cmd.reply),
        })
    }

    /// SIGHUP: the switch the file (written by hand) asks for, validated as
    /// a command is; a file that cannot be used is put back to what runs
    /// (and asks for none).
    pub fn on_hup(&mut self, backend: &'static str) -> Option<SwitchRequest> {
        let want = match record::read(&self.file) {
            Ok(None) => Ok(self.flag),
            Ok(Some(text)) => Record::parse(&text).and_then(|r| match r.made_for {
                Some(m) if m.backend != self.backend_type || m.flag != self.flag => Err(format!(
                    "it was recorded for backend {} with --dataplane={}, this weftd runs {} with --dataplane={}",
                    m.backend,
                    m.flag.as_str(),
                    self.backend_type,
                    self.flag.as_str()
                )),
                _ => Ok(r.choice),
            }),
            Err(e) => Err(e),
        };
        match want {
            Ok(want) => {
                tracing::info!(
                    "SIGHUP: dataplane {} requested ({}) for the {backend} backend",
                    want.as_str(),
                    self.file.display(),
                );
                Some(SwitchRequest { want, reply: None })
            }
            Err(e) => {
                tracing::error!(
                    "SIGHUP: {}: {e}; not switching (write one of auto, kernel, userspace)",
                    self.file.display()
                );
                let _ = self.persist();
                None
            }
        }
    }

    /// A pending switch is due ([`SwitchOutcome::pending`]): the request
    /// that completes it (answered to whoever waits for it).
    pub fn on_due(&mut self) -> SwitchRequest {
        SwitchRequest {
            want: self.requested,
            reply: self.waiter.take(),
        }
    }

    /// What the backend did with `req`: persist on success, reply (or keep
    /// the reply for when the pending switch completes).
    pub fn on_switched(&mut self, req: SwitchRequest, out: SwitchOutcome) {
        let SwitchRequest { want, reply } = req;
        if let Some(old) = self.waiter.take() {
            let _ = old.send(error_reply(&format!(
                "superseded by a newer request ({})",
                want.as_str()
            )));
        }
        let backend = out.backend;
        match out.result {
            Ok(now) if out.pending.is_some() => {
                tracing::info!(
                    "dataplane: {backend} runs in the {now} until the pending switch is due"
                );
                self.requested = want;
                self.waiter = reply;
            }
            Ok(now) => {
                tracing::info!("dataplane: {backend} runs in the {now}");
                self.requested = want;
                self.effective = want;
                let persisted = self.persist();
                if let Some(r) = reply {
                    let mut v = serde_json::json!({
                        "ok": true,
                        "pid": std::process::id(),
                        "backend": backend,
                        "dataplane": now.as_str(),
                        "requested": want.as_str(),
                        "flag": self.flag.as_str(),
                    });
                    match persisted {
                        Ok(Some(p)) => v["persisted"] = p.display().to_string().into(),
                        Ok(None) => {}
                        Err(e) => v["warning"] = e.into(),
                    }
                    let _ = r.send(v);
                }
            }
            Err(e) => {
                tracing::error!("dataplane switch to {} failed: {e}", want.as_str());
                // Nothing is persisted: the choice in effect stays.
                self.requested = self.effective;
                if let Err(pe) = self.persist() {
                    tracing::warn!("{pe}");
                }
                if let Some(r) = reply {
                    let _ = r.send(error_reply(&e.to_string()));
                }
            }
        }
    }

    /// Makes the file say what is in effect: the record of a choice other
    /// than the flag's, or nothing. Returns the file when it holds one.
    fn persist(&self) -> Result<Option<PathBuf>, String> {
        let res = if self.effective == self.flag {
            record::remove(&self.file).map(|()| None)
        } else {
            let rec = Record {
                choice: self.effective,
                made_for: Some(MadeFor {
                    backend: self.backend_type.clone(),
                    flag: self.flag,
                }),
            };
            record::write(&self.file, &rec).map(|()| Some(self.file.clone()))
        };
        res.map_err(|e| {
            let msg = format!(
                "{}: {e}; the choice is not kept across restarts",
                self.file.display()
            );
            tracing::error!("{msg}");
            msg
        })
    }
}

/// A switch to ask the backend for, and who waits for its outcome.
#[derive(Debug)]
pub struct SwitchRequest {
    /// The choice to switch to.
    pub want: DataplaneChoice,
    reply: Option<oneshot::Sender<serde_json::Value>>,
}

/// What the backend did with a [`SwitchRequest`] ([`switch`]).
#[derive(Debug)]
pub struct SwitchOutcome {
    /// The backend's name.
    pub backend: &'static str,
    /// The dataplane that runs afterwards, or why the switch was refused.
    pub result: Result<Dataplane, BackendError>,
    /// When a pending switch is due ([`Switch::switch_pending`]; `None`:
    /// nothing pending).
    pub pending: Option<SystemTime>,
}

/// The backend's side of a [`SwitchRequest`]: switches `backend` to `want`
/// (run by the task that owns the backend, never by the main loop).
pub async fn switch(backend: &mut dyn Switch, want: DataplaneChoice) -> SwitchOutcome {
    let result = backend.switch_dataplane(want).await;
    SwitchOutcome {
        backend: backend.name(),
        result,
        pending: backend.switch_pending(),
    }
}

/// The choice a command asks for: `set` (a dataplane) or `reset` (the flag's).
fn parse_command(v: &serde_json::Value, flag: DataplaneChoice) -> Result<DataplaneChoice, String> {
    let set = v.get("set").and_then(|s| s.as_str());
    let reset = v.get("reset").and_then(|r| r.as_bool()) == Some(true);
    match (set, reset) {
        (Some(s), false) => DataplaneChoice::parse(s)
            .ok_or_else(|| format!("{s:?} is not auto, kernel or userspace")),
        (None, true) => Ok(flag),
        _ => Err(r#"expected {"op":"dataplane","set":"auto|kernel|userspace"} or {"op":"dataplane","reset":true}"#.into()),
    }
}

fn error_reply(message: &str) -> serde_json::Value {
    serde_json::json!({ "error": message })
}

#[cfg(test)]
mod tests;
