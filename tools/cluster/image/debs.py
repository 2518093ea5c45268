"""Debian 12 packages: resolved with apt-cache (version and sha256, memoised per apt state), downloaded
once with apt-get, unpacked with dpkg-deb; and the two layers made of them: base (busybox, dash,
python3.11-minimal, the accounts; the utility image is this layer alone) and the rest of the Python
standard library."""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tools.cluster import build
from tools.cluster.image.common import ImageError, atomic_write, file_sha256, images_dir, sha
from tools.cluster.image.layers import Entry

# Debian 12 packages, by layer. Versions are not pinned here (the archive drops superseded versions);
# the versions and sha256 apt-cache reports are part of every cache key, and a different candidate
# builds anew. Left out on purpose: libnsl2/libtirpc3 (only the stdlib's `nis` module needs them) and
# ca-certificates (nothing in a test pod reaches TLS endpoints; certifi ships its own bundle).
BASE_PACKAGES = (
    "libc6",
    "zlib1g",
    "libssl3",
    "libexpat1",
    "python3.11-minimal",
    "libpython3.11-minimal",
    "busybox-static",
    "dash",
    "netbase",
)
STDLIB_PACKAGES = (
    "libpython3.11-stdlib",
    "libgcc-s1",
    "libstdc++6",
    "libffi8",
    "libbz2-1.0",
    "liblzma5",
    "libsqlite3-0",
    "libuuid1",
    "libcrypt1",
    "libncursesw6",
    "libtinfo6",
    "libreadline8",
    "readline-common",
    "libdb5.3",
    "media-types",
    "tzdata",
)
DEB_SKIP = ("usr/share/man/*", "usr/share/info/*", "usr/share/lintian/*", "usr/share/doc/*")


@dataclass(frozen=True)
class Deb:
    package: str
    version: str
    sha256: str

    @property
    def pin(self) -> str:
        return f"{self.package}={self.version}"


