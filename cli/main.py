"""``warpdeck``: run a pipeline spec or the demo; attach to a run elsewhere; replay a recording.

Exit status of ``run`` and ``demo``, headless or under the control room (decided by
``RunReport.exit_code`` from the run's report, never from how the control room closed):

====  =====================================================================================
0     finished: every task done
1     one or more tasks failed or were cancelled
2     bad usage or a bad spec (a flag, a spec field, a run directory made by another spec, a
      backend that is not there): nothing ran; never anything else
3     drained by the operator: nothing more admitted, what was admitted finished, nothing failed
4     stopped before the end: the operator quit the control room with work running, SIGINT or
      SIGTERM, the engine stopped, or the source raised part way (what it had yielded finished);
      the same command again resumes the run and finishes it
5     stopped by an outage: the disk of the outputs or the journal stayed full, read-only or
      failing for ``[faults] outage_timeout_s``; nothing was marked failed; once the disk is
      fixed, the same command again finishes the run
6     the journal could not be written (the run stopped at once, or its run directory could not
      be opened); the same command again resumes once its disk is fixed
7     a spec with steps was held at a gate with no decision: the same command with
      ``--approve STEP`` goes on (finished steps are not run again)
8     a gate was rejected (``--reject STEP``, or from the control room): the steps after it did not run
====  =====================================================================================

Where two apply, the higher of 6, 5 and 4 wins, then 8 and 7, then failed or cancelled (1), then
drained (3).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.metadata
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console

from warpdeck.cli.advise import add_advise_parser, run_advise
from warpdeck.cli.check import add_check_parser, run_check
from warpdeck.cli.reports import refuse, write_report
from warpdeck.cli.run_log import LOG_NAME, RunLog
from warpdeck.cli.steps import run_steps_command, say_steps, steps_command
from warpdeck.engine.api import (
    EXIT_STATUS_HELP,
    BackendError,
    ControlSettings,
    ExitStatus,
    ExportSettings,
    GateDecision,
    JournalError,
    LedgerError,
    PipelineSpec,
    RunDirError,
    RunReport,
    SpecError,
    StepsReport,
    load_secret,
    load_spec,
    not_run,
    parse_broker,
    parse_metrics_address,
    parse_spec,
    ray_log_grew,
    ray_log_size,
)

if TYPE_CHECKING:
    from warpdeck.tui.link import Link

__all__ = ["main"]

_DEMO = "warpdeck.examples.spectrogram:stage"


def _version() -> str:
    try:
        return importlib.metadata.version("warpdeck")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - running from a bare checkout
        return "0+unknown"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="warpdeck", description="A control room for GPU batch pipelines.",
                                epilog=f"{EXIT_STATUS_HELP}\n(of run and demo)",
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"warpdeck {_version()}")
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a pipeline spec (TOML)", epilog=EXIT_STATUS_HELP,
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    run.add_argument("spec", type=Path)
    run.add_argument("--retry-failed", action="store_true",
                     help="when resuming a run directory, retry the tasks that failed in it")
    run.add_argument("--approve", action="append", default=[], metavar="STEP",
                     help="a spec with steps: approve STEP's gate (repeatable); kept in the run directory's ledger")
    run.add_argument("--reject", action="append", default=[], metavar="STEP",
                     help="a spec with steps: reject STEP's gate, ending the run there (exit status 8)")
    run.add_argument("--note", default="", help="what you say of the gates you --approve or --reject (kept with them)")
    _common(run)
    demo = sub.add_parser("demo", help="run a built-in example pipeline on generated inputs", epilog=EXIT_STATUS_HELP,
                          formatter_class=argparse.RawDescriptionHelpFormatter)
    demo.add_argument("--count", type=int, help="how many synthetic signals (default 4000 headless; 60000 in the "
                      "control room, so there is time to watch)")
    demo.add_argument("--outputs", action="store_true",
                      help="write the control-room demo's outputs too (headless always writes them)")
    _common(demo)
    attach = sub.add_parser("attach", help="open the control room over an engine elsewhere, through its broker")
    attach.add_argument("url", help="the engine's broker: mqtt://[user:pass@]host:port or mqtts://…")
    attach.add_argument("--pipeline", required=True, help="the pipeline's name (its spec's name)")
    attach.add_argument("--readonly", action="store_true", help="watch only: send no commands")
    attach.add_argument("--secret-file", type=Path,
                        help="shared secret to sign commands with (else $WARPDECK_SECRET; with neither: read-only)")
    attach.add_argument("--ca-file", type=Path, help="CA certificate that signs an mqtts:// broker's certificate")
    attach.add_argument("--record", type=Path, metavar="FILE", help="also save the telemetry stream, for replay")
    attach.add_argument("--theme", help="control-room theme")
    replay = sub.add_parser("replay", help="play a recorded telemetry stream (attach --record) in the control room")
    replay.add_argument("recording", type=Path)
    replay.add_argument("--speed", type=float, default=1.0, help="playback speed (2: twice as fast)")
    replay.add_argument("--theme", help="control-room theme")
    replay.add_argument("--trace", type=Path, metavar="FILE",
                        help="write the recording's timeline as a Trace Event Format file and exit (no control room)")
    add_advise_parser(sub)
    add_check_parser(sub)
    return p


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--headless", action="store_true", help="no control room: a progress display and a summary")
    p.add_argument("--json", type=Path, metavar="REPORT.json", help="write the run report as JSON")
    p.add_argument("--backend", choices=("auto", "numpy", "cupy"), help="override the spec's backend")
    p.add_argument("--run-dir", type=Path, help="journal and outputs (default .warpdeck/<pipeline>)")
    p.add_argument("--broker", default="embedded", metavar="embedded|URL|none",
                   help="the MQTT control plane: embedded (default: a broker in this process), "
                   "mqtt://[user:pass@]host:port or mqtts://… for a real one, none to run without")
    p.add_argument("--ca-file", type=Path, help="CA certificate that signs an mqtts:// broker's certificate")
    p.add_argument("--secret-file", type=Path,
                   help="shared secret for signed remote commands (else $WARPDECK_SECRET; with neither, "
                   "remote commands are refused)")
    p.add_argument("--theme", help="control-room theme: warpdeck-dark (default), warpdeck-light, "
                   "warpdeck-high-contrast, warpdeck-ansi, or one of yours")
    p.add_argument("--trace", type=Path, metavar="FILE",
                   help="write the run's timeline as it goes, in the Trace Event Format (Perfetto, chrome://tracing)")
    p.add_argument("--metrics", metavar="HOST:PORT",
                   help="serve Prometheus/OpenMetrics metrics at http://HOST:PORT/metrics while the run lasts "
                   "(PORT 0: a free one; the address is printed)")


def _demo_spec(count: int, outputs: bool) -> PipelineSpec:
    return parse_spec({
        "name": "demo-spectrogram", "batch_size": 64, "lanes": 2,
        "source": {"kind": "synthetic", "count": count, "shape": [8192], "dtype": "float32", "seed": 7},
        "sink": {"kind": "npy_dir", "path": "outputs"} if outputs else {"kind": "null"},
        "stages": [{"fn": _DEMO, "deadline_s": 30}],
    }, "<demo>")


def main(argv: list[str] | None = None, early: list[int] | None = None) -> int:
    """The ``warpdeck`` command (its entry point is ``entry.main``). ``early``: the stop signals
    that came while the command imported (None: called in-process, signals stay as they are)."""
    args = _parser().parse_args(argv)
    err = Console(stderr=True)
    if early is not None:
        # SIGINT acts as Python's default again; a run's SIGTERM stays held until
        # ``_sigterm_interrupts`` takes it over, so no moment is left to the default.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        if args.command not in ("run", "demo"):
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            if early:
                signal.raise_signal(early[0])  # as it would have acted, had it not been held
    if args.command in ("attach", "replay"):
        return _remote(args, err)
    if args.command == "advise":
        return run_advise(args, err)
    if args.command == "check":
        return run_check(args, err)
    name = Path(args.spec).stem if args.command == "run" else "demo-spectrogram"
    try:
        with _sigterm_interrupts():
            if early:
                raise KeyboardInterrupt  # stopped while it imported: a report, as for any stop
            return _run_command(args, err, name)
    except KeyboardInterrupt:  # a signal while the run started, or a second one while it stopped
        err.print("interrupted before the run could report")
        write_report(not_run(name, stopped_by="signal"), args.json, err)
        return ExitStatus.STOPPED


@contextlib.contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """Until the run's own handlers take over, a SIGTERM stops the run as a SIGINT does, with a
    report: Python's default for it ends the process without a word (issue 28). Outside the main
    thread (a test calling ``main``) signals stay as they are."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, interrupt)
    except ValueError:
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _run_command(args: argparse.Namespace, err: Console, name: str) -> int:
    """``warpdeck run`` and ``warpdeck demo``: every ending, a refusal too, writes its report."""
    try:
        if args.command == "run":
            spec = load_spec(args.spec)
        else:
            count = args.count or (4000 if args.headless else 60_000)
            spec = _demo_spec(count, outputs=args.headless or args.outputs)
    except SpecError as exc:
        return refuse(not_run(name, refused=str(exc)), err, args.json)
    if args.backend:
        spec = spec.model_copy(update={"backend": args.backend})
    try:
        control = _control(args)
        exports = ExportSettings(trace=args.trace,
                                 metrics=parse_metrics_address(args.metrics) if args.metrics else None)
    except ValueError as exc:
        return refuse(not_run(spec.name, refused=str(exc)), err, args.json)
    run_dir = args.run_dir or Path(".warpdeck") / spec.name
    retry_failed = getattr(args, "retry_failed", False)
    # The demo starts afresh each time unless it is given a run directory to keep (and resume).
    journal = False if args.command == "demo" and args.run_dir is None else None
    room = False
    if not args.headless:
        if not (sys.stdin.isatty() and sys.stdout.isatty()):
            err.print("warpdeck: not a terminal, so no control room; running headless (--headless says so).")
        elif (unfit := _textual_unfit()) is not None:
            err.print(f"warpdeck: {unfit}; running headless", markup=False, highlight=False)
        else:
            room = True

    def control_room(decisions: dict[str, GateDecision] | None = None) -> int:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the control room's own business (issue 29)
        return _control_room(spec, run_dir, args.theme, retry_failed, journal, control, args.json, err, exports,
                             decisions, getattr(args, "spec", None))

    if spec.steps:
        return run_steps_command(spec, run_dir, args, control, exports, err, control_room if room else None)
    if room:
        return control_room()
    console = Console(stderr=False)
    ray_log = _ray_log_size(spec, run_dir)
    from warpdeck.cli.headless import run_headless  # noqa: PLC0415 - rich loads only for a run

    try:
        with RunLog(run_dir / LOG_NAME).installed():
            report = asyncio.run(run_headless(spec, run_dir, console, live=console.is_terminal,
                                              retry_failed=retry_failed, journal=journal, control=control,
                                              exports=exports))
    except JournalError as exc:  # the run directory's disk refused the journal: not a usage error
        return refuse(not_run(spec.name, journal_error=str(exc)), err, args.json)
    except (BackendError, RunDirError, SpecError) as exc:  # SpecError: a source's listing
        return refuse(not_run(spec.name, refused=str(exc)), err, args.json)
    except OSError as exc:  # a trace file or a metrics port refused: nothing ran
        return refuse(not_run(spec.name, refused=_export_error(exc, exports)), err, args.json)
    write_report(report, args.json, err)
    _closing_note(report, err)
    _ray_note(spec, run_dir, ray_log, err)
    return report.exit_code


