//! The one place where a plugin invocation is decoded: `CNI_*` variables and
//! stdin become a [`Command`], validated as Go's `skel.PluginMain` does.
//!
//! Contract (order matters, it decides which error a runtime sees):
//! 1. `CNI_COMMAND` and the variables the verb needs must be non-empty
//!    (ADD/CHECK: container ID, netns, ifname, path; DEL: container ID,
//!    ifname, path; GC/STATUS: path), else code 4 listing all missing ones.
//!    A set container ID must match `^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$`; a set
//!    ifname must be 1-15 bytes, not `.`/`..`, without `/`, `:` or spaces.
//! 2. stdin is read whole (VERSION included; its `cniVersion` is echoed).
//! 3. An unknown verb is code 4.
//! 4. The network config is decoded; `name` must exist and match the same
//!    pattern as container IDs.
//! 5. The network's `cniVersion` must be supported; CHECK needs >= 0.4.0,
//!    GC and STATUS >= 1.1.0.

use std::io::Read;

use crate::config::NetConf;
use crate::error::Error;
use crate::version;

/// Longest interface name Linux accepts.
const MAX_IFNAME: usize = 15;

/// The `CNI_*` parameters of one invocation (empty when not given).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Env {
    /// `CNI_CONTAINERID`.
    pub container_id: String,
    /// `CNI_NETNS`.
    pub netns: String,
    /// `CNI_IFNAME`.
    pub ifname: String,
    /// `CNI_ARGS`.
    pub args: String,
    /// `CNI_PATH`.
    pub path: String,
}

/// A verb with its validated inputs.
#[derive(Debug, Clone)]
pub struct Request {
    /// The `CNI_*` parameters.
    pub env: Env,
    /// The decoded network config.
    pub conf: NetConf,
}

/// One plugin invocation.
#[derive(Debug, Clone)]
pub enum Command {
    /// ADD: build, save and run the delegate config.
    Add(Request),
    /// DEL: replay the saved delegate config with DEL.
    Del(Request),
    /// CHECK: run the delegate's CHECK with the saved config.
    Check(Request),
    /// GC (CNI 1.1): drop attachments that are not listed as valid.
    Gc(Request),
    /// STATUS (CNI 1.1): whether ADD can succeed now.
    Status(Request),
    /// VERSION: report supported versions.
    Version {
        /// The `cniVersion` sent on stdin, if any.
        requested: Option<String>,
    },
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Verb {
    Add,
    Del,
    Check,
    Gc,
    Status,
    Version,
}

// === impl Command ===

impl Command {
    /// Decodes an invocation from `getenv` and `stdin`; the bytes read are
    /// left in `input` (the caller uses them to label errors).
    pub fn load(
        getenv: &dyn Fn(&str) -> Option<String>,
        stdin: &mut dyn Read,
        input: &mut Vec<u8>,
    ) -> Result<Command, Error> {
        let get = |k: &str| getenv(k).unwrap_or_default();
        let command = get("CNI_COMMAND");
        let verb = match command.as_str() {
            "ADD" => Some(Verb::Add),
            "DEL" => Some(Verb::Del),
            "CHECK" => Some(Verb::Check),
            "GC" => Some(Verb::Gc),
            "STATUS" => Some(Verb::Status),
            "VERSION" => Some(Verb::Version),
            _ => None,
        };
        let env = Env {
            container_id: get("CNI_CONTAINERID"),
            netns: get("CNI_NETNS"),
            ifname: get("CNI_IFNAME"),
            args: get("CNI_ARGS"),
            path: get("CNI_PATH"),
        };
        validate_env(&command, verb, &env)?;
        stdin.read_to_end(input).map_err(Error::Stdin)?;
        let Some(verb) = verb else {
            return Err(Error::UnknownCommand(command));
        };
        if verb == Verb::Version {
            let requested = serde_json::from_slice::<serde_json::Value>(input)
                .ok()
                .and_then(|v| {
                    v.get("cniVersion")
                        .and_then(|s| s.as_str().map(str::to_string))
                });
            return Ok(Command::Version { requested });
        }
        let conf = NetConf::parse(input)?;
        if conf.name.is_empty() {
            return Err(Error::MissingName);
        }
        if !valid_id(&conf.name) {
            return Err(Error::InvalidName(conf.name));
        }
        match verb {
            Verb::Check => version::check_at_least(&conf.cni_version, "0.4.0", "CHECK")?,
            Verb::Gc => version::check_at_least(&conf.cni_version, "1.1.0", "GC")?,
            Verb::Status => version::check_at_least(&conf.cni_version, "1.1.0", "STATUS")?,
            _ => version::check_supported(&conf.cni_version)?,
        }
        let req = Request { env, conf };
        Ok(match verb {
            Verb::Add => Command::Add(req),
            Verb::Del => Command::Del(req),
            Verb::Check => Command::Check(req),
            Verb::Gc => Command::Gc(req),
            Verb::Status | Verb::Version => Command::Status(req),
        })
    }
}

/// skel's `getCmdArgsFromEnv`: which variables each verb needs, and their
/// values' validity.
fn validate_env(command: &str, verb: Option<Verb>, env: &Env) -> Result<(), Error> {
    use Verb::*;
    let needs = |verbs: &[Verb]| verb.is_some_and(|v| verbs.contains(&v));
    let vars: [(&'static str, &str, bool); 5] = [
        ("CNI_COMMAND", command, true),
        (
            "CNI_CONTAINERID",
            &env.container_id,
            needs(&[Add, Check, Del]),
        ),
        ("CNI_NETNS", &env.netns, needs(&[Add, Check])),
        ("CNI_IFNAME", &env.ifname, needs(&[Add, Check, Del])),
        ("CNI_PATH", &env.path, needs(&[Add, Check, Del, Gc, Status])),
    ];
    let mut missing = Vec::new();
    for (name, value, required) in vars {
        if value.is_empty() {
            if required {
                missing.push(name);
            }
        } else if required && name == "CNI_CONTAINERID" && !valid_id(value) {
            return Err(Error::InvalidEnv {
                msg: "invalid characters in containerID",
                details: value.to_string(),
            });
        } else if required && name == "CNI_IFNAME" {
            validate_ifname(value)?;
        }
    }
    if missing.is_empty() {
        Ok(())
    } else {
        Err(Error::MissingEnv(missing))
    }
}

/// CNI's ID pattern `^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$` (container IDs, network names).
pub fn valid_id(s: &str) -> bool {
    let mut bytes = s.bytes();
    bytes.next().is_some_and(|b| b.is_ascii_alphanumeric())
        && bytes.all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

/// skel's `ValidateInterfaceName`.
fn validate_ifname(name: &str) -> Result<(), Error> {
    let invalid = |msg, details: String| Err(Error::InvalidEnv { msg, details });
    if name.len() > MAX_IFNAME {
        return invalid(
            "interface name is too long",
            format!(
                "interface name should be less than {} characters",
                MAX_IFNAME + 1
            ),
        );
    }
    if name == "." || name == ".." {
        return invalid("interface name is . or ..", String::new());
    }
    if name
        .chars()
        .any(|c| c == '/' || c == ':' || c.is_whitespace())
    {
        return invalid(
            "interface name contains / or : or whitespace characters",
            String::new(),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests;
