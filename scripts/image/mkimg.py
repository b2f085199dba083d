#!/usr/bin/env python3
"""mkimg.py REF ROOTFS OUT.tar [--entrypoint JSON] [--cmd JSON] [--env K=V]... [--label K=V]...

Packs the directory ROOTFS as a one-layer container image in one tarball that is both an OCI image
layout (oci-layout, index.json, blobs/sha256/...) and a docker-archive (manifest.json with RepoTags
pointing at the same blobs), the format `docker save` writes since Docker 25: `ctr images import`,
`docker load`, podman and skopeo (oci-archive: or docker-archive:) all accept it.

Reproducible: entries sorted, owner 0:0, every mtime SOURCE_DATE_EPOCH (default 0), no compression,
so the same ROOTFS gives the same bytes (and image digest)."""
import argparse, hashlib, io, json, os, stat, tarfile

ap = argparse.ArgumentParser()
ap.add_argument("ref")
ap.add_argument("rootfs")
ap.add_argument("out")
ap.add_argument("--cmd", default="null")
ap.add_argument("--entrypoint", default="null")
ap.add_argument("--env", action="append",
                default=["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"])
ap.add_argument("--label", action="append", default=[])
a = ap.parse_args()
epoch = int(os.environ.get("SOURCE_DATE_EPOCH", "0"))


def reset(ti):
    ti.uid = ti.gid = 0
    ti.uname = ti.gname = ""
    ti.mtime = epoch
    return ti


# The layer: every path of ROOTFS, parents before children, names sorted.
lb = io.BytesIO()
with tarfile.open(fileobj=lb, mode="w", format=tarfile.GNU_FORMAT) as t:
    for root, dirs, files in os.walk(a.rootfs):
        dirs.sort()
        for n in sorted(dirs + files):
            p = os.path.join(root, n)
            st = os.lstat(p)
            if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode) or stat.S_ISLNK(st.st_mode)):
                raise SystemExit(f"mkimg.py: {p}: only files, directories and symlinks go into an image")
            t.add(p, arcname=os.path.relpath(p, a.rootfs), recursive=False, filter=reset)
layer = lb.getvalue()
lsha = hashlib.sha256(layer).hexdigest()

name, _, tag = a.ref.rpartition(":")
if "/" in tag or not name:
    name, tag = a.ref, "latest"
labels = dict(kv.split("=", 1) for kv in a.label)
cfg = {
    "architecture": "amd64",
    "os": "linux",
    "created": "1970-01-01T00:00:00Z" if epoch == 0 else None,
    "config": {"Env": a.env, "Cmd": json.loads(a.cmd), "Entrypoint": json.loads(a.entrypoint),
               "WorkingDir": "/", "Labels": labels or None},
    "rootfs": {"type": "layers", "diff_ids": ["sha256:" + lsha]},
    "history": [{"created_by": "scripts/image/mkimg.py"}],
}
if cfg["created"] is None:
    import datetime
    cfg["created"] = datetime.datetime.fromtimestamp(epoch, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def blob(data):
    return data, hashlib.sha256(data).hexdigest()


cb, csha = blob(json.dumps(cfg, sort_keys=True).encode())
manifest = {
    "schemaVersion": 2,
    "mediaType": "application/vnd.oci.image.manifest.v1+json",
    "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": "sha256:" + csha,
               "size": len(cb)},
    "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": "sha256:" + lsha,
                "size": len(layer)}],
}
mb, msha = blob(json.dumps(manifest, sort_keys=True).encode())
index = {
    "schemaVersion": 2,
    "mediaType": "application/vnd.oci.image.index.v1+json",
    "manifests": [{"mediaType": manifest["mediaType"], "digest": "sha256:" + msha, "size": len(mb),
                   "annotations": {"io.containerd.image.name": f"{name}:{tag}",
                                   "org.opencontainers.image.ref.name": tag}}],
}
docker = [{"Config": "blobs/sha256/" + csha, "RepoTags": [f"{name}:{tag}"],
           "Layers": ["blobs/sha256/" + lsha]}]

tmp = a.out + ".tmp"
with tarfile.open(tmp, "w", format=tarfile.GNU_FORMAT) as t:
    def add(path, data=None):
        ti = reset(tarfile.TarInfo(path))
        if data is None:
            ti.type, ti.mode = tarfile.DIRTYPE, 0o755
            t.addfile(ti)
        else:
            ti.size, ti.mode = len(data), 0o644
            t.addfile(ti, io.BytesIO(data))
    add("blobs")
    add("blobs/sha256")
    for data, sha in sorted([(layer, lsha), (cb, csha), (mb, msha)], key=lambda x: x[1]):
        add("blobs/sha256/" + sha, data)
    add("index.json", json.dumps(index, sort_keys=True).encode())
    add("manifest.json", json.dumps(docker, sort_keys=True).encode())
    add("oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
os.replace(tmp, a.out)
print(f"{a.out}: {name}:{tag} manifest sha256:{msha} config sha256:{csha} layer {len(layer)} bytes")