def _ray_log_size(spec: PipelineSpec, run_dir: Path) -> int:
    """The size of the run's ray.log before a Ray run (0 for a local run, which loads no scale-out code)."""
    if spec.executor.kind != "ray":
        return 0
    return ray_log_size(run_dir)


def _ray_note(spec: PipelineSpec, run_dir: Path, before: int, err: Console) -> None:
    """After a Ray run that added to the run's ray.log (Ray's warnings and errors, the actors'
    output), where it is."""
    if spec.executor.kind != "ray":
        return
    if (log := ray_log_grew(run_dir, before)) is not None:
        err.print(f"warpdeck: Ray or the actors wrote warnings, errors or output during the run; see {log}",
                  markup=False,
                  highlight=False, soft_wrap=True)


def _textual_unfit() -> str | None:
    """Why the control room cannot run on the installed Textual, or None (tui/textual_internals.py)."""
    from warpdeck.tui.textual_internals import check  # noqa: PLC0415 - Textual loads only for a control room

    try:
        check()
    except RuntimeError as exc:
        return str(exc)
    return None


def _remote(args: argparse.Namespace, err: Console) -> int:
    """``attach`` and ``replay``: the control room over an engine that is not in this process."""
    if args.command == "replay":
        # The file first, from its first line: a file that is not a recording is said at once, in
        # one line, before a terminal is asked for or Textual loaded (issue 29).
        refused = _recording_refused(args.recording)
        if refused is not None:
            err.print(f"error: {refused}", markup=False, highlight=False, soft_wrap=True)
            return ExitStatus.USAGE
        if args.trace is not None:
            return _replay_trace(args.recording, args.trace, err)
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        err.print(f"warpdeck {args.command}: the control room needs a terminal")
        return ExitStatus.USAGE
    if (unfit := _textual_unfit()) is not None:
        err.print(f"error: {unfit}", markup=False, highlight=False)
        return ExitStatus.USAGE
    from warpdeck.cli.control_room import UnknownTheme, check_theme, run_remote  # noqa: PLC0415 - Textual loads only here
    from warpdeck.tui.attach import AttachLink, replay_link  # noqa: PLC0415

    link: Link
    try:
        check_theme(args.theme)
        if args.command == "replay":
            link = replay_link(args.recording, args.speed)
        else:
            address = parse_broker(args.url, args.ca_file)
            if address is None:
                raise ValueError("attach needs the engine's broker URL (an embedded broker's is in its report)")
            secret = None if args.readonly else load_secret(args.secret_file)
            link = AttachLink(address, args.pipeline, secret=secret, readonly=args.readonly or secret is None,
                              record=args.record)
    except (UnknownTheme, ValueError, OSError) as exc:
        err.print(f"error: {exc}", markup=False, highlight=False, soft_wrap=True)
        return ExitStatus.USAGE
    return run_remote(link, theme=args.theme)


