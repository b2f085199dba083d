use serde_json::json;

use super::*;

#[test]
fn keys_fold_and_last_duplicate_wins() {
    let m =
        parse_object(br#"{"Network":"10.0.0.0/8","network":"10.3.0.0/16","X":1}"#).expect("valid");
    assert_eq!(m.get("network"), Some(&Value::from("10.3.0.0/16")));
    assert_eq!(m.get("x"), Some(&Value::from(1)));
    assert!(m.get("Network").is_none());
}

#[test]
fn exact_duplicate_then_null_keeps_the_first_value() {
    // serde_json's map would merge these before folding; Go keeps "a".
    let m = parse_object(br#"{"PublicIP":"a","PublicIP":null}"#).expect("valid");
    assert_eq!(m.get("publicip"), Some(&Value::from("a")));
}

#[test]
fn null_leaves_field_untouched() {
    let m = parse_object(br#"{"EnableIPv4":false,"enableipv4":null}"#).expect("valid");
    assert_eq!(m.get("enableipv4"), Some(&Value::Bool(false)));
}

#[test]
fn strict_types() {
    let mut m = parse_object(br#"{"Port":"8472"}"#).expect("valid");
    let err = take::<u16>(&mut m, "port").expect_err("string is not an int");
    assert!(err.to_string().contains("port"), "{err}");
}

#[test]
fn non_object_is_an_error() {
    assert!(matches!(
        parse_object(b"[1]"),
        Err(GoJsonError::NotAnObject("array"))
    ));
    assert!(matches!(parse_object(b"{"), Err(GoJsonError::Syntax(_))));
}

#[test]
fn go_unicode_key_folding() {
    assert_eq!(fold_key("\u{17f}ubnetLen"), "subnetlen");
    assert_eq!(fold_key("Bac\u{212a}end"), "backend");
    // Other non-ASCII runes never fold to ASCII.
    assert_eq!(fold_key("Ébc"), "Ébc");
}

#[test]
fn lookup_fold_last_match_wins() {
    let v = json!({"subnetFile": "a", "SUBNETFILE": "b", "other": 1});
    let map = v.as_object().expect("object");
    assert_eq!(lookup_fold(map, "subnetFile"), Some(&json!("b")));
    assert_eq!(lookup_fold(map, "missing"), None);
}

#[test]
fn lookup_fold_folds_like_go() {
    // The same folding as the decoder's: `ſ` is `s`, the Kelvin sign `k`.
    let v = json!({"\u{17f}ubnetFile": "a", "\u{212a}ind": "b"});
    let map = v.as_object().expect("object");
    assert_eq!(lookup_fold(map, "subnetFile"), Some(&json!("a")));
    assert_eq!(lookup_fold(map, "kind"), Some(&json!("b")));
    assert_eq!(lookup_fold(map, "subnetFil"), None);
}

#[test]
fn field_errors_are_go_unmarshal_type_errors() {
    let raw = |t: &str| RawValue::from_string(t.to_string()).expect("raw JSON");
    let f = Field {
        strukt: "Config",
        name: "SubnetLen",
    };
    assert_eq!(f.uint(&raw("24")), Ok(Some(24)));
    assert_eq!(f.uint(&raw("null")), Ok(None));
    assert_eq!(
        f.uint(&raw("24.5")).expect_err("float").to_string(),
        "json: cannot unmarshal number 24.5 into Go struct field Config.SubnetLen of type uint"
    );
    assert_eq!(
        f.bool(&raw("\"true\"")).expect_err("string").to_string(),
        "json: cannot unmarshal string into Go struct field Config.SubnetLen of type bool"
    );
    assert_eq!(f.int(&raw("-3"), "int"), Ok(Some(-3)));
    assert_eq!(unmarshaler_text(&raw(r#""10.3.0.0\/16""#)), r"10.3.0.0\/16");
}

#[test]
fn marshal_is_go_compatible() {
    let v = sorted(json!({"b": 1.0, "a": {"z": "<&>", "y": [0.5, 2]}}));
    assert_eq!(
        String::from_utf8(marshal(&v)).expect("utf8"),
        r#"{"a":{"y":[0.5,2],"z":"\u003c\u0026\u003e"},"b":1}"#
    );
}
