"""docker/Dockerfile read for the test image: the run-time facts of its final stage (user, working
directory, environment, entry point, the files it COPYs, the venv it copies, the account useradd makes)
and the python-env stage's pip pins.

`dockerfile_config` fails, naming the line, on any instruction the test image does not mirror (a new or
changed RUN, a VOLUME, ...), so that a Dockerfile change can never silently leave the test image behind.
What the test image deliberately does differently is listed in `KNOWN_DIFFERENCES`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tools.cluster.image.common import REPO_ROOT, ImageError, canonical

DOCKERFILE = REPO_ROOT / "docker" / "Dockerfile"


# The base image's default environment (Docker's PATH); the CUDA base image adds CUDA and NVIDIA
# settings on top, which a CPU image must not carry.
BASE_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
# Directories of the Dockerfile's PATH-like variables that only the CUDA/EFA image has.
EFA_ONLY_DIRS = ("/opt/amazon/efa/bin", "/opt/amazon/efa/lib", "/opt/amazon/ofi-nccl/lib")

KNOWN_DIFFERENCES = (
    "base: Debian 12 packages (python3.11 3.11.2, busybox, dash) instead of nvidia/cuda:13.0.2-base-ubuntu24.04 "
    "(Ubuntu's python3 3.12): no CUDA user space, no NVIDIA_*/CUDA_* variables, no bash (/bin/sh is dash)",
    "EFA: no libfabric, rdma-core or aws-ofi-nccl (the EFA installer RUN); "
    "/opt/amazon/efa/bin leaves PATH and LD_LIBRARY_PATH is unset (it would name only EFA folders)",
    "the base image's ENTRYPOINT/CMD (the CUDA entrypoint script, bash) are not set: pods give their command",
    "user: trainer's login shell is /bin/sh (no bash); uid, gid, name, group and home are the Dockerfile's",
    "/opt/venv: the packages and versions of the Dockerfile's pip line, packed from the test environment "
    "(CPU use: GPU-only files left out, GPU_ONLY_FILES), under Debian's python3.11 instead of Ubuntu's python3",
    "no /opt/amazon/ofi-nccl/lib/libcudart.so link and no build-time verify_image.py run (both need EFA and CUDA)",
    "/bin/nslookup is a Python gethostbyname wrapper (busybox 1.35's nslookup fails on any NXDOMAIN search variant)",
)

# RUN instructions of the Dockerfile's final stage the test image does not replicate, by the sha256 of
# the instruction (continuation lines joined); each is CUDA/EFA-only or mirrored by hand (useradd).
# A RUN that is new or changed fails the build until it is mirrored here and its hash added.
ACKNOWLEDGED_RUNS = {
    "3f580b08dc41": "apt-get install ca-certificates curl libhwloc15 python3, the EFA installer, useradd trainer "
    "(mirrored: users from the useradd options)",
    "77c140b09d3e": "libcudart.so link for aws-ofi-nccl (EFA only)",
    "e2b03e35980b": "verify_image.py: NCCL and EFA checks (GPU image only)",
}
# Final-stage instructions that change nothing a container sees at run time, or are read below.
RUNTIME_NEUTRAL = {"ARG", "LABEL", "SHELL"}


@dataclass
class DockerfileConfig:
    user: str = ""
    workdir: str = "/"
    env: dict[str, str] = field(default_factory=dict)  # after $VAR substitution, in order
    entrypoint: list[str] | None = None
    cmd: list[str] | None = None
    copies: list[tuple[str, str]] = field(default_factory=list)  # (context source, destination)
    venv_from: str = ""  # the COPY --from=<stage> <venv> <venv> destination
    account: dict[str, Any] = field(default_factory=dict)  # name, uid, gid, home, create_home
    pins: dict[str, str] = field(default_factory=dict)  # the python-env stage's pip pins
    runs: list[str] = field(default_factory=list)  # sha256[:12] of each final-stage RUN


def _instructions(text: str) -> list[tuple[int, str, str]]:
    """(line number, INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out: list[tuple[int, str, str]] = []
    current, start = "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if not current:
            start = number
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        line = current + stripped
        current = ""
        word, _, rest = line.partition(" ")
        out.append((start, word.upper(), rest.strip()))
    return out


def _substitute(value: str, env: dict[str, str]) -> str:
    return re.sub(
        r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)", lambda m: env.get(m[1] or m[2], ""), value
    )


def _env_pairs(args: str) -> list[tuple[str, str]]:
    words = shlex.split(args, posix=True)
    if words and "=" not in words[0]:  # legacy form: ENV KEY value with spaces
        return [(words[0], args.split(None, 1)[1] if len(words) > 1 else "")]
    return [tuple(w.split("=", 1)) for w in words]  # type: ignore[misc]


def _exec_form(args: str) -> list[str]:
    if args.startswith("["):
        return list(json.loads(args))
    return ["/bin/sh", "-c", args]


