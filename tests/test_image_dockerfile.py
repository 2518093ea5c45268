"""The trainer test image (tools/cluster/image/) follows docker/Dockerfile, and its archives are well formed.

Fast tests, Python only: the Dockerfile's final stage as the image builder reads it, checked against
an independent reading of the file; edits to a copy of the Dockerfile that the test image cannot
follow fail the build with the line; and the layer and OCI archive writers on small synthetic
layers (digests, sizes, diff_ids, names, determinism). tests/test_image_build.py checks the real
images, tests/cluster/test_image_rootfs.py runs them.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import tarfile
from pathlib import Path

import pytest
from support import REPO_ROOT

from tools.cluster import image
from tools.cluster.image import Entry, ImageError, Layer

DOCKERFILE = (REPO_ROOT / "docker" / "Dockerfile").read_text()


def final_stage(text: str) -> list[str]:
    """The final stage's instructions, continuation lines joined (independent of the builder's reader)."""
    joined = re.sub(r"\\\n\s*", " ", "\n".join(ln for ln in text.splitlines() if not ln.lstrip().startswith("#")))
    lines = [ln.strip() for ln in joined.splitlines() if ln.strip()]
    last_from = max(i for i, ln in enumerate(lines) if ln.upper().startswith("FROM "))
    return lines[last_from + 1 :]


def expected_env(text: str) -> dict[str, str]:
    """The final stage's ENV as a container sees it, with the test image's base PATH for $PATH and the
    EFA-only folders removed."""
    env = {"PATH": image.BASE_ENV["PATH"]}
    for line in final_stage(text):
        if not line.startswith("ENV "):
            continue
        for key, value in re.findall(r"(\w+)=(\S+)", line[4:]):
            env[key] = re.sub(r"\$(\w+)", lambda m: env.get(m[1], ""), value)
    for key in ("PATH", "LD_LIBRARY_PATH"):
        dirs = [d for d in env.get(key, "").split(":") if d and not d.startswith("/opt/amazon/")]
        env[key] = ":".join(dirs)
    if not env["LD_LIBRARY_PATH"]:
        del env["LD_LIBRARY_PATH"]
    return env


def test_config_matches_the_dockerfile() -> None:
    stage = final_stage(DOCKERFILE)
    config = image.trainer_config()["config"]
    (user,) = [ln.split(None, 1)[1] for ln in stage if ln.startswith("USER ")]
    (workdir,) = [ln.split(None, 1)[1] for ln in stage if ln.startswith("WORKDIR ")]
    assert config["User"] == user == "10001:10001"
    assert config["WorkingDir"] == workdir
    assert dict(e.split("=", 1) for e in config["Env"]) == expected_env(DOCKERFILE)
    assert config["Env"][0].startswith("PATH=/opt/venv/bin:")  # the venv's python and torchrun come first
    for word in ("ENTRYPOINT", "CMD"):
        declared = [ln for ln in stage if ln.startswith(word + " ")]
        key = word.title() if word == "CMD" else "Entrypoint"
        assert (key in config) == bool(declared)


def test_account_and_copies_match_the_dockerfile() -> None:
    cfg = image.dockerfile_config()
    useradd = re.search(r"useradd ([^&\n]*)", DOCKERFILE)
    assert useradd
    words = useradd[1].split()
    assert cfg.account["name"] == words[-1] == "trainer"
    assert cfg.account["uid"] == int(words[words.index("--uid") + 1]) == 10001
    assert cfg.account["gid"] == 10001 and "--user-group" in words
    assert cfg.account["home"] == "/home/trainer" and cfg.account["create_home"] == ("--create-home" in words)
    copies = re.findall(r"^COPY (?!--from)(\S+) (\S+)$", DOCKERFILE, re.M)
    assert cfg.copies == copies
    assert cfg.venv_from == "/opt/venv"
    pip = re.findall(r"([A-Za-z0-9-]+)==([\w.${}]+)", DOCKERFILE)
    assert {image.canonical(n) for n, _ in pip} == set(cfg.pins)


def test_every_final_stage_run_is_acknowledged() -> None:
    """A stale acknowledgement would hide nothing, but it would be wrong documentation."""
    assert sorted(image.dockerfile_config().runs) == sorted(image.ACKNOWLEDGED_RUNS)


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda t: t + "RUN mkdir -p /opt/fsdp/cache\n", r"Dockerfile:\d+: RUN mkdir .* is new or changed"),
        (lambda t: t.replace("libhwloc15 python3", "libhwloc15 python3 jq"), r"RUN apt-get update .* new or changed"),
        (lambda t: t + "VOLUME /data\n", r"Dockerfile:\d+: VOLUME is not mirrored"),
        (lambda t: t + "EXPOSE 8000\n", r"EXPOSE is not mirrored"),
        (lambda t: t + "COPY --chown=1:1 trainer/ /x/\n", r"COPY with 2 paths or flags"),
    ],
)
def test_a_dockerfile_change_the_image_cannot_follow_fails(tmp_path: Path, edit, message: str) -> None:
    path = tmp_path / "Dockerfile"
    path.write_text(edit(DOCKERFILE))
    with pytest.raises(ImageError, match=message):
        image.dockerfile_config(path)


def test_a_dockerfile_change_the_image_follows(tmp_path: Path) -> None:
    path = tmp_path / "Dockerfile"
    path.write_text(
        DOCKERFILE.replace("USER 10001:10001", "USER 10002:10002")
        .replace("WORKDIR /opt/fsdp", "WORKDIR /opt/train")
        .replace("PYTHONUNBUFFERED=1", "PYTHONUNBUFFERED=0 \\\n    EXTRA=$HOME/x")
        + 'ENTRYPOINT ["python", "-m"]\nCMD ["trainer.train"]\n'
    )
    config = image.trainer_config(image.dockerfile_config(path))["config"]
    assert config["User"] == "10002:10002" and config["WorkingDir"] == "/opt/train"
    env = dict(e.split("=", 1) for e in config["Env"])
    assert env["PYTHONUNBUFFERED"] == "0" and env["EXTRA"] == "/x"  # HOME is set only later in the file
    assert config["Entrypoint"] == ["python", "-m"] and config["Cmd"] == ["trainer.train"]


def read_layer(data: bytes) -> list[tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return tar.getmembers()


def test_layers_are_deterministic_and_normalised(tmp_path: Path) -> None:
    src = tmp_path / "big.bin"
    src.write_bytes(b"x" * 3000)
    src.chmod(0o600)
    entries = [
        Entry("opt/venv/lib/a.py", "file", 0o644, data=b"print(1)\n"),
        Entry("home/trainer", "dir", 0o750, uid=10001, gid=10001),
        Entry("bin/sh", "symlink", 0o777, target="dash"),
        Entry("opt/venv/big.bin", "file", 0o644, source=src),
        Entry("x/" + "long-name-" * 20, "file", 0o755, data=b""),
    ]
    first, second = io.BytesIO(), io.BytesIO()
    digest, size = image.write_layer(entries, first)
    assert (digest, size) == image.write_layer(list(reversed(entries)), second)
    assert first.getvalue() == second.getvalue()
    assert digest == "sha256:" + hashlib.sha256(first.getvalue()).hexdigest() and size == len(first.getvalue())
    members = {m.name: m for m in read_layer(first.getvalue())}
    assert list(members) == sorted(members, key=lambda n: n.split("/"))
    assert {"opt", "opt/venv", "opt/venv/lib", "home", "bin", "x"} <= set(members)  # parents added
    assert all(m.mtime == image.EPOCH and m.uname == m.gname == "" for m in members.values())
    assert (members["home/trainer"].uid, members["home/trainer"].mode) == (10001, 0o750)
    assert members["opt/venv/big.bin"].size == 3000 and members["opt/venv/big.bin"].mode == 0o644
    assert members["bin/sh"].linkname == "dash"


def test_valid_pyc_headers_get_the_layer_mtime(tmp_path: Path) -> None:
    import importlib.util
    import py_compile

    source = tmp_path / "mod.py"
    source.write_text("X = 1\n")
    pyc = Path(py_compile.compile(str(source), cfile=str(tmp_path / "__pycache__" / "mod.cpython-311.pyc")))
    assert pyc.read_bytes()[:4] == importlib.util.MAGIC_NUMBER
    fixed = image.pyc_header_fix(pyc.read_bytes(), source)
    assert fixed[8:12] == image.EPOCH.to_bytes(4, "little") and fixed[12:] == pyc.read_bytes()[12:]
    source.write_text("X = 22\n")  # stale pyc: left as it is (Python recompiles it)
    assert image.pyc_header_fix(pyc.read_bytes(), source) == pyc.read_bytes()


def test_archive_structure(tmp_path: Path) -> None:
    layers = [
        lambda: [Entry("etc/passwd", "file", 0o644, data=b"root:x:0:0::/:/bin/sh\n")],
        lambda: [Entry("opt/a", "file", data=b"a" * 5000)],
    ]
    config = image.image_config("10001:10001", {"PATH": "/bin"}, "/opt", None, ["sh"])
    archive = tmp_path / "image.tar"
    name = "localhost/fsdp-gitops/demo:test-0123"
    with open(archive, "wb") as out:
        digest, placed = image.write_archive(out, name, layers, config)
    with tarfile.open(archive) as tar:
        names = tar.getnames()
        blobs = {
            n.split("/")[-1]: tar.extractfile(n).read()
            for n in names
            if n.startswith("blobs/sha256/") and n.count("/") == 2 and tar.getmember(n).isfile()
        }
        layout = json.loads(tar.extractfile("oci-layout").read())  # type: ignore[union-attr]
        index = json.loads(tar.extractfile("index.json").read())  # type: ignore[union-attr]
    assert layout == {"imageLayoutVersion": "1.0.0"}
    for hexdigest, blob in blobs.items():
        assert hashlib.sha256(blob).hexdigest() == hexdigest
    (entry,) = index["manifests"]
    assert entry["digest"] == digest and entry["annotations"] == {
        "io.containerd.image.name": name,
        "org.opencontainers.image.ref.name": "test-0123",
    }
    manifest = json.loads(blobs[digest[7:]])
    assert entry["size"] == len(blobs[digest[7:]])
    assert [la["digest"] for la in manifest["layers"]] == [la.digest for la in placed]
    assert [la["size"] for la in manifest["layers"]] == [len(blobs[la.digest[7:]]) for la in placed]
    with open(archive, "rb") as f:  # each layer's recorded place in the archive holds its bytes
        for la in placed:
            f.seek(la.offset)
            assert f.read(la.size) == blobs[la.digest[7:]]
    assert all(la["mediaType"] == "application/vnd.oci.image.layer.v1.tar" for la in manifest["layers"])
    cfg = json.loads(blobs[manifest["config"]["digest"][7:]])
    assert manifest["config"]["size"] == len(blobs[manifest["config"]["digest"][7:]])
    assert cfg["rootfs"] == {"type": "layers", "diff_ids": [la.digest for la in placed]}  # uncompressed
    assert cfg["config"]["User"] == "10001:10001" and cfg["os"] == "linux" and cfg["architecture"] == "amd64"
    again = tmp_path / "again.tar"  # built anew, and with the layers copied from the first archive
    copied = [Layer(archive, la.digest, la.size, la.offset) for la in placed]
    for sources in (layers, copied):
        with open(again, "wb") as out:
            assert image.write_archive(out, name, sources, config)[0] == digest
        assert again.read_bytes() == archive.read_bytes()
    assert image.read_archive(archive)["manifest"] == manifest


def test_big_files_copied_in_kernel_give_the_same_layer(tmp_path: Path) -> None:
    big = tmp_path / "big.so"
    big.write_bytes(bytes(range(256)) * 12289)  # over _HashingWriter.BIG, not a multiple of 512
    entries = [Entry("a/big.so", "file", 0o755, source=big), Entry("a/small", "file", data=b"s")]
    memory = io.BytesIO()
    expected = image.write_layer(entries, memory)
    with open(tmp_path / "layer.tar", "wb") as out:
        out.write(b"p" * 512)  # not at the file's start, as inside an archive
        assert image.write_layer(entries, out) == expected
    assert (tmp_path / "layer.tar").read_bytes()[512:] == memory.getvalue()


def test_delta_archive_leaves_out_the_present_layers(tmp_path: Path) -> None:
    sources = [lambda: [Entry("opt/big", "file", data=b"b" * 70000)], lambda: [Entry("opt/code.py", "file", data=b"1")]]
    archive = tmp_path / "image.tar"
    with open(archive, "wb") as out:
        digest, placed = image.write_archive(
            out, "localhost/x/y:test-1", sources, image.image_config("", {}, "/", None, None)
        )
    img = image.Image(archive, "localhost/x/y:test-1", digest)
    assert image.delta_archive(img, ["sha256:" + "1" * 64]) == archive  # nothing of the image is present
    delta = image.delta_archive(img, [placed[0].digest, "sha256:" + "1" * 64])
    with tarfile.open(archive) as full, tarfile.open(delta) as part:
        left_out = f"blobs/sha256/{placed[0].digest[7:]}"
        assert set(full.getnames()) - set(part.getnames()) == {left_out}
        for member in part.getmembers():
            if member.isfile():
                assert part.extractfile(member).read() == full.extractfile(member.name).read()  # type: ignore[union-attr]
    assert image.read_archive(delta)["manifest"] == image.read_archive(archive)["manifest"]
