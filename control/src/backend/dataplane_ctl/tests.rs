//! The dataplane control's contract on a fake backend: what a start takes
//! from the persisted file, what a command or SIGHUP persists, and that a
//! refused switch is answered with the backend's reason and never persisted.

use std::time::SystemTime;

use async_trait::async_trait;
use tokio::sync::oneshot;

use super::record::{self, MadeFor, Record};
use super::*;
use crate::backend::{ApplyError, Backend, Batch, Dataplane, Observe, Prepared, Running, Setup};
use crate::iface::ExternalInterface;
use crate::lease::{Lease, LeaseAttrs};
use DataplaneChoice::{Auto, Kernel, Userspace};

/// A backend that can run the choices in `allowed` and delays a switch to
/// the kernel when `delay` is set (as WireGuard's handover does).
#[derive(Debug)]
struct Fake {
    runs: Dataplane,
    allowed: Vec<DataplaneChoice>,
    delay: bool,
    pending: Option<SystemTime>,
}

fn fake(allowed: &[DataplaneChoice]) -> Box<Fake> {
    Box::new(Fake {
        runs: Dataplane::Userspace,
        allowed: allowed.to_vec(),
        delay: false,
        pending: None,
    })
}

impl Observe for Fake {
    fn name(&self) -> &'static str {
        "vxlan"
    }
    fn dataplane(&self) -> Option<Dataplane> {
        Some(self.runs)
    }
}

/// One type for the three stages (the fake has nothing to prepare or set up).
#[async_trait]
impl Backend<dyn Switch> for Fake {
    fn name(&self) -> &'static str {
        "vxlan"
    }
    async fn lease_attrs(
        self: Box<Self>,
        _: &ExternalInterface,
        _: Option<&Lease>,
    ) -> Result<Prepared<dyn Switch>, BackendError> {
        Ok(Prepared {
            attrs: LeaseAttrs::default(),
            backend: self,
        })
    }
    async fn can_run(&mut self, to: DataplaneChoice) -> Result<Dataplane, BackendError> {
        if !self.allowed.contains(&to) {
            return Err(BackendError::Config(format!(
                "--dataplane={}: this kernel cannot run the vxlan backend: no vxlan support",
                to.as_str()
            )));
        }
        Ok(match to {
            Kernel => Dataplane::Kernel,
            _ => Dataplane::Userspace,
        })
    }
}

#[async_trait]
impl Setup<dyn Switch> for Fake {
    async fn setup(self: Box<Self>, _: &Lease) -> Result<Box<dyn Switch>, BackendError> {
        Ok(self)
    }
}

#[async_trait]
impl Running for Fake {
    fn mtu(&self) -> u32 {
        1450
    }
    async fn apply(&mut self, _: Batch<'_>) -> Result<(), ApplyError> {
        Ok(())
    }
    async fn reconcile(&mut self) -> Result<(), BackendError> {
        Ok(())
    }
    async fn teardown(&mut self) {}
}

#[async_trait]
impl Switch for Fake {
    fn switch_pending(&self) -> Option<SystemTime> {
        self.pending
    }
    async fn switch_dataplane(&mut self, to: DataplaneChoice) -> Result<Dataplane, BackendError> {
        let path = Backend::can_run(self, to).await?;
        if self.delay && path == Dataplane::Kernel && self.pending.is_none() {
            self.pending = Some(SystemTime::now());
            return Ok(self.runs);
        }
        self.pending = None;
        self.runs = path;
        Ok(path)
    }
    async fn rebuild(&mut self, _: &Lease) -> Result<(), BackendError> {
        Ok(())
    }
}

fn recorded(choice: DataplaneChoice, backend: &str, flag: DataplaneChoice) -> String {
    Record {
        choice,
        made_for: Some(MadeFor {
            backend: backend.into(),
            flag,
        }),
    }
    .render()
}

