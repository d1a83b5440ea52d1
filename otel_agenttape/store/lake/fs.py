"""Where a lake lives: a local folder or an S3-compatible bucket, through pyarrow's file systems.

``lake_fs("s3://bucket/prefix")`` uses ``pyarrow.fs.S3FileSystem`` with the standard AWS variables
(``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``AWS_REGION`` /
``AWS_DEFAULT_REGION``) and an endpoint from ``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL`` (MinIO,
a test server). Every object is written whole under its final name: locally to a hidden temp name,
fsynced and renamed; on S3 by one upload of a file written locally first (an S3 object appears only
once its upload completes). So no reader ever sees a partial file.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from urllib.parse import urlparse

import pyarrow.fs as pafs

from otel_agenttape.atomicfile import fsync_dir

_COPY_CHUNK = 8 * 1024 * 1024


class LakeError(OSError):
    """A lake cannot be reached, read or written; the message is meant for the user."""


def is_lake_uri(source: str) -> bool:
    """An ``s3://`` URI, or a local folder holding a lake manifest (``_manifest/``)."""
    return source.startswith("s3://") or os.path.isdir(os.path.join(source, "_manifest"))


def _s3(uri: str) -> tuple[pafs.FileSystem, str]:
    parsed = urlparse(uri)
    if not parsed.netloc:
        raise LakeError(f"{uri}: an S3 lake is s3://BUCKET[/PREFIX]")
    base = (parsed.netloc + "/" + parsed.path.strip("/")).rstrip("/")
    kwargs: dict[str, object] = {}
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if endpoint:
        ep = urlparse(endpoint)
        kwargs["endpoint_override"] = ep.netloc or ep.path
        kwargs["scheme"] = ep.scheme or "https"
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if region:
        kwargs["region"] = region
    if os.environ.get("AWS_ACCESS_KEY_ID"):
        kwargs["access_key"] = os.environ["AWS_ACCESS_KEY_ID"]
        kwargs["secret_key"] = os.environ.get("AWS_SECRET_ACCESS_KEY", "")
        if os.environ.get("AWS_SESSION_TOKEN"):
            kwargs["session_token"] = os.environ["AWS_SESSION_TOKEN"]
    try:
        return pafs.S3FileSystem(**kwargs), base  # type: ignore[arg-type]
    except Exception as exc:  # noqa: BLE001 - pyarrow raises plain ArrowInvalid/OSError here
        raise LakeError(f"cannot open {uri}: {exc}") from exc


