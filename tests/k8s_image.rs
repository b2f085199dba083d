//! weft's node image: the one layout (scripts/image/layout) that both
//! builds follow, deploy/Dockerfile (registry) and scripts/image.sh
//! (offline, from Debian packages), and the tarball image.sh writes.
//!
//! The first tests are static (no root): the Dockerfile's apt-get, cargo
//! build, COPY and RUN lines are exactly the layout's. The last builds the
//! image from this build's binaries, unpacks the tarball it wrote and runs
//! the layout's checks inside it, and builds it again to show the bytes are
//! the same.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("repo root")
        .to_path_buf()
}

/// Prints a figure as tests/support/k8s does (`k8s figure: <name>: <value>`).
fn figure(name: &str, value: impl std::fmt::Display) {
    eprintln!("k8s figure: {name}: {value}");
}

/// scripts/image/layout, parsed: (kind, words) per line, comments dropped.
fn layout() -> Vec<(String, Vec<String>)> {
    let text =
        std::fs::read_to_string(repo().join("scripts/image/layout")).expect("scripts/image/layout");
    text.lines()
        .map(|l| l.split('#').next().unwrap_or_default())
        .filter_map(|l| {
            let mut w = l.split_whitespace().map(str::to_string);
            let kind = w.next()?;
            Some((kind, w.collect()))
        })
        .collect()
}

fn of_kind(kind: &str) -> Vec<Vec<String>> {
    layout()
        .into_iter()
        .filter(|(k, _)| k == kind)
        .map(|(_, w)| w)
        .collect()
}

/// The Dockerfile with `\`-continued lines joined.
fn dockerfile() -> Vec<String> {
    let text = std::fs::read_to_string(repo().join("deploy/Dockerfile")).expect("Dockerfile");
    let mut lines = Vec::new();
    let mut cur = String::new();
    for l in text.lines() {
        if l.trim_start().starts_with('#') && cur.is_empty() {
            continue;
        }
        if let Some(head) = l.strip_suffix('\\') {
            cur += head;
            cur.push(' ');
        } else {
            cur += l;
            lines.push(std::mem::take(&mut cur));
        }
    }
    lines
}

/// The lines of the Dockerfile's last stage (the image itself).
fn final_stage() -> Vec<String> {
    let all = dockerfile();
    let from = all
        .iter()
        .rposition(|l| l.starts_with("FROM "))
        .expect("FROM");
    all[from..].to_vec()
}

#[test]
fn layout_has_only_known_kinds_and_its_sources_exist() {
    let l = layout();
    assert!(!l.is_empty());
    for (kind, words) in &l {
        match kind.as_str() {
            "deb" => assert_eq!(words.len(), 1, "deb {words:?}"),
            "bin" => {
                assert_eq!(words.len(), 3, "bin {words:?}");
                let (krate, bin) = (&words[0], &words[1]);
                let dir = member_dir(krate);
                let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).expect("Cargo.toml");
                assert!(
                    manifest.contains(&format!("name = \"{bin}\"")),
                    "{krate} has no binary {bin}"
                );
                assert!(
                    words[2].starts_with('/'),
                    "bin {words:?}: absolute destination"
                );
            }
            "file" => {
                assert_eq!(words.len(), 3, "file {words:?}");
                assert!(
                    repo().join(&words[0]).is_file(),
                    "file {} missing",
                    words[0]
                );
                assert!(
                    u32::from_str_radix(&words[2], 8).is_ok(),
                    "file mode {}",
                    words[2]
                );
            }
            "setup" | "check" => assert!(!words.is_empty(), "{kind} without a command"),
            other => panic!("unknown layout kind {other}"),
        }
    }
    // What the DaemonSet runs is in the image.
    let manifest =
        std::fs::read_to_string(repo().join("deploy/kube-flannel.yml")).expect("manifest");
    let dests: BTreeSet<String> = of_kind("bin").into_iter().map(|w| w[2].clone()).collect();
    for p in ["/opt/bin/flanneld", "/opt/bin/install-conf", "/flannel"] {
        assert!(manifest.contains(p), "the manifest no longer runs {p}");
        assert!(
            dests.contains(p),
            "the layout lacks {p}, which the manifest runs"
        );
    }
    let checks: Vec<String> = of_kind("check").into_iter().map(|w| w.join(" ")).collect();
    assert!(
        checks.iter().any(|c| c == "test -x /bin/cp"),
        "the install-cni-plugin init container runs cp"
    );
}

/// The workspace member that is cargo package `name`.
fn member_dir(name: &str) -> PathBuf {
    for e in std::fs::read_dir(repo()).expect("repo").flatten() {
        let m = e.path().join("Cargo.toml");
        if std::fs::read_to_string(&m).is_ok_and(|t| t.contains(&format!("name = \"{name}\""))) {
            return e.path();
        }
    }
    panic!("no workspace member {name}")
}