def dockerfile_config(path: Path = DOCKERFILE) -> DockerfileConfig:
    """The run-time facts of the Dockerfile's final stage, as the test image reproduces them.

    Raises ImageError naming the line for an instruction the test image cannot follow (a new RUN, a
    VOLUME, ...), so that a Dockerfile change can never silently leave the test image behind."""
    text = path.read_text()
    instructions = _instructions(text)
    froms = [i for i, (_, word, _) in enumerate(instructions) if word == "FROM"]
    if not froms:
        raise ImageError(f"{path}: no FROM instruction")
    cfg = DockerfileConfig()
    args: dict[str, str] = {}
    for _, word, rest in instructions[: froms[-1]]:
        if word == "ARG" and "=" in rest:
            name, value = rest.split("=", 1)
            args[name] = value
        if word == "RUN" and "pip install" in rest:
            for name, version in re.findall(r"""["']?([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s"']+)["']?""", rest):
                cfg.pins[canonical(name)] = _substitute(version, args)
    env = dict(BASE_ENV)
    for number, word, rest in instructions[froms[-1] + 1 :]:
        where = f"{path.relative_to(REPO_ROOT) if path.is_relative_to(REPO_ROOT) else path}:{number}"
        if word == "ARG":
            name, _, value = rest.partition("=")
            args[name] = value
        elif word == "ENV":
            for key, value in _env_pairs(rest):
                env[key] = _substitute(value, {**args, **env})
        elif word == "USER":
            cfg.user = _substitute(rest, {**args, **env})
        elif word == "WORKDIR":
            cfg.workdir = os.path.normpath(os.path.join(cfg.workdir, _substitute(rest, {**args, **env})))
        elif word == "ENTRYPOINT":
            cfg.entrypoint = _exec_form(rest)
            cfg.cmd = None  # Docker resets CMD when ENTRYPOINT is set
        elif word == "CMD":
            cfg.cmd = _exec_form(rest)
        elif word == "COPY":
            words = shlex.split(rest)
            flags = [w for w in words if w.startswith("--")]
            paths = [w for w in words if not w.startswith("--")]
            if any(f.startswith("--from=") for f in flags):
                if len(paths) != 2 or paths[0] != paths[1]:
                    raise ImageError(f"{where}: COPY --from is expected to copy one folder to the same path")
                cfg.venv_from = paths[1]
            elif len(paths) != 2 or flags:
                raise ImageError(f"{where}: COPY with {len(paths)} paths or flags {flags} is not mirrored")
            else:
                cfg.copies.append((paths[0], paths[1]))
        elif word == "RUN":
            digest = hashlib.sha256(rest.encode()).hexdigest()[:12]
            cfg.runs.append(digest)
            match = re.search(r"useradd\s+([^&;|]*)", rest)
            if match:
                cfg.account = _useradd(match[1], where)
            if digest not in ACKNOWLEDGED_RUNS:
                raise ImageError(
                    f"{where}: RUN {rest[:60]}... is new or changed; mirror what it does for run time in "
                    f"tools/cluster/image/ and add {digest!r} to ACKNOWLEDGED_RUNS (tools/cluster/image/dockerfile.py)"
                )
        elif word not in RUNTIME_NEUTRAL:
            raise ImageError(f"{where}: {word} is not mirrored by the test image (tools/cluster/image/)")
    cfg.env = {
        k: v for k, v in ((k, _drop_efa_dirs(k, v)) for k, v in env.items()) if v or k not in {"LD_LIBRARY_PATH"}
    }
    if not cfg.account:
        raise ImageError(f"{path}: the final stage creates no user (useradd)")
    if not cfg.venv_from:
        raise ImageError(f"{path}: the final stage copies no Python environment (COPY --from=python-env)")
    return cfg


def _drop_efa_dirs(key: str, value: str) -> str:
    if key not in {"PATH", "LD_LIBRARY_PATH"}:
        return value
    return ":".join(d for d in value.split(":") if d and d not in EFA_ONLY_DIRS)


def _useradd(options: str, where: str) -> dict[str, Any]:
    words = shlex.split(options)
    account: dict[str, Any] = {"create_home": False, "user_group": False, "shell": "/bin/sh"}
    i = 0
    while i < len(words):
        w = words[i]
        if w in ("--uid", "-u"):
            account["uid"] = int(words[i + 1])
            i += 1
        elif w in ("--gid", "-g"):
            account["gid"] = int(words[i + 1])
            i += 1
        elif w in ("--home-dir", "-d"):
            account["home"] = words[i + 1]
            i += 1
        elif w in ("--shell", "-s"):
            account["dockerfile_shell"] = words[i + 1]
            i += 1
        elif w in ("--create-home", "-m"):
            account["create_home"] = True
        elif w in ("--user-group", "-U"):
            account["user_group"] = True
        elif w.startswith("-"):
            raise ImageError(f"{where}: useradd option {w} is not mirrored by the test image")
        else:
            account["name"] = w
        i += 1
    if "uid" not in account or "name" not in account:
        raise ImageError(f"{where}: useradd without --uid or a name")
    account.setdefault("gid", account["uid"])
    account.setdefault("home", f"/home/{account['name']}")
    return account
