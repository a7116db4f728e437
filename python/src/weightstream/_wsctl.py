"""Running the bundled ``wsctl``: finding it, passing a job on standard input, reading its JSON, and turning its
``--error-format json`` report into the matching exception. Every other module calls wsctl through here."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from .errors import RunFailedError, WeightstreamError, from_kind

#: Environment variable naming the wsctl binary to use instead of the bundled one.
WSCTL_ENV = "WEIGHTSTREAM_WSCTL"


def binary() -> str:
    """The wsctl to run: ``$WEIGHTSTREAM_WSCTL``, else the one this package installed beside the interpreter,
    else the first on the PATH."""
    explicit = os.environ.get(WSCTL_ENV)
    if explicit:
        return explicit
    name = "wsctl.exe" if sys.platform == "win32" else "wsctl"
    for scripts in (sysconfig.get_path("scripts"), str(Path(sys.executable).parent)):
        candidate = Path(scripts) / name
        if candidate.is_file():
            return str(candidate)
    found = shutil.which(name)
    if found:
        return found
    raise RunFailedError(
        "wsctl was not found: install the package with `pip install ./python` (it builds and bundles wsctl), "
        f"or set {WSCTL_ENV} to a wsctl binary"
    )


def _error(stderr: str, code: int, args: Sequence[str]) -> WeightstreamError:
    """The exception for a failed wsctl: its JSON report (the last line that is one), else its last line."""
    for line in reversed(stderr.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                report = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(report, dict) and isinstance(report.get("message"), str):
                return from_kind(str(report.get("kind", "failed")), report["message"])
    last = next((l for l in reversed(stderr.splitlines()) if l.strip()), "")
    return RunFailedError(last or f"wsctl {' '.join(args[:1])} exited with status {code} and said nothing")


def _env(extra: Mapping[str, str] | None) -> dict[str, str] | None:
    """This process's environment with ``extra`` over it (a cluster's KUBECONFIG), or None for as it is."""
    return None if not extra else {**os.environ, **extra}


def _command(args: Sequence[str]) -> list[str]:
    return [binary(), "--error-format", "json", *args]


def run(
    args: Sequence[str],
    *,
    stdin: str | None = None,
    timeout: float | None = None,
    cwd: str | Path | None = None,
    env: Mapping[str, str] | None = None,
) -> str:
    """Runs wsctl to completion and returns its standard output; raises the typed error it reports."""
    try:
        done = subprocess.run(
            _command(args), input=stdin, capture_output=True, text=True, timeout=timeout, cwd=cwd, env=_env(env), check=False
        )
    except subprocess.TimeoutExpired:
        from .errors import WaitTimeoutError

        raise WaitTimeoutError(f"wsctl {args[0]} did not finish within {timeout:.0f}s") from None
    except OSError as e:
        raise RunFailedError(f"cannot start wsctl ({e}): set {WSCTL_ENV} or reinstall the package") from None
    if done.returncode != 0:
        raise _error(done.stderr, done.returncode, args)
    return done.stdout


def run_json(args: Sequence[str], **kwargs: Any) -> Any:
    """:func:`run`, its output parsed as JSON."""
    out = run(args, **kwargs)
    try:
        return json.loads(out)
    except json.JSONDecodeError:
        raise RunFailedError(f"wsctl {args[0]} printed something that is not JSON: {out[:200]!r}") from None


class Lines:
    """A running wsctl whose standard output is read line by line (progress, a watch, a log), its standard
    error kept aside (drained by a thread, so neither pipe can fill) for the error it reports at the end. Closing
    it early (``close()``, leaving a ``with``, breaking out of the loop) stops the process."""

    def __init__(
        self,
        args: Sequence[str],
        *,
        stdin: str | None = None,
        cwd: str | Path | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.args = list(args)
        try:
            self._proc = subprocess.Popen(
                _command(args),
                stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                bufsize=1,
                cwd=cwd,
                env=_env(env),
            )
        except OSError as e:
            raise RunFailedError(f"cannot start wsctl ({e}): set {WSCTL_ENV} or reinstall the package") from None
        self._stderr: list[str] = []
        self._drain = threading.Thread(target=self._read_stderr, daemon=True)
        self._drain.start()
        if stdin is not None and self._proc.stdin is not None:
            self._proc.stdin.write(stdin)
            self._proc.stdin.close()

    def _read_stderr(self) -> None:
        assert self._proc.stderr is not None
        for line in self._proc.stderr:
            self._stderr.append(line)

    def __iter__(self) -> Iterator[str]:
        """The output's lines (without their newline); raises the typed error once wsctl fails."""
        assert self._proc.stdout is not None
        try:
            for line in self._proc.stdout:
                yield line.rstrip("\n")
            code = self._proc.wait()
            self._drain.join(timeout=5)
            if code != 0:
                raise _error("".join(self._stderr), code, self.args)
        finally:
            self.close()

    def close(self) -> None:
        """Stops wsctl if it still runs (its children are its to stop: it ends them on SIGTERM)."""
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        for stream in (self._proc.stdout, self._proc.stderr):
            if stream is not None:
                stream.close()

    def __enter__(self) -> "Lines":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
