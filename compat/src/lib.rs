//! The flannel and Go contracts that weft's daemon (`weft-control`) and its
//! CNI plugin (`weft-cni`) both implement, written once.
//!
//! flannel is written in Go, and a drop-in replacement must reproduce what
//! Go's standard library does where users can see it: which CIDRs parse,
//! how JSON keys match struct fields, the exact bytes of `subnet.env`. weftd
//! and the plugin also talk to each other over the IPAM socket. Each of
//! these lives here, once:
//!
//! - [`gonet`]: Go's `net.ParseIP` and `net.ParseCIDR`, and flannel's IPv6
//!   address text;
//! - [`gojson`]: Go's `encoding/json`: key folding, document-order decoding
//!   with strict field types, and `json.Marshal`'s output;
//! - [`goio`]: Go's rendering of an OS error;
//! - [`subnet_env`]: flannel's `subnet.env`: weftd's writer, flanneld's
//!   reader and (in [`subnet_env::plugin`]) the CNI plugin's reader;
//! - [`ipam`]: the IPAM socket's wire types, framing and default path.
//!
//! The crate is synchronous and small (serde, serde_json, ipnet,
//! thiserror): the CNI plugin depends on it and on nothing of the daemon or
//! the engine.

#![forbid(unsafe_code)]

pub mod goio;
pub mod gojson;
pub mod gonet;
pub mod ipam;
pub mod subnet_env;
