"""A verified copy of each complete checkpoint on S3 (checkpoint.s3_uri), made by rank 0 in the background.

Why a copy and not checkpoint.dir on the bucket: DCP's FileSystemWriter ends a save by renaming
`.metadata.tmp` to `.metadata`, and the checkpointer (trainer/checkpoint.py) renames the whole
`.tmp-step-*` directory; Mountpoint for Amazon S3 refuses renames on general-purpose buckets, so a
checkpoint.dir on a Mountpoint-mounted bucket fails at its first save. The checkpoints are written to
the shared volume as always, and once one is complete its folder is copied:

    s3://<bucket>/<prefix>/step-00000020/<every file of the local folder>   uploaded first
    s3://<bucket>/<prefix>/step-00000020/COMPLETE                           written last

1. Every file but COMPLETE is uploaded: at most PART_BYTES in one PutObject, larger ones in parts of
   PART_BYTES (more where a file would need over 10,000 parts), each request carrying its SHA-256,
   which S3 checks on receipt. Each object also carries the file's SHA-256 as metadata `sha256`.
2. Verify: the step's prefix is listed; it must hold exactly those files, each with the local size,
   and each object's SHA-256 as S3 reports it (HeadObject with checksum mode: the file's digest, or
   for a file uploaded in parts the digest of its parts' digests and the part count) must be the one
   computed from the local file. Where a store reports no SHA-256 (some S3-compatible servers), the
   ETag must be the MD5 computed the same way. Anything else is a failed export.
3. Only then the local COMPLETE (the file list with sizes) is put as the step's COMPLETE object, so a
   prefix with a COMPLETE object is a whole checkpoint that `aws s3 cp --recursive` brings back as a
   folder the trainer resumes from. A prefix without one is an unfinished or failed copy.

A step that already has objects on S3 (a run started again with the same s3_uri): a copy whose
COMPLETE and objects verify against the local folder is kept as it is; any other is removed first,
COMPLETE before the rest (the one case that needs s3:DeleteObject).

Exports run one after another in one thread, in the order the checkpoints completed; training never
waits for them. A checkpoint that keep_last rotation removes before its copy is verified is skipped with a
line (a partial copy stays without a COMPLETE object). A failed or unverifiable export is
one warning line and changes nothing local. The final checkpoint of a finished run is exported before
the process exits (the other ranks wait, polling over the checkpointer's gloo group, so no collective
timeout runs out during a long upload); with checkpoint.prune_after_export its local folder is then
removed, and only when its copy verified. A run stopped by SIGTERM does not wait: an unfinished copy
has no COMPLETE object.

Endpoint and credentials are boto3's own: AWS_ENDPOINT_URL for an S3-compatible store or a test
server, the default credential chain (IRSA or EKS Pod Identity in the cluster). IAM: docs/trainer.md.

Tests only: with FSDP_CHECKPOINT_TEST_HOOK=<dir>, export events go to the checkpointer's event log,
and while a file <dir>/hold-export-step-<N> exists the export of step N stops after its upload and
before its verification, saying so with <dir>/held-export-step-<N>.
"""

from __future__ import annotations

import base64
import hashlib
import os
import queue
import shutil
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

COMPLETE = "COMPLETE"  # the same marker name as trainer.checkpoint's, for a copy that reads like the folder
# Part size of multipart uploads: files up to this size take one PutObject. 64 MiB keeps a 640 GB shard
# within S3's 10,000 parts; larger files get larger parts (part_bytes).
PART_BYTES = 64 * 2**20
MAX_PARTS = 10_000
UPLOAD_THREADS = 8
READ_BYTES = 8 * 2**20


def parse_uri(uri: str) -> tuple[str, str]:
    """(bucket, prefix without surrounding slashes) of s3://bucket/prefix."""
    rest = uri.removeprefix("s3://")
    bucket, _, prefix = rest.partition("/")
    return bucket, prefix.strip("/")