def _recording_refused(recording: Path) -> str | None:
    """Why ``replay`` cannot play ``recording``, read from its first line (None: it can)."""
    from warpdeck.engine.api import read_recording  # noqa: PLC0415

    frames = read_recording(recording)
    try:
        next(frames, None)
    except OSError as exc:
        return f"cannot read {recording}: {exc.strerror or exc}"
    except ValueError as exc:  # RecordingError: what the file is instead
        return str(exc)
    finally:
        frames.close()
    return None


def _replay_trace(recording: Path, out: Path, err: Console) -> int:
    """``replay REC --trace FILE``: the recording's timeline as a trace file; no terminal needed."""
    from warpdeck.engine.api import trace_recording  # noqa: PLC0415

    try:
        events = trace_recording(recording, out)
    except (OSError, ValueError) as exc:
        err.print(f"error: {exc}", markup=False, highlight=False, soft_wrap=True)
        return ExitStatus.USAGE
    Console().print(f"{out}: {events:,} trace events from {recording} (Trace Event Format: open it in "
                    "https://ui.perfetto.dev)", markup=False, highlight=False, soft_wrap=True)
    return ExitStatus.FINISHED


def _control(args: argparse.Namespace) -> ControlSettings | None:
    """The control plane the flags ask for; ``ValueError`` says what is wrong with them."""
    if args.broker == "none":
        return None
    address = parse_broker(args.broker, args.ca_file)
    if args.ca_file is not None and (address is None or not address.tls):
        raise ValueError("--ca-file needs an mqtts:// broker")
    return ControlSettings(broker=address, secret=load_secret(args.secret_file))


