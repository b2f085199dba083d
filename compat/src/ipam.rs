//! The IPAM API's wire format, spoken by weftd (control `ipam::server`) and
//! the CNI plugin's routed mode (cni `routed::client`): one JSON object per
//! line each way, one reply per request, in order, on a unix stream socket
//! ([`default_socket`] unless configured).
//!
//! Requests (`op` selects the operation; unknown keys are errors):
//!
//! ```text
//! {"op":"allocate","containerID":"abc","ifname":"eth0","hostLocalDir":"/var/lib/cni/networks/cbr0"}
//!     -> {"ok":true,"allocation":{"containerID":"abc","ifname":"eth0","ipv4":"10.244.1.2","ipv6":"fd00::2"}}
//! {"op":"release","containerID":"abc","ifname":"eth0","hostLocalDir":"/var/lib/cni/networks/cbr0"}
//!     -> {"ok":true,"allocation":{...}}     (what was released; absent if nothing was held)
//! {"op":"list"}    -> {"ok":true,"allocations":[{...},...]}
//! {"op":"status"}  -> {"ok":true,"subnet":"10.244.1.0/24","ipv6Subnet":"fd00::/64"}
//! any failure      -> {"ok":false,"error":{"kind":"invalid|exhausted|unavailable","message":"..."}}
//! ```
//!
//! `hostLocalDir` (optional) is host-local's directory for the node's CNI
//! network (`<ipam dataDir>/<network name>`): the daemon avoids the
//! addresses host-local holds there and records its own there in
//! host-local's format (see control's `ipam::host_local`), so that routed
//! and bridge mode never hand out one address twice on a node.
//!
//! Contract: a request line is at most [`MAX_REQUEST`] bytes (a longer one is
//! answered with an `invalid` error and the connection is closed); container
//! IDs follow CNI's `^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$` (at most 256 bytes) and
//! interface names Linux's rules (1-15 bytes, no `/`, `:`, whitespace, not
//! `.`/`..`). Parsing never panics. `allocate` and `release` are idempotent.
//! A reply line is at most [`MAX_REPLY`] bytes. Replies may gain fields:
//! clients ignore the keys (and error kinds) they do not know; the daemon
//! refuses unknown request keys.

use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};

use ipnet::{Ipv4Net, Ipv6Net};
use serde::{Deserialize, Serialize};

/// Longest request line accepted, in bytes (without the newline).
pub const MAX_REQUEST: usize = 4096;
/// Largest reply a client accepts (a `list` of a /16 fits easily).
pub const MAX_REPLY: u64 = 16 * 1024 * 1024;
/// Longest container ID accepted.
const MAX_CONTAINER_ID: usize = 256;
/// The socket's file name next to the subnet file ([`default_socket`]).
pub const SOCKET_NAME: &str = "weft.sock";

/// The socket both sides use unless told otherwise: `weft.sock` next to
/// the subnet file, named after its stem ([`crate::subnet_env::beside`]):
/// `/run/flannel/subnet.env` → `/run/flannel/weft.sock`.
pub fn default_socket(subnet_file: &Path) -> PathBuf {
    crate::subnet_env::beside(subnet_file, SOCKET_NAME)
}

/// The key of one pod attachment.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Key {
    /// `CNI_CONTAINERID`.
    pub container_id: String,
    /// `CNI_IFNAME`.
    pub ifname: String,
}

/// The addresses held by one attachment (in replies, and in weftd's state
/// file, which is read strictly: unknown keys are refused).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Allocation {
    /// `CNI_CONTAINERID`.
    #[serde(rename = "containerID")]
    pub container_id: String,
    /// `CNI_IFNAME`.
    pub ifname: String,
    /// The IPv4 address, when the lease has an IPv4 subnet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv4: Option<Ipv4Addr>,
    /// The IPv6 address, when the lease has an IPv6 subnet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv6: Option<Ipv6Addr>,
}

// === impl Allocation ===