/// The control's start, and the backend it chose run through its stages.
async fn start(
    env: &Path,
    flag: DataplaneChoice,
    allowed: &[DataplaneChoice],
) -> (DataplaneControl, Box<dyn Switch>) {
    let allowed = allowed.to_vec();
    let (ctl, b) = DataplaneControl::start(env, "vxlan", flag, |_| Ok(fake(&allowed)))
        .await
        .expect("start");
    let ext = crate::backend::test_util::ext();
    let lease = crate::backend::test_util::lease("10.244.1.0/24", "192.0.2.1", "vxlan", None);
    let p = b.lease_attrs(&ext, None).await.expect("attrs");
    (ctl, p.backend.setup(&lease).await.expect("setup"))
}

/// What weftd's main loop and the backend's task do with a request: the
/// task switches, the control hears the outcome.
async fn drive(ctl: &mut DataplaneControl, b: &mut dyn Switch, req: Option<SwitchRequest>) {
    if let Some(req) = req {
        let out = switch(b, req.want).await;
        ctl.on_switched(req, out);
    }
}

/// Sends one command and returns the reply (or `None` while it waits).
async fn command(
    ctl: &mut DataplaneControl,
    b: &mut dyn Switch,
    req: serde_json::Value,
) -> oneshot::Receiver<serde_json::Value> {
    let (tx, rx) = oneshot::channel();
    let req = ctl.on_command(
        Command {
            request: req,
            reply: tx,
        },
        b.name(),
    );
    drive(ctl, b, req).await;
    rx
}

/// SIGHUP.
async fn hup(ctl: &mut DataplaneControl, b: &mut dyn Switch) {
    let req = ctl.on_hup(b.name());
    drive(ctl, b, req).await;
}

#[tokio::test]
async fn a_start_uses_a_persisted_choice_only_where_it_belongs_and_can_run() {
    let dir = tempfile::tempdir().expect("tempdir");
    let env = dir.path().join("subnet.env");
    let file = record::path(&env);
    let all = [Auto, Kernel, Userspace];
    // No file: the flag.
    let (ctl, _) = start(&env, Auto, &all).await;
    assert_eq!(ctl.requested(), Auto);
    // Made for this backend and flag, and runnable: used, kept.
    std::fs::write(&file, recorded(Kernel, "vxlan", Auto)).expect("write");
    let (ctl, _) = start(&env, Auto, &all).await;
    assert_eq!(ctl.requested(), Kernel);
    assert!(file.exists());
    // Finding 1 of issue 29: an explicit --dataplane now wins over it,
    // and the stale file goes.
    let (ctl, _) = start(&env, Userspace, &all).await;
    assert_eq!(ctl.requested(), Userspace);
    assert!(
        !file.exists(),
        "a choice made under another flag is removed"
    );
    // Made for vxlan, the node now runs another backend type.
    std::fs::write(&file, recorded(Kernel, "host-gw", Auto)).expect("write");
    let (ctl, _) = start(&env, Auto, &all).await;
    assert_eq!((ctl.requested(), file.exists()), (Auto, false));
    // Made for this configuration, but this kernel cannot run it.
    std::fs::write(&file, recorded(Kernel, "vxlan", Auto)).expect("write");
    let (ctl, _) = start(&env, Auto, &[Auto, Userspace]).await;
    assert_eq!((ctl.requested(), file.exists()), (Auto, false));
    // A hand-written word, or garbage, is not applied at start.
    for text in ["kernel\n", "dataplane=turbo\n"] {
        std::fs::write(&file, text).expect("write");
        let (ctl, _) = start(&env, Auto, &all).await;
        assert_eq!((ctl.requested(), file.exists()), (Auto, false), "{text}");
    }
}

#[tokio::test]
async fn a_refused_switch_is_answered_with_the_backends_reason_and_not_persisted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let env = dir.path().join("subnet.env");
    let (mut ctl, mut b) = start(&env, Auto, &[Auto, Userspace]).await;
    let reply = command(&mut ctl, b.as_mut(), serde_json::json!({"set": "kernel"}))
        .await
        .await
        .expect("answered at once");
    let e = reply["error"].as_str().expect("an error");
    assert!(e.contains("no vxlan support"), "{reply}");
    assert_eq!(ctl.requested(), Auto);
    assert!(
        !record::path(&env).exists(),
        "a failed switch is never persisted"
    );
    let reply = command(&mut ctl, b.as_mut(), serde_json::json!({"set": "fast"}))
        .await
        .await
        .expect("answered");
    assert!(
        reply["error"]
            .as_str()
            .is_some_and(|e| e.contains("\"fast\"")),
        "{reply}"
    );
}

