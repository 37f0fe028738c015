"""What a ``/judge0`` submission asks for, checked before anything is stored or queued: its
body (``SubmissionIn``), its text fields decoded, ``compiler_options`` and
``command_line_arguments`` split into argv words, ``additional_files`` (a base64 zip)
unpacked into text files of the build directory, and the judge item it becomes.

Bad input is a 422 problem here, before the submission gets a token. Why: docs/design/judge.md.
"""

from __future__ import annotations

import base64
import binascii
import io
import math
import posixpath
import shlex
import stat
import zipfile
import zlib
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from farm.judge.languages import LANGUAGES
from farm.judge.specs import BUILD_DIR
from farm.models.batch import BatchItem
from farm.serve.problem_documents import ProblemError

LANGUAGE_BY_ID = {lang.judge0: name for name, lang in LANGUAGES.items() if lang.judge0}
MAX_WORDS_CHARS = 512  # Judge0's bound on compiler_options and command_line_arguments
MAX_EXTRACT_BYTES = 10240 * 1024  # Judge0's max_extract_size (10240 KB), all files unpacked
MAX_FILES = 256
MAX_CALLBACK_URL = 2048


class SubmissionIn(BaseModel):
    """The fields of a Judge0 submission farm takes; the others are accepted and ignored."""

    model_config = ConfigDict(extra="ignore")

    source_code: str
    language_id: int
    stdin: str | None = None
    expected_output: str | None = None
    cpu_time_limit: float | None = None
    wall_time_limit: float | None = None
    memory_limit: float | None = None  # kB
    max_file_size: int | None = None  # kB
    compiler_options: str | None = None
    command_line_arguments: str | None = None
    additional_files: str | None = None  # base64 of a zip, whatever base64_encoded says
    callback_url: str | None = None


class BatchIn(BaseModel):
    submissions: list[SubmissionIn]


def _refuse(why: str) -> ProblemError:
    return ProblemError(422, "input", why)


def _decode(value: str | None, encoded: bool) -> str | None:
    if value is None or not encoded:
        return value
    try:
        return base64.b64decode(value, validate=False).decode()
    except (ValueError, UnicodeDecodeError):
        raise _refuse("a field is not base64 of UTF-8 text") from None


def words(name: str, value: str | None) -> list[str]:
    """``value`` split as a shell would split it (quotes kept together) into argv words; no
    shell ever runs them, so ``;``, ``|`` or ``$(...)`` are only characters of a word."""
    if not value or not value.strip():
        return []
    if len(value) > MAX_WORDS_CHARS:
        raise _refuse(f"{name} is over {MAX_WORDS_CHARS} characters")
    try:
        return shlex.split(value)
    except ValueError as exc:
        raise _refuse(f"{name}: {exc}") from None


def unpack(encoded: str) -> dict[str, str]:
    """The files of ``additional_files`` (a base64 zip), each a path under the build
    directory (the program's working directory) -> its text. Refused: no zip, over
    ``MAX_FILES`` files or ``MAX_EXTRACT_BYTES`` unpacked (counted as they unpack, whatever
    the zip declares), a path out of the directory, a link, a file that is not UTF-8 text."""
    try:
        data = base64.b64decode(encoded, validate=True)
        archive = zipfile.ZipFile(io.BytesIO(data))
    except (binascii.Error, ValueError):
        raise _refuse("additional_files is not base64") from None
    except zipfile.BadZipFile:
        raise _refuse("additional_files is not a zip archive") from None
    members = [info for info in archive.infolist() if not info.is_dir()]
    if len(members) > MAX_FILES:
        raise _refuse(f"additional_files holds {len(members)} files, over {MAX_FILES}")
    files: dict[str, str] = {}
    total = 0
    for info in members:
        name = _member_name(info)
        left = MAX_EXTRACT_BYTES - total
        if info.file_size > left:
            raise _refuse(f"additional_files unpacks to over {MAX_EXTRACT_BYTES} bytes")
        try:
            with archive.open(info) as member:
                content = member.read(left + 1)  # never more, whatever the zip declared
        except (zipfile.BadZipFile, zlib.error, NotImplementedError, RuntimeError) as exc:
            raise _refuse(
                f"additional_files: {info.filename!r} cannot be unpacked: {exc}"
            ) from None
        total += len(content)
        if total > MAX_EXTRACT_BYTES:
            raise _refuse(f"additional_files unpacks to over {MAX_EXTRACT_BYTES} bytes")
        try:
            files[f"{BUILD_DIR}/{name}"] = content.decode()
        except UnicodeDecodeError:
            raise _refuse(
                f"additional_files: {info.filename!r} is not UTF-8 text (farm passes text "
                "files only)"
            ) from None
    return files