impl Allocation {
    /// The allocation's key.
    pub fn key(&self) -> Key {
        Key {
            container_id: self.container_id.clone(),
            ifname: self.ifname.clone(),
        }
    }
}

/// One request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "lowercase", deny_unknown_fields)]
pub enum Request {
    /// Allocate (or return the existing) addresses of an attachment.
    Allocate {
        /// `CNI_CONTAINERID`.
        #[serde(rename = "containerID")]
        container_id: String,
        /// `CNI_IFNAME`.
        ifname: String,
        /// host-local's directory for this network (see the module docs).
        #[serde(
            rename = "hostLocalDir",
            default,
            skip_serializing_if = "Option::is_none"
        )]
        host_local_dir: Option<String>,
    },
    /// Release an attachment's addresses (no-op when it holds none).
    Release {
        /// `CNI_CONTAINERID`.
        #[serde(rename = "containerID")]
        container_id: String,
        /// `CNI_IFNAME`.
        ifname: String,
        /// host-local's directory for this network.
        #[serde(
            rename = "hostLocalDir",
            default,
            skip_serializing_if = "Option::is_none"
        )]
        host_local_dir: Option<String>,
    },
    /// List every allocation (for GC). (An empty struct variant, so that
    /// unknown keys are refused as for the others.)
    List {},
    /// Whether the API can allocate, and from which subnets.
    Status {},
}

/// What kind of failure an error reply reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ErrorKind {
    /// The request is malformed.
    Invalid,
    /// No free address is left.
    Exhausted,
    /// The allocator cannot serve (corrupt state file, failed write).
    Unavailable,
    /// A kind this client does not know (a newer daemon); never sent.
    #[serde(other)]
    Unknown,
}

/// The error part of a reply.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorReply {
    /// The failure class.
    pub kind: ErrorKind,
    /// A human-readable message.
    pub message: String,
}

/// One reply.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Response {
    /// Whether the request succeeded.
    pub ok: bool,
    /// Set when `ok` is false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorReply>,
    /// `allocate`: the addresses; `release`: what was released.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocation: Option<Allocation>,
    /// `list`: every allocation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocations: Option<Vec<Allocation>>,
    /// `status`: the IPv4 lease subnet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subnet: Option<Ipv4Net>,
    /// `status`: the IPv6 lease subnet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv6_subnet: Option<Ipv6Net>,
}

// === impl Response ===

impl Response {
    /// A failure reply.
    pub fn error(kind: ErrorKind, message: impl Into<String>) -> Response {
        Response {
            ok: false,
            error: Some(ErrorReply {
                kind,
                message: message.into(),
            }),
            ..Response::default()
        }
    }

    /// A success reply with nothing in it (the caller fills it).
    pub fn ok() -> Response {
        Response {
            ok: true,
            ..Response::default()
        }
    }

    /// The reply as one line, newline included.
    pub fn to_line(&self) -> Vec<u8> {
        // Plain strings, addresses and numbers: encoding cannot fail.
        let mut out = serde_json::to_vec(self).unwrap_or_else(|_| b"{\"ok\":false}".to_vec());
        out.push(b'\n');
        out
    }

    /// Parses one reply line (with or without its newline).
    pub fn parse(line: &[u8]) -> Result<Response, serde_json::Error> {
        serde_json::from_slice(line)
    }
}

// === impl Request ===

impl Request {
    /// The request as one line, newline included.
    pub fn to_line(&self) -> Vec<u8> {
        // Plain strings: encoding cannot fail.
        let mut out = serde_json::to_vec(self).unwrap_or_else(|_| b"{}".to_vec());
        out.push(b'\n');
        out
    }