#[tokio::test]
async fn a_switch_is_persisted_with_its_configuration_and_reset_removes_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let env = dir.path().join("n1.env");
    let file = record::path(&env);
    let (mut ctl, mut b) = start(&env, Auto, &[Auto, Kernel, Userspace]).await;
    let reply = command(&mut ctl, b.as_mut(), serde_json::json!({"set": "kernel"}))
        .await
        .await
        .expect("answered");
    assert_eq!(reply["ok"], true, "{reply}");
    assert_eq!(reply["dataplane"], "kernel");
    assert_eq!(reply["persisted"], file.display().to_string());
    assert_eq!(
        Record::parse(&std::fs::read_to_string(&file).expect("file")),
        Record::parse(&recorded(Kernel, "vxlan", Auto))
    );
    let reply = command(&mut ctl, b.as_mut(), serde_json::json!({"reset": true}))
        .await
        .await
        .expect("answered");
    assert_eq!(
        (reply["ok"].clone(), reply["requested"].clone()),
        (true.into(), "auto".into())
    );
    assert!(reply.get("persisted").is_none(), "{reply}");
    assert!(!file.exists(), "back on the flag's choice, no file");
}

#[tokio::test]
async fn sighup_validates_a_hand_written_file_like_a_command() {
    let dir = tempfile::tempdir().expect("tempdir");
    let env = dir.path().join("subnet.env");
    let file = record::path(&env);
    let (mut ctl, mut b) = start(&env, Auto, &[Auto, Userspace]).await;
    // A word the kernel cannot run: refused, the file put back (none).
    std::fs::write(&file, "kernel\n").expect("write");
    hup(&mut ctl, b.as_mut()).await;
    assert_eq!((ctl.requested(), file.exists()), (Auto, false));
    // A word it can run: switched, and rewritten with its record.
    std::fs::write(&file, "userspace\n").expect("write");
    hup(&mut ctl, b.as_mut()).await;
    assert_eq!(ctl.requested(), Userspace);
    assert_eq!(
        Record::parse(&std::fs::read_to_string(&file).expect("file")),
        Record::parse(&recorded(Userspace, "vxlan", Auto))
    );
    // Garbage: not switched, the file says again what runs.
    std::fs::write(&file, "dataplane=turbo\n").expect("write");
    hup(&mut ctl, b.as_mut()).await;
    assert_eq!(ctl.requested(), Userspace);
    assert!(
        std::fs::read_to_string(&file).is_ok_and(|t| t.contains("dataplane=userspace")),
        "restored"
    );
    // Deleted by hand: back to the flag.
    std::fs::remove_file(&file).expect("rm");
    hup(&mut ctl, b.as_mut()).await;
    assert_eq!((ctl.requested(), file.exists()), (Auto, false));
}

#[tokio::test]
async fn a_pending_switch_is_answered_and_persisted_when_it_completes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let env = dir.path().join("subnet.env");
    let file = record::path(&env);
    let allowed = [Auto, Kernel, Userspace];
    let (mut ctl, _) = start(&env, Auto, &allowed).await;
    let mut b: Box<dyn Switch> = Box::new(Fake {
        runs: Dataplane::Userspace,
        allowed: allowed.to_vec(),
        delay: true,
        pending: None,
    });
    let mut rx = command(&mut ctl, b.as_mut(), serde_json::json!({"set": "kernel"})).await;
    assert!(rx.try_recv().is_err(), "no answer while pending");
    assert_eq!(ctl.requested(), Kernel);
    assert!(!file.exists(), "not persisted while pending");
    let due = ctl.on_due();
    drive(&mut ctl, b.as_mut(), Some(due)).await;
    let reply = rx.await.expect("answered when done");
    assert_eq!(reply["dataplane"], "kernel", "{reply}");
    assert!(file.exists());
}