def part_bytes(size: int, part: int = PART_BYTES) -> int:
    """The part size a file of `size` bytes is uploaded with (a multiple of `part`)."""
    return part * max(1, -(-size // (part * MAX_PARTS)))


@dataclass
class FileDigest:
    """What S3 should report for one uploaded file: its size, SHA-256 and the form the upload gives."""

    size: int
    sha256: str  # hex digest of the whole file (object metadata `sha256`)
    parts: int  # 0: uploaded in one PutObject
    checksum: str  # S3's ChecksumSHA256: base64 of the file's digest, or of the parts' digests + "-N"
    etag: str  # S3's ETag where it is an MD5 (unencrypted or SSE-S3): of the file, or of the parts' + "-N"
    part_sha256: list[str] = field(default_factory=list)  # base64 digests of the parts, to upload them


def digest(path: str, part: int = PART_BYTES) -> FileDigest:
    """Read `path` once and compute everything verification compares."""
    size = os.path.getsize(path)
    chunk = part_bytes(size, part)
    whole = hashlib.sha256()
    part_sha: list[bytes] = []
    part_md5: list[bytes] = []
    md5_whole = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as fh:
        while True:
            sha, md5, left = hashlib.sha256(), hashlib.md5(usedforsecurity=False), chunk
            while left:
                block = fh.read(min(READ_BYTES, left))
                if not block:
                    break
                for h in (whole, sha, md5) if size > chunk else (whole, md5_whole):
                    h.update(block)
                left -= len(block)
            if left == chunk:
                break
            part_sha.append(sha.digest())
            part_md5.append(md5.digest())
    if size <= chunk:
        return FileDigest(size, whole.hexdigest(), 0, _b64(whole.digest()), md5_whole.hexdigest())
    n = len(part_sha)
    return FileDigest(
        size,
        whole.hexdigest(),
        n,
        f"{_b64(hashlib.sha256(b''.join(part_sha)).digest())}-{n}",
        f"{hashlib.md5(b''.join(part_md5), usedforsecurity=False).hexdigest()}-{n}",
        [_b64(d) for d in part_sha],
    )


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def _one_line(err: BaseException) -> str:
    return " ".join(f"{type(err).__name__}: {err}".split())


class StepCopy:
    """The copy of one local checkpoint folder at s3://bucket/<prefix>/<folder name>/."""

    def __init__(self, client: Any, bucket: str, prefix: str, path: str, part: int = PART_BYTES):
        self.client = client
        self.bucket = bucket
        self.path = path
        self.name = os.path.basename(path.rstrip("/"))
        self.prefix = f"{prefix}/{self.name}/" if prefix else f"{self.name}/"
        self.part = part
        self.digests: dict[str, FileDigest] = {}

    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"

    def local_files(self) -> list[str]:
        """The folder's files, COMPLETE last (it is written last on S3 too)."""
        names = sorted(n for n in os.listdir(self.path) if os.path.isfile(os.path.join(self.path, n)))
        if COMPLETE not in names:
            raise OSError(f"{self.path} has no {COMPLETE} file (not a complete checkpoint)")
        return [n for n in names if n != COMPLETE] + [COMPLETE]

    def compute(self) -> None:
        for name in self.local_files():
            self.digests[name] = digest(os.path.join(self.path, name), self.part)

    def listed(self) -> dict[str, int]:
        """{file name: size} of the objects under the step's prefix."""
        found: dict[str, int] = {}
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=self.prefix):
            for obj in page.get("Contents", []):
                found[obj["Key"][len(self.prefix) :]] = int(obj["Size"])
        return found

    def clear(self, listed: dict[str, int]) -> None:
        """Remove an earlier copy of this step: COMPLETE first, so it never marks a mixed prefix whole."""
        names = sorted(listed, key=lambda n: n != COMPLETE)
        if COMPLETE in listed:
            self.client.delete_object(Bucket=self.bucket, Key=self.prefix + COMPLETE)
            names.remove(COMPLETE)
        for start in range(0, len(names), 1000):
            batch = [{"Key": self.prefix + n} for n in names[start : start + 1000]]
            reply = self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": batch, "Quiet": True})
            if reply.get("Errors"):
                first = reply["Errors"][0]
                raise OSError(f"cannot remove {first.get('Key')}: {first.get('Code')} {first.get('Message')}")

    def upload(self, name: str) -> None:
        d = self.digests[name]
        key, file = self.prefix + name, os.path.join(self.path, name)
        meta = {"sha256": d.sha256}
        if not d.parts:
            with open(file, "rb") as fh:
                self.client.put_object(
                    Bucket=self.bucket, Key=key, Body=fh, ChecksumSHA256=d.checksum, Metadata=meta, ContentLength=d.size
                )
            return
        chunk = part_bytes(d.size, self.part)
        upload_id = self.client.create_multipart_upload(
            Bucket=self.bucket, Key=key, ChecksumAlgorithm="SHA256", Metadata=meta
        )["UploadId"]

        def put(index: int) -> dict[str, Any]:
            with open(file, "rb") as fh:
                fh.seek(index * chunk)
                body = fh.read(chunk)
            reply = self.client.upload_part(
                Bucket=self.bucket,
                Key=key,
                UploadId=upload_id,
                PartNumber=index + 1,
                Body=body,
                ChecksumSHA256=d.part_sha256[index],
            )
            return {"PartNumber": index + 1, "ETag": reply["ETag"], "ChecksumSHA256": d.part_sha256[index]}

        try:
            with ThreadPoolExecutor(UPLOAD_THREADS, thread_name_prefix="s3-part") as pool:
                parts = list(pool.map(put, range(d.parts)))
            self.client.complete_multipart_upload(
                Bucket=self.bucket, Key=key, UploadId=upload_id, MultipartUpload={"Parts": parts}
            )
        except BaseException:
            try:  # best effort: without s3:AbortMultipartUpload the parts wait for the bucket's lifecycle rule
                self.client.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload_id)
            except Exception:  # noqa: BLE001 - the upload's own error is the one to report
                pass
            raise

    def problem(self, names: list[str], listed: dict[str, int], complete: bool) -> str | None:
        """Why the objects of `names` on S3 are not the local files, or None when every one matches.

        `complete`: the prefix holds COMPLETE as well (a finished copy); otherwise it must not.
        """
        expected = set(names) | ({COMPLETE} if complete else set())
        extra = sorted(set(listed) - expected)
        if extra:
            return f"{len(extra)} objects that are not files of the checkpoint (first: {extra[0]})"
        for name in sorted(expected):
            d = self.digests[name]
            if name not in listed:
                return f"{name} is missing"
            if listed[name] != d.size:
                return f"{name} has {listed[name]} bytes, the local file {d.size}"
            head = self.client.head_object(Bucket=self.bucket, Key=self.prefix + name, ChecksumMode="ENABLED")
            reported = head.get("ChecksumSHA256")
            if reported is not None:
                # A file uploaded in parts: S3 appends the part count ("-N"), some servers leave it off.
                if reported != d.checksum and ("-" in reported or reported != d.checksum.split("-")[0]):
                    return f"{name}: S3 reports SHA-256 {reported}, the local file gives {d.checksum}"
            elif head.get("ETag", "").strip('"') != d.etag:
                return f"{name}: no SHA-256 reported and ETag {head.get('ETag', '')} is not the local MD5 {d.etag}"
            if head.get("Metadata", {}).get("sha256") != d.sha256:
                return f"{name}: its sha256 metadata is not the local file's"
        return None


