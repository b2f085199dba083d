//! VICI codec: the README's example byte for byte, round trips, and
//! fuzz-style checks that no input panics.

use super::*;

/// The example message of strongSwan's vici README.
fn readme_message() -> Section {
    Section::new().kv("key1", "value1").section(
        "section1",
        Section::new()
            .section("sub-section", Section::new().kv("key2", "value2"))
            .list("list1", &["item1", "item2"]),
    )
}

fn readme_bytes() -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&[3, 4]);
    b.extend_from_slice(b"key1");
    b.extend_from_slice(&[0, 6]);
    b.extend_from_slice(b"value1");
    b.extend_from_slice(&[1, 8]);
    b.extend_from_slice(b"section1");
    b.extend_from_slice(&[1, 11]);
    b.extend_from_slice(b"sub-section");
    b.extend_from_slice(&[3, 4]);
    b.extend_from_slice(b"key2");
    b.extend_from_slice(&[0, 6]);
    b.extend_from_slice(b"value2");
    b.push(2);
    b.extend_from_slice(&[4, 5]);
    b.extend_from_slice(b"list1");
    b.extend_from_slice(&[5, 0, 5]);
    b.extend_from_slice(b"item1");
    b.extend_from_slice(&[5, 0, 5]);
    b.extend_from_slice(b"item2");
    b.push(6);
    b.push(2);
    b
}

#[test]
fn encodes_the_readme_example_exactly() {
    let p = Packet::Request("cmd".into(), readme_message())
        .encode()
        .expect("encode");
    let body = &p[4..];
    assert_eq!(
        u32::from_be_bytes([p[0], p[1], p[2], p[3]]) as usize,
        body.len()
    );
    assert_eq!(&body[..5], &[0, 3, b'c', b'm', b'd']);
    assert_eq!(&body[5..], readme_bytes().as_slice());
    assert_eq!(
        Packet::decode(body).expect("decode"),
        Packet::Request("cmd".into(), readme_message())
    );
}

#[test]
fn every_packet_type_round_trips() {
    let m = readme_message();
    for p in [
        Packet::Request("load-conn".into(), m.clone()),
        Packet::Response(Section::new().kv("success", "yes")),
        Packet::Unknown,
        Packet::EventRegister("ike-updown".into()),
        Packet::EventUnregister("ike-updown".into()),
        Packet::EventConfirm,
        Packet::EventUnknown,
        Packet::Event("log".into(), m.clone()),
        Packet::Response(Section::new()),
    ] {
        let bytes = p.encode().expect("encode");
        assert_eq!(Packet::decode(&bytes[4..]).expect("decode"), p);
    }
    assert_eq!(
        m.get("section1")
            .and_then(|v| if let Value::Section(s) = v {
                s.str("x")
            } else {
                None
            }),
        None
    );
    assert_eq!(m.str("key1").as_deref(), Some("value1"));
}

#[test]
fn refuses_what_cannot_be_encoded() {
    let long = "k".repeat(256);
    assert!(matches!(
        Packet::Request(long.clone(), Section::new()).encode(),
        Err(ViciError::TooLong("name"))
    ));
    assert!(matches!(
        Packet::Response(Section::new().kv(&long, "v")).encode(),
        Err(ViciError::TooLong("name"))
    ));
    let big = "v".repeat(65536);
    assert!(matches!(
        Packet::Response(Section::new().kv("k", &big)).encode(),
        Err(ViciError::TooLong("value"))
    ));
    let many: Vec<String> = (0..10).map(|_| "v".repeat(60000)).collect();
    let refs: Vec<&str> = many.iter().map(String::as_str).collect();
    assert!(matches!(
        Packet::Response(Section::new().list("l", &refs)).encode(),
        Err(ViciError::Oversized(_))
    ));
}

#[test]
fn malformed_input_is_an_error_not_a_panic() {
    let body = Packet::Request("cmd".into(), readme_message())
        .encode()
        .expect("encode")[4..]
        .to_vec();
    // Every truncation of a valid packet either decodes to something shorter
    // (a cut exactly between elements) or fails.
    for n in 0..body.len() {
        if let Ok(Packet::Request(_, m)) = Packet::decode(&body[..n]) {
            assert_ne!(m, readme_message());
        }
    }
    for bad in [
        &[][..],
        &[9],                   // unknown packet type
        &[1, 7],                // unknown element
        &[1, 2],                // SECTION_END at top level
        &[1, 1, 1, b'a'],       // unterminated section
        &[1, 4, 1, b'l', 5, 0], // list item without its value
        &[1, 4, 1, b'l', 3],    // key-value inside a list
        &[1, 3, 5, b'a'],       // name longer than the rest
        &[2, 0],                // trailing byte after CMD_UNKNOWN
        &[0, 2, 0xff, 0xfe],    // name not UTF-8
    ] {
        assert!(Packet::decode(bad).is_err(), "{bad:?}");
    }
    let deep: Vec<u8> = std::iter::once(1u8)
        .chain((0..=MAX_DEPTH + 1).flat_map(|_| [1u8, 1, b's']))
        .collect();
    assert!(matches!(
        Packet::decode(&deep),
        Err(ViciError::Malformed("nesting too deep"))
    ));
    // Pseudo-random bytes (xorshift) and single-byte mutations of a valid packet.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for _ in 0..20_000 {
        let len = (next() % 64) as usize;
        let junk: Vec<u8> = (0..len).map(|_| (next() % 8) as u8).collect();
        let _ = Packet::decode(&junk);
        let mut m = body.clone();
        let i = (next() as usize) % m.len();
        m[i] = next() as u8;
        let _ = Packet::decode(&m);
    }
}

#[tokio::test]
async fn client_talks_to_a_socket_peer() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("vici");
    let listener = tokio::net::UnixListener::bind(&path).expect("bind");
    let server = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.expect("accept");
        let mut seen = Vec::new();
        for answer in [
            Packet::Response(Section::new().kv("success", "yes")),
            Packet::Response(
                Section::new()
                    .kv("success", "no")
                    .kv("errmsg", "bad proposal"),
            ),
            Packet::Unknown,
        ] {
            let mut len = [0u8; 4];
            s.read_exact(&mut len).await.expect("len");
            let mut body = vec![0u8; u32::from_be_bytes(len) as usize];
            s.read_exact(&mut body).await.expect("body");
            seen.push(Packet::decode(&body).expect("decode"));
            s.write_all(&answer.encode().expect("encode"))
                .await
                .expect("write");
        }
        seen
    });
    let mut c = ViciClient::connect(&path).await.expect("connect");
    c.call("load-shared", Section::new().kv("type", "IKE"))
        .await
        .expect("ok");
    let e = c.call("load-conn", Section::new()).await.expect_err("no");
    assert_eq!(e.to_string(), "vici load-conn: bad proposal");
    assert!(
        matches!(c.call("nope", Section::new()).await, Err(ViciError::UnknownCommand(c)) if c == "nope")
    );
    let seen = server.await.expect("server");
    assert_eq!(
        seen[0],
        Packet::Request("load-shared".into(), Section::new().kv("type", "IKE"))
    );
    assert!(ViciClient::connect(&dir.path().join("none")).await.is_err());
}