def _export_error(exc: OSError, exports: ExportSettings) -> str:
    """What a refused export means, naming the flag."""
    why = exc.strerror or str(exc)
    if exc.filename is not None and exports.trace is not None and Path(exc.filename) == exports.trace:
        return f"--trace {exports.trace}: {why}"
    if exports.metrics is not None:
        host, port = exports.metrics
        return f"--metrics {host}:{port}: {why}"
    return str(exc)


def _control_room(spec: PipelineSpec, run_dir: Path, theme: str | None, retry_failed: bool, journal: bool | None,
                  control: ControlSettings | None, json_path: Path | None, err: Console,
                  exports: ExportSettings, decisions: dict[str, GateDecision] | None = None,
                  spec_file: Path | None = None) -> int:
    from warpdeck.cli.control_room import UnknownTheme, check_theme, run_control_room  # noqa: PLC0415 - Textual loads only here

    try:
        check_theme(theme)
        log, ray_log = RunLog(run_dir / LOG_NAME), _ray_log_size(spec, run_dir)
        with log.installed(), log.held():  # the terminal is the app's until it closes
            report = run_control_room(spec, run_dir, theme=theme, retry_failed=retry_failed, journal=journal,
                                      control=control, exports=exports, decisions=decisions)
    except JournalError as exc:
        return refuse(not_run(spec.name, journal_error=str(exc)), err, json_path)
    except (UnknownTheme, BackendError, RunDirError, SpecError, LedgerError) as exc:  # SpecError: a source's listing
        return refuse(not_run(spec.name, refused=str(exc)), err, json_path)
    except OSError as exc:
        return refuse(not_run(spec.name, refused=_export_error(exc, exports)), err, json_path)
    if report is None:
        err.print("the engine stopped before it could report")
        return ExitStatus.STOPPED
    write_report(report, json_path, err)
    if isinstance(report, StepsReport):
        say_steps(report, Console(), steps_command(spec_file, run_dir))
        return report.exit_code
    # The status comes from the report (quitting with work running leaves it "stopped": 4), never
    # from how the app closed.
    Console().print(f"{spec.name}: {report.ended}; {report.counts.done:,} done, {report.counts.failed:,} failed, "
                    f"{report.counts.cancelled:,} cancelled", markup=False, highlight=False)
    _closing_note(report, err)
    _ray_note(spec, run_dir, ray_log, err)
    return report.exit_code


def _closing_note(report: RunReport, err: Console) -> None:
    """After a run that stopped before the end, why and how to finish it."""
    code = report.exit_code
    if code not in (ExitStatus.STOPPED, ExitStatus.OUTAGE, ExitStatus.JOURNAL):
        return
    c = report.counts
    how = ("run the same command again to resume and finish it" if report.resume is not None else
           "it kept no journal (give it a --run-dir to keep one): running it again starts over")
    why = "stopped before the end"
    if code == ExitStatus.OUTAGE and report.outages is not None:
        why = f"stopped by an outage ({report.outages.last}); nothing failed"
        how = f"once the disk is fixed, {how}"
    elif code == ExitStatus.JOURNAL:
        why = f"stopped: {report.journal_error}"
        how = f"once its disk is fixed, {how}"
    elif report.stopped_by == "source":
        why = f"stopped: the source failed after {c.total:,} tasks ({report.source_error}; traceback in the report)"
        how = f"once the source is fixed, {how}"
    err.print(f"{report.pipeline}: {why}, {c.done:,} done; {how}", markup=False, highlight=False, soft_wrap=True)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