def _member_name(info: zipfile.ZipInfo) -> str:
    """The member's path, relative and inside the directory; else refused."""
    name = info.filename
    if stat.S_ISLNK(info.external_attr >> 16):
        raise _refuse(f"additional_files: {name!r} is a symbolic link")
    normal = posixpath.normpath(name)
    if (
        "\\" in name
        or "\0" in name
        or name.startswith("/")
        or normal == "."
        or normal.split("/")[0] == ".."
    ):
        raise _refuse(f"additional_files: {name!r} is not a path inside the directory")
    return normal


def compiled(language: str) -> bool:
    """Whether ``language`` compiles its source to something else that runs (as Judge0 has
    it: a compile command), not a syntax check of a source its run command reads."""
    row = LANGUAGES[language]
    return bool(row.compile) and not {row.file, "{file}"} & set(row.run)


def _callback_url(url: str | None, allowed: bool) -> str | None:
    if not url:
        return None
    if not allowed:
        raise _refuse("callback_url: callbacks are off on this server (judge0_callbacks)")
    if len(url) > MAX_CALLBACK_URL or not url.startswith(("http://", "https://")):
        raise _refuse("callback_url must be an http:// or https:// URL")
    return url


def document(
    token: str, submission: SubmissionIn, encoded: bool, created_at: str, callbacks: bool
) -> tuple[dict[str, Any], dict[str, str]]:
    """The submission as it is stored (decoded text, its options) and its additional files;
    the judge item it makes is checked here, so that a bad one is refused before it queues."""
    if submission.language_id not in LANGUAGE_BY_ID:
        raise _refuse(f"language_id {submission.language_id} is not served")
    doc = submission.model_dump(exclude={"additional_files"})
    for key in ("source_code", "stdin", "expected_output"):
        doc[key] = _decode(doc[key], encoded)
    doc.update(token=token, created_at=created_at)
    doc["callback_url"] = _callback_url(submission.callback_url, callbacks)
    files = unpack(submission.additional_files) if submission.additional_files else {}
    try:
        BatchItem.model_validate(item(doc, files))
    except ValidationError as exc:
        why = "; ".join(str(error["msg"]) for error in exc.errors())
        raise _refuse(why) from None
    return doc, files


def item(doc: dict[str, Any], files: dict[str, str]) -> dict[str, Any]:
    """The judge item of a stored submission: one test (``checker`` ``lines``, or ``none``
    without ``expected_output``), its outputs kept."""
    expected = doc["expected_output"]
    limits: dict[str, Any] = {"time_s": doc["cpu_time_limit"] or 5.0}
    if doc["wall_time_limit"]:
        limits["wall_s"] = doc["wall_time_limit"]
    if doc["memory_limit"]:
        limits["memory_mb"] = max(16, math.ceil(doc["memory_limit"] / 1024))
    if doc["max_file_size"]:
        limits["output_mb"] = max(1, math.ceil(doc["max_file_size"] / 1024))
    built: dict[str, Any] = {
        "id": doc["token"],
        "language": LANGUAGE_BY_ID[doc["language_id"]],
        "source": doc["source_code"],
        "tests": [{"stdin": doc["stdin"] or "", "expected": expected}],
        "checker": "lines" if expected is not None else "none",
        "limits": limits,
        "keep_outputs": True,
    }
    options = words("compiler_options", doc["compiler_options"])
    if options:
        if not compiled(built["language"]):
            raise _refuse("setting compiler options is only allowed for compiled languages")
        built["compile_options"] = options
    arguments = words("command_line_arguments", doc["command_line_arguments"])
    if arguments:
        built["args"] = arguments
    if files:
        built["files"] = files
    return built
