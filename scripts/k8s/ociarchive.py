#!/usr/bin/env python3
"""Packs a root file system (a tar) as an OCI image archive (an image
layout in a tar), reproducibly: entries sorted, times clamped to
SOURCE_DATE_EPOCH, no owner names, gzip without name or time.

Usage: ociarchive.py ROOTFS.tar OUT.tar NAME:TAG ENTRYPOINT... [-- CMD...]
Prints the manifest digest.
"""
import gzip, hashlib, io, json, os, shutil, sys, tarfile, tempfile
rootfs, out, name = sys.argv[1], sys.argv[2], sys.argv[3]
rest = sys.argv[4:]
entrypoint = rest[:rest.index("--")] if "--" in rest else rest
cmd = rest[rest.index("--") + 1:] if "--" in rest else []
tmp = tempfile.mkdtemp()
epoch = int(os.environ.get("SOURCE_DATE_EPOCH", "0"))
layout = os.path.join(tmp, "layout")
blobs = os.path.join(layout, "blobs", "sha256")
os.makedirs(blobs)

def blob(data):
    d = hashlib.sha256(data).hexdigest()
    with open(os.path.join(blobs, d), "wb") as f:
        f.write(data)
    return "sha256:" + d, len(data)

# The root as one layer, its entries sorted and their times clamped.
src = tarfile.open(rootfs)
members = sorted(src.getmembers(), key=lambda m: m.name)
raw = io.BytesIO()
with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as dst:
    for m in members:
        m.mtime = min(m.mtime, epoch)
        m.pax_headers = {}
        m.uname = m.gname = ""
        dst.addfile(m, src.extractfile(m) if m.isfile() else None)
layer = raw.getvalue()
diff_id = "sha256:" + hashlib.sha256(layer).hexdigest()
gz = io.BytesIO()
with gzip.GzipFile(fileobj=gz, mode="wb", mtime=0, filename="") as g:
    g.write(layer)
layer_digest, layer_size = blob(gz.getvalue())
created = __import__("datetime").datetime.fromtimestamp(epoch, __import__("datetime").timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
config = {
    "architecture": "amd64", "os": "linux", "created": created,
    "config": {"Entrypoint": entrypoint, "Cmd": cmd,
               "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8"],
               "WorkingDir": "/var/lib/pysandbox", "ExposedPorts": {"8080/tcp": {}, "8081/tcp": {}}},
    "rootfs": {"type": "layers", "diff_ids": [diff_id]},
    "history": [{"created": created, "created_by": "scripts/k8s/image.sh"}],
}
cfg_digest, cfg_size = blob(json.dumps(config, sort_keys=True, separators=(",", ":")).encode())
manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cfg_digest, "size": cfg_size},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": layer_digest, "size": layer_size}]}
man_digest, man_size = blob(json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode())
ref = name if "/" in name.split(":")[0] or "." in name.split("/")[0] else "docker.io/library/" + name
index = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
         "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": man_digest, "size": man_size,
                        "annotations": {"org.opencontainers.image.ref.name": name.split(":")[-1], "io.containerd.image.name": ref}}]}
with open(os.path.join(layout, "index.json"), "w") as f:
    json.dump(index, f, sort_keys=True, separators=(",", ":"))
with open(os.path.join(layout, "oci-layout"), "w") as f:
    f.write('{"imageLayoutVersion":"1.0.0"}')
with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as t:
    for root, dirs, files in os.walk(layout):
        dirs.sort()
        for fn in sorted(files):
            p = os.path.join(root, fn)
            ti = t.gettarinfo(p, os.path.relpath(p, layout))
            ti.mtime, ti.uid, ti.gid, ti.uname, ti.gname, ti.mode = epoch, 0, 0, "", "", 0o644
            with open(p, "rb") as f:
                t.addfile(ti, f)
print(f"{ref} {man_digest} layer {layer_size >> 20} MiB", file=sys.stderr)
print(man_digest)
shutil.rmtree(tmp)
