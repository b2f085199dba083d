use serde_json::json;
use weft_compat::subnet_env::plugin as subnet_env;

use super::*;
use crate::exec::PluginError;

fn code(e: Error) -> u32 {
    e.to_cni(None).code
}

#[test]
fn codes_for_each_kind() {
    assert_eq!(code(Error::MissingEnv(vec!["CNI_PATH"])), 4);
    assert_eq!(code(Error::Stdin(io::Error::other("x"))), 5);
    assert_eq!(code(Error::MissingName), 7);
    assert_eq!(
        code(Error::Version(VersionError::Incompatible {
            config: "9".into()
        })),
        1
    );
    assert_eq!(code(Error::Version(VersionError::Invalid("x".into()))), 6);
    let missing = subnet_env::load("/nonexistent-weft/subnet.env").expect_err("missing");
    assert_eq!(code(Error::SubnetEnv(missing)), 11);
    let bad = subnet_env::parse("f", "FLANNEL_MTU=x\n".as_bytes()).expect_err("bad");
    assert_eq!(code(Error::SubnetEnv(bad)), 7);
    assert_eq!(code(Error::Delegate(DelegateError::TypeNotString)), 7);
    assert_eq!(
        code(Error::Exec(ExecError::NotFound {
            plugin: "bridge".into(),
            paths: vec![]
        })),
        7
    );
    assert_eq!(
        code(Error::NoSavedConfig {
            container_id: "c".into(),
            path: "p".into()
        }),
        CODE_NO_SAVED_CONFIG
    );
    assert_eq!(code(Error::NotReady(Box::new(Error::MissingName))), 50);
    assert_eq!(
        code(Error::Gc(vec![
            Error::Output(io::Error::other("x")),
            Error::MissingName
        ])),
        5
    );
}

#[test]
fn subnet_env_error_uses_flannel_text() {
    let missing = subnet_env::load("/nonexistent-weft/subnet.env").expect_err("missing");
    assert_eq!(
        Error::SubnetEnv(missing).to_string(),
        "failed to load flannel 'subnet.env' file: open /nonexistent-weft/subnet.env: no such file or directory. Check the flannel pod log for this node."
    );
}

#[test]
fn forbidden_delegate_field_names_key_and_value() {
    let e = Error::Delegate(DelegateError::NameSet { value: json!("x") }).to_cni(Some("0.3.1"));
    assert_eq!(e.code, 2);
    assert_eq!(
        e.msg,
        "'delegate' dictionary must not have 'name' field, it'll be set by flannel"
    );
    assert_eq!(e.details, r#"delegate.name="x""#);
    assert_eq!(e.cni_version.as_deref(), Some("0.3.1"));
}

#[test]
fn delegate_errors_pass_through() {
    let p = PluginError {
        code: 11,
        msg: "busy".into(),
        details: "d".into(),
    };
    let e = Error::Exec(ExecError::Plugin(p)).to_cni(Some("1.0.0"));
    assert_eq!(
        (e.code, e.msg.as_str(), e.details.as_str()),
        (11, "busy", "d")
    );
    let p = PluginError {
        code: 0,
        msg: "netplugin failed".into(),
        details: String::new(),
    };
    assert_eq!(code(Error::Exec(ExecError::Plugin(p))), CODE_INTERNAL);
}

#[test]
fn json_shape_matches_skel() {
    let e = CniError {
        cni_version: Some("1.0.0".into()),
        code: 4,
        msg: "m".into(),
        details: String::new(),
    };
    assert_eq!(
        String::from_utf8(e.to_json()).expect("utf8"),
        "{\n    \"cniVersion\": \"1.0.0\",\n    \"code\": 4,\n    \"msg\": \"m\"\n}\n"
    );
    let e = CniError {
        cni_version: None,
        code: 7,
        msg: "m".into(),
        details: "d".into(),
    };
    let v: serde_json::Value = serde_json::from_slice(&e.to_json()).expect("json");
    assert_eq!(v, json!({"code": 7, "msg": "m", "details": "d"}));
}