@dataclass
class _Job:
    step: int
    path: str
    final: bool


class S3Export:
    """Rank 0's queue of checkpoints to copy (see the module docstring); `submit` never blocks."""

    def __init__(
        self,
        uri: str,
        prune_final: bool,
        event: Callable[..., None],
        hook_dir: str = "",
        say: Callable[[str], None] = print,
    ):
        self.uri = uri
        self.bucket, self.prefix = parse_uri(uri)
        self.prune_final = prune_final
        self._event = event
        self._hook_dir = hook_dir
        self._say = say
        self._client: Any = None
        self._queue: queue.Queue[_Job | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self.final_submitted = False
        self._closed = False
        self.results: dict[int, str | None] = {}  # step -> None (verified) or why not

    def submit(self, step: int, path: str, final: bool) -> None:
        self.final_submitted = self.final_submitted or final
        self._queue.put(_Job(step, path, final))
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="s3-export", daemon=True)
            self._thread.start()

    def done(self, timeout: float) -> bool:
        """Take no more checkpoints and wait up to `timeout` s; True once every export submitted has ended."""
        if self._thread is None:
            return True
        if not self._closed:
            self._closed = True
            self._queue.put(None)  # the thread ends after the exports queued before it
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            self._export(job)

    def _export(self, job: _Job) -> None:
        if not os.path.isdir(job.path):
            self._skipped(job, "before its upload started")
            return
        t0 = time.perf_counter()
        try:
            copy = StepCopy(self._s3(), self.bucket, self.prefix, job.path)
            copy.compute()
            names = [n for n in copy.digests if n != COMPLETE]
            listed = copy.listed()
            if listed and copy.problem(names, listed, complete=True) is None:
                why = None
                self._event("export_present", job.step)
            else:
                if listed:
                    copy.clear(listed)
                for n in names:
                    copy.upload(n)
                    self._event("s3_put", job.step, key=copy.prefix + n)
                self._hold(job.step)
                why = copy.problem(names, copy.listed(), complete=False)
                if why is None:
                    copy.upload(COMPLETE)
                    self._event("s3_put", job.step, key=copy.prefix + COMPLETE)
                    why = copy.problem(names, copy.listed(), complete=True)
                    if why is not None:
                        why = f"after COMPLETE was written: {why}"
        except Exception as err:  # noqa: BLE001 - any failure of a copy is one warning line, never the run's end
            why = _one_line(err)
        if why is not None and not os.path.isdir(job.path):
            self._skipped(job, "during its upload; that copy has no COMPLETE object")
            return
        self.results[job.step] = why
        if why is not None:
            self._event("export_failed", job.step, reason=why)
            self._say(f"warning: export of {job.path} to {self.uri} failed: {why}; the local checkpoint is kept")
            return
        size = sum(d.size for d in copy.digests.values())
        self._event("exported", job.step)
        self._say(
            f"export: {job.path} copied to {copy.uri} and verified "
            f"({len(copy.digests)} files, {size / 1e9:.2f} GB, {time.perf_counter() - t0:.1f}s)"
        )
        if job.final and self.prune_final:
            shutil.rmtree(job.path, ignore_errors=True)
            self._event("pruned", job.step)
            self._say(f"checkpoint: removed the local {job.path}, its copy {copy.uri} is verified")

    def _skipped(self, job: _Job, when: str) -> None:
        """A checkpoint rotated away locally before its copy was done: expected where exports lag behind
        the saves, and a newer checkpoint is queued; not a warning."""
        self.results[job.step] = f"removed locally {when}"
        self._event("export_skipped", job.step)
        self._say(f"export: {job.path} skipped, keep_last removed it {when}")

    def _s3(self) -> Any:
        if self._client is None:
            import boto3  # type: ignore[import-untyped]  # only runs with checkpoint.s3_uri need it
            from botocore.config import Config  # type: ignore[import-untyped]

            self._client = boto3.client("s3", config=Config(retries={"mode": "standard", "max_attempts": 8}))
        return self._client

    def _hold(self, step: int) -> None:
        hold = os.path.join(self._hook_dir, f"hold-export-step-{step}") if self._hook_dir else ""
        if hold and os.path.exists(hold):
            with open(os.path.join(self._hook_dir, f"held-export-step-{step}"), "w", encoding="utf-8"):
                pass
            while os.path.exists(hold):
                time.sleep(0.02)