    /// Parses and validates one request line (without its newline).
    pub fn parse(line: &[u8]) -> Result<Request, String> {
        if line.len() > MAX_REQUEST {
            return Err(format!("request longer than {MAX_REQUEST} bytes"));
        }
        let req: Request = serde_json::from_slice(line).map_err(|e| format!("bad request: {e}"))?;
        if let Request::Allocate {
            container_id,
            ifname,
            host_local_dir,
        }
        | Request::Release {
            container_id,
            ifname,
            host_local_dir,
        } = &req
        {
            validate_container_id(container_id)?;
            validate_ifname(ifname)?;
            if host_local_dir
                .as_deref()
                .is_some_and(|d| !d.starts_with('/'))
            {
                return Err(format!(
                    "hostLocalDir {:?} is not an absolute path",
                    host_local_dir.as_deref().unwrap_or_default()
                ));
            }
        }
        Ok(req)
    }

    /// The `hostLocalDir` of `allocate`/`release`.
    pub fn host_local_dir(&self) -> Option<&str> {
        match self {
            Request::Allocate { host_local_dir, .. } | Request::Release { host_local_dir, .. } => {
                host_local_dir.as_deref()
            }
            Request::List {} | Request::Status {} => None,
        }
    }

    /// The attachment key of `allocate`/`release`.
    pub fn key(&self) -> Option<Key> {
        match self {
            Request::Allocate {
                container_id,
                ifname,
                ..
            }
            | Request::Release {
                container_id,
                ifname,
                ..
            } => Some(Key {
                container_id: container_id.clone(),
                ifname: ifname.clone(),
            }),
            Request::List {} | Request::Status {} => None,
        }
    }
}

fn validate_container_id(id: &str) -> Result<(), String> {
    let mut bytes = id.bytes();
    let ok = id.len() <= MAX_CONTAINER_ID
        && bytes.next().is_some_and(|b| b.is_ascii_alphanumeric())
        && bytes.all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(format!("invalid containerID {id:?}"))
    }
}