def _apt_state() -> str:
    """Changes whenever apt's package lists or configuration change (cheap: stat only)."""
    h = hashlib.sha256()
    for folder in ("/var/lib/apt/lists", "/etc/apt", "/etc/apt/sources.list.d", "/etc/apt/preferences.d"):
        with contextlib.suppress(OSError):
            for name in sorted(os.listdir(folder)):
                with contextlib.suppress(OSError):
                    st = os.stat(os.path.join(folder, name))
                    h.update(f"{folder}/{name} {st.st_size} {st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:16]


def resolve_debs(packages: Iterable[str]) -> list[Deb]:
    """The candidate version and sha256 of each package, from apt-cache (memoised per apt state)."""
    names = sorted(set(packages))
    memo = images_dir() / "apt" / f"{_apt_state()}-{sha(' '.join(names))[:16]}.json"
    if memo.is_file():
        return [Deb(**d) for d in json.loads(memo.read_text())]
    if shutil.which("apt-cache") is None:
        raise ImageError("apt-cache not found: the test images are built from Debian packages (a Debian machine)")
    proc = subprocess.run(
        ["apt-cache", "show", "--no-all-versions", *names], capture_output=True, text=True, env=_apt_env()
    )
    found: dict[str, Deb] = {}
    for stanza in proc.stdout.split("\n\n"):
        fields = dict(re.findall(r"^([A-Za-z0-9-]+): (.*)$", stanza, re.M))
        if fields.get("Package") in names and "SHA256" in fields:
            found.setdefault(fields["Package"], Deb(fields["Package"], fields["Version"], fields["SHA256"]))
    missing = [n for n in names if n not in found]
    if missing:
        raise ImageError(f"apt-cache knows no {', '.join(missing)}: run `apt-get update` (Debian 12 packages)")
    debs = [found[n] for n in names]
    atomic_write(memo, json.dumps([d.__dict__ for d in debs]).encode())
    return debs


def _apt_env() -> dict[str, str]:
    return {**os.environ, "LC_ALL": "C"}


def fetch_debs(debs: list[Deb]) -> dict[str, Path]:
    """The .deb file of each package, downloaded once with `apt-get download` and checked by sha256."""
    folder = build.cache_root() / "debs"
    folder.mkdir(parents=True, exist_ok=True)
    paths = {d.package: folder / f"{d.package}_{d.sha256[:16]}.deb" for d in debs}
    todo = [d for d in debs if not paths[d.package].is_file()]
    if todo:
        with tempfile.TemporaryDirectory(dir=folder, prefix=".download-") as tmp:
            proc = build.run_with_progress(
                ["apt-get", "download", *(d.pin for d in todo)],
                f"image: apt-get download of {len(todo)} packages",
                doing="downloading",
                cwd=tmp,
                capture_output=True,
                text=True,
                env=_apt_env(),
            )
            if proc.returncode != 0:
                raise ImageError(f"apt-get download failed: {proc.stderr.strip().splitlines()[-1:]}")
            files = {p.name.split("_", 1)[0]: p for p in Path(tmp).glob("*.deb")}
            for d in todo:
                got = files.get(d.package)
                if got is None or file_sha256(got) != d.sha256:
                    raise ImageError(f"apt-get download {d.pin}: no file or a sha256 other than apt-cache's")
                os.replace(got, paths[d.package])
    return paths


def deb_entries(deb: Path) -> Iterator[tuple[tarfile.TarInfo, bytes]]:
    """The members of a package's data archive (`dpkg-deb --fsys-tarfile`), documentation left out."""
    proc = subprocess.run(["dpkg-deb", "--fsys-tarfile", str(deb)], capture_output=True)
    if proc.returncode != 0:
        raise ImageError(f"dpkg-deb --fsys-tarfile {deb}: {proc.stderr.decode().strip()}")
    contents: dict[str, bytes] = {}
    with tarfile.open(fileobj=io.BytesIO(proc.stdout), mode="r:") as tar:
        for m in tar:
            name = m.name.removeprefix("./").strip("/")
            if not name or any(fnmatch.fnmatch(name, p) for p in DEB_SKIP):
                continue
            data = b""
            if m.isreg():
                f = tar.extractfile(m)
                data = f.read() if f else b""
                contents[name] = data
            elif m.islnk():  # hard link: a copy of the file it names
                data = contents[m.linkname.removeprefix("./").strip("/")]
                m.type, m.size = tarfile.REGTYPE, len(data)
            m.name = name
            yield m, data


def debs_layer(debs: list[Deb]) -> list[Entry]:
    paths = fetch_debs(debs)
    entries: list[Entry] = []
    for d in debs:
        for m, data in deb_entries(paths[d.package]):
            if m.isdir():
                entries.append(Entry(m.name, "dir", m.mode & 0o7777))
            elif m.issym():
                entries.append(Entry(m.name, "symlink", 0o777, target=m.linkname))
            elif m.isreg():
                entries.append(Entry(m.name, "file", m.mode & 0o7777, data=data))
    return entries


NSLOOKUP = '''#!/usr/bin/python3.11
"""nslookup NAME: resolve NAME with the C library's resolver (the pod's resolv.conf search list),
print its address and exit 0, or exit 1. Stands in for busybox's nslookup, which fails whenever one
search-list variant of the name is NXDOMAIN although the name itself resolves."""
import socket
import sys

if len(sys.argv) != 2:
    sys.exit("usage: nslookup NAME")
try:
    address = socket.gethostbyname(sys.argv[1])
except OSError as e:
    print(f"nslookup: can't resolve '{sys.argv[1]}': {e}", file=sys.stderr)
    sys.exit(1)
print(f"Name:\\t{sys.argv[1]}\\nAddress: {address}")
'''


def _accounts(account: dict[str, Any]) -> list[Entry]:
    name, uid, gid, home = account["name"], account["uid"], account["gid"], account["home"]
    passwd = "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
    passwd += f"{name}:x:{uid}:{gid}::{home}:{account['shell']}\n"
    group = f"root:x:0:\nnogroup:x:65534:\n{name}:x:{gid}:\n"
    entries = [
        Entry("etc/passwd", "file", 0o644, data=passwd.encode()),
        Entry("etc/group", "file", 0o644, data=group.encode()),
        Entry("etc/nsswitch.conf", "file", 0o644, data=b"passwd: files\ngroup: files\nhosts: files dns\n"),
        Entry("root", "dir", 0o700),
    ]
    if account["create_home"]:
        entries.append(Entry(home.strip("/"), "dir", 0o750, uid=uid, gid=gid))
    return entries


def _busybox_links(busybox: bytes, taken: set[str]) -> list[Entry]:
    """A link per busybox applet (as `busybox --install -s`), except where a package put a file, sh
    (dash) and nslookup (the Python one)."""
    with tempfile.NamedTemporaryFile(prefix="busybox-", delete=False) as f:
        f.write(busybox)
    try:
        os.chmod(f.name, 0o755)
        listing = subprocess.run([f.name, "--list-full"], capture_output=True, text=True, check=True).stdout
    finally:
        os.unlink(f.name)
    entries = []
    for path in listing.split():
        name = path.rsplit("/", 1)[-1]
        if path in taken or name in {"sh", "nslookup", "busybox", "linuxrc"}:
            continue
        entries.append(Entry(path, "symlink", 0o777, target="/bin/busybox"))
    return entries


def base_layer(account: dict[str, Any]) -> Callable[[], list[Entry]]:
    def make() -> list[Entry]:
        entries = debs_layer(resolve_debs(BASE_PACKAGES))
        taken = {e.path for e in entries}
        busybox = next(e.data for e in entries if e.path == "bin/busybox" and e.data)
        entries += _busybox_links(busybox, taken)
        entries += [
            Entry("bin/sh", "symlink", 0o777, target="dash"),
            Entry("bin/nslookup", "file", 0o755, data=NSLOOKUP.encode()),
            Entry("usr/bin/python3", "symlink", 0o777, target="python3.11"),
            Entry("tmp", "dir", 0o1777),
            *(Entry(d, "dir") for d in ("proc", "sys", "dev", "run", "etc", "var/tmp", "home", "usr/local/bin")),
            Entry("etc/hosts", "file", 0o644, data=b"127.0.0.1 localhost\n"),
            *_accounts(account),
        ]
        return entries

    return make


def stdlib_layer() -> list[Entry]:
    return debs_layer(resolve_debs(STDLIB_PACKAGES))