#[test]
fn dockerfile_installs_the_layouts_packages() {
    let stage = final_stage();
    let install = stage
        .iter()
        .find(|l| l.contains("apt-get install"))
        .expect("apt-get install in the final stage");
    let words: Vec<&str> = install.split_whitespace().collect();
    let at = words.iter().position(|w| *w == "install").expect("install");
    let pkgs: BTreeSet<String> = words[at + 1..]
        .iter()
        .take_while(|w| **w != "&&")
        .filter(|w| !w.starts_with('-'))
        .map(|w| w.to_string())
        .collect();
    let want: BTreeSet<String> = of_kind("deb").into_iter().map(|w| w[0].clone()).collect();
    assert_eq!(
        pkgs, want,
        "deploy/Dockerfile's apt-get install must list exactly scripts/image/layout's deb lines"
    );
}

#[test]
fn dockerfile_builds_and_copies_the_layouts_binaries_and_files() {
    let all = dockerfile();
    let build = all
        .iter()
        .find(|l| l.contains("cargo build"))
        .expect("cargo build line");
    // -p CRATE --bin A --bin B -p CRATE2 --bin C
    let mut built = BTreeSet::new();
    let mut krate = String::new();
    let words: Vec<&str> = build.split_whitespace().collect();
    for w in words.windows(2) {
        match w[0] {
            "-p" => krate = w[1].to_string(),
            "--bin" => {
                built.insert((krate.clone(), w[1].to_string()));
            }
            _ => {}
        }
    }
    let bins = of_kind("bin");
    let want: BTreeSet<(String, String)> =
        bins.iter().map(|w| (w[0].clone(), w[1].clone())).collect();
    assert_eq!(
        built, want,
        "cargo build in the Dockerfile vs the layout's bin lines"
    );

    let stage = final_stage();
    let mut copied = BTreeSet::new();
    let mut files = BTreeSet::new();
    for l in stage.iter().filter(|l| l.starts_with("COPY ")) {
        let p: Vec<&str> = l.split_whitespace().collect();
        match p.as_slice() {
            ["COPY", "--from=build", src, dest] => {
                let b = src.strip_prefix("/out/").expect("binaries come from /out/");
                copied.insert((b.to_string(), dest.to_string()));
            }
            ["COPY", src, dest] => {
                files.insert((src.to_string(), dest.to_string()));
            }
            _ => panic!("unexpected COPY line {l}"),
        }
    }
    let want: BTreeSet<(String, String)> =
        bins.iter().map(|w| (w[1].clone(), w[2].clone())).collect();
    assert_eq!(
        copied, want,
        "the Dockerfile's COPY --from=build lines vs the layout"
    );
    let mut want: BTreeSet<(String, String)> = of_kind("file")
        .into_iter()
        .map(|w| (w[0].clone(), w[1].clone()))
        .collect();
    want.insert(("scripts/image/layout".into(), "/tmp/image/layout".into()));
    want.insert((
        "scripts/image/apply.sh".into(),
        "/tmp/image/apply.sh".into(),
    ));
    assert_eq!(
        files, want,
        "the Dockerfile's COPY lines vs the layout's file lines"
    );
    let run = stage.join("\n");
    for w in of_kind("file") {
        assert!(
            run.contains(&format!("chmod {} {}", w[2], w[1])),
            "the Dockerfile must chmod {} {}",
            w[2],
            w[1]
        );
    }
    for kind in ["setup", "check"] {
        assert!(
            run.contains(&format!("sh /tmp/image/apply.sh /tmp/image/layout {kind}")),
            "the Dockerfile must run the layout's {kind} lines"
        );
    }
    assert!(run.contains("ENTRYPOINT [\"/opt/bin/flanneld\"]"));
}

