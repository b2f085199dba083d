//! The VICI protocol of strongSwan's charon (the `vici` plugin): packet and
//! message encoding, a client over its unix socket.
//!
//! Wire format (strongSwan `src/libcharon/plugins/vici/README.md`):
//! - a packet is a 32-bit big-endian length, then that many bytes: one type
//!   byte, a name (8-bit length + bytes) for `CMD_REQUEST`,
//!   `EVENT_REGISTER`, `EVENT_UNREGISTER` and `EVENT`, then a message for
//!   `CMD_REQUEST`, `CMD_RESPONSE` and `EVENT`;
//! - a message is a sequence of elements: `SECTION_START` (1) name,
//!   `SECTION_END` (2), `KEY_VALUE` (3) name + value (16-bit length + bytes),
//!   `LIST_START` (4) name, `LIST_ITEM` (5) value, `LIST_END` (6).
//!
//! Decoding never panics and never allocates beyond the input: every length
//! is checked against what is left, nesting is capped at [`MAX_DEPTH`] and a
//! packet at [`MAX_PACKET`] bytes (charon's own limit is 512 KiB).

use std::path::{Path, PathBuf};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

/// The largest packet accepted (charon's `VICI_MESSAGE_SIZE_MAX` is 512 KiB).
pub const MAX_PACKET: usize = 512 * 1024;
/// The deepest section nesting accepted.
pub const MAX_DEPTH: usize = 32;

const CMD_REQUEST: u8 = 0;
const CMD_RESPONSE: u8 = 1;
const CMD_UNKNOWN: u8 = 2;
const EVENT_REGISTER: u8 = 3;
const EVENT_UNREGISTER: u8 = 4;
const EVENT_CONFIRM: u8 = 5;
const EVENT_UNKNOWN: u8 = 6;
const EVENT: u8 = 7;

const SECTION_START: u8 = 1;
const SECTION_END: u8 = 2;
const KEY_VALUE: u8 = 3;
const LIST_START: u8 = 4;
const LIST_ITEM: u8 = 5;
const LIST_END: u8 = 6;