fn validate_ifname(name: &str) -> Result<(), String> {
    let ok = (1..=15).contains(&name.len())
        && name != "."
        && name != ".."
        && !name
            .chars()
            .any(|c| c == '/' || c == ':' || c.is_whitespace());
    if ok {
        Ok(())
    } else {
        Err(format!("invalid ifname {name:?}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_the_lines_the_daemon_parses() {
        let a = Request::Allocate {
            container_id: "abc".into(),
            ifname: "eth0".into(),
            host_local_dir: None,
        };
        assert_eq!(
            a.to_line(),
            b"{\"op\":\"allocate\",\"containerID\":\"abc\",\"ifname\":\"eth0\"}\n"
        );
        let r = Request::Release {
            container_id: "abc".into(),
            ifname: "eth0".into(),
            host_local_dir: Some("/var/lib/cni/networks/cbr0".into()),
        };
        assert_eq!(
            r.to_line(),
            b"{\"op\":\"release\",\"containerID\":\"abc\",\"ifname\":\"eth0\",\"hostLocalDir\":\"/var/lib/cni/networks/cbr0\"}\n"
        );
        assert_eq!(r.host_local_dir(), Some("/var/lib/cni/networks/cbr0"));
        assert!(
            Request::parse(
                br#"{"op":"allocate","containerID":"a","ifname":"eth0","hostLocalDir":"cbr0"}"#
            )
            .is_err_and(|e| e.contains("not an absolute path"))
        );
        assert_eq!(Request::List {}.to_line(), b"{\"op\":\"list\"}\n");
        assert_eq!(Request::Status {}.to_line(), b"{\"op\":\"status\"}\n");
        for r in [a, Request::List {}] {
            let line = r.to_line();
            assert_eq!(Request::parse(&line[..line.len() - 1]), Ok(r));
        }
    }

    #[test]
    fn clients_ignore_what_they_do_not_know() {
        let r = Response::parse(
            br#"{"ok":false,"error":{"kind":"throttled","message":"m","hint":1},"x":2}"#,
        )
        .expect("newer reply");
        assert_eq!(r.error.map(|e| e.kind), Some(ErrorKind::Unknown));
        let r = Response::parse(br#"{"ok":true,"subnet":"10.244.1.0/24"}"#).expect("status");
        assert_eq!(r.subnet, Some("10.244.1.0/24".parse().expect("net")));
    }

    #[test]
    fn default_socket_follows_the_subnet_file() {
        assert_eq!(
            default_socket(Path::new("/run/flannel/subnet.env")),
            Path::new("/run/flannel/weft.sock")
        );
        assert_eq!(
            default_socket(Path::new("/tmp/x/n1.env")),
            Path::new("/tmp/x/n1.weft.sock")
        );
    }

    #[test]
    fn parses_every_op() {
        assert_eq!(
            Request::parse(br#"{"op":"allocate","containerID":"abc-1","ifname":"eth0"}"#),
            Ok(Request::Allocate {
                container_id: "abc-1".into(),
                ifname: "eth0".into(),
                host_local_dir: None,
            })
        );
        assert_eq!(
            Request::parse(br#"{"ifname":"net1","containerID":"x","op":"release"}"#),
            Ok(Request::Release {
                container_id: "x".into(),
                ifname: "net1".into(),
                host_local_dir: None,
            })
        );
        assert_eq!(Request::parse(br#"{"op":"list"}"#), Ok(Request::List {}));
        assert_eq!(
            Request::parse(br#"{"op":"status"}"#),
            Ok(Request::Status {})
        );
    }

    #[test]
    fn rejects_bad_input_with_reasons() {
        let cases: [(&[u8], &str); 11] = [
            (b"", "EOF"),
            (b"\xff\xfe", "bad request"),
            (b"[]", "bad request"),
            (br#"{"op":"steal"}"#, "unknown variant `steal`"),
            (
                br#"{"containerID":"a","ifname":"eth0"}"#,
                "missing field `op`",
            ),
            (
                br#"{"op":"allocate","containerID":"a"}"#,
                "missing field `ifname`",
            ),
            (
                br#"{"op":"allocate","containerID":"a","ifname":"eth0","x":1}"#,
                "unknown field `x`",
            ),
            (br#"{"op":"list","x":1}"#, "unknown field `x`"),
            (
                br#"{"op":"allocate","containerID":"-a","ifname":"eth0"}"#,
                "invalid containerID",
            ),
            (
                br#"{"op":"release","containerID":"a","ifname":"a/b"}"#,
                "invalid ifname",
            ),
            (
                br#"{"op":"allocate","containerID":"a","ifname":"sixteen-chars-xx"}"#,
                "invalid ifname",
            ),
        ];
        for (input, want) in cases {
            let e = Request::parse(input).expect_err(&String::from_utf8_lossy(input));
            assert!(
                e.contains(want),
                "{:?}: {e}",
                String::from_utf8_lossy(input)
            );
        }
        let long = format!(r#"{{"op":"list","pad":"{}"}}"#, "x".repeat(MAX_REQUEST));
        assert!(
            Request::parse(long.as_bytes())
                .expect_err("too long")
                .contains("longer than")
        );
        let long_id = format!(
            r#"{{"op":"release","containerID":"{}","ifname":"eth0"}}"#,
            "a".repeat(300)
        );
        assert!(Request::parse(long_id.as_bytes()).is_err());
    }

    #[test]
    fn replies_round_trip() {
        let mut r = Response::ok();
        r.allocation = Some(Allocation {
            container_id: "a".into(),
            ifname: "eth0".into(),
            ipv4: Some("10.244.1.2".parse().expect("ip")),
            ipv6: None,
        });
        let line = r.to_line();
        assert_eq!(
            std::str::from_utf8(&line).expect("utf8"),
            "{\"ok\":true,\"allocation\":{\"containerID\":\"a\",\"ifname\":\"eth0\",\"ipv4\":\"10.244.1.2\"}}\n"
        );
        let back = Response::parse(&line).expect("parse");
        assert_eq!(back, r);
        let e = Response::error(
            ErrorKind::Exhausted,
            "no free address left in 10.244.1.0/24",
        );
        assert_eq!(
            String::from_utf8(e.to_line()).expect("utf8"),
            "{\"ok\":false,\"error\":{\"kind\":\"exhausted\",\"message\":\"no free address left in 10.244.1.0/24\"}}\n"
        );
    }
}