#[test]
fn image_script_reads_the_layout() {
    let script = std::fs::read_to_string(repo().join("scripts/image.sh")).expect("image.sh");
    assert!(script.contains("scripts/image/layout"));
    for kind in ["bin", "file", "deb"] {
        assert!(
            script.contains(&format!("layout {kind}")),
            "image.sh must read the layout's {kind} lines"
        );
    }
    for kind in ["setup", "check"] {
        assert!(
            script.contains(&format!("/tmp/apply.sh /tmp/layout {kind}")),
            "image.sh must run the layout's {kind} lines"
        );
    }
    for (shell, s) in [
        ("bash", "scripts/image.sh"),
        ("sh", "scripts/image/apply.sh"),
    ] {
        let out = Command::new(shell)
            .arg("-n")
            .arg(repo().join(s))
            .output()
            .expect("sh");
        assert!(
            out.status.success(),
            "{s}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

fn sha256(p: &Path) -> String {
    let out = Command::new("sha256sum")
        .arg(p)
        .output()
        .expect("sha256sum");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string()
}

/// Builds the image from this build's binaries with scripts/image.sh,
/// checks the tarball's two indexes (OCI and docker-archive), unpacks its
/// layer and runs every `check` line of the layout inside it, and builds it
/// again: the same inputs give the same bytes.
#[test]
fn image_sh_builds_the_layout_reproducibly() {
    weft_testenv::require_root!();
    weft_testenv::require_tool!("python3", "/usr/bin/python3", "python3");
    weft_testenv::require_tool!("strip", "/usr/bin/strip", "binutils");
    let dir = tempfile::Builder::new()
        .prefix("weft-image-test-")
        .tempdir_in("/var/tmp")
        .expect("tempdir");
    let bins = weft_tests::bins::dir();
    for b in ["weftd", "install-conf", "flannel"] {
        weft_tests::bins::path(b);
    }
    let build = |out: &Path| {
        let t = std::time::Instant::now();
        let o = Command::new("bash")
            .arg(repo().join("scripts/image.sh"))
            .args(["--ref", "weft.local/weft:test", "--bin-dir"])
            .arg(&bins)
            .arg("--out")
            .arg(out)
            .output()
            .expect("image.sh");
        assert!(
            o.status.success(),
            "scripts/image.sh: {}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        figure(
            "scripts/image.sh (debs cached)",
            format!("{:.1} s", t.elapsed().as_secs_f64()),
        );
    };
    let a = dir.path().join("a.tar");
    build(&a);
    let size = std::fs::metadata(&a).expect("image").len();
    figure(
        "weft image size",
        format!("{:.1} MiB", size as f64 / 1048576.0),
    );

    // Both indexes name the image and point at the same config and layer.
    let x = dir.path().join("x");
    std::fs::create_dir(&x).expect("mkdir");
    let st = Command::new("tar")
        .arg("-xf")
        .arg(&a)
        .arg("-C")
        .arg(&x)
        .status()
        .expect("tar");
    assert!(st.success());
    let read = |p: &str| -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(x.join(p)).unwrap_or_else(|e| panic!("{p}: {e}")))
            .unwrap_or_else(|e| panic!("{p}: {e}"))
    };
    let docker = read("manifest.json");
    assert_eq!(docker[0]["RepoTags"][0], "weft.local/weft:test");
    let layer = docker[0]["Layers"][0].as_str().expect("layer").to_string();
    let index = read("index.json");
    assert_eq!(
        index["manifests"][0]["annotations"]["io.containerd.image.name"],
        "weft.local/weft:test"
    );
    let mdigest = index["manifests"][0]["digest"].as_str().expect("digest");
    let manifest = read(&format!("blobs/sha256/{}", &mdigest[7..]));
    assert_eq!(
        format!(
            "blobs/sha256/{}",
            &manifest["layers"][0]["digest"].as_str().expect("layer")[7..]
        ),
        layer
    );
    assert_eq!(
        format!(
            "blobs/sha256/{}",
            &manifest["config"]["digest"].as_str().expect("cfg")[7..]
        ),
        docker[0]["Config"].as_str().expect("Config")
    );
    let config = read(docker[0]["Config"].as_str().expect("Config"));
    assert_eq!(config["config"]["Entrypoint"][0], "/opt/bin/flanneld");
    assert_eq!(
        config["rootfs"]["diff_ids"][0].as_str().expect("diff_id"),
        format!("sha256:{}", sha256(&x.join(&layer)))
    );

    // The layer holds the layout: its checks pass inside it.
    let root = dir.path().join("root");
    std::fs::create_dir(&root).expect("mkdir");
    let st = Command::new("tar")
        .arg("-xf")
        .arg(x.join(&layer))
        .arg("-C")
        .arg(&root)
        .status()
        .expect("tar");
    assert!(st.success());
    std::fs::copy(repo().join("scripts/image/layout"), root.join("tmp/layout")).expect("copy");
    std::fs::copy(
        repo().join("scripts/image/apply.sh"),
        root.join("tmp/apply.sh"),
    )
    .expect("copy");
    let out = Command::new("chroot")
        .arg(&root)
        .args(["/bin/sh", "/tmp/apply.sh", "/tmp/layout", "check"])
        .output()
        .expect("chroot");
    assert!(
        out.status.success(),
        "the layout's checks inside the built image: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let pkgs =
        std::fs::read_to_string(root.join("usr/share/weft/image-packages")).expect("packages");
    for w in of_kind("deb") {
        assert!(
            pkgs.lines().any(|l| l.starts_with(&format!("{}=", w[0]))),
            "{} is not in the image",
            w[0]
        );
    }
    // The wrapper picks the backend at first use: its links point at it.
    let link = std::fs::read_link(root.join("usr/sbin/iptables")).expect("iptables link");
    assert_eq!(link, Path::new("/usr/sbin/iptables-wrapper"));

    // Reproducible: a second build gives the same bytes.
    let b = dir.path().join("b.tar");
    build(&b);
    assert_eq!(
        sha256(&a),
        sha256(&b),
        "two builds of the same inputs differ"
    );
}