@dataclass
class LakeFS:
    """A lake's file system and base path; every ``key`` below is relative to the base (``spans/...``)."""

    fs: pafs.FileSystem
    base: str
    uri: str
    # where a file for an object store is written before its upload (default: the temp folder); a
    # receiver gives its own, and clears what a crash left there when it starts (``clear_staged``)
    staging: str | None = None

    @property
    def local(self) -> bool:
        return isinstance(self.fs, pafs.LocalFileSystem)

    def path(self, key: str) -> str:
        return f"{self.base}/{key}" if key else self.base

    def list(self, prefix: str) -> dict[str, int]:
        """Every file under ``prefix`` (recursive): key -> size. Hidden temp files are left out."""
        try:
            infos = self.fs.get_file_info(pafs.FileSelector(self.path(prefix), recursive=True, allow_not_found=True))
        except OSError as exc:
            raise LakeError(f"cannot list {self.uri}/{prefix}: {exc}") from exc
        out: dict[str, int] = {}
        cut = len(self.base) + 1
        for info in infos:
            if info.type == pafs.FileType.File and not info.base_name.startswith("."):
                out[info.path[cut:]] = int(info.size or 0)
        return out

    def sizes(self, keys: list[str]) -> dict[str, int | None]:
        """Size of each key, None where it is missing."""
        try:
            infos = self.fs.get_file_info([self.path(k) for k in keys])
        except OSError as exc:
            raise LakeError(f"cannot stat files in {self.uri}: {exc}") from exc
        return {k: (int(i.size or 0) if i.type == pafs.FileType.File else None) for k, i in zip(keys, infos)}

    def read(self, key: str) -> bytes:
        try:
            with self.fs.open_input_stream(self.path(key)) as fh:
                return fh.read()
        except FileNotFoundError:
            raise
        except OSError as exc:
            if "not found" in str(exc).lower() or "no such" in str(exc).lower():
                raise FileNotFoundError(f"{self.uri}/{key}") from exc
            raise LakeError(f"cannot read {self.uri}/{key}: {exc}") from exc

    def exists(self, key: str) -> bool:
        return self.sizes([key])[key] is not None

    def put_bytes(self, key: str, data: bytes) -> None:
        """Write ``data`` under ``key`` whole (atomic for readers)."""
        with self.staged(key) as tmp:
            with open(tmp, "wb") as fh:
                fh.write(data)

    @contextmanager
    def staged(self, key: str) -> Iterator[str]:
        """A local path to write; on success it becomes ``key`` in one step (rename, or one upload)."""
        if self.local:
            final = self.path(key)
            folder = os.path.dirname(final)
            os.makedirs(folder, exist_ok=True)
            tmp = os.path.join(folder, f".{os.path.basename(final)}.{uuid.uuid4().hex[:8]}.tmp")
            try:
                yield tmp
                with open(tmp, "rb") as fh:
                    os.fsync(fh.fileno())
                os.replace(tmp, final)
                fsync_dir(folder)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
            return
        if self.staging:
            os.makedirs(self.staging, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix="agenttape-lake-", suffix=".tmp", dir=self.staging)
        os.close(fd)
        try:
            yield tmp
            try:
                with open(tmp, "rb") as src, self.fs.open_output_stream(self.path(key)) as dst:
                    while chunk := src.read(_COPY_CHUNK):
                        dst.write(chunk)
            except OSError as exc:
                raise LakeError(f"cannot write {self.uri}/{key}: {exc}") from exc
        finally:
            os.unlink(tmp)

    def clear_staged(self, prefix: str, own: str = "") -> int:
        """Remove the staged files a killed writer left: those of ``staging`` (an object store), or in a
        local lake the hidden ``.{prefix}*.tmp`` files of its folders and every ``.tmp`` file of the
        folder ``own`` (the writer's files alone are named so: another's file in flight is left alone).
        Returns how many went."""
        gone = 0
        if self.local:
            mine = os.path.normpath(self.path(own)) if own else None
            walk = ((d, [n for n in names if n.endswith(".tmp") and (
                n.startswith(f".{prefix}") or os.path.normpath(d) == mine)]) for d, _, names in os.walk(self.base))
        elif self.staging and os.path.isdir(self.staging):
            walk = iter([(self.staging, [n for n in os.listdir(self.staging)
                                         if n.startswith("agenttape-lake-") and n.endswith(".tmp")])])
        else:
            return 0
        for folder, names in walk:
            for name in names:
                try:
                    os.unlink(os.path.join(folder, name))
                    gone += 1
                except FileNotFoundError:
                    pass
        return gone

    def delete(self, key: str) -> bool:
        """Remove one file; False if it was already gone."""
        try:
            self.fs.delete_file(self.path(key))
            return True
        except FileNotFoundError:
            return False
        except OSError as exc:
            if "not found" in str(exc).lower() or "no such" in str(exc).lower():
                return False
            raise LakeError(f"cannot delete {self.uri}/{key}: {exc}") from exc

    def open_input(self, key: str) -> pafs.NativeFile:  # type: ignore[name-defined]
        return self.fs.open_input_file(self.path(key))


def lake_fs(uri: str | os.PathLike[str], create: bool = False) -> LakeFS:
    """Open a lake by folder path or ``s3://bucket/prefix``; ``create`` makes a local folder."""
    src = os.fspath(uri)
    if src.startswith("s3://"):
        fs, base = _s3(src)
        return LakeFS(fs, base, src.rstrip("/"))
    root = os.path.abspath(src)
    if create:
        os.makedirs(root, exist_ok=True)
    elif not os.path.isdir(root):
        raise LakeError(f"no lake at {src}")
    return LakeFS(pafs.LocalFileSystem(), root, root)