/// Errors encoding, decoding or exchanging VICI packets.
#[derive(Debug, thiserror::Error)]
pub enum ViciError {
    /// A name is longer than 255 bytes or a value longer than 65535.
    #[error("vici: {0} too long to encode")]
    TooLong(&'static str),
    /// The bytes are not a valid packet or message.
    #[error("vici: malformed {0}")]
    Malformed(&'static str),
    /// The packet is larger than [`MAX_PACKET`].
    #[error("vici: packet of {0} bytes exceeds the limit")]
    Oversized(usize),
    /// charon does not know the command.
    #[error("vici: charon does not know the command {0:?}")]
    UnknownCommand(String),
    /// charon answered with `success = no`.
    #[error("vici {cmd}: {errmsg}")]
    Failed {
        /// The command.
        cmd: String,
        /// charon's `errmsg`.
        errmsg: String,
    },
    /// The socket failed.
    #[error("vici socket {path}: {source}")]
    Io {
        /// The socket path.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
}

/// A value in a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    /// `KEY_VALUE`.
    Str(Vec<u8>),
    /// `LIST_START` .. `LIST_END`.
    List(Vec<Vec<u8>>),
    /// `SECTION_START` .. `SECTION_END`.
    Section(Section),
}

/// A message or section: named values in order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Section(pub Vec<(String, Value)>);

impl Section {
    /// An empty section.
    pub fn new() -> Section {
        Section::default()
    }

    /// Adds `key = value`.
    pub fn kv(mut self, key: &str, value: &str) -> Section {
        self.0
            .push((key.into(), Value::Str(value.as_bytes().to_vec())));
        self
    }

    /// Adds a list.
    pub fn list(mut self, key: &str, items: &[&str]) -> Section {
        self.0.push((
            key.into(),
            Value::List(items.iter().map(|s| s.as_bytes().to_vec()).collect()),
        ));
        self
    }

    /// Adds a subsection.
    pub fn section(mut self, key: &str, s: Section) -> Section {
        self.0.push((key.into(), Value::Section(s)));
        self
    }

    /// The first value named `key`.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.0.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// The string value named `key` (lossy UTF-8).
    pub fn str(&self, key: &str) -> Option<String> {
        match self.get(key)? {
            Value::Str(v) => Some(String::from_utf8_lossy(v).into_owned()),
            _ => None,
        }
    }

    fn encode(&self, out: &mut Vec<u8>) -> Result<(), ViciError> {
        for (k, v) in &self.0 {
            match v {
                Value::Str(s) => {
                    out.push(KEY_VALUE);
                    put_name(out, k)?;
                    put_value(out, s)?;
                }
                Value::List(items) => {
                    out.push(LIST_START);
                    put_name(out, k)?;
                    for i in items {
                        out.push(LIST_ITEM);
                        put_value(out, i)?;
                    }
                    out.push(LIST_END);
                }
                Value::Section(s) => {
                    out.push(SECTION_START);
                    put_name(out, k)?;
                    s.encode(out)?;
                    out.push(SECTION_END);
                }
            }
        }
        Ok(())
    }
}

fn put_name(out: &mut Vec<u8>, name: &str) -> Result<(), ViciError> {
    let len = u8::try_from(name.len()).map_err(|_| ViciError::TooLong("name"))?;
    out.push(len);
    out.extend_from_slice(name.as_bytes());
    Ok(())
}

fn put_value(out: &mut Vec<u8>, v: &[u8]) -> Result<(), ViciError> {
    let len = u16::try_from(v.len()).map_err(|_| ViciError::TooLong("value"))?;
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(v);
    Ok(())
}

/// One VICI packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Packet {
    /// A command and its arguments.
    Request(String, Section),
    /// The answer to a command.
    Response(Section),
    /// The command is unknown.
    Unknown,
    /// Register for an event.
    EventRegister(String),
    /// Unregister from an event.
    EventUnregister(String),
    /// (Un)registration done.
    EventConfirm,
    /// The event is unknown.
    EventUnknown,
    /// An event.
    Event(String, Section),
}

impl Packet {
    /// The packet with its 4-byte length prefix.
    pub fn encode(&self) -> Result<Vec<u8>, ViciError> {
        let mut out = vec![0u8; 4];
        let (ty, name, msg) = match self {
            Packet::Request(n, m) => (CMD_REQUEST, Some(n), Some(m)),
            Packet::Response(m) => (CMD_RESPONSE, None, Some(m)),
            Packet::Unknown => (CMD_UNKNOWN, None, None),
            Packet::EventRegister(n) => (EVENT_REGISTER, Some(n), None),
            Packet::EventUnregister(n) => (EVENT_UNREGISTER, Some(n), None),
            Packet::EventConfirm => (EVENT_CONFIRM, None, None),
            Packet::EventUnknown => (EVENT_UNKNOWN, None, None),
            Packet::Event(n, m) => (EVENT, Some(n), Some(m)),
        };
        out.push(ty);
        if let Some(n) = name {
            put_name(&mut out, n)?;
        }
        if let Some(m) = msg {
            m.encode(&mut out)?;
        }
        let len = out.len() - 4;
        if len > MAX_PACKET {
            return Err(ViciError::Oversized(len));
        }
        let len32 = u32::try_from(len).map_err(|_| ViciError::Oversized(len))?;
        out[..4].copy_from_slice(&len32.to_be_bytes());
        Ok(out)
    }

    /// Decodes a packet body (without the length prefix).
    pub fn decode(body: &[u8]) -> Result<Packet, ViciError> {
        let mut r = Reader { buf: body };
        let ty = r.byte("packet type")?;
        let p = match ty {
            CMD_REQUEST => Packet::Request(r.name()?, r.message(0)?),
            CMD_RESPONSE => Packet::Response(r.message(0)?),
            CMD_UNKNOWN => Packet::Unknown,
            EVENT_REGISTER => Packet::EventRegister(r.name()?),
            EVENT_UNREGISTER => Packet::EventUnregister(r.name()?),
            EVENT_CONFIRM => Packet::EventConfirm,
            EVENT_UNKNOWN => Packet::EventUnknown,
            EVENT => Packet::Event(r.name()?, r.message(0)?),
            _ => return Err(ViciError::Malformed("packet type")),
        };
        if !r.buf.is_empty() {
            return Err(ViciError::Malformed("trailing bytes"));
        }
        Ok(p)
    }
}

struct Reader<'a> {
    buf: &'a [u8],
}

