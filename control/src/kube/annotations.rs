//! flannel's node annotation names (fl:pkg/subnet/kube/annotations.go).
//!
//! The prefix (`--kube-annotation-prefix`, default `flannel.alpha.coreos.com`)
//! may hold at most one `/`. Without one, `/` is appended; a prefix that then
//! ends in neither `/` nor `-` gets a `-`. The result must match flannel's
//! (end-anchored) regex `(?:[a-z0-9_-]+\.)+[a-z0-9_-]+/(?:[a-z0-9_-]+-)?$`.
//!
//! weft adds one name of its own under the same prefix, `weft-nat` (the
//! lease's `WeftNAT`, docs/nat.md): the prefix is what keeps two networks
//! on one node apart, and `WeftNAT` belongs to one network's lease.
//! flanneld reads its annotations by their fixed names (`nodeToLease`) and
//! forwards a node update only when one of its own changed (spec §6.2), so
//! it never sees this one.

use std::sync::LazyLock;

use regex::Regex;

use super::KubeError;

/// The annotation prefix flanneld uses by default.
pub const DEFAULT_PREFIX: &str = "flannel.alpha.coreos.com";

static PREFIX_RE: LazyLock<Option<Regex>> =
    LazyLock::new(|| Regex::new(r"(?:[a-z0-9_-]+\.)+[a-z0-9_-]+/(?:[a-z0-9_-]+-)?$").ok());

/// The full annotation keys for one prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Annotations {
    /// `kube-subnet-manager` = `"true"` on every node flannel manages.
    pub subnet_kube_managed: String,
    /// `backend-data`: the backend's IPv4 data, raw JSON text (`null` if none).
    pub backend_data: String,
    /// `backend-v6-data`: the backend's IPv6 data.
    pub backend_v6_data: String,
    /// `backend-type`.
    pub backend_type: String,
    /// `public-ip`: the node's IPv4 underlay address.
    pub backend_public_ip: String,
    /// `public-ipv6`.
    pub backend_public_ipv6: String,
    /// `node-public-ip`: user input, replaces `--public-ip` at start.
    pub backend_node_public_ip: String,
    /// `node-public-ipv6`: user input, replaces `--public-ipv6` at start.
    pub backend_node_public_ipv6: String,
    /// `public-ip-overwrite`: user input, published as `public-ip`.
    pub backend_public_ip_overwrite: String,
    /// `public-ipv6-overwrite`: user input, published as `public-ipv6`.
    pub backend_public_ipv6_overwrite: String,
    /// weft only, `weft-nat`: the lease's `WeftNAT` JSON, present while the
    /// node runs NAT traversal (written and removed by weftd).
    pub weft_nat: String,
    /// weft only, `weft-gso`: `"true"` while the lease has `WeftGSO` (a
    /// weft udp node with `--tunnel-gso`; written and removed by weftd).
    pub weft_gso: String,
}

impl Annotations {
    /// flannel's `newAnnotations`, with its error texts.
    pub fn new(prefix: &str) -> Result<Annotations, KubeError> {
        let slashes = prefix.matches('/').count();
        if slashes > 1 {
            return Err(KubeError::Prefix(
                "subnet/kube: prefix can contain at most single slash",
            ));
        }
        let mut p = prefix.to_string();
        if slashes == 0 {
            p.push('/');
        }
        if !p.ends_with('/') && !p.ends_with('-') {
            p.push('-');
        }
        let ok = PREFIX_RE.as_ref().is_some_and(|re| re.is_match(&p));
        if !ok {
            return Err(KubeError::Prefix(
                "subnet/kube: prefix must be in a format: fqdn/[0-9a-z-_]*",
            ));
        }
        let k = |s: &str| format!("{p}{s}");
        Ok(Annotations {
            subnet_kube_managed: k("kube-subnet-manager"),
            backend_data: k("backend-data"),
            backend_v6_data: k("backend-v6-data"),
            backend_type: k("backend-type"),
            backend_public_ip: k("public-ip"),
            backend_public_ipv6: k("public-ipv6"),
            backend_node_public_ip: k("node-public-ip"),
            backend_node_public_ipv6: k("node-public-ipv6"),
            backend_public_ip_overwrite: k("public-ip-overwrite"),
            backend_public_ipv6_overwrite: k("public-ipv6-overwrite"),
            weft_nat: k("weft-nat"),
            weft_gso: k("weft-gso"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_prefix_gives_flannels_names() {
        let a = Annotations::new(DEFAULT_PREFIX).expect("default prefix");
        assert_eq!(
            a.subnet_kube_managed,
            "flannel.alpha.coreos.com/kube-subnet-manager"
        );
        assert_eq!(a.backend_data, "flannel.alpha.coreos.com/backend-data");
        assert_eq!(
            a.backend_v6_data,
            "flannel.alpha.coreos.com/backend-v6-data"
        );
        assert_eq!(a.backend_type, "flannel.alpha.coreos.com/backend-type");
        assert_eq!(a.backend_public_ip, "flannel.alpha.coreos.com/public-ip");
        assert_eq!(
            a.backend_public_ipv6,
            "flannel.alpha.coreos.com/public-ipv6"
        );
        assert_eq!(
            a.backend_node_public_ip,
            "flannel.alpha.coreos.com/node-public-ip"
        );
        assert_eq!(
            a.backend_public_ip_overwrite,
            "flannel.alpha.coreos.com/public-ip-overwrite"
        );
        assert_eq!(
            a.backend_public_ipv6_overwrite,
            "flannel.alpha.coreos.com/public-ipv6-overwrite"
        );
        assert_eq!(a.weft_nat, "flannel.alpha.coreos.com/weft-nat");
        let custom = Annotations::new("example.com/a_b").expect("custom prefix");
        assert_eq!(custom.weft_nat, "example.com/a_b-weft-nat");
        assert_eq!(custom.weft_gso, "example.com/a_b-weft-gso");
    }

    /// The cases of flannel's annotations_test.go.
    #[test]
    fn prefix_rules_match_flannel() {
        let ok = [
            (
                "flannel.alpha.coreos.com",
                "flannel.alpha.coreos.com/public-ip",
            ),
            (
                "flannel.alpha.coreos.com/",
                "flannel.alpha.coreos.com/public-ip",
            ),
            (
                "flannel.alpha.coreos.com/prefix",
                "flannel.alpha.coreos.com/prefix-public-ip",
            ),
            (
                "flannel.alpha.coreos.com/prefix-",
                "flannel.alpha.coreos.com/prefix-public-ip",
            ),
            ("example.com/a_b", "example.com/a_b-public-ip"),
        ];
        for (prefix, want) in ok {
            assert_eq!(
                Annotations::new(prefix).expect(prefix).backend_public_ip,
                want,
                "{prefix}"
            );
        }
        // Go's MatchString is not anchored at the start: "lannel.coreos.com/" matches.
        assert!(Annotations::new("Flannel.coreos.com").is_ok());
        for bad in [
            "flannel.alpha.coreos.com/a/b",
            "flannel",
            "flannel.io/Pre",
            "flannel.io/a.b",
        ] {
            assert!(Annotations::new(bad).is_err(), "{bad} must be rejected");
        }
        let e = Annotations::new("a.b/c/d").expect_err("two slashes");
        assert_eq!(
            e.to_string(),
            "subnet/kube: prefix can contain at most single slash"
        );
    }
}