impl Reader<'_> {
    fn take(&mut self, n: usize, what: &'static str) -> Result<&[u8], ViciError> {
        if self.buf.len() < n {
            return Err(ViciError::Malformed(what));
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Ok(head)
    }

    fn byte(&mut self, what: &'static str) -> Result<u8, ViciError> {
        Ok(self.take(1, what)?[0])
    }

    fn name(&mut self) -> Result<String, ViciError> {
        let n = usize::from(self.byte("name length")?);
        let b = self.take(n, "name")?;
        String::from_utf8(b.to_vec()).map_err(|_| ViciError::Malformed("name (not UTF-8)"))
    }

    fn value(&mut self) -> Result<Vec<u8>, ViciError> {
        let l = self.take(2, "value length")?;
        let n = usize::from(u16::from_be_bytes([l[0], l[1]]));
        Ok(self.take(n, "value")?.to_vec())
    }

    /// Elements up to the end (depth 0) or up to the matching `SECTION_END`.
    fn message(&mut self, depth: usize) -> Result<Section, ViciError> {
        if depth > MAX_DEPTH {
            return Err(ViciError::Malformed("nesting too deep"));
        }
        let mut s = Section::new();
        loop {
            if self.buf.is_empty() {
                return if depth == 0 {
                    Ok(s)
                } else {
                    Err(ViciError::Malformed("unterminated section"))
                };
            }
            match self.byte("element")? {
                SECTION_START => {
                    let k = self.name()?;
                    s.0.push((k, Value::Section(self.message(depth + 1)?)));
                }
                SECTION_END if depth > 0 => return Ok(s),
                KEY_VALUE => {
                    let k = self.name()?;
                    s.0.push((k, Value::Str(self.value()?)));
                }
                LIST_START => {
                    let k = self.name()?;
                    let mut items = Vec::new();
                    loop {
                        match self.byte("list element")? {
                            LIST_ITEM => items.push(self.value()?),
                            LIST_END => break,
                            _ => return Err(ViciError::Malformed("list element")),
                        }
                    }
                    s.0.push((k, Value::List(items)));
                }
                _ => return Err(ViciError::Malformed("element type")),
            }
        }
    }
}

/// A connection to charon's VICI socket; one request at a time.
#[derive(Debug)]
pub struct ViciClient {
    path: PathBuf,
    stream: UnixStream,
}

impl ViciClient {
    /// Connects to the socket at `path`.
    pub async fn connect(path: &Path) -> Result<ViciClient, ViciError> {
        let stream = UnixStream::connect(path)
            .await
            .map_err(|source| ViciError::Io {
                path: path.into(),
                source,
            })?;
        Ok(ViciClient {
            path: path.into(),
            stream,
        })
    }

    fn io(&self) -> impl FnOnce(std::io::Error) -> ViciError + '_ {
        move |source| ViciError::Io {
            path: self.path.clone(),
            source,
        }
    }

    async fn read_packet(&mut self) -> Result<Packet, ViciError> {
        let mut len = [0u8; 4];
        self.stream.read_exact(&mut len).await.map_err(self.io())?;
        let n = usize::try_from(u32::from_be_bytes(len)).unwrap_or(usize::MAX);
        if n > MAX_PACKET {
            return Err(ViciError::Oversized(n));
        }
        let mut body = vec![0u8; n];
        self.stream.read_exact(&mut body).await.map_err(self.io())?;
        Packet::decode(&body)
    }

    /// Sends command `cmd` with `args`; returns charon's response message.
    pub async fn request(&mut self, cmd: &str, args: Section) -> Result<Section, ViciError> {
        let bytes = Packet::Request(cmd.into(), args).encode()?;
        self.stream.write_all(&bytes).await.map_err(self.io())?;
        loop {
            match self.read_packet().await? {
                Packet::Response(m) => return Ok(m),
                Packet::Unknown => return Err(ViciError::UnknownCommand(cmd.into())),
                // Events are only sent after a registration, which this client never makes.
                Packet::Event(..) => continue,
                _ => return Err(ViciError::Malformed("unexpected packet type in answer")),
            }
        }
    }

    /// [`ViciClient::request`] for commands answering `success = yes|no`.
    pub async fn call(&mut self, cmd: &str, args: Section) -> Result<Section, ViciError> {
        let m = self.request(cmd, args).await?;
        match m.str("success").as_deref() {
            Some("yes") => Ok(m),
            _ => Err(ViciError::Failed {
                cmd: cmd.into(),
                errmsg: m.str("errmsg").unwrap_or_else(|| "no errmsg".into()),
            }),
        }
    }
}

#[cfg(test)]
#[path = "vici_tests.rs"]
mod tests;
